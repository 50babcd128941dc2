"""Gradients: exact/bf16 recipes differentiate like torch SDPA; quantized recipes refuse with one line."""

import pytest
import torch
import torch.nn.functional as F

import fsattn_diffusers as fa
from tolerances import BF16_GRAD_ERR_MAX, FP32_ACCUMULATED, FP32_FINITE_DIFFERENCE_GRAD, FP32_LSE_NATS


def leaf_inputs(b=2, h=3, s_q=70, s_k=90, d=64, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, s, d, generator=g).to(dtype).requires_grad_() for s in (s_q, s_k, s_k)]


def sdpa_grads(q, k, v, go, kv_lens=None):
    q2, k2, v2 = (t.detach().double().requires_grad_() for t in (q, k, v))
    mask = None
    if kv_lens is not None:
        mask = (torch.arange(k.shape[2])[None, :] < torch.tensor(kv_lens)[:, None])[:, None, None, :]
    out = F.scaled_dot_product_attention(q2, k2, v2, attn_mask=mask)
    out.backward(go.double())
    return out, (q2.grad, k2.grad, v2.grad)


def rel(a, b):
    return float((a.detach().double() - b.detach().double()).norm() / b.detach().double().norm())


@pytest.mark.parametrize("kv_lens", [None, [90, 33]])
def test_exact_gradients_match_sdpa(kv_lens):
    q, k, v = leaf_inputs()
    go = torch.randn(q.shape[0], q.shape[1], q.shape[2], q.shape[3], generator=torch.Generator().manual_seed(9))
    out = fa.attention(q, k, v, "exact", layout="bhsd", kv_lens=kv_lens)
    assert out.grad_fn is not None
    out.backward(go)
    ref_out, ref_grads = sdpa_grads(q, k, v, go, kv_lens)
    errs = [rel(out, ref_out)] + [rel(t.grad, r) for t, r in zip((q, k, v), ref_grads)]
    print(f"exact vs SDPA (float64), kv_lens={kv_lens}: out {errs[0]:.2e} dq {errs[1]:.2e} dk {errs[2]:.2e} "
          f"dv {errs[3]:.2e}")
    assert max(errs) < FP32_ACCUMULATED
    if kv_lens is not None:  # keys past kv_lens get no gradient
        assert torch.all(k.grad[1, :, 33:] == 0) and torch.all(v.grad[1, :, 33:] == 0)


def test_exact_gradients_pass_finite_differences():
    q, k, v = leaf_inputs(b=1, h=1, s_q=5, s_k=7, d=32, seed=3)
    eps, g = 1e-2, torch.Generator().manual_seed(4)
    w = torch.randn(1, 1, 5, 32, generator=g)

    def f(q_, k_, v_):
        return float((fa.attention(q_, k_, v_, "exact", layout="bhsd", kv_lens=[6]).double() * w).sum())
    (fa.attention(q, k, v, "exact", layout="bhsd", kv_lens=[6]) * w).sum().backward()
    worst = 0.0
    for i, t in enumerate((q, k, v)):
        for idx in [(0, 0, 1, 3), (0, 0, 4, 31), (0, 0, 0, 0)]:
            with torch.no_grad():
                plus, minus = [x.detach().clone() for x in (q, k, v)], [x.detach().clone() for x in (q, k, v)]
                plus[i][idx] += eps
                minus[i][idx] -= eps
                fd = (f(*plus) - f(*minus)) / (2 * eps)
            worst = max(worst, abs(fd - float(t.grad[idx])))
    print(f"worst |finite difference - autograd| {worst:.2e}")
    assert worst < FP32_FINITE_DIFFERENCE_GRAD


def test_bf16_recipe_is_differentiable_and_close_to_sdpa():
    q, k, v = leaf_inputs(s_q=90, seed=5, dtype=torch.bfloat16)
    out = fa.attention(q, k, v, "bf16-emulated", layout="bshd")
    out.float().square().sum().backward()
    q2, k2, v2 = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref = F.scaled_dot_product_attention(q2.transpose(1, 2), k2.transpose(1, 2), v2.transpose(1, 2)).transpose(1, 2)
    ref.square().sum().backward()
    errs = [rel(out, ref), rel(q.grad, q2.grad), rel(k.grad, k2.grad), rel(v.grad, v2.grad)]
    print(f"bf16 vs float32 SDPA on the same bf16 inputs: out {errs[0]:.2e} grads {errs[1:]}")
    assert out.dtype == torch.bfloat16 and q.grad.dtype == torch.bfloat16
    assert max(errs) < BF16_GRAD_ERR_MAX


@pytest.mark.parametrize("recipe", ["mxfp8", "mxfp6", "mxfp4"])
def test_quantized_recipes_refuse_grad_with_one_line(recipe):
    q, k, v = leaf_inputs()
    out, lse = fa.attention(q, k, v, recipe, layout="bhsd", return_lse=True)  # forward-only use still works
    with torch.no_grad():
        plain, plain_lse = fa.attention(q, k, v, recipe, layout="bhsd", return_lse=True)
    assert torch.equal(out, plain) and torch.equal(lse, plain_lse) and out.grad_fn is not None
    for target in (out.sum(), lse.sum()):
        with pytest.raises(ValueError) as info:
            target.backward()
        assert str(info.value) == str(info.value).strip()
    assert q.grad is None
    msg = str(info.value)
    print(msg)
    assert "\n" not in msg
    assert msg == (f"fsattn attention is inference-only for quantized recipe '{recipe}'; use recipe='bf16-emulated' or "
                   f"'exact' (differentiable) or torch.nn.functional.scaled_dot_product_attention for training")


def test_no_grad_mode_runs_the_backend():
    q, k, v = leaf_inputs()
    with torch.no_grad():
        out = fa.attention(q, k, v, "mxfp8", layout="bhsd")
    assert out.grad_fn is None
    detached = fa.attention(q.detach(), k.detach(), v.detach(), "mxfp8", layout="bhsd")
    assert torch.equal(out, detached)


def test_grad_path_forward_matches_the_emulator_and_lse():
    q, k, v = leaf_inputs(seed=7)
    out, lse, st = fa.attention(q, k, v, "exact", layout="bhsd", kv_lens=[90, 0], return_lse=True, return_stats=True)
    with torch.no_grad():
        emu, emu_lse, emu_st = fa.attention(q, k, v, "exact", layout="bhsd", kv_lens=[90, 0], return_lse=True,
                                            return_stats=True, backend="emulator")
    lse_diff = float((lse.detach() - emu_lse)[0].abs().max())
    print("grad path vs emulator:", rel(out, emu), lse_diff, st, emu_st)
    assert rel(out, emu) < FP32_ACCUMULATED and torch.all(out[1] == 0)
    assert torch.equal(torch.isinf(lse), torch.isinf(emu_lse)) and lse_diff < FP32_LSE_NATS
    assert st["tiles"] == emu_st["tiles"] and set(st) == set(emu_st)

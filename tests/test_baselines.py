"""FA3 baseline policies (``fa3``, ``fa3-fp8``): the refusal without the package, and the argument mapping
onto FA3's entry points (checked against a CPU stand-in with FA3's signatures, ``fake_fa3``)."""

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import fake_fa3
import fsattn_diffusers
from fsattn_diffusers.backends import fa3_backend
from fsattn_diffusers.integration.policy import BASELINE_POLICIES, get_policy
from tolerances import BF16_OPERANDS_ERR_MAX, FP8_OPERANDS_ERR_MAX, QUANTIZED_ERR_MIN, STAND_IN_MODEL_ERR_MAX

FA3_ABSENT = fa3_backend.fa3_missing() is not None


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _qkv(b=2, s=96, h=3, d=64, seed=0, s_k=None):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, s, h, d, generator=g).to(torch.bfloat16)
    k = torch.randn(b, s_k or s, h, d, generator=g).to(torch.bfloat16)
    v = torch.randn(b, s_k or s, h, d, generator=g).to(torch.bfloat16)
    return q, k, v


def _sdpa(q, k, v, kv_lens=None):
    mask = None
    if kv_lens is not None:
        mask = (torch.arange(k.shape[1])[None, :] < kv_lens[:, None])[:, None, None, :]
    out = F.scaled_dot_product_attention(*(t.float().transpose(1, 2) for t in (q, k, v)), attn_mask=mask)
    return out.transpose(1, 2)


@pytest.mark.skipif(not FA3_ABSENT, reason="fa3-fwd is installed here")
@pytest.mark.parametrize("name", ["fa3", "fa3-fp8"])
def test_missing_fa3_is_one_clear_error(name):
    # without CUDA the message says a GPU is needed (pip install alone would not help); with CUDA, what to install
    expected = r"needs the fa3-fwd package \(pip install fa3-fwd einops\)" if torch.cuda.is_available() else \
        r"needs an NVIDIA Hopper GPU and the fa3-fwd package; this machine has no CUDA device"
    with pytest.raises(ValueError, match=expected) as info:
        get_policy(name)
    print(info.value)
    assert "\n" not in str(info.value)
    from fsattn_diffusers.integration.tiny import tiny_wan_transformer

    model = tiny_wan_transformer(num_layers=1)
    with pytest.raises(ValueError, match="fa3-fwd"):
        fsattn_diffusers.apply(model, policy=name)
    assert all("FSAttn" not in type(p).__name__ for p in model.attn_processors.values())


@pytest.mark.skipif(not FA3_ABSENT, reason="fa3-fwd is installed here")
def test_cli_e2e_without_fa3_exits_2_with_one_line():
    res = subprocess.run([sys.executable, "-m", "fsattn_diffusers", "e2e", "--device", "cpu", "--policies",
                          "bf16,fa3"], capture_output=True, text=True, timeout=120)
    print(res.returncode, res.stderr)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "fa3-fwd" in res.stderr


def test_policy_maps_to_recipe_and_backend(monkeypatch):
    fake_fa3.install(monkeypatch)
    for name, (recipe, backend) in BASELINE_POLICIES.items():
        policy = get_policy(name)
        assert policy.is_fixed and policy.backend == backend == "fa3"
        assert policy.entry.name == recipe == name
        assert policy.plan_names(4) == [name] * 4
    assert get_policy("mxfp8").backend is None
    from fsattn_diffusers.integration import WanFSAttnProcessor

    assert WanFSAttnProcessor("fa3-fp8", backend="emulator").backend == "fa3"  # the baseline names its kernel
    assert WanFSAttnProcessor("mxfp8", backend="emulator").backend == "emulator"


def test_bf16_call_passes_the_callers_bshd_tensors(monkeypatch):
    fake = fake_fa3.install(monkeypatch)
    q, k, v = _qkv()
    out, lse = fsattn_diffusers.attention(q, k, v, get_policy("fa3").entry, backend="fa3", return_lse=True,
                                          scale=0.1)
    (call,) = fake.CALLS
    assert call["entry"] == "dense" and call["q_descale"] is None and call["softmax_scale"] == 0.1
    assert call["q"].data_ptr() == q.data_ptr() and call["q"].shape == q.shape  # no copy, BSHD
    ref = F.scaled_dot_product_attention(*(t.float().transpose(1, 2) for t in (q, k, v)), scale=0.1)
    err = _rel(out.transpose(1, 2), ref)
    print(f"fa3 (stand-in) vs SDPA: {err:.2e}")
    assert out.shape == q.shape and out.dtype == torch.bfloat16 and err < BF16_OPERANDS_ERR_MAX
    assert lse.shape == (2, 3, 96) and lse.dtype == torch.float32


def test_fp8_call_quantizes_per_batch_and_head(monkeypatch):
    fake = fake_fa3.install(monkeypatch)
    q, k, v = _qkv()
    recipe = get_policy("fa3-fp8").entry
    err = _rel(fsattn_diffusers.attention(q, k, v, recipe, backend="fa3"), _sdpa(q, k, v))
    print(f"fa3-fp8 (stand-in) vs FP32 attention, N(0,1) operands: {err:.3%}")
    # E4M3 Q/K/V with per-head scales: a few percent, and not exact
    assert QUANTIZED_ERR_MIN < err < FP8_OPERANDS_ERR_MAX
    q[1, :, 2] *= 40.0  # one (batch, head) far larger: its scale alone must follow it
    q_in = q.clone()
    fake.CALLS.clear()
    fsattn_diffusers.attention(q, k, v, recipe, backend="fa3")
    assert torch.equal(q, q_in)  # the caller's tensor is untouched
    (call,) = fake.CALLS
    assert call["q"].dtype == call["k"].dtype == call["v"].dtype == torch.float8_e4m3fn
    for name, t in (("q", q), ("k", k), ("v", v)):
        descale = call[f"{name}_descale"]
        assert descale.shape == (2, 3) and descale.dtype == torch.float32
        torch.testing.assert_close(descale, t.float().abs().amax(dim=(1, 3)) / 448.0)
    assert call["q_descale"][1, 2] > 20 * call["q_descale"][0, 2]


@pytest.mark.parametrize("name", ["fa3", "fa3-fp8"])
def test_kv_lens_use_the_varlen_entry(monkeypatch, name):
    fake = fake_fa3.install(monkeypatch)
    q, k, v = _qkv(b=2, s=80, s_k=80)
    lens = torch.tensor([80, 53])
    k[1, 53:] = 1e4  # padded keys: must reach neither the scores nor an FP8 scale
    v[1, 53:] = 1e4
    out, lse = fsattn_diffusers.attention(q, k, v, get_policy(name).entry, backend="fa3", kv_lens=lens,
                                          return_lse=True)
    (call,) = fake.CALLS
    assert call["entry"] == "varlen" and call["q"].shape == (160, 3, 64)
    assert call["cu_seqlens_q"].tolist() == [0, 80, 160] and call["cu_seqlens_k"].tolist() == [0, 80, 160]
    assert call["seqused_k"].tolist() == [80, 53] and (call["max_seqlen_q"], call["max_seqlen_k"]) == (80, 80)
    if name == "fa3-fp8":
        torch.testing.assert_close(call["k_descale"][1], k[1, :53].float().abs().amax(dim=(0, 2)) / 448.0)
    err = _rel(out, _sdpa(q, k, v, lens))
    print(f"{name} varlen (stand-in) vs masked FP32 attention: {err:.3%}")
    assert err < (BF16_OPERANDS_ERR_MAX if name == "fa3" else FP8_OPERANDS_ERR_MAX)
    assert lse.shape == (2, 3, 80) and torch.isfinite(lse).all()


def test_apply_runs_fa3_on_the_tiny_wan_transformer(monkeypatch):
    fake = fake_fa3.install(monkeypatch)
    from fsattn_diffusers.integration.tiny import tiny_wan_transformer

    model = tiny_wan_transformer(num_layers=2).to(torch.bfloat16)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 16, 2, 8, 8, generator=g).to(torch.bfloat16)
    ctx = torch.randn(1, 8, 32, generator=g).to(torch.bfloat16)
    with torch.no_grad():
        stock = model(x, torch.tensor([500.0]), ctx, return_dict=False)[0]
        handle = fsattn_diffusers.apply(model, policy="fa3")
        try:
            out = model(x, torch.tensor([500.0]), ctx, return_dict=False)[0]
        finally:
            fsattn_diffusers.remove(model)
    assert len(fake.CALLS) == 2 and {r.backend for r in handle.records} == {"fa3"}
    assert {r.recipe for r in handle.records} == {"fa3"}
    err = _rel(out, stock)
    print(f"tiny Wan, fa3 (stand-in) vs stock: {err:.2e}")
    assert err < STAND_IN_MODEL_ERR_MAX

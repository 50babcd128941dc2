"""The INT8 pre-pass (kernels/sm90/prepass_int8.py) against the reference's operands (SM90Int8Numerics), on an sm_90
GPU or (``FSATTN_KERNEL_TEST_CPU=1`` with ``TRITON_INTERPRET=1``) Triton's interpreter.

Rule: codes, scales and V bit for bit (both sides divide by IEEE rules: ``formats.int8_rows``)."""

import pytest
import torch

from kernel_device import DEV, a_fragment_position, skip_module_without_sm90  # noqa: E402

skip_module_without_sm90()
pytest.importorskip("triton")

from fsattn_diffusers.emulator import valid_prefix  # noqa: E402
from fsattn_diffusers.numerics import numerics_for  # noqa: E402
from fsattn_diffusers.recipe import INT8_BF16, get_recipe  # noqa: E402
from fsattn_diffusers.smoothing import smooth_inputs  # noqa: E402

from fsattn_diffusers.kernels.sm90.ops_int8 import prepass_int8  # noqa: E402
from tolerances import FP32_ACCUMULATED  # noqa: E402

RECIPE = get_recipe(INT8_BF16).replace(numerics="sm90")


@pytest.mark.parametrize("b,h,s,d,kv_lens,dtype", [(1, 2, 200, 64, None, torch.bfloat16),
                                                    (2, 1, 300, 128, [130, 300], torch.float16),
                                                    (1, 1, 129, 128, [0], torch.float32)],
                         ids=["bf16", "fp16-kv-lens", "fp32-empty"])
def test_codes_and_scales_are_the_references(b, h, s, d, kv_lens, dtype):
    g = torch.Generator().manual_seed(s)
    q, k, v = (torch.randn(b, h, s, d, generator=g).mul(3.0).to(dtype).to(DEV) for _ in range(3))
    k[..., 5] += 4.0  # a shared offset for K smoothing to remove
    before = [t.clone() for t in (q, k, v)]
    kvl = torch.tensor(kv_lens, dtype=torch.int32, device=DEV) if kv_lens else None
    q8, qs, k8, ks, v16 = prepass_int8(q, k, v, d ** -0.5, kvl)[:5]
    valid = valid_prefix(kvl, s, q.device)
    qi, ki, _, _ = smooth_inputs(q, k, RECIPE, d ** -0.5, valid, None)
    qo, ko, vo, *_ = numerics_for(RECIPE).operands(qi, ki, v, d ** -0.5, valid)
    ks_rows = ks.repeat_interleave(128, dim=2)[:, :, :s]
    diffs = [int((q8[:, :, :s].float() != qo[..., :-1]).sum()), int((qs[:, :, :s] != qo[..., -1]).sum()),
             int((k8[:, :, :s].float() != ko[..., :-1]).sum()), int((ks_rows != ko[..., -1]).sum()),
             int((v16[:, :, :s].float() != vo).sum())]
    code_step = float((q8[:, :, :s].float() - qo[..., :-1]).abs().max())
    print(f"({b}, {h}, {s}, {d}) kv_lens={kv_lens} {dtype}: differing Q codes, Q scales, K codes, K scales, V: {diffs}; "
          f"largest Q code step {code_step}")
    assert diffs == [0, 0, 0, 0, 0]
    assert bool((q8[:, :, s:] == 0).all()) and bool((k8[:, :, s:] == 0).all()) and bool((v16[:, :, s:] == 0).all())
    assert all(torch.equal(a, c) for a, c in zip(before, (q, k, v)))


def test_the_pre_pass_flags_the_slices_with_non_finite_inputs():
    b, h, s, d = 2, 3, 200, 64
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(b, h, s, d, generator=g).to(torch.bfloat16).to(DEV) for _ in range(3))
    q[0, 1, 17, 3] = float("nan")
    k[1, 2, 40, 0] = float("inf")
    v[1, 0, 150:] = float("nan")  # past kv_lens[1]: never read, not flagged
    v[0, 2, 5, 5] = float("-inf")
    kvl = torch.tensor([200, 150], dtype=torch.int32, device=DEV)
    flags = torch.zeros((b * h,), dtype=torch.int32, device=DEV)
    prepass_int8(q, k, v, d ** -0.5, kvl, flags=flags)
    got = flags.view(b, h).cpu().tolist()
    print(got)
    assert got == [[0, 1, 1], [0, 0, 1]]


@pytest.mark.parametrize("min_ratio", [1.0, 0.0], ids=["switch", "every-slice"])
def test_q_smoothing_codes_and_key_term_are_the_references(min_ratio):
    """Q smoothing (``smooth_q``): Q's codes and scales bit for bit, the key term within fp32 summation order."""
    from fsattn_diffusers.smoothing import q_smoothing_ratio2

    b, h, s, d = 1, 3, 200, 64
    g = torch.Generator().manual_seed(21)
    q, k, v = (torch.randn(b, h, s, d, generator=g).to(torch.bfloat16).to(DEV) for _ in range(3))
    q[:, 1] += 3.0  # one slice with a shared query offset: the switch at 1 takes only this one
    k[..., 5] += 4.0
    kvl = torch.tensor([170], dtype=torch.int32, device=DEV)
    recipe = RECIPE.replace(smooth_q=True, smooth_q_min_ratio=min_ratio)
    ops = prepass_int8(q, k, v, d ** -0.5, kvl, smooth_q_ratio2=q_smoothing_ratio2(min_ratio))
    q8, qs, k8, bias, q_sel = ops.q8, ops.qs, ops.k8, ops.bias, ops.q_sel
    valid = valid_prefix(kvl, s, q.device)
    qi, ki, ref_bias, _ = smooth_inputs(q, k, recipe, d ** -0.5, valid, None)
    qo, ko, *_ = numerics_for(recipe).operands(qi, ki, v, d ** -0.5, valid, ref_bias)
    diffs = [int((q8[:, :, :s].float() != qo[..., :-1]).sum()), int((qs[:, :, :s] != qo[..., -1]).sum()),
             int((k8[:, :, :s].float() != ko[..., :-1]).sum())]
    rel = float((bias[:, :, :170] - ref_bias[:, :, :170]).abs().max() / ref_bias.abs().max().clamp_min(1e-30))
    print(f"min_ratio {min_ratio}: differing Q codes, Q scales, K codes {diffs}; key term max rel. diff {rel:.2e}; "
          f"per-slice max |term| {[round(float(x), 3) for x in ref_bias.abs().amax(dim=(0, 2))]}")
    assert diffs == [0, 0, 0]
    assert rel < FP32_ACCUMULATED and bool((bias[:, :, 170:] == 0).all())
    if min_ratio > 0:  # the slices without a shared offset keep Q as it is and no term
        assert bool((bias[:, [0, 2]] == 0).all()) and bool((bias[:, 1, :170] != 0).any())
        assert q_sel.tolist() == [0, 1, 0]  # the kernel's launch per setting reads it
    else:
        assert q_sel is None


def test_fp8_v_is_the_references():
    """FP8 V (the speed tier, ``int8-fp8``): ``V8T^T * vs`` bit for bit the reference's ``E4M3(V / s) s`` (scale
    ``amax / 448`` per channel over the valid keys), keys in the FP8 A-fragment order, padded keys and keys past
    ``kv_lens`` zero."""
    b, h, s, d = 2, 2, 300, 64
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(b, h, s, d, generator=g).mul(2.0).to(torch.bfloat16).to(DEV) for _ in range(3))
    v[..., 7] *= 30.0  # a channel far above the rest: its own scale
    v[1, :, 250:] = float("nan")  # past kv_lens[1]: never read
    kvl = torch.tensor([300, 250], dtype=torch.int32, device=DEV)
    recipe = get_recipe("int8-fp8").replace(numerics="sm90")
    ops = prepass_int8(q, k, v, d ** -0.5, kvl, v_format=recipe.v_format)
    valid = valid_prefix(kvl, s, q.device)
    vo = numerics_for(recipe).operands(q, k, v, d ** -0.5, valid)[2]
    v8 = ops.v[..., a_fragment_position(torch.arange(ops.v.shape[-1], device=DEV))].transpose(2, 3)  # key order
    got = v8.float() * ops.vs[:, :, None, :]
    diffs = int((got[:, :, :s] != vo).sum())
    print(f"{recipe.v_format}: V8T {tuple(ops.v.shape)} {ops.v.dtype}, differing values {diffs} of {vo.numel()}, "
          f"channel scales {ops.vs[0, 0, :8].tolist()}")
    assert ops.v.dtype == torch.float8_e4m3fn and diffs == 0
    assert bool((got[:, :, s:] == 0).all()) and bool((got[1, :, 250:] == 0).all())
    assert ops.vs[0, 0, 7] > 10 * ops.vs[0, 0, 6]  # the outlier channel has its own scale

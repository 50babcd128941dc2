"""The INT8 Q/K kernel (kernels/sm90/fused_attention_gluon_int8.py) on an sm_90 GPU, both tiers (``int8-bf16``, and
``int8-fp8`` with FP8 P and V), against its reference (:class:`fsattn_diffusers.numerics.SM90Int8Numerics`,
``sm90_reference_attention``) and exact attention.

Rule (fsattn_diffusers.testing): the kernel's error against exact attention equals the reference's within
``within_kernel_rule``, the two outputs lie within INT8_KERNEL_REF_MAX (2^-10; FP8 P and V: INT8_FP8_KERNEL_REF_MAX, 2^-8) of
each other, the LSE within
INT8_LSE_MAX (ln(1 + 2^-7) + 1e-3 nats) and the rollback counts are equal. Skipped without an sm_90 CUDA GPU; every test
prints its numbers before asserting.
"""

import pytest
import torch

from kernel_device import CPU_INTERPRET, make, skip_module_without_sm90  # noqa: E402

skip_module_without_sm90()
if CPU_INTERPRET:
    pytest.skip("the Gluon INT8 kernel has no interpreter mode", allow_module_level=True)
pytest.importorskip("triton")

import fsattn_diffusers as fa  # noqa: E402
from fsattn_diffusers.backends import LAST_RAN  # noqa: E402
from kernel_device import sm90_reference_attention  # noqa: E402
from fsattn_diffusers.measure.structured_inputs import FAMILIES  # noqa: E402
from fsattn_diffusers.recipe import INT8_BF16, INT8_FP8, get_recipe  # noqa: E402
from fsattn_diffusers.testing import (INT8_FP8_KERNEL_REF_MAX, INT8_KERNEL_REF_MAX, INT8_LSE_MAX,  # noqa: E402
                                      exact_attention, relative_error, within_kernel_rule)
from tolerances import INT8_OVER_MXFP8_MAX

RECIPE = get_recipe(INT8_BF16)
TIERS = (INT8_BF16, INT8_FP8)


def _same(a, b):
    """Equal values, NaN where NaN."""
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())


def _check(q, k, v, kv_lens=None, label="", recipe=RECIPE, lse_max=INT8_LSE_MAX):
    scale = q.shape[-1] ** -0.5
    before = [t.clone() for t in (q, k, v)]
    out, lse, stats = fa.attention(q, k, v, recipe, layout="bhsd", backend="triton", kv_lens=kv_lens,
                                   return_lse=True, return_stats=True)
    ref, ref_lse, ref_stats = sm90_reference_attention(q, k, v, recipe, scale=scale, kv_lens=kv_lens)
    exact = exact_attention(q, k, v, scale, kv_lens=kv_lens)[0]
    err_k, err_r = relative_error(out, exact), relative_error(ref, exact)
    drift = relative_error(out, ref)
    finite = torch.isfinite(ref_lse)
    lse_diff = float((lse[finite] - ref_lse[finite]).abs().max()) if bool(finite.any()) else 0.0
    print(f"{label} {tuple(q.shape)} {q.dtype}: err kernel {err_k:.5f} ref {err_r:.5f} kernel-vs-ref {drift:.2e} "
          f"lse maxdiff {lse_diff:.2e} stats {stats} ref {ref_stats}")
    assert all(_same(a, b) for a, b in zip(before, (q, k, v))), "inputs modified"
    assert bool(torch.isfinite(out).all())
    assert within_kernel_rule(err_k, err_r)
    assert drift <= (INT8_FP8_KERNEL_REF_MAX if recipe.p_format == "fp8_row" else INT8_KERNEL_REF_MAX)
    assert lse_max is None or lse_diff <= lse_max
    assert stats["rollbacks"] == ref_stats["rollbacks"] and stats["tiles"] == ref_stats["tiles"]
    assert LAST_RAN[recipe.name] == "triton"
    return out, lse_diff


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("family", ["gaussian", "sharp", "k_channel_outliers", "offset_uniform_k", "locality",
                                    "attention_sink", "clustered", "v_channel_outliers"])
@pytest.mark.parametrize("d,dtype", [(128, torch.bfloat16), (64, torch.float16)])
def test_structured_families_match_the_reference(family, d, dtype, tier):
    q, k, v = FAMILIES[family](1, 3, 1000, d, dtype, "cuda", 0)
    _check(q, k, v, label=f"{tier} {family}", recipe=get_recipe(tier))


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("shape,layout", [((2, 3, 300, 200, 64), "bshd"), ((1, 2, 257, 1000, 128), "bhsd"),
                                          ((2, 14, 9, 1, 128), "bshd"), ((1, 1, 128, 128, 128), "bhsd")])
def test_awkward_shapes_and_layouts(shape, layout, tier):
    q, k, v = make(*shape, layout)
    _check(q, k, v, label=f"{tier} {layout}", recipe=get_recipe(tier))


@pytest.mark.parametrize("tier", TIERS)
def test_kv_lens_with_garbage_past_the_valid_keys_and_an_empty_entry(tier):
    q, k, v = make(3, 2, 130, 300, 128, "bhsd", seed=3)
    kv_lens = torch.tensor([129, 0, 300], device="cuda")
    k[0, :, 129:] = float("nan")
    v[0, :, 129:] = float("inf")
    out, _ = _check(q, k, v, kv_lens=kv_lens, label=f"{tier} kv_lens", recipe=get_recipe(tier))
    assert bool((out[1] == 0).all())


def _spiky():
    q, k, v = make(1, 2, 256, 1024, 128, "bhsd", seed=5, spiky=True)
    k[:, :, 700] *= 40.0  # a key far above the first tile's peak: more than 32 doublings for some rows
    return q, k, v


@pytest.mark.parametrize("tier", TIERS)
def test_the_gate_rolls_back_as_the_reference_does(tier):
    _check(*_spiky(), label=f"{tier} spiky", recipe=get_recipe(tier))


@pytest.mark.parametrize("tier", TIERS)
def test_the_output_buffer_is_fully_written(tier):
    q, k, v = make(1, 2, 200, 333, 128, "bhsd", seed=7)
    from fsattn_diffusers.kernels.sm90.ops_int8 import attention_int8_from_operands, prepass_for, settings_key

    recipe = get_recipe(tier).replace(smooth_q=False)
    ops, launch = prepass_for(q, k, v, 128 ** -0.5, settings_key(recipe))
    out = torch.full_like(q, float("nan"))
    attention_int8_from_operands(ops, out, 200, 333, **launch)
    ref = sm90_reference_attention(q, k, v, recipe, scale=128 ** -0.5)[0]
    drift = relative_error(out, ref)
    print(f"{tier} poisoned buffer: kernel-vs-ref {drift:.2e}")
    assert bool(torch.isfinite(out).all())
    assert drift <= (INT8_FP8_KERNEL_REF_MAX if recipe.p_format == "fp8_row" else INT8_KERNEL_REF_MAX)


@pytest.mark.parametrize("s_k", [32768, 75600])
@pytest.mark.parametrize("family", ["clustered", "sharp"])
def test_fp8_pv_sums_o_in_fp32_over_long_key_ranges(family, s_k):
    """The speed tier adds each key tile's FP8 PV product to O in fp32: at 256 and 591 key tiles the kernel stays its
    reference's (chained in the FP8 wgmma accumulator, later tiles' products were cut at O's magnitude: 10.5% off on
    sharp rows at S = 32768 with mxfp8)."""
    q, k, v = FAMILIES[family](1, 2, s_k, 128, torch.bfloat16, "cuda", 0)
    _check(q[:, :, :256].contiguous(), k, v, label=f"int8-fp8 {family} S_k={s_k}", recipe=get_recipe(INT8_FP8))


def test_the_int8_tier_is_more_accurate_than_mxfp8_on_structured_inputs():
    for family in ("gaussian", "sharp", "k_channel_outliers"):
        q, k, v = FAMILIES[family](1, 4, 2048, 128, torch.bfloat16, "cuda", 1)
        exact = exact_attention(q, k, v, 128 ** -0.5)[0]
        e8 = relative_error(fa.attention(q, k, v, "mxfp8", layout="bhsd"), exact)
        ei = relative_error(fa.attention(q, k, v, INT8_BF16, layout="bhsd"), exact)
        print(f"{family}: int8-bf16 {ei:.4f}, mxfp8 {e8:.4f}")
        assert ei < INT8_OVER_MXFP8_MAX * e8


@pytest.mark.parametrize("exponential", ["schraudolph", "exact"])
@pytest.mark.parametrize("case", ["gaussian", "sharp", "clustered", "attention_sink", "spiky", "kv_lens"])
def test_each_stage_a_exponential_matches_its_reference(exponential, case):
    recipe = RECIPE.replace(exponential=exponential)
    kv_lens = None
    if case == "spiky":
        q, k, v = _spiky()
    elif case == "kv_lens":
        q, k, v = make(2, 2, 130, 300, 128, "bhsd", seed=3)
        kv_lens = torch.tensor([129, 300], device="cuda")
        k[0, :, 129:] = float("nan")
    else:
        q, k, v = FAMILIES[case](1, 3, 1000, 128, torch.bfloat16, "cuda", 0)
    _check(q, k, v, kv_lens=kv_lens, label=f"{exponential} {case}", recipe=recipe)


@pytest.mark.parametrize("exponential", ["schraudolph", "exact"])
def test_the_switch_gives_each_head_the_kernel_output_of_its_setting(exponential):
    """Q smoothing's per-slice switch: the kernel runs once per setting, so the heads the switch leaves out get the
    bits of the recipe without Q smoothing and the heads it takes those of Q smoothing on every slice."""
    from fsattn_diffusers.kernels.sm90.ops_int8 import fused_attention_int8

    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(1, 4, s, 128, generator=g) for s in (640, 520, 520))
    q[:, 1::2] += 3.0  # odd heads share a query offset, even heads none
    q, k, v = (t.bfloat16().cuda() for t in (q, k, v))
    kv = torch.tensor([400], dtype=torch.int32, device="cuda")
    base = RECIPE.replace(exponential=exponential)
    outs = {name: fused_attention_int8(q, k, v, r, scale=128 ** -0.5, kv_lens=kv, return_lse=True)[:2]
            for name, r in (("auto", base.replace(smooth_q=True)), ("off", base),
                            ("every slice", base.replace(smooth_q=True, smooth_q_min_ratio=0.0)))}
    for heads, other in ((slice(0, None, 2), "off"), (slice(1, None, 2), "every slice")):
        (o1, l1), (o2, l2) = outs["auto"], outs[other]
        d_out = float((o1[:, heads].float() - o2[:, heads].float()).abs().max())
        print(f"{exponential}: heads {heads} against smooth_q {other}: max |out diff| {d_out:.3e}, "
              f"|lse diff| {float((l1[:, heads] - l2[:, heads]).abs().max()):.3e}")
        assert torch.equal(o1[:, heads], o2[:, heads]) and torch.equal(l1[:, heads], l2[:, heads])
    _check(q, k, v, kv_lens=kv, label=f"switch {exponential}", recipe=base.replace(smooth_q=True))


@pytest.mark.parametrize("exponential", ["schraudolph", "exact"])
@pytest.mark.parametrize("case", ["offset_direction_qk", "offset_uniform_q", "gaussian", "kv_lens"])
def test_q_smoothing_matches_its_reference(exponential, case):
    """``smooth_q`` (sm90_numerics difference 12): the key term in the kernel's scores, the switch's slices."""
    recipe = RECIPE.replace(exponential=exponential, smooth_q=True)
    kv_lens = None
    if case == "kv_lens":
        q, k, v = make(2, 2, 130, 300, 128, "bhsd", seed=3)
        q[:, 1] += 3.0
        kv_lens = torch.tensor([129, 300], device="cuda")
        k[0, :, 129:] = float("nan")
    else:
        q, k, v = FAMILIES[case](1, 3, 1000, 128, torch.bfloat16, "cuda", 0)
    _check(q, k, v, kv_lens=kv_lens, label=f"smooth_q {exponential} {case}", recipe=recipe)

"""The accurate tier's numerics (``int8-bf16``): INT8 Q/K with one scale per query and per key tile, Stage-A's BF16
proxy as P, BF16 V; the emulator is its reference (no Hopper kernel runs it yet)."""

import pytest
import torch

import fsattn_diffusers as fa
from fsattn_diffusers.emulator import emulate_attention
from fsattn_diffusers.formats import INT8_MAX, fake_quantize_int8_rows
from fsattn_diffusers.kernels.sm90.plan import unsupported_reason
from fsattn_diffusers.measure.structured_inputs import FAMILIES
from fsattn_diffusers.recipe import PRESETS, get_recipe
from fsattn_diffusers.testing import exact_attention, relative_error
from tolerances import (INT8_BACKEND_ERR_AGREE, INT8_BACKEND_VS_EMULATOR, INT8_CODE_SLACK,
                        INT8_EXACT_EXP_OVER_RAMP_MAX, INT8_OVER_MXFP8_MAX, INT8_TIER_ERR_MAX, SMOOTHING_GAIN_MAX)

TIER = "int8-bf16"


def test_int8_rows_table():
    # group 0: amax 127, scale 1 (nearest-even ties); group 1: amax 254, scale 2; group 2 zeros; group 3 a NaN
    x = torch.tensor([[127.0, -63.5, 0.5, 1.5, 2.5, -127.0],
                      [254.0, 3.0, 5.0, 1.0, -1.0, 0.0],
                      [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
                      [1.0, float("nan"), 0.0, 0.0, 0.0, 0.0]])
    got = fake_quantize_int8_rows(x, rows_per_scale=1)
    want = torch.tensor([[127.0, -64.0, 0.0, 2.0, 2.0, -127.0],
                         [254.0, 4.0, 4.0, 0.0, -0.0, 0.0],
                         [0.0] * 6])
    print(got)
    assert torch.equal(got[:3], want) and torch.isnan(got[3]).all()
    assert INT8_MAX == 127


def test_int8_groups_of_rows_share_a_scale_and_only_their_own():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 1, 300, 64, generator=g)
    x[0, 0, 5] *= 100.0  # an outlier key in the first group of 128
    got = fake_quantize_int8_rows(x, rows_per_scale=128)
    for r0 in (0, 128, 256):  # each group: its own amax / 127, codes on that grid
        grp, q = x[0, 0, r0:r0 + 128], got[0, 0, r0:r0 + 128]
        scale = grp.abs().amax() / INT8_MAX
        codes = q / scale
        print(r0, float(scale), float((codes - codes.round()).abs().max()))
        assert torch.allclose(codes, codes.round(), atol=INT8_CODE_SLACK)
        assert float(codes.abs().max()) <= INT8_MAX + INT8_CODE_SLACK
    assert torch.equal(got[:, :, 128:], fake_quantize_int8_rows(x[:, :, 128:], rows_per_scale=128))
    with pytest.raises(ValueError, match="rows_per_scale"):
        fake_quantize_int8_rows(x, rows_per_scale=0)


@pytest.mark.parametrize("family", ["gaussian", "sharp", "locality"])
def test_the_tier_is_more_accurate_than_mxfp8(family):
    q, k, v = FAMILIES[family](1, 2, 1024, 128, torch.bfloat16, "cpu", 0)
    scale = 128 ** -0.5
    ex = exact_attention(q, k, v, scale)[0]
    e_tier = relative_error(emulate_attention(q, k, v, get_recipe(TIER), scale=scale)[0], ex)
    e_mxfp8 = relative_error(emulate_attention(q, k, v, get_recipe("mxfp8"), scale=scale)[0], ex)
    print(f"{family}: {TIER} {e_tier:.4f} mxfp8 {e_mxfp8:.4f}")
    assert e_tier < INT8_OVER_MXFP8_MAX * e_mxfp8 and e_tier < INT8_TIER_ERR_MAX


def test_padded_keys_do_not_move_a_key_tiles_scale():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 256, 64, generator=g).to(torch.bfloat16) for _ in range(3))
    k_bad, v_bad = k.clone(), v.clone()
    k_bad[:, :, 200:] = 3e4  # garbage past kv_lens, in the second key tile
    v_bad[:, :, 200:] = 3e4
    scale = 64 ** -0.5
    lens = torch.tensor([200])
    a = emulate_attention(q, k_bad, v_bad, get_recipe(TIER), scale=scale, kv_lens=lens)[0]
    b = emulate_attention(q, k[:, :, :200], v[:, :, :200], get_recipe(TIER), scale=scale)[0]
    print(float((a.float() - b.float()).abs().max()))
    assert torch.equal(a, b)


def test_the_hopper_kernel_takes_the_tier_and_says_why_not_for_what_it_lacks():
    assert "int8" in TIER and PRESETS[TIER].qk_format == "int8" and PRESETS[TIER].p_format == "bf16"
    assert unsupported_reason(PRESETS[TIER], 128) is None and unsupported_reason(PRESETS[TIER], 64) is None
    assert unsupported_reason(PRESETS[TIER].replace(smooth_q=True), 128) is None
    for changed, words in ((PRESETS[TIER].replace(p_format="fp8_row"), "p_format 'fp8_row'"),
                           (PRESETS[TIER].replace(frozen_max=False), "frozen maximum"),
                           # its DIAGONAL build fails Triton 3.6's lowering to LLVM (an assertion; offline sm_90a)
                           (PRESETS[TIER].replace(key_order="diagonal"), "key_order 'diagonal'")):
        reason = unsupported_reason(changed, 128)
        print(reason)
        assert reason is not None and words in reason
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 130, 64, generator=g) for _ in range(3))
    input_copy = q.clone()
    out = fa.attention(q, k, v, TIER, layout="bhsd")  # on the CPU the emulator runs it
    ex = exact_attention(q, k, v)[0]
    print(relative_error(out, ex))
    assert torch.equal(q, input_copy) and relative_error(out, ex) < INT8_TIER_ERR_MAX


def test_the_hopper_reference_of_the_tier():
    """``numerics="sm90"`` for INT8 Q/K (SM90Int8Numerics): integer scores exact, times float32(s_q s_k) once; the
    same error against exact attention as the paper's numerics; Q smoothing refused in one line."""
    from kernel_device import sm90_reference_attention
    from fsattn_diffusers.numerics import SM90Int8Numerics

    recipe = PRESETS[TIER]
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 300, 64, generator=g) for _ in range(3))
    num = SM90Int8Numerics(recipe.replace(numerics="sm90"))
    qo, ko, *_ = num.operands(q, k, v, 0.125, None)
    qo, ko = qo.reshape(2, 300, 65), ko.reshape(2, 300, 65)
    x = num.scores(qo, ko[:, :128])
    exact_int = torch.matmul(qo[..., :-1].double(), ko[:, :128, :-1].double().transpose(1, 2))
    want = (exact_int * (qo[..., -1:] * ko[:, :128, -1][:, None, :]).double()).float()
    assert bool((qo[..., :-1] == qo[..., :-1].round()).all()) and float(qo[..., :-1].abs().max()) <= 127
    assert torch.equal(x, want)
    out, lse, stats = sm90_reference_attention(q, k, v, recipe, scale=0.125)
    ex = exact_attention(q, k, v, 0.125)[0]
    emu = fa.attention(q, k, v, recipe, layout="bhsd", scale=0.125)
    print(relative_error(out, ex), relative_error(emu, ex), relative_error(out, emu), stats)
    assert abs(relative_error(out, ex) - relative_error(emu, ex)) < INT8_BACKEND_ERR_AGREE
    assert relative_error(out, emu) < INT8_BACKEND_VS_EMULATOR
    # Q smoothing (difference 12): the key term joins the scores; a shared Q offset no longer costs accuracy
    qo_ = q + 3.0
    ex = exact_attention(qo_, k, v, 0.125)[0]
    plain = relative_error(sm90_reference_attention(qo_, k, v, recipe, scale=0.125)[0], ex)
    smoothed = relative_error(sm90_reference_attention(qo_, k, v, recipe.replace(smooth_q=True), scale=0.125)[0], ex)
    print(f"Q offset +3: without Q smoothing {plain:.4f}, with {smoothed:.4f}")
    assert smoothed < SMOOTHING_GAIN_MAX * plain


def test_the_exact_exponential_of_the_hopper_reference():
    """``exponential="exact"`` on the INT8 tier (sm90_numerics difference 11): P is BF16(2^(x - m)) with ``x - m``
    rounded once to fp32; it removes Schraudolph's ramp (about half of the tier's error on normal inputs); the INT8
    kernel takes it, and refuses Rowmax-H15 in one line."""
    from kernel_device import sm90_reference_attention
    from fsattn_diffusers.numerics import SM90Int8Numerics

    exact_recipe = PRESETS[TIER].replace(exponential="exact")
    num = SM90Int8Numerics(exact_recipe.replace(numerics="sm90"))
    x = torch.tensor([[[0.0, -1.0, -0.5, -20.25, float("-inf"), 3.0]]])
    m = torch.tensor([[0.0]])
    p = num.stage_a(x, m)
    want = torch.tensor([[[1.0, 0.5, 2 ** -0.5, 2 ** -20.25, 0.0, 8.0]]]).to(torch.bfloat16).float()
    print(p, want)
    assert torch.equal(p, want)
    q, k, v = FAMILIES["gaussian"](1, 2, 512, 64, torch.bfloat16, "cpu", 0)
    ex = exact_attention(q, k, v, 0.125)[0]
    err_exact = relative_error(sm90_reference_attention(q, k, v, exact_recipe, scale=0.125)[0], ex)
    err_ramp = relative_error(sm90_reference_attention(q, k, v, PRESETS[TIER], scale=0.125)[0], ex)
    print(f"gaussian: exact exponential {err_exact:.4f}, Schraudolph {err_ramp:.4f}")
    assert err_exact < INT8_EXACT_EXP_OVER_RAMP_MAX * err_ramp
    assert unsupported_reason(exact_recipe, 64) is None
    reason = unsupported_reason(PRESETS[TIER].replace(exponential="rowmax_h15"), 128)
    print(reason)
    assert reason is not None and "rowmax_h15" in reason and "exact" in reason and "\n" not in reason

"""The Hopper speed tier (``int8-fp8``): the accurate tier's INT8 pre-pass, Stage-A's proxy as E4M3 P under the fixed
per-row 2^4, E4M3 V with one scale per channel (sm90_numerics difference 13); and the FP8 wgmma's accumulation with
O's fp32 promotion interval (``Recipe.o_promotion_tiles``, ``numerics_accumulation``)."""

import math

import pytest
import torch

from fsattn_diffusers.emulator import emulate_attention
from fsattn_diffusers.formats import E4M3, VFormat, fake_quantize_fp8_channel
from fsattn_diffusers.measure.sage2_model import _k_groups, _q_groups, sage2_hopper_attention
from fsattn_diffusers.measure.structured_inputs import FAMILIES
from fsattn_diffusers.numerics import SM90Int8Numerics, numerics_for
from fsattn_diffusers.numerics_accumulation import FP8_MMA_ACC_MANT_BITS, fp8_chained_mma, promotes_after
from fsattn_diffusers.recipe import INT8_FP8, PRESETS, get_recipe
from fsattn_diffusers.sm90_numerics import D_BITS_F16, P_SIGMA
from fsattn_diffusers.testing import exact_attention, relative_error
from kernel_device import sm90_reference_attention
from tolerances import (FP8_CHANNEL_SCALED_ATOL, INT8_FP8_AWKWARD_ERR_MAX, INT8_FP8_ERR_MAX, INT8_FP8_LSE_NATS,
                        INT8_FP8_OVER_SAGE2_MODEL_MAX, PROMOTION_MOVE_MAX)

SM90 = PRESETS[INT8_FP8].replace(numerics="sm90")


def test_the_preset_resolves_and_names_its_numerics():
    r = get_recipe(INT8_FP8)
    assert (r.qk_format, r.p_format, r.v_format) == ("int8", "fp8_row", "fp8_channel")
    assert r.frozen_max and r.rollback and r.rowsum_gemm and r.hadamard and r.smooth_k and r.smooth_q
    assert r.exponential == "exact" and r.key_order == "natural" and r.rollback_floor_log2 == 10
    assert r.o_promotion_tiles == 1 and VFormat("fp8_channel") is VFormat.FP8_CHANNEL
    assert get_recipe("int8-fp8+o_promotion_tiles=none").o_promotion_tiles is None
    assert r.replace(o_promotion_tiles=0).o_promotion_tiles is None  # 0: never, stored as None
    assert get_recipe("int8-fp8+o_promotion_tiles=4").o_promotion_tiles == 4
    for bad in (-1, 1.5, "2"):
        with pytest.raises(ValueError, match="o_promotion_tiles"):
            r.replace(o_promotion_tiles=bad)
    assert isinstance(numerics_for(SM90), SM90Int8Numerics)
    with pytest.raises(ValueError, match="int8-fp8"):
        numerics_for(SM90.replace(v_format="mxfp8"))


def test_the_int8_kernel_takes_the_preset_and_refuses_what_it_does_not_compute():
    from fsattn_diffusers.kernels.sm90.plan import unsupported_reason

    assert unsupported_reason(get_recipe(INT8_FP8), 128) is None
    assert unsupported_reason(get_recipe("int8-fp8+smooth_q=false"), 64) is None
    for name, words in (("int8-fp8+exponential=schraudolph", "exact exponential"),
                        ("int8-fp8+o_promotion_tiles=2", "every key tile"),
                        ("int8-fp8+key_order=diagonal", "natural order"),
                        ("int8-fp8+v_format=bf16", "P/V"), ("int8-fp8+v_format=fp8_tensor", "P/V")):
        reason = unsupported_reason(get_recipe(name), 128)
        print(f"{name}: {reason}")
        assert reason and words in reason and "\n" not in reason


def test_fp8_channel_v_table():
    x = torch.tensor([[448.0, 1.0, 0.0], [-224.0, 3.0, 0.0], [17.0, -0.1, 0.0]])  # amax 448, 3, 0 per channel
    got = fake_quantize_fp8_channel(x)
    # channel 0: scale 1, E4M3 values; 17 lies between 16 and 18 (step 2): a tie, even mantissa 16
    want0 = torch.tensor([448.0, -224.0, 16.0])
    s1 = 3.0 / 448.0
    want1 = torch.tensor([1.0 / s1, 3.0 / s1, -0.1 / s1]).to(torch.float8_e4m3fn).to(torch.float32) * s1
    assert torch.equal(got[:, 0], want0) and torch.allclose(got[:, 1], want1, rtol=0, atol=FP8_CHANNEL_SCALED_ATOL)
    assert torch.equal(got[:, 2], torch.zeros(3))


def _y_grid():
    """``x - m`` on the FP16 proxy's 1/1024 grid over the range the gate leaves (-20 .. 4 doublings), plus -inf."""
    y = torch.arange(-20 * 1024, 4 * 1024 + 1, dtype=torch.float64) / 1024.0
    return torch.cat([y, torch.tensor([float("-inf")], dtype=torch.float64)]).float()


def test_p_is_the_fp16_proxys_e4m3_cast_bit_for_bit():
    num = numerics_for(SM90.replace(exponential="schraudolph"))
    y = _y_grid()
    m = torch.zeros(1)
    p8, row = num.stage_b(num.stage_a(y[None, :], m))
    sigma = P_SIGMA["fp8_row"]
    # independent: the FP16 pattern rne(1024 y + D16 + 1024 sigma), clamped at 0, cast by torch to E4M3
    t = torch.round(y.double() * 1024 + D_BITS_F16 + 1024 * sigma).nan_to_num(neginf=0.0).clamp(min=0)
    f16 = t.to(torch.int64).to(torch.int16).view(torch.float16)
    want = f16.to(torch.float8_e4m3fn).to(torch.float32)
    assert torch.equal(p8[0], want) and float(p8.max()) <= 2 ** (4 + sigma) and p8[0, -1] == 0
    assert torch.equal(row, want.sum()[None]) and num.p_scale_log2 == sigma and num.cap_log2 == 4


def test_exact_exponential_p_is_e4m3_of_the_fp32_power():
    num = numerics_for(SM90)  # the preset's exponential
    y = _y_grid()
    p8, row = num.stage_b(num.stage_a(y[None, :], torch.zeros(1)))
    want = (torch.exp2(y) * 16).to(torch.float8_e4m3fn).to(torch.float32)
    assert torch.equal(p8[0], want) and torch.equal(row, want.sum()[None]) and num.cap_log2 == 4


@pytest.mark.parametrize("shape", [(1, 3, 37, 200, 64), (2, 1, 130, 300, 128)])
def test_awkward_shapes_padded_keys_no_nan_inputs_unchanged(shape):
    b, h, s_q, s_k, d = shape
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(b, h, s, d, generator=g).to(torch.bfloat16) for s in (s_q, s_k, s_k))
    kv = torch.tensor([s_k - 77] + [s_k] * (b - 1))
    copies = [t.clone() for t in (q, k, v)]
    out, lse, _ = sm90_reference_attention(q, k, v, PRESETS[INT8_FP8], scale=d ** -0.5, kv_lens=kv)
    assert all(torch.equal(a, c) for a, c in zip((q, k, v), copies))
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    ex, ex_lse = exact_attention(q, k, v, d ** -0.5, kv_lens=kv)
    assert relative_error(out, ex) < INT8_FP8_AWKWARD_ERR_MAX
    assert float((lse - ex_lse).abs().max()) < INT8_FP8_LSE_NATS  # the LSE of the scores, P's 2^4 taken out
    # padded keys: garbage there changes nothing
    k2, v2 = k.clone(), v.clone()
    k2[0, :, s_k - 77:] = 1e4
    v2[0, :, s_k - 77:] = float("nan")
    out2 = sm90_reference_attention(q, k2, v2, PRESETS[INT8_FP8], scale=d ** -0.5, kv_lens=kv)[0]
    assert torch.equal(out, out2)


@pytest.mark.parametrize("family", ["gaussian", "clustered", "offset_uniform_qk"])
def test_error_against_exact_and_against_the_sage2_model(family):
    q, k, v = FAMILIES[family](1, 2, 1024, 64, torch.bfloat16, "cpu", 0)
    sc = 64 ** -0.5
    ex = exact_attention(q, k, v, sc)[0]
    err = relative_error(sm90_reference_attention(q, k, v, PRESETS[INT8_FP8], scale=sc)[0], ex)
    err_sage = relative_error(sage2_hopper_attention(q, k, v, scale=sc), ex)
    print(f"{family}: int8-fp8 {err:.4f} sage2 model {err_sage:.4f}")
    assert err < INT8_FP8_ERR_MAX and err <= INT8_FP8_OVER_SAGE2_MODEL_MAX * err_sage


def test_sage2_model_groups():
    # Q: pairs {16 b + t, 16 b + t + 8}; K: four groups of 32 keys per 128-key tile, interleaved by pairs of keys
    qg = _q_groups(32)
    assert qg[0] == qg[8] and qg[7] == qg[15] and qg[0] != qg[1] and qg[16] == qg[24] and len(set(qg.tolist())) == 16
    kg = _k_groups(256)
    assert kg[0] == kg[1] == kg[8] and kg[2] == kg[3] != kg[0] and (kg[:128] < 4).all() and (kg[128:] >= 4).all()
    assert all(int((kg == i).sum()) == 32 for i in range(8))


# ---------------------------------------------------------------------------------------------------- accumulation

def test_chained_mma_truncates_below_the_largest_exponent():
    # acc 2^14: the grid is 2^(14 - 13) = 2, so the product 1.5 is cut to 0 and 1.5 * -3 = -4.5 to -4 (toward zero)
    acc = torch.tensor([[[16384.0, 16384.0]]])
    p = torch.tensor([[[1.5, 1.0]]])
    v = torch.tensor([[[1.0, -3.0], [0.0, 0.0]]])
    got = fp8_chained_mma(acc, p, v)
    assert torch.equal(got, torch.tensor([[[16384.0, 16380.0]]]))
    # from zero, exact products of one instruction sum exactly when they lie within 2^13 of the largest
    p = torch.full((1, 1, 32), 2.0)
    v = torch.ones(1, 32, 1)
    assert torch.equal(fp8_chained_mma(None, p, v), torch.tensor([[[64.0]]])) and FP8_MMA_ACC_MANT_BITS == 13


def test_chained_mma_loses_small_products_against_a_large_sum_and_promotion_keeps_them():
    # one large product (2^16) then 127 small ones (1/2): chained, each 1/2 is below the grid 2^(16-13) = 8
    p = torch.cat([torch.tensor([256.0]), torch.full((127,), 0.5)])[None, None, :]
    v = torch.cat([torch.tensor([256.0]), torch.ones(127)])[None, :, None]
    chained = fp8_chained_mma(None, p, v)
    exact = float(p[0, 0] @ v[0, :, 0])
    assert float(chained) == 65536.0  # every 1/2 is cut: the first 31 beside 2^16, the rest against the sum
    assert exact == 65536.0 + 63.5 and float(chained) < exact
    # promoting after every 32 keys: each later zeroed accumulator keeps its sum of halves exactly
    parts = [fp8_chained_mma(None, p[:, :, i:i + 32], v[:, i:i + 32]) for i in range(0, 128, 32)]
    assert float(sum(parts)) == 65536.0 + 48.0  # the first chunk's 31 halves are still cut, the others kept
    assert [promotes_after(j, 2) for j in range(4)] == [False, True, False, True]
    assert not any(promotes_after(j, None) for j in range(4)) and all(promotes_after(j, 1) for j in range(4))


def test_promotion_interval_in_the_reference():
    q, k, v = FAMILIES["sharp"](1, 1, 2048, 64, torch.bfloat16, "cpu", 0)
    q = q[:, :, :32]
    sc = 64 ** -0.5
    outs = {n: emulate_attention(q, k, v, SM90.replace(o_promotion_tiles=n), scale=sc)[0] for n in (1, 2, None)}
    base = emulate_attention(q, k, v, SM90, scale=sc)[0]
    assert torch.equal(outs[1], base)  # 1: O summed in fp32 per tile, as without the field
    d2, dn = (relative_error(outs[n], outs[1]) for n in (2, None))
    print(f"vs every tile: interval 2 {d2:.2e}, never {dn:.2e}")
    assert 0 < d2 < dn < PROMOTION_MOVE_MAX
    again = emulate_attention(q, k, v, SM90.replace(o_promotion_tiles=None), scale=sc)[0]
    assert torch.equal(again, outs[None]) and math.isfinite(dn)
    assert E4M3.max_value == 448.0

"""MX casts at the ends of the fp32 range, bit for bit (NUMERICS.md section 9).

The references below are the integer arithmetic of AITER's mha_v4 quantizers (gfx950), written out:
MXFP8 ``e = ((bits(amax) + 2^21) & 0x7F800000) >> 23``, scale byte ``254 if e == 255 else max(e - 8, 0)``;
MXFP4 scale byte ``((bits(amax / 6) + 0x7FFFFF) & 0x7F800000) >> 23``.
"""

import struct

import pytest
import torch

from fsattn_diffusers.formats import (E2M1, E2M3, E4M3, dequantize_mx, fake_quantize_mx, quantize_mx,
                                      shared_exponent)


def bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def aiter_mxfp8_byte(amax: float) -> int:
    e = ((bits(amax) + 0x00200000) & 0x7F800000) >> 23
    return 254 if e == 255 else max(e - 8, 0)


def aiter_mxfp4_byte(amax: float) -> int:
    return ((bits(f32(amax / 6.0)) + 0x007FFFFF) & 0x7F800000) >> 23


def sweep():
    """Magnitudes over the whole fp32 range, with both ends and the rounding boundaries."""
    g = torch.Generator().manual_seed(0)
    vals = (torch.rand(4000, generator=g) * 2 + 1) * torch.exp2(torch.randint(-149, 128, (4000,), generator=g).float())
    edges = [1.75 * 2.0 ** 127, f32((1.75 - 2 ** -23) * 2.0 ** 127), 3.4028234663852886e38, 2.0 ** 127,
             1.75 * 2.0 ** 120, 2.0 ** -149, 6 * 2.0 ** -130, 6 * 2.0 ** -127, 6 * 2.0 ** -126, 2.0 ** -126, 1.75, 448.0]
    return torch.cat([vals[torch.isfinite(vals) & (vals > 0)], torch.tensor(edges)])


def assert_rule_equals_aiter(rule, fmt, aiter_byte, label):
    """The shared exponent of ``rule`` equals AITER's (its E8M0 byte minus the bias 127) on every magnitude of
    :func:`sweep`."""
    amax = sweep()
    ours = shared_exponent(amax, fmt, rule)
    ref = torch.tensor([aiter_byte(float(a)) - 127 for a in amax], dtype=torch.int32)
    print(f"{rule} vs {label}: {int((ours != ref).sum())} of {len(amax)} differ")
    assert torch.equal(ours, ref)


def test_round_up_175_equals_aiter_mxfp8_over_the_whole_range():
    assert_rule_equals_aiter("round_up_175", E4M3, aiter_mxfp8_byte, "AITER MXFP8")


def test_round_up_175_saturates_the_scale_at_2_127_above_1_75_times_2_127():
    at = torch.tensor([1.75 * 2.0 ** 127, 3.4028234663852886e38, float("inf")])
    below = torch.tensor([f32((1.75 - 2 ** -23) * 2.0 ** 127)])
    print("s at/above 1.75*2^127:", shared_exponent(at, E4M3, "round_up_175").tolist(),
          "just below:", shared_exponent(below, E4M3, "round_up_175").tolist())
    assert shared_exponent(at, E4M3, "round_up_175").tolist() == [127, 127, 127]  # the "minus 8" rule: 120
    assert shared_exponent(below, E4M3, "round_up_175").tolist() == [119]
    # what the saturated scale does to a block: the maximum is exact, small elements lose 7 binades
    x = torch.zeros(32)
    x[0], x[1], x[2] = 1.75 * 2.0 ** 127, 1.5 * 2.0 ** 118, 2.0 ** 116
    y = fake_quantize_mx(x, E4M3, rule="round_up_175")
    print("block at the top of the range ->", y[:3].tolist())
    assert y[0] == 1.75 * 2.0 ** 127 and y[1] == 2.0 ** 119 and y[2] == 0.0  # E4M3 subnormals of 2^127


def test_ceil_equals_aiter_mxfp4_and_differs_from_exact_ceil_below_2_minus_127():
    assert_rule_equals_aiter("ceil", E2M1, aiter_mxfp4_byte, "AITER MXFP4")
    tiny = torch.tensor([6 * 2.0 ** -130, 6 * 2.0 ** -127, 2.0 ** -140])  # amax / 6 <= 2^-127 (fp32 subnormal)
    print("ceil at amax/6 <= 2^-127:", shared_exponent(tiny, E2M1, "ceil").tolist(), "(exact ceil, torchao: -127)")
    assert shared_exponent(tiny, E2M1, "ceil").tolist() == [-126, -126, -126]
    assert shared_exponent(torch.tensor([6 * 2.0 ** -126, 0.0]), E2M1, "ceil").tolist() == [-126, -127]


def test_ceil_below_2_minus_127_differs_from_torchao_rceil():
    mx = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
    from torchao.prototype.mx_formats.config import ScaleCalculationMode

    x = torch.zeros(1, 32)
    x[0, 0] = 6 * 2.0 ** -130
    scale, _ = mx.to_mx(x, torch.float4_e2m1fn_x2, 32, ScaleCalculationMode.RCEIL)
    ours = quantize_mx(x, E2M1, rule="ceil").scales
    print("torchao RCEIL byte", int(scale.view(torch.uint8)), "ours", int(ours))
    assert int(scale.view(torch.uint8)) == 0 and int(ours) == 1


@pytest.mark.parametrize("fmt,rule,s_inf", [(E4M3, "round_up_175", 127), (E2M3, "floor", 126), (E2M1, "ceil", 127),
                                            (E4M3, "floor", 120), (E4M3, "ceil", 127)])
def test_an_inf_element_dequantizes_to_inf_and_flushes_its_block(fmt, rule, s_inf):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 32, generator=g) * 1e30  # every finite element below 2^117
    x[0, 3] = float("inf")
    x[0, 9] = float("-inf")
    q = quantize_mx(x, fmt, rule=rule)
    y = dequantize_mx(q)
    print(f"{fmt.name}/{rule}: scale {int(q.scales[0, 0, 0]) - 127}, block zeros {int((y[0] == 0).sum())}")
    assert int(q.scales[0, 0, 0]) - 127 == s_inf
    assert y[0, 3] == float("inf") and y[0, 9] == float("-inf")
    assert int((y[0] == 0).sum()) == 30
    assert torch.equal(y, fake_quantize_mx(x, fmt, rule=rule))
    assert torch.equal(y[1], fake_quantize_mx(x[1:], fmt, rule=rule)[0]), "the other block is untouched"


def test_a_nan_element_makes_its_block_nan():
    x = torch.randn(2, 32, generator=torch.Generator().manual_seed(2))
    x[1, 0] = float("nan")
    for fmt, rule in ((E4M3, "round_up_175"), (E2M3, "floor"), (E2M1, "ceil")):
        q = quantize_mx(x, fmt, rule=rule)
        y = dequantize_mx(q)
        assert int(q.scales[1, 0, 0]) == 255 and torch.isnan(y[1]).all() and torch.isfinite(y[0]).all()

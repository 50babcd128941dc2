"""MX casts: bit-exact against torchao and against hand tables."""

import pytest
import torch

from fsattn_diffusers.formats import (E2M1, E2M3, E4M3, decode_elem, dequantize_mx, encode_elem, fake_quantize_fp8_tensor,
                                      fake_quantize_mx, pack_fp4, quantize_mx, round_to_elem, shared_exponent,
                                      unpack_fp4)

torchao_mx = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
from torchao.prototype.mx_formats.config import ScaleCalculationMode  # noqa: E402
from tolerances import E4M3_ROUNDTRIP  # noqa: E402

TORCHAO_DTYPE = {"e4m3": torch.float8_e4m3fn, "e2m3": "fp6_e2m3", "e2m1": torch.float4_e2m1fn_x2}


def _random_blocks(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(96, 256, generator=g) * torch.exp2(torch.randint(-20, 20, (96, 1), generator=g).float())
    x[0, :32] = 0.0  # an all-zero block
    x[1, 5] = 1e4  # an outlier block
    return x


@pytest.mark.parametrize("fmt", [E4M3, E2M3, E2M1], ids=lambda f: f.name)
@pytest.mark.parametrize("rule,mode", [("floor", ScaleCalculationMode.FLOOR), ("ceil", ScaleCalculationMode.RCEIL)])
@pytest.mark.parametrize("seed", [0, 1])
def test_bit_exact_against_torchao(fmt, rule, mode, seed):
    x = _random_blocks(seed)
    scale_ref, data_ref = torchao_mx.to_mx(x, TORCHAO_DTYPE[fmt.name], 32, mode)
    ours = quantize_mx(x, fmt, rule=rule)
    ref_codes = data_ref.view(torch.uint8) if fmt is E4M3 else data_ref
    scale_diff = (ours.scales.reshape(96, -1) != scale_ref.view(torch.uint8)).sum().item()
    code_diff = (ours.codes.reshape(96, -1) != ref_codes.reshape(96, -1)).sum().item()
    print(f"{fmt.name} {rule}: {scale_diff} scale bytes and {code_diff} code bytes differ from torchao")
    assert scale_diff == 0 and code_diff == 0
    assert torch.equal(dequantize_mx(ours), fake_quantize_mx(x, fmt, rule=rule))


def test_e4m3_matches_torch_cast_on_every_code_and_random_values():
    codes = torch.arange(256, dtype=torch.uint8)
    ours = decode_elem(codes, E4M3)
    ref = codes.view(torch.float8_e4m3fn).float()
    assert torch.equal(torch.isnan(ours), torch.isnan(ref))
    assert torch.equal(ours[~torch.isnan(ref)], ref[~torch.isnan(ref)])
    x = torch.randn(200_000, generator=torch.Generator().manual_seed(3)) * 64
    rounded = round_to_elem(x, E4M3)
    assert torch.equal(rounded, x.clamp(-448, 448).to(torch.float8_e4m3fn).float())
    assert torch.equal(encode_elem(rounded, E4M3), x.clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8))


# (input, E2M3 value, E2M1 value, E4M3 value): zero, signed zero, subnormals, ties to even, saturation.
HAND_TABLE = [
    (0.0, 0.0, 0.0, 0.0),
    (0.0625, 0.0, 0.0, 0.0625),  # E2M3: half of the smallest subnormal 0.125 ties to 0 (even)
    (0.1875, 0.25, 0.0, 0.1875),  # E2M3: 1.5 steps of 0.125 ties to 2 steps (even)
    (0.25, 0.25, 0.0, 0.25),  # E2M1: half of subnormal 0.5 ties to 0
    (0.75, 0.75, 1.0, 0.75),  # E2M1: between 0.5 (odd code) and 1.0 (even) -> 1.0
    (1.0625, 1.0, 1.0, 1.0),  # 3 mantissa bits: 1 + 1/16 ties to 1.0 (mantissa 000 even)
    (1.1875, 1.25, 1.0, 1.25),  # 3 mantissa bits: 1.1875 ties to 1.25 (mantissa 010 even)
    (2.5, 2.5, 2.0, 2.5),  # E2M1: 2.5 ties to 2 (even)
    (3.5, 3.5, 4.0, 3.5),  # E2M1: 3.5 ties to 4 (even)
    (5.0, 5.0, 4.0, 5.0),  # E2M1: 5 ties to 4 (even)
    (7.75, 7.5, 6.0, 8.0),  # saturation for FP6/FP4; E4M3 ties 1.9375*4 up to 8 (even)
    (1e6, 7.5, 6.0, 448.0),  # saturation
    (float("inf"), 7.5, 6.0, 448.0),  # saturating conversions have no infinity
    (2.0 ** -9, 0.0, 0.0, 2.0 ** -9),  # E4M3 smallest subnormal
    (3 * 2.0 ** -10, 0.0, 0.0, 2.0 ** -8),  # E4M3: 1.5 subnormal steps ties to 2 steps
    (464.0, 7.5, 6.0, 448.0),  # E4M3: 464 is the tie between 448 and 480 -> saturates at 448
]


@pytest.mark.parametrize("value,e2m3,e2m1,e4m3", HAND_TABLE)
def test_hand_table_rounding(value, e2m3, e2m1, e4m3):
    for sign in (1.0, -1.0):
        x = torch.tensor([sign * value])
        got = [round_to_elem(x, f).item() for f in (E2M3, E2M1, E4M3)]
        want = [sign * e2m3, sign * e2m1, sign * e4m3]
        print(value * sign, got, want)
        assert got == want
    neg_zero = round_to_elem(torch.tensor([-0.0]), E2M3)
    assert torch.signbit(neg_zero).item()


def test_nan_stays_nan_and_marks_its_block():
    x = torch.ones(2, 64)
    x[0, 3] = float("nan")
    q = quantize_mx(x, E4M3, rule="floor")
    assert q.scales.reshape(2, 2)[0, 0].item() == 255
    deq = dequantize_mx(q)
    assert torch.isnan(deq[0, :32]).all() and torch.isfinite(deq[0, 32:]).all() and torch.isfinite(deq[1]).all()


@pytest.mark.parametrize("amax,floor_s,ceil_fp4,ceil_fp8", [
    (1.0, -8, -2, -8),  # 1/6 -> 2^-2.58 -> ceil -2; 1/448 -> ceil -8
    (448.0, 0, 7, 0),
    (449.0, 0, 7, 1),
    (6.0, -6, 0, -6),
    (6.0000005, -6, 1, -6),
])
def test_scale_rules_hand_values(amax, floor_s, ceil_fp4, ceil_fp8):
    a = torch.tensor([amax])
    assert shared_exponent(a, E4M3, "floor").item() == floor_s
    assert shared_exponent(a, E2M1, "ceil").item() == ceil_fp4
    assert shared_exponent(a, E4M3, "ceil").item() == ceil_fp8


def test_round_up_175_boundary():
    # mantissa < 1.75 keeps floor(log2 amax) - 8; >= 1.75 rounds the exponent up first (AITER MXFP8).
    below = torch.tensor([1.7499999, 3.4999998, 1.0])
    at = torch.tensor([1.75, 3.5, 1.9999999])
    print(shared_exponent(below, E4M3, "round_up_175"), shared_exponent(at, E4M3, "round_up_175"))
    assert shared_exponent(below, E4M3, "round_up_175").tolist() == [-8, -7, -8]
    assert shared_exponent(at, E4M3, "round_up_175").tolist() == [-7, -6, -7]
    # The rule never saturates: the block maximum stays within 448 after scaling.
    x = torch.tensor([[1.75] + [0.1] * 31, [1.7499999] + [0.1] * 31])
    y = fake_quantize_mx(x, E4M3, rule="round_up_175")
    assert y[0, 0].item() == 1.75 and abs(y[1, 0].item() - y[0, 0].item()) < E4M3_ROUNDTRIP
    assert torch.equal(shared_exponent(torch.tensor([0.0]), E4M3, "round_up_175"), torch.tensor([-127], dtype=torch.int32))
    with pytest.raises(ValueError, match="E4M3 only"):
        shared_exponent(below, E2M3, "round_up_175")


def test_floor_rule_saturates_and_ceil_rule_does_not():
    x = torch.tensor([[7.9] + [0.01] * 31])
    assert fake_quantize_mx(x, E2M3, rule="floor")[0, 0].item() == 7.5  # floor: 7.9/2^0 saturates at 7.5
    assert fake_quantize_mx(x, E2M1, rule="ceil")[0, 0].item() == 8.0  # ceil: 2^1 * 4


def test_fp4_packing_roundtrip_and_nibble_order():
    codes = torch.tensor([[1, 14, 7, 0]], dtype=torch.uint8)
    packed = pack_fp4(codes)
    assert packed.tolist() == [[0xE1, 0x07]]
    assert torch.equal(unpack_fp4(packed), codes)
    every = torch.arange(16, dtype=torch.uint8)
    assert torch.equal(encode_elem(decode_elem(every, E2M1), E2M1), every)
    every6 = torch.arange(64, dtype=torch.uint8)
    assert torch.equal(encode_elem(decode_elem(every6, E2M3), E2M3), every6)


def test_key_axis_blocks_with_ragged_length():
    g = torch.Generator().manual_seed(5)
    v = torch.randn(2, 3, 45, 16, generator=g)  # 45 keys: one full block of 32 and a padded block of 13
    y = fake_quantize_mx(v, E2M3, axis=-2, rule="floor")
    assert y.shape == v.shape
    # Equal to quantizing each block explicitly along that axis.
    first = fake_quantize_mx(v[:, :, :32].transpose(-1, -2), E2M3, rule="floor").transpose(-1, -2)
    tail = fake_quantize_mx(v[:, :, 32:].transpose(-1, -2), E2M3, rule="floor").transpose(-1, -2)
    assert torch.equal(y, torch.cat([first, tail], dim=2))


def test_fp8_tensor_scale():
    x = torch.randn(4, 100, generator=torch.Generator().manual_seed(6))
    y = fake_quantize_fp8_tensor(x)
    scale = x.abs().max() / 448
    assert torch.equal(y, (x / scale).to(torch.float8_e4m3fn).float() * scale)
    assert torch.equal(fake_quantize_fp8_tensor(torch.zeros(3)), torch.zeros(3))

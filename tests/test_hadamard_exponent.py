"""Hadamard rotation, Schraudolph patterns, Rowmax-H15 and Table 8."""

import math

import pytest
import torch

from fsattn_diffusers.measure.accuracy_tables import PAPER_TABLE8, table8
from fsattn_diffusers.exponent import (SCHRAUDOLPH_EPS, rowmax_h15, schraudolph, schraudolph_pattern,
                                       schraudolph_u16)
from fsattn_diffusers.hadamard import fwht_unnormalized, hadamard_matrix, hadamard_transform
from tolerances import FP32_ACCUMULATED, FP32_LSE_NATS, FP64_ROUNDOFF, FP64_SLACK, PAPER_TWO_DECIMALS, SCHRAUDOLPH_P_REL


@pytest.mark.parametrize("d", [32, 64, 128, 256])
def test_hadamard_is_orthogonal_and_matches_the_butterfly(d):
    h = hadamard_matrix(d, dtype=torch.float64)
    assert torch.allclose(h @ h.T, torch.eye(d, dtype=torch.float64), atol=FP64_ROUNDOFF)
    x = torch.randn(5, d, generator=torch.Generator().manual_seed(d), dtype=torch.float64)
    assert torch.allclose(hadamard_transform(x).double(), x @ h, atol=FP32_ACCUMULATED)
    # scores are unchanged by rotating both operands
    q, k = torch.randn(7, d), torch.randn(9, d)
    s0 = q @ k.T
    s1 = hadamard_transform(q) @ hadamard_transform(k).T
    print(f"d={d}: max |QK^T - (QH)(KH)^T| = {(s0 - s1).abs().max():.2e}")
    assert torch.allclose(s0, s1, atol=FP32_LSE_NATS)


def test_butterfly_of_bf16_inputs_matches_float64_to_fp32_rounding():
    x = torch.randn(64, 128, generator=torch.Generator().manual_seed(1)).bfloat16()
    signs = torch.round(hadamard_matrix(128, dtype=torch.float64) * math.sqrt(128))
    exact = x.double() @ signs
    err = (fwht_unnormalized(x).double() - exact).abs().max().item()
    print(f"max |butterfly - float64| = {err:.2e}")
    assert err <= 2 ** -23 * exact.abs().max().item() * 8


def test_hadamard_rejects_non_power_of_two():
    with pytest.raises(ValueError, match="power-of-two head dim"):
        hadamard_matrix(96)


def test_schraudolph_pattern_hand_values():
    y = torch.tensor([0.0, 1.0, -1.0, float("-inf")])
    # U16: 128 * (127 - eps) = 16248.58 -> 16249; one doubling is 128 pattern units.
    assert schraudolph_pattern(y, "u16").tolist() == [16249, 16377, 16121, 0]
    assert round(128 * (127 - SCHRAUDOLPH_EPS)) == 16249
    p = schraudolph_u16(torch.tensor([0.0]))
    assert p.item() == torch.tensor([16249 << 16], dtype=torch.int32).view(torch.float32).item()
    assert p.item() == pytest.approx(2 ** -SCHRAUDOLPH_EPS * (1 + 121 / 128) / (1 + (1 - SCHRAUDOLPH_EPS)) * 1.0,
                                     rel=SCHRAUDOLPH_P_REL)
    # Large overshoots climb into the sign bit (Appendix C) and saturate at 0xFFFF (NaN) past 384 doublings.
    assert schraudolph_pattern(torch.tensor([400.0]), "u16").item() == 0xFFFF
    assert math.isnan(schraudolph(torch.tensor([400.0]), "u16").item())
    assert schraudolph_pattern(torch.tensor([1e30]), "u8").item() == 0x7E


@pytest.mark.parametrize("proxy", ["u32", "u16", "u8"])
def test_schraudolph_error_is_bounded_by_table8(proxy):
    y = torch.linspace(-6, 6, 100_001)
    rel = schraudolph(y, proxy).double() / torch.exp2(y.double()) - 1
    bounds = {"u32": (-0.0394, 0.0197), "u16": (-0.0420, 0.0225), "u8": (-0.0802, 0.0641)}[proxy]
    print(proxy, rel.min().item(), rel.max().item())
    assert bounds[0] <= rel.min().item() and rel.max().item() <= bounds[1]


def test_rowmax_h15_levels_for_every_n():
    n = torch.arange(-252, 120, dtype=torch.float32)
    for offset in (0.0, 0.2, -0.2):  # any x rounding to n gives the same level
        w = rowmax_h15((n + offset) / 2.0)
        want = torch.tensor([(1 + 0.5 * (int(i) % 2)) * 2.0 ** (int(i) // 2) for i in n.tolist()])
        assert torch.equal(w, want)
    assert rowmax_h15(torch.tensor([0.25])).item() == 1.0  # 2x = 0.5 ties to n = 0 (even)
    assert rowmax_h15(torch.tensor([0.75])).item() == 2.0  # 2x = 1.5 ties to n = 2 (even)
    assert rowmax_h15(torch.tensor([-1000.0])).item() == 2.0 ** -126  # clamped to n >= -252


def test_table8_reproduces_the_paper_to_0005_pp():
    for row in table8():
        for key in ("min", "max", "rms", "added_rms"):
            ours, paper = row["ours"][key], row["paper"][key]
            if paper is None:
                continue
            print(row["proxy"], key, f"{ours:.4f}", paper)
            assert abs(ours - paper) <= PAPER_TWO_DECIMALS + FP64_SLACK, (row["proxy"], key, ours, paper)
    assert set(PAPER_TABLE8) == {r["proxy"] for r in table8()}

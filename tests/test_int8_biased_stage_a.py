"""The INT8 kernel's Stage-A on biased scores (sm90_numerics difference 14): ``Xb = 1.5 2^23 + S`` and one FMA per
element against a per-row constant of the key tile, checked bit for bit against exact rational arithmetic rounded to
fp32 once per FMA; the rows that add Q smoothing's key term, and FP8 P under Schraudolph (no kernel), keep the scores'
Stage-A."""

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from fsattn_diffusers import numerics as numerics_module
from fsattn_diffusers.emulator import emulate_attention
from fsattn_diffusers.measure import kernel_recipe
from fsattn_diffusers.measure.structured_inputs import FAMILIES
from fsattn_diffusers.numerics import SM90Int8Numerics, numerics_for
from fsattn_diffusers.sm90_numerics import D_BITS, I2F_MAGIC, stage_a_biased
from fsattn_diffusers.smoothing import q_smoothing_heads
from fsattn_diffusers.testing import exact_attention, relative_error
from tolerances import INT8_BIASED_ERR_MOVE_MAX

CASES = 400


def fp32(x: Fraction) -> Fraction:
    """``x`` rounded to the nearest fp32 value, ties to even (independent of torch: exact neighbours compared)."""
    c = np.float32(float(x))
    best = None
    for cand in (np.nextafter(c, np.float32(-np.inf)), c, np.nextafter(c, np.float32(np.inf))):
        d = abs(Fraction(float(cand)) - x)
        even = (int(np.float32(cand).view(np.int32)) & 1) == 0
        if best is None or d < best[0] or (d == best[0] and even):
            best = (d, cand)
    return Fraction(float(best[1]))


def _cases(seed: int):
    """Integer scores, factors ``a`` from 2^-30 to 2^-3 and references on the 1/128 grid that put ``S a - m`` in
    -40 .. 4 doublings (what the gate leaves)."""
    g = torch.Generator().manual_seed(seed)
    s = torch.randint(-(2 ** 21), 2 ** 21, (CASES,), generator=g).float()
    a = torch.exp2(torch.empty(CASES).uniform_(-30.0, -3.0, generator=g)).float()
    y = torch.empty(CASES).uniform_(-40.0, 4.0, generator=g)
    m = torch.round((s.double() * a.double() - y) * 128).float() / 128
    return s, a, m


@pytest.mark.parametrize("sigma", [0, 4])
def test_exact_exponential_is_one_fma_of_the_biased_score_against_the_rounded_constant(sigma):
    s, a, m = _cases(sigma)
    got = stage_a_biased(s[:, None], a[:, None], m, sigma, exact=True, saturate=False)[:, 0]
    want = []
    for si, ai, mi in zip(s.tolist(), a.tolist(), m.tolist()):
        k = fp32(Fraction(ai) * Fraction(I2F_MAGIC) + Fraction(mi) - sigma)
        want.append(float(fp32((Fraction(I2F_MAGIC) + Fraction(si)) * Fraction(ai) - k)))
    want = torch.exp2(torch.tensor(want, dtype=torch.float32))
    print(f"sigma {sigma}: {int((got != want).sum())} of {CASES} differ")
    assert torch.equal(got, want)


def test_schraudolph_pattern_is_one_fma_of_the_biased_score_against_the_rounded_constant():
    s, a, m = _cases(7)
    got = stage_a_biased(s[:, None], a[:, None], m, 0, exact=False, saturate=True)[:, 0]
    bits = []
    for si, ai, mi in zip(s.tolist(), a.tolist(), m.tolist()):
        ag = Fraction(ai) * 128
        c = Fraction(I2F_MAGIC) + D_BITS - 128 * Fraction(mi)
        k = fp32(ag * Fraction(I2F_MAGIC) - c)
        z = fp32((Fraction(I2F_MAGIC) + Fraction(si)) * ag - k)
        bits.append(min(max(int(z - Fraction(I2F_MAGIC)), 0), 65535))
    want = (torch.tensor(bits, dtype=torch.int64) << 16).to(torch.int32).view(torch.float32)
    print(f"{int((got != want).sum())} of {CASES} differ; patterns {min(bits)}..{max(bits)}")
    assert torch.equal(got, want) and len(set(bits)) > CASES // 2


@pytest.mark.parametrize("name", ["int8-bf16", "int8-bf16+exponential=exact", "int8-fp8"])
def test_the_constants_rounding_moves_p_by_less_than_its_bound_and_the_error_not(name):
    """Against Stage-A from ``float32(S a)``: Schraudolph's patterns within one unit (the constant rounds to an
    integer), the exact power within ``2^(ulp(k) / 2 + ulp(y))``; errors against exact attention alike."""
    recipe = kernel_recipe(name)
    num = numerics_for(recipe)
    q, k, v = FAMILIES["gaussian"](1, 2, 512, 128, torch.bfloat16, "cpu", 0)
    qo, ko, *_ = num.operands(q, k, v, 128 ** -0.5, None)
    qo, ko = qo.reshape(2, 512, 129), ko.reshape(2, 512, 129)
    x, parts = num.tile_scores(qo, ko[:, :128])
    m = num.seed(x.amax(dim=-1))
    plain, biased = num.stage_a(x, m), num.stage_a(x, m, parts)
    if recipe.exponential == "schraudolph":  # the BF16 patterns
        units = ((biased.view(torch.int32) >> 16) - (plain.view(torch.int32) >> 16)).abs()
        print(f"{name}: patterns apart by up to {int(units.max())}, in {float((units > 0).float().mean()):.3f}")
        assert int(units.max()) <= 1
    elif recipe.p_format == "bf16":  # one BF16 ulp
        bound = 1 + 2.0 ** -7
    else:  # FP8 P, fp32 values before the E4M3 cast: 2^(ulp(k) / 2 + ulp(y)), k ~ a 1.5 2^23, y < 2^3
        ulp_k = 2.0 ** (math.floor(math.log2(float(parts.a.max()) * I2F_MAGIC)) - 23)
        bound = 2.0 ** (ulp_k / 2 + 2.0 ** -20)
        ratio = (biased.double() / plain.double())[plain > 2 ** -100]
        print(f"{name}: P ratio {float(ratio.min()):.8f} .. {float(ratio.max()):.8f}, bound {bound:.8f}")
        assert float(ratio.max()) <= bound and float(ratio.min()) >= 1 / bound
    ex = exact_attention(q, k, v, 128 ** -0.5)[0]
    err = relative_error(emulate_attention(q, k, v, recipe, scale=128 ** -0.5)[0], ex)
    saved = SM90Int8Numerics.tile_scores
    try:  # the reference without difference 14: Stage-A from float32(S a)
        SM90Int8Numerics.tile_scores = lambda self, qq, kk: (saved(self, qq, kk)[0], None)
        err_plain = relative_error(emulate_attention(q, k, v, recipe, scale=128 ** -0.5)[0], ex)
    finally:
        SM90Int8Numerics.tile_scores = saved
    print(f"{name}: error {err:.5f} on biased scores, {err_plain:.5f} from the rounded scores")
    assert abs(err - err_plain) <= INT8_BIASED_ERR_MOVE_MAX * err_plain


@pytest.mark.parametrize("name,biased", [("int8-fp8", True), ("int8-fp8+exponential=schraudolph", False)])
def test_fp8_p_reads_the_biased_scores_with_the_kernels_exponential(name, biased):
    """``int8-fp8`` (the kernel's exact exponential) reads the parts; FP8 P under Schraudolph, a reference-only
    recipe, the scores."""
    num = numerics_for(kernel_recipe(name))
    q, k, v = FAMILIES["gaussian"](1, 1, 128, 64, torch.bfloat16, "cpu", 0)
    qo, ko, *_ = num.operands(q, k, v, 0.125, None)
    x, parts = num.tile_scores(qo.reshape(1, 128, 65), ko.reshape(1, 128, 65))
    print(f"{name}: parts {'given' if parts is not None else 'None'}")
    assert (parts is not None) == biased and torch.equal(x, num.scores(qo.reshape(1, 128, 65), ko.reshape(1, 128, 65)))


def test_slices_with_the_key_term_keep_the_scores_stage_a(monkeypatch):
    """Q smoothing's per-slice switch: the slice the switch smooths reads X + b_j, the other the biased scores
    (``ScoreParts.rows``), as the kernel's two launches do."""
    recipe = kernel_recipe("int8-bf16+smooth_q=true")
    q, k, v = FAMILIES["gaussian"](1, 2, 256, 64, torch.bfloat16, "cpu", 3)
    q = q.clone()
    q[:, 0] += 2.0  # a shared offset on head 0's queries: the switch takes that slice
    heads = q_smoothing_heads(q, recipe.smooth_q_min_ratio)
    assert heads.tolist() == [[True, False]]
    seen = []
    original = numerics_module.SM90Int8Numerics.stage_a

    def recording(self, x, m, parts=None):
        seen.append(None if parts is None or parts.rows is None else parts.rows.clone())
        return original(self, x, m, parts)

    monkeypatch.setattr(numerics_module.SM90Int8Numerics, "stage_a", recording)
    emulate_attention(q, k, v, recipe, scale=64 ** -0.5)
    print(f"{len(seen)} Stage-A calls; rows per slice {[r.all(dim=-1).tolist() for r in seen[:1]]}")
    assert seen and all(r is not None for r in seen)
    assert all(bool((~r[0]).all()) and bool(r[1].all()) for r in seen)

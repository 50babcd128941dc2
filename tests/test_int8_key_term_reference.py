"""The reference of the INT8 kernel's Q-smoothing key term (sm90_numerics difference 12): the term added to Stage-A's
argument with the exact exponential, its row peaks, and the rollback's exact scaling, against the biased Stage-A
(difference 14) and the scores path (the term added to ``float32(S a)``, Stage-A on ``float32(y - m)``)."""

import pytest
import torch

from fsattn_diffusers import sm90_numerics as sm90
from fsattn_diffusers.emulator import emulate_attention
from fsattn_diffusers.measure.structured_inputs import FAMILIES
from fsattn_diffusers.numerics import MI355XNumerics, SM90Int8Numerics
from fsattn_diffusers.recipe import INT8_BF16, INT8_FP8, PRESETS
from fsattn_diffusers.testing import exact_attention, relative_error
from tolerances import (HALF_ULP_BOUND_SLACK, KEY_TERM_FOLD_ERR_MOVE_MAX, KEY_TERM_FOLD_LSE_NATS,
                        KEY_TERM_FOLD_OUT_MAX)


def _parts(seed=0, rows=64, keys=128):
    g = torch.Generator().manual_seed(seed)
    s = torch.randint(-2 ** 20, 2 ** 20, (1, rows, keys), generator=g).float()
    a = torch.ldexp(torch.rand(1, rows, 1, generator=g) + 1.0, torch.full((1, rows, 1), -18)).expand(1, rows, keys)
    m = torch.round((s * a).amax(dim=-1) * 128.0) / 128.0
    return s, a.contiguous(), m


@pytest.mark.parametrize("sigma", [0, 4])
def test_without_a_term_the_argument_is_the_biased_stage_a(sigma):
    s, a, m = _parts()
    z = sm90.stage_a_argument_key_term(s, a, torch.zeros(1, 1, s.shape[-1]), m, sigma)
    p_biased = sm90.stage_a_biased(s, a, m, sigma, exact=True, saturate=False)
    p = torch.nan_to_num(torch.exp2(z), nan=0.0)
    print("max |2^z - biased Stage-A|", float((p - p_biased).abs().max()))
    assert torch.equal(p, p_biased)


def test_the_scores_with_the_term_are_one_fma_and_the_argument_within_its_three_roundings():
    s, a, m = _parts(1)
    b = torch.randn(1, 1, s.shape[-1], generator=torch.Generator().manual_seed(2)) * 8.0
    y = sm90.scores_with_key_term(s, a, b)
    two = (s * a).float() + b  # float32(float32(S a) + b): two roundings
    big = torch.maximum(torch.maximum((s * a).abs(), b.abs()), y.abs())  # the roundings' scale (y may cancel)
    ulp = torch.ldexp(torch.ones_like(y), torch.frexp(big)[1] - 24)
    print("max |fma - two roundings| in ulps of the largest operand", float(((y - two).abs() / ulp).max()))
    assert float(((y - two).abs() / ulp).max()) <= 1.0
    z = sm90.stage_a_argument_key_term(s, a, b, m, 4)
    exact = s.double() * a.double() + b.double() - (m.double()[..., None] - 4)

    def ulp(t):
        return torch.ldexp(torch.ones_like(t, dtype=torch.float64), torch.frexp(t.float())[1] - 24)

    c = a.double() * sm90.I2F_MAGIC + (m.double()[..., None] - 4)  # C's rounding, then one at each sum's magnitude
    bound = 0.5 * (ulp(c) + ulp(exact - b.double()) + ulp(z))
    print("max |z - exact| / the three roundings' bound", float(((z.double() - exact).abs() / bound).max()))
    assert bool(((z.double() - exact).abs() <= bound * (1 + HALF_ULP_BOUND_SLACK)).all())


def _emulate(recipe, q, k, v, scores_path=False, monkeypatch=None):
    if scores_path:
        monkeypatch.setattr(SM90Int8Numerics, "with_key_term", MI355XNumerics.with_key_term)
    out, lse, stats = emulate_attention(q, k, v, recipe, scale=q.shape[-1] ** -0.5, return_lse=True,
                                        return_stats=True)
    if scores_path:
        monkeypatch.undo()
    return out, lse, stats


@pytest.mark.parametrize("name", [INT8_FP8, INT8_BF16])
@pytest.mark.parametrize("family", ["offset_uniform_q", "offset_direction_qk"])
def test_the_folded_term_is_the_scores_path_up_to_roundings(name, family, monkeypatch):
    recipe = PRESETS[name].replace(numerics="sm90", smooth_q=True, smooth_q_min_ratio=0.0, exponential="exact")
    q, k, v = FAMILIES[family](1, 2, 384, 64, torch.float32, "cpu", 0)
    out, lse, stats = _emulate(recipe, q, k, v)
    out0, lse0, stats0 = _emulate(recipe, q, k, v, scores_path=True, monkeypatch=monkeypatch)
    ref = exact_attention(q, k, v)[0]
    d_out = relative_error(out, out0)
    d_lse = float((lse - lse0).abs().max())
    e, e0 = relative_error(out, ref), relative_error(out0, ref)
    print(f"{name} {family}: folded vs scores path out {d_out:.2e}, lse {d_lse:.2e}; error {e:.5f} / {e0:.5f}; "
          f"rollbacks {stats['rollbacks']} / {stats0['rollbacks']}")
    assert d_out <= KEY_TERM_FOLD_OUT_MAX and abs(e - e0) <= KEY_TERM_FOLD_ERR_MOVE_MAX
    assert d_lse <= KEY_TERM_FOLD_LSE_NATS
    assert stats["rollbacks"] == stats0["rollbacks"]


def test_a_rolled_back_row_keeps_its_weights_times_an_exact_power_of_two(monkeypatch):
    recipe = PRESETS[INT8_FP8].replace(numerics="sm90", smooth_q=True, smooth_q_min_ratio=0.0)
    q, k, v = FAMILIES["offset_uniform_q"](1, 2, 256, 64, torch.float32, "cpu", 3)
    k[:, :, 300:310] *= 6.0  # later keys far above the first tile's peak: rollbacks
    out, lse, stats = _emulate(recipe, q, k, v)
    out0, lse0, stats0 = _emulate(recipe, q, k, v, scores_path=True, monkeypatch=monkeypatch)
    d_out, d_lse = relative_error(out, out0), float((lse - lse0).abs().max())
    print(f"rollbacks {stats['rollbacks']} / {stats0['rollbacks']}; out {d_out:.2e}, lse {d_lse:.2e}")
    assert stats["rollbacks"] > 0 and stats["rollbacks"] == stats0["rollbacks"]
    assert d_out <= KEY_TERM_FOLD_OUT_MAX and d_lse <= KEY_TERM_FOLD_LSE_NATS

"""Interventions on the attention probabilities against hand-computed rows, and the diagnostics."""

import math

import pytest
import torch

from fsattn_diffusers.exponent import ROWMAX_H15_MIN_N, rowmax_h15
from fsattn_diffusers.interventions import (DEFAULT_INTERVENTIONS, LOG2E, Intervention, Kind, grid_fractions,
                                            intervened_attention, parse_intervention, parse_interventions,
                                            pow2_lerp, weights)
from fsattn_diffusers.quality.diagnostics import Diagnostics, call_diagnostics, jsd_rows
from tolerances import FP32_ACCUMULATED, FP32_ROUNDOFF, FP64_ROUNDOFF, FP64_SLACK, JSD_TARGET_REL

LN2 = math.log(2.0)


def w(scores, label, valid=None):
    s = torch.tensor([scores], dtype=torch.float32)
    v = None if valid is None else torch.tensor([valid])
    return weights(s, parse_intervention(label), v)[0].double()


def normed(values):
    t = torch.tensor(values, dtype=torch.float64)
    return t / t.sum()


def close(got, want, tol=1e-6):
    want = torch.as_tensor(want, dtype=torch.float64)
    print("got", got.tolist(), "want", want.tolist(), "max diff", float((got - want).abs().max()))
    assert torch.allclose(got, want, atol=tol, rtol=0)


def test_exact_and_masking():
    s = [0.0, -1.0, -2.0, 5.0]
    close(w(s, "exact"), torch.softmax(torch.tensor(s, dtype=torch.float64), 0))
    close(w(s, "exact", [True, True, True, False]), normed([1, math.exp(-1), math.exp(-2), 0]))
    close(w(s, "top:0.5", [False] * 4), [0, 0, 0, 0])  # no valid key: all zero


def test_top_fraction_keeps_ceil_of_the_valid_count():
    s = [0.0, -1.0, -2.0, -3.0, -4.0, 9.0]
    valid = [True] * 5 + [False]
    close(w(s, "top:0.5", valid), normed([1, math.exp(-1), math.exp(-2), 0, 0, 0]))  # ceil(2.5) = 3 kept
    close(w(s, "top:0.01", valid), [1, 0, 0, 0, 0, 0])  # at least one
    close(w([1.0, 1.0, 0.0, 0.0], "top:0.25"), [1, 0, 0, 0])  # a tie goes to the earlier key
    close(w(s, "top:1", valid), w(s, "exact", valid))


def test_equal_weights_on_the_kept_positions():
    s = [-3.0, 0.0, -1.0, -2.0, -4.0]
    close(w(s, "equal:0.5"), [0, 1 / 3, 1 / 3, 1 / 3, 0])
    close(w(s, "equal:1"), [0.2] * 5)


def test_grid_uniform_and_geometric_hand_rows():
    # K=2, R=1 on [-2, 0]: grid {0, -1, -2}.
    close(w([0.0, -0.4, -0.6, -1.0, -2.0], "grid:2:1"), normed([1, 1, math.exp(-1), math.exp(-1), math.exp(-2)]))
    # K=2, R=3: widths 0.5 (next to the max) and 1.5: grid {0, -0.5, -2}.
    close(w([0.0, -0.2, -0.3, -1.2, -1.3, -2.0], "grid:2:3"),
          normed([1, 1, math.exp(-0.5), math.exp(-0.5), math.exp(-2), math.exp(-2)]))
    # A score on a midpoint goes to the value nearer the maximum.
    close(w([0.0, -0.5, -1.0], "grid:1:1"), normed([1, 1, math.exp(-1)]))
    close(w([2.0, 2.0], "grid:4:4"), [0.5, 0.5])  # zero span: equal scores stay equal


def test_grid_widths_match_the_seed_statements():
    k, r = 16, 4.0
    c = grid_fractions(k, r)
    widths = c[1:] - c[:-1]
    ratios = widths[1:] / widths[:-1]
    print("widths from the max:", widths.tolist())
    assert torch.allclose(ratios, torch.full_like(ratios, r ** (1 / (k - 1))))  # geometric
    assert float(widths[-1] / widths[0]) == pytest.approx(r)  # widest / narrowest = R
    assert bool((widths[1:] > widths[:-1]).all())  # finest next to the maximum
    uni = grid_fractions(k, 1.0)
    assert torch.allclose(uni, torch.linspace(0, 1, k + 1, dtype=torch.float64))  # R = 1: uniform
    low = grid_fractions(k, 0.25)
    assert bool(((low[1:] - low[:-1])[1:] < (low[1:] - low[:-1])[:-1]).all())  # R < 1: finest at the bottom
    g = torch.Generator().manual_seed(0)
    s = torch.randn(8, 2048, generator=g) * 3
    for label in ("grid:16:1", "grid:16:4", "grid:16:0.25"):
        p = weights(s, parse_intervention(label))
        counts = [len(torch.unique(row)) for row in p]
        print(label, "distinct weights per row:", counts)
        assert max(counts) <= 17 and min(counts) >= 10


def test_octave_row_anchor_hand_rows():
    x = [0.0, -0.4, -0.6, -1.5, -2.5, -3.2]  # octaves below the max
    s = [v * LN2 for v in x]
    close(w(s, "octave:1"), normed([1, 1, 0.5, 0.25, 0.25, 0.125]))  # round half even: -1.5 -> -2, -2.5 -> -2
    close(w(s, "octave:2"), normed([1, 0.75, 0.75, 0.375, 0.1875, 0.125]))
    # L = 4: -0.3 -> -0.25 (1.75 x 2^-1), -1.6 -> -1.5 (1.5 x 2^-2).
    close(w([v * LN2 for v in (0.0, -0.25, -0.3, -1.6)], "octave:4"), normed([1, 0.875, 0.875, 0.375]))
    # L = 4: every weight is {1, 1.25, 1.5, 1.75} x 2^n.
    g = torch.Generator().manual_seed(1)
    p = weights(torch.randn(4, 512, generator=g) * 4, parse_intervention("octave:4"))
    raw = p / p.amax(dim=-1, keepdim=True)
    mant = raw / torch.exp2(torch.floor(torch.log2(raw)))
    levels = sorted({round(float(m), 6) for m in mant.flatten()})
    print("L=4 mantissas:", levels)
    assert set(levels) <= {1.0, 1.25, 1.5, 1.75}


def test_octave_2_is_rowmax_h15():
    n = torch.arange(ROWMAX_H15_MIN_N, 1, dtype=torch.float32)
    assert torch.equal(pow2_lerp(torch.round(2 * (n / 2)) / 2), rowmax_h15(n / 2))  # every level n in range
    g = torch.Generator().manual_seed(2)
    s = -torch.rand(3, 300, generator=g) * 60.0
    p = weights(s, parse_intervention("octave:2"))
    h15 = rowmax_h15((s - s.amax(-1, keepdim=True)) * LOG2E)
    ref = h15 / h15.sum(-1, keepdim=True)
    print("octave:2 vs rowmax_h15 max diff:", float((p - ref).abs().max()))
    assert torch.allclose(p, ref, rtol=FP32_ROUNDOFF, atol=0)


def test_octave_absolute_lattice_hand_rows():
    ln = lambda ps: [math.log(v) for v in ps]  # noqa: E731
    # log2 p = -0.737, -1.32: both code 1 on the absolute lattice; the row anchor separates them.
    close(w(ln([0.6, 0.4]), "octave:1:abs"), [0.5, 0.5])
    close(w(ln([0.6, 0.4]), "octave:1"), [2 / 3, 1 / 3])
    # L = 2: 2 log2 p = -1.47, -2.64 -> codes 1, 3 -> S(-0.5) = 0.75, S(-1.5) = 0.375.
    close(w(ln([0.6, 0.4]), "octave:2:abs"), [2 / 3, 1 / 3])
    # The lattice is of p, so a shift of every score changes nothing.
    close(w([v + 7.3 for v in ln([0.6, 0.4])], "octave:1:abs"), [0.5, 0.5])
    # 2-bit codes 0..3: log2 p = -0.152, -3.47, -6.64 -> codes 0, 3, 7 (7 > 3: weight 0).
    close(w(ln([0.9, 0.09, 0.01]), "octave:1:abs:2"), normed([1, 0.125, 0]))
    close(w(ln([0.9, 0.09, 0.01]), "octave:1:abs"), normed([1, 0.125, 2 ** -7]))


def test_lerp2_and_scale():
    close(w([0.0, -0.25 * LN2, -2.5 * LN2], "lerp2"), normed([1, 0.875, 1.5 * 2 ** -3]))  # floor(-2.5) = -3
    s = [0.0, -1.0, -3.0]
    for a in (0.5, 2.0):
        close(w(s, f"scale:{a}"), torch.softmax(a * torch.tensor(s, dtype=torch.float64), 0))
    flat, sharp = w(s, "scale:0.5"), w(s, "scale:2")
    assert flat[0] < w(s, "exact")[0] < sharp[0]


def test_labels_round_trip_and_errors():
    for label in DEFAULT_INTERVENTIONS + ("lerp2", "octave:2:abs:6", "grid:21:0.25"):
        assert parse_intervention(label).label == label
    assert parse_intervention("grid:16:4") == Intervention(Kind.GRID, steps=16, ratio=4.0)
    assert [i.label for i in parse_interventions(["top:0.5,exact", "top:0.50"])] == ["top:0.5", "exact"]
    for bad, match in (("top:0", "fraction"), ("top:1.5", "fraction"), ("grid:0:1", "grid"), ("foo", "unknown"),
                       ("grid:16", "argument"), ("octave:2:sideways", "anchor"), ("scale:-1", "alpha"),
                       ("top:x", "not a number")):
        with pytest.raises(ValueError, match=match):
            parse_intervention(bad)


def test_intervened_attention_matches_the_rows_chunked_and_masked():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 3, 7, 8, generator=g) for _ in range(3))
    before = [t.clone() for t in (q, k, v)]
    lens = torch.tensor([7, 4])
    for label in ("exact", "top:0.5", "grid:4:4", "octave:1:abs"):
        iv = parse_intervention(label)
        full = intervened_attention(q, k, v, label, kv_lens=lens)
        small = intervened_attention(q, k, v, label, kv_lens=lens, slab_elements=1)
        for b in range(2):
            valid = torch.arange(7) < lens[b]
            p = weights(q[b] @ k[b].transpose(-1, -2) * 8 ** -0.5, iv, valid)
            assert torch.allclose(full[b], p @ v[b], atol=FP32_ROUNDOFF)
        assert torch.equal(full, small)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    out = intervened_attention(q, k, v, "exact")
    print("exact vs SDPA max diff:", float((out - ref).abs().max()))
    assert torch.allclose(out, ref, atol=FP32_ACCUMULATED)
    assert all(torch.equal(a, b) for a, b in zip(before, (q, k, v)))
    with pytest.raises(ValueError, match="kv_lens"):
        intervened_attention(q, k, v, "exact", kv_lens=torch.tensor([3]))


def test_diagnostics_hand_row():
    p_ref = torch.tensor([[0.5, 0.5]])
    p = torch.tensor([[1.0, 0.0]])
    d = Diagnostics().add(p_ref, p).result()
    print(d)
    jsd = 0.5 * (0.5 * math.log(0.5 / 0.75) + 0.5 * math.log(2.0) + math.log(1 / 0.75))
    assert d["jsd"] == pytest.approx(jsd) and d["jsd"] == pytest.approx(float(jsd_rows(p_ref, p)[0]))
    assert d["zero_share"] == 0.5 and d["dropped_mass"] == pytest.approx(0.5)
    assert d["log_rmse"] == pytest.approx(math.log(2)) and d["weighted_log_err"] == pytest.approx(math.log(2))
    assert (d["ref_share_hi"], d["ref_mass_hi"], d["share_hi"], d["mass_hi"]) == (1.0, 1.0, 0.5, 1.0)
    assert (d["share_lo"], d["mass_lo"], d["ref_share_lo"]) == (0.5, 0.0, 0.0)
    # Unweighted vs weighted: an error on a small weight counts fully in one and little in the other.
    r = torch.tensor([[0.9, 0.1]])
    t = torch.tensor([[0.9, 0.1 * math.e]])
    t = t / t.sum()
    e = Diagnostics().add(r, t).result()
    print(e)
    assert e["log_rmse"] > e["weighted_log_err"] > 0
    assert math.isnan(e["out_rel_err"])


def test_call_diagnostics_exact_is_zero_and_heads_chunk():
    g = torch.Generator().manual_seed(4)
    q = torch.randn(4, 5, 16, generator=g)
    k, v = torch.randn(4, 30, 16, generator=g), torch.randn(4, 30, 16, generator=g)
    a = call_diagnostics(q, k, v, ["exact", "top:0.1", "scale:0.5"], scale=0.25, kv_len=20)
    b = call_diagnostics(q, k, v, ["exact", "top:0.1", "scale:0.5"], scale=0.25, kv_len=20, chunk_elements=1)
    print(a)
    assert a["exact"]["jsd"] == pytest.approx(0.0, abs=FP64_ROUNDOFF) and a["exact"]["out_rel_err"] < FP32_ROUNDOFF
    assert a["top:0.1"]["zero_share"] == pytest.approx(18 / 20)  # ceil(2.0) = 2 of 20 valid keys kept
    assert a["scale:0.5"]["jsd"] > 0 and a["scale:0.5"]["out_rel_err"] > 0
    for label in a:
        for f, x in a[label].items():
            # fp32 matmuls per head chunk
            assert x == pytest.approx(b[label][f], rel=FP32_ROUNDOFF, abs=FP64_SLACK), (label, f)


def test_flatten_and_sharpen_match_the_jsd():
    from fsattn_diffusers.interventions import MATCH_ROWS, resolve_for_call

    g = torch.Generator().manual_seed(5)
    q, k = torch.randn(2, MATCH_ROWS, 16, generator=g), torch.randn(2, 50, 16, generator=g)
    s = q @ k.transpose(-1, -2) * 0.5
    exact = weights(s, Intervention(Kind.EXACT))
    got = {}
    for label in ("flatten:0.01", "sharpen:0.01"):
        use = resolve_for_call(label, q, k, scale=0.5)
        jsd = float(jsd_rows(exact, weights(s, use)).mean())
        got[label] = (use.alpha, jsd)
        assert jsd == pytest.approx(0.01, rel=JSD_TARGET_REL)
    print(got)
    assert got["flatten:0.01"][0] < 1 < got["sharpen:0.01"][0]
    assert resolve_for_call("top:0.5", q, k, scale=0.5) == parse_intervention("top:0.5")
    with pytest.raises(ValueError, match="resolve"):
        weights(s, parse_intervention("flatten:0.01"))
    with pytest.raises(ValueError, match="JSD target"):
        parse_intervention("sharpen:1")
    d = call_diagnostics(q, k, k, ["flatten:0.01", "sharpen:0.01"], scale=0.5)
    print({lab: (x["alpha"], x["jsd"]) for lab, x in d.items()})
    assert d["flatten:0.01"]["jsd"] == pytest.approx(0.01, rel=JSD_TARGET_REL) and d["sharpen:0.01"]["alpha"] > 1
    out = intervened_attention(q[None], k[None], k[None], "sharpen:0.01", scale=0.5)
    want = weights(s, Intervention(Kind.SCALE, alpha=got["sharpen:0.01"][0])) @ k
    assert torch.allclose(out[0], want, atol=FP32_ACCUMULATED)

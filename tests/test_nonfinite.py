"""Non-finite inputs (NUMERICS.md section 8): the damage is what exact attention gives, on every recipe."""

import warnings

import pytest
import torch

import fsattn_diffusers as fa
from fsattn_diffusers import nonfinite, notices
from tolerances import FP32_ACCUMULATED, QUANTIZED_ELEMENT_ATOL

RECIPES = ["mxfp8", "mxfp6", "mxfp4", "bf16-emulated", "exact"]
B, H, S, D = 2, 2, 300, 64


def inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, S, D, generator=g) for _ in range(3))


def exact_ref(q, k, v, kv_lens=None):
    """float64 softmax attention by elementwise products (no BLAS), IEEE NaN/inf semantics."""
    s = (q.double()[:, :, :, None, :] * k.double()[:, :, None, :, :]).sum(-1) * D ** -0.5
    vd = v.double()
    if kv_lens is not None:
        valid = torch.arange(k.shape[2])[None, :] < torch.tensor(kv_lens)[:, None]
        s = s.masked_fill(~valid[:, None, None, :], float("-inf"))
        vd = torch.where(valid[:, None, :, None], vd, torch.zeros_like(vd))
    return (torch.softmax(s, dim=-1)[..., None] * vd[:, :, None, :, :]).sum(-2)


@pytest.fixture(autouse=True)
def fresh_warning():
    notices._WARNED.discard("nonfinite")
    yield


def run(q, k, v, recipe, **kw):
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        out = fa.attention(q, k, v, recipe, layout="bhsd", backend="emulator", **kw)
    return out, [w for w in rec if "non-finite" in str(w.message)]


@pytest.mark.parametrize("recipe", RECIPES)
def test_one_nan_in_q_gives_nan_in_its_row_only(recipe):
    q, k, v = inputs(1)
    q[1, 0, 17, 5] = float("nan")
    before = [t.clone() for t in (q, k, v)]
    out, warned = run(q, k, v, recipe)
    bad = ~torch.isfinite(out)
    print(f"{recipe}: {int(bad.sum())} non-finite output elements (row {D})")
    assert int(bad.sum()) == D and bad[1, 0, 17].all()
    assert torch.equal(torch.isnan(q), torch.isnan(before[0])) and torch.equal(k, before[1])
    assert torch.equal(v, before[2])
    assert len(warned) == 1
    msg = str(warned[0].message)
    assert "\n" not in msg and "q: 1" in msg
    assert warned[0].filename == __file__, f"warning attributed to {warned[0].filename}"


@pytest.mark.parametrize("recipe", RECIPES)
def test_one_inf_in_k_gives_exact_attentions_nan_pattern(recipe):
    q, k, v = inputs(2)
    k[0, 1, 200, 3] = float("inf")
    ref = exact_ref(q, k, v)
    out, warned = run(q, k, v, recipe)
    got_bad, ref_bad = ~torch.isfinite(out), ~torch.isfinite(ref)
    print(f"{recipe}: non-finite output {int(got_bad.sum())}, exact attention {int(ref_bad.sum())} "
          f"(head {S * D}), other slices finite: {bool(torch.isfinite(out[1]).all())}")
    assert 0 < int(ref_bad.sum()) < S * D
    assert torch.equal(got_bad, ref_bad)
    # the repaired slice is exact attention; the others are the recipe's own output, untouched
    ok = ~ref_bad[0, 1]
    atol = QUANTIZED_ELEMENT_ATOL if recipe != "exact" else FP32_ACCUMULATED
    assert torch.allclose(out[0, 1][ok].double(), ref[0, 1][ok], atol=atol)
    clean_k = k.clone()
    clean_k[0, 1, 200, 3] = 0.0
    clean = fa.attention(q, clean_k, v, recipe, layout="bhsd", backend="emulator")
    assert torch.equal(out[1], clean[1]) and torch.equal(out[0, 0], clean[0, 0])
    assert len(warned) == 1 and "k: 1" in str(warned[0].message)


@pytest.mark.parametrize("recipe", RECIPES)
def test_inf_in_v_damages_its_channel_only(recipe):
    q, k, v = inputs(3)
    v[1, 1, 40, 9] = float("-inf")
    ref = exact_ref(q, k, v)
    out, lse = fa.attention(q, k, v, recipe, layout="bhsd", backend="emulator", return_lse=True)
    bad = ~torch.isfinite(out)
    print(f"{recipe}: non-finite output {int(bad.sum())} (exact {int((~torch.isfinite(ref)).sum())}), "
          f"in channel 9 of slice (1, 1): {int(bad[1, 1, :, 9].sum())}")
    assert torch.equal(bad, ~torch.isfinite(ref))
    assert bad[1, 1, :, 9].all() and int(bad.sum()) == S
    assert torch.isfinite(lse).all()
    # per-tensor V scale (mxfp8's fp8_tensor): the other slices equal a clean call's
    clean_v = v.clone()
    clean_v[1, 1, 40, 9] = 0.0
    clean = fa.attention(q, k, clean_v, recipe, layout="bhsd", backend="emulator")
    assert torch.equal(out[0], clean[0])


@pytest.mark.parametrize("recipe", ["mxfp8", "mxfp4", "exact"])
def test_nan_garbage_past_kv_lens_is_ignored(recipe):
    q, k, v = inputs(4)
    lens = [250, 0]
    k2, v2 = k.clone(), v.clone()
    k2[0, :, 250:] = float("nan")
    v2[0, :, 250:] = float("inf")
    k2[1] = float("nan")
    out, warned = run(q, k2, v2, recipe, kv_lens=lens)
    want = fa.attention(q, k, v, recipe, layout="bhsd", backend="emulator", kv_lens=lens)
    print(f"{recipe}: warnings {len(warned)}, finite {bool(torch.isfinite(out).all())}")
    assert not warned and torch.isfinite(out).all()
    assert torch.equal(out, want)


def test_strict_raises_one_line_value_error_and_leaves_inputs_alone():
    q, k, v = inputs(5)
    k[0, 0, 3, 3] = float("inf")
    v[1, 1, 5, 5] = float("nan")
    v[1, 1, 6, 5] = float("nan")
    before = [t.clone() for t in (q, k, v)]
    with pytest.raises(ValueError) as info:
        fa.attention(q, k, v, "mxfp8", layout="bhsd", backend="emulator", strict=True)
    msg = str(info.value)
    print(msg)
    assert "\n" not in msg and "k: 1" in msg and "v: 2" in msg and "q:" not in msg
    assert torch.equal(q, before[0]) and torch.equal(k, before[1])
    assert torch.equal(torch.isnan(v), torch.isnan(before[2]))
    # strict with finite inputs (and with garbage past kv_lens) runs normally
    fa.attention(*inputs(5), "mxfp8", layout="bhsd", backend="emulator", strict=True)


def test_bshd_layout_and_lse_are_repaired():
    q, k, v = (t.transpose(1, 2).contiguous() for t in inputs(6))  # (B, S, H, D)
    q[0, 9, 1, 0] = float("nan")
    out, lse = fa.attention(q, k, v, "mxfp6", return_lse=True, backend="emulator")
    assert out.shape == q.shape
    bad = ~torch.isfinite(out)
    assert int(bad.sum()) == D and bad[0, 9, 1].all()
    assert torch.isnan(lse[0, 1, 9]) and int((~torch.isfinite(lse)).sum()) == 1


def test_detector_flags_slices_and_ignores_padding():
    q, k, v = inputs(7)
    k[1, 0, 299] = float("nan")
    flags = nonfinite.detect(q, k, v, None)
    assert flags.tolist() == [[False, False], [True, False]]
    assert not nonfinite.detect(q, k, v, torch.tensor([300, 299])).any()
    big = torch.full((1, 1, 4, 64), 3e38)  # finite values near fp32's top are not flagged (per-token extremes)
    assert not nonfinite.detect(big, big, big).any()
    assert nonfinite.count_nonfinite(big, big, big, torch.ones((1, 1), dtype=torch.bool), None) == {"q": 0, "k": 0, "v": 0}


def test_shared_exact_reference_keeps_a_nan_score_nan():
    # testing.exact_attention is what repaired slices are compared with: a NaN key reaches every row of its head
    # (the softmax of a NaN score), a row without a valid key is 0 with LSE -inf, padded garbage is never read.
    from fsattn_diffusers.testing import exact_attention

    q, k, v = inputs(11)
    k[0, 1, 5, 2] = float("nan")
    k[1, 0, 299] = float("nan")  # past kv_lens[1] below
    out, lse = exact_attention(q, k, v, None, torch.tensor([300, 299]))
    print("NaN rows per head:", torch.isnan(out).any(dim=-1).sum(dim=-1).tolist())
    assert torch.isnan(out[0, 1]).all() and torch.isnan(lse[0, 1]).all()
    assert torch.isfinite(out[1]).all() and torch.isfinite(out[0, 0]).all()
    empty, lse_empty = exact_attention(q, k, v, None, torch.tensor([0, 299]))
    assert torch.equal(empty[0], torch.zeros_like(empty[0])) and bool((lse_empty[0] == float("-inf")).all())


def test_staged_flags_answer_as_the_flags_do():
    flags = torch.zeros((2, 3), dtype=torch.bool)
    assert nonfinite.StagedFlags(flags).any() is False
    assert nonfinite.StagedFlags(None).any() is False  # nothing detected (a traced call)
    flags[1, 2] = True
    staged = nonfinite.StagedFlags(flags)
    print("staged flags:", staged.flags.nonzero().tolist(), "any:", staged.any())
    assert staged.any() is True and staged.flags is flags


def test_a_backend_that_detects_hands_its_flags_to_the_repair(monkeypatch):
    """A backend with ``detects_nonfinite`` is asked to detect and its flags drive the repair; the separate
    detection pass does not run."""
    from fsattn_diffusers import backends
    from fsattn_diffusers.backends import AttentionResult, registry
    from fsattn_diffusers.emulator import emulate_attention

    calls = []

    def run(request):
        r = request
        calls.append(r.detect_nonfinite)
        out, lse, stats = emulate_attention(r.q, r.k, r.v, r.recipe, scale=r.scale, kv_lens=r.kv_lens,
                                            return_lse=r.return_lse)
        flags = nonfinite.detect(r.q, r.k, r.v, r.kv_lens) if r.detect_nonfinite else None
        return AttentionResult(out, lse, None, nonfinite.StagedFlags(flags) if r.detect_nonfinite else None)

    registry.register_backend(registry.Backend("detecting", run, lambda d: None, lambda request: None,
                                               detects_nonfinite=True))
    monkeypatch.setattr(backends, "detect_nonfinite", lambda *a: pytest.fail("the separate detection pass ran"))
    try:
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 2, 64, 32, generator=g) for _ in range(3))
        q[0, 1, 5, 0] = float("nan")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            out = fa.attention(q, k, v, "mxfp8", layout="bhsd", backend="detecting")
    finally:
        registry.unregister_backend("detecting")
    nan_rows = torch.isnan(out).any(dim=-1)
    print("backend asked to detect:", calls, "NaN rows per head:", nan_rows.sum(dim=-1).tolist())
    assert calls == [True]
    assert nan_rows[0, 1].nonzero().flatten().tolist() == [5] and not nan_rows[0, 0].any()

"""Token-mean smoothing and the signed rotation (Recipe.smooth_k, smooth_q, hadamard_signs): exact in real
arithmetic, so the exact recipe is unchanged and the LSE stays the log-sum-exp of the unsmoothed scores."""


import pytest
import torch

import fsattn_diffusers as fa
from fsattn_diffusers.emulator import emulate_attention
from fsattn_diffusers.hadamard import hadamard_matrix, rotation_signs
from fsattn_diffusers.recipe import PAPER_SUFFIX, PRESETS, Q_SMOOTHING_MIN_RATIO, ROBUST, ROBUST_P
from fsattn_diffusers.smoothing import q_smoothing_heads, token_mean
from fsattn_diffusers.testing import exact_attention
from tolerances import (FP32_LSE_NATS, FP32_ROUNDOFF, GARBAGE_MOVES_ROWS_MIN, OFFSET_BREAKS_PAPER_MIN,
                        OFFSET_DEFAULT_OVER_GAUSSIAN_MAX, SMOOTHED_LSE_VS_EXACT, SMOOTHING_BF16_ROUNDING,
                        SMOOTHING_GAIN_MAX)


def _inputs(b=2, h=2, s_q=200, s_k=300, d=64, seed=0, offset=3.0, q_offset=None):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, s, d, generator=g) for s in (s_q, s_k, s_k))
    q_offset = offset if q_offset is None else q_offset
    return (q + q_offset).bfloat16(), (k + offset).bfloat16(), v.bfloat16()


def _exact(q, k, v, scale, kv_lens=None):
    return exact_attention(q, k, v, scale, kv_lens)


@pytest.mark.parametrize("fields", [dict(smooth_k=True), dict(smooth_q=True), dict(smooth_k=True, smooth_q=True),
                                    dict(hadamard=True, hadamard_signs=True)])
def test_smoothing_leaves_the_exact_recipe_unchanged(fields):
    q, k, v = _inputs()
    kv = torch.tensor([300, 123])
    scale = q.shape[-1] ** -0.5
    plain = emulate_attention(q, k, v, PRESETS["exact"], scale=scale, kv_lens=kv, return_lse=True)
    smooth = emulate_attention(q, k, v, PRESETS["exact"].replace(**fields), scale=scale, kv_lens=kv, return_lse=True)
    ex_o, ex_lse = _exact(q, k, v, scale, kv)
    d_out = float((smooth[0].double() - plain[0].double()).abs().max())
    d_lse = float((smooth[1].double() - ex_lse).abs().max())
    print(f"{fields}: max |out - unsmoothed| {d_out:.2e}, max |lse - exact logsumexp| {d_lse:.2e}")
    # smoothing rounds (q - mean), (k - mean) to BF16: float tolerance of BF16 operands, not of fp32
    assert d_out < SMOOTHING_BF16_ROUNDING and d_lse < SMOOTHING_BF16_ROUNDING
    assert float((plain[1].double() - ex_lse).abs().max()) < FP32_LSE_NATS  # the unsmoothed exact recipe, for scale


@pytest.mark.parametrize("name", ["mxfp8", "mxfp6", "mxfp4"])
@pytest.mark.parametrize("numerics", ["mi355x", "sm90"])
def test_quantized_lse_is_the_unsmoothed_logsumexp(name, numerics):
    """K offset by +3 on every channel: K smoothing takes out ~34 nats per row, the LSE adds them back."""
    q, k, v = _inputs(d=128, q_offset=1.0)
    scale = 128 ** -0.5
    recipe = PRESETS[name].replace(numerics=numerics)
    assert recipe.smooth_k
    _, lse, _ = emulate_attention(q, k, v, recipe, scale=scale, return_lse=True)
    _, ex_lse = _exact(q, k, v, scale)
    diff = float((lse.double() - ex_lse).abs().max())
    print(f"{name}/{numerics}: max |lse - exact| {diff:.3f} nats (exact lse ~ {float(ex_lse.mean()):.1f})")
    assert diff < SMOOTHED_LSE_VS_EXACT[name]  # without the offset it would be ~34


def test_padded_garbage_keys_do_not_move_the_mean():
    q, k, v = _inputs(b=1, s_k=256)
    kv = torch.tensor([100])
    k2 = k.clone()
    k2[:, :, 100:] = 1e4  # garbage past kv_lens
    valid = torch.arange(256)[None, :] < kv[:, None]
    assert torch.equal(token_mean(k, valid), token_mean(k2, valid))
    a = fa.attention(q, k, v, "mxfp8", layout="bhsd", kv_lens=kv)
    b = fa.attention(q, k2, v, "mxfp8", layout="bhsd", kv_lens=kv)
    assert torch.equal(a, b)


def test_robust_presets_and_paper_presets():
    for name in ("mxfp8", "mxfp6", "mxfp4"):
        robust, paper = PRESETS[name], PRESETS[name + PAPER_SUFFIX]
        assert all(getattr(robust, f) == v for f, v in ROBUST.items())
        assert not (paper.smooth_k or paper.smooth_q or paper.hadamard_signs)
        per_p = ROBUST_P[robust.p_format]
        assert all(getattr(robust, f) == v for f, v in per_p.items())
        paper_p = {f: getattr(paper, f) for f in per_p}
        print(name, "per P format:", per_p, "paper:", paper_p)
        assert all(per_p[f] != paper_p[f] for f in per_p)
        assert robust.replace(**{f: False for f in ROBUST}, **paper_p, name=paper.name) == paper


def test_rotation_signs_are_fixed_and_orthogonal():
    s = rotation_signs(128)
    assert torch.equal(s, rotation_signs(128)) and set(s.tolist()) == {-1.0, 1.0}
    assert 40 < int((s > 0).sum()) < 88
    m = torch.diag(s) @ hadamard_matrix(128)
    assert torch.allclose(m @ m.T, torch.eye(128), atol=FP32_ROUNDOFF)


def test_shared_offsets_no_longer_break_mxfp8():
    """Q and K biased by the same +3 vector: the paper pipeline's error is ~100%; the default recipe's stays near
    its Gaussian error (the Hadamard rotation maps the shared offset onto one coordinate; K smoothing removes it)."""
    q, k, v = _inputs(b=1, h=2, s_q=1024, s_k=1024, d=128, seed=3)
    scale = 128 ** -0.5
    ref, _ = _exact(q, k, v, scale)
    errs = {}
    for name in ("mxfp8", "mxfp8" + PAPER_SUFFIX):
        out = emulate_attention(q, k, v, PRESETS[name], scale=scale)[0]
        errs[name] = float((out.double() - ref).norm() / ref.norm())
    q0, k0, v0 = _inputs(b=1, h=2, s_q=1024, s_k=1024, d=128, seed=3, offset=0.0)
    ref0, _ = _exact(q0, k0, v0, scale)
    gauss = float((emulate_attention(q0, k0, v0, PRESETS["mxfp8"], scale=scale)[0].double() - ref0).norm()
                  / ref0.norm())
    print(f"errors with a shared +3 offset: {errs}; default recipe on Gaussian inputs {gauss:.4f}")
    assert errs["mxfp8-paper"] > OFFSET_BREAKS_PAPER_MIN
    assert errs["mxfp8"] < OFFSET_DEFAULT_OVER_GAUSSIAN_MAX * gauss


def test_recipe_names_with_changes():
    assert PRESETS["mxfp8"].smooth_q and PRESETS["mxfp8"].smooth_q_min_ratio == Q_SMOOTHING_MIN_RATIO == 1.0
    r = fa.get_recipe("mxfp8+smooth_q=false")
    assert not r.smooth_q and r.name == "mxfp8+smooth_q=false"
    assert r.replace(smooth_q=True, name="mxfp8") == PRESETS["mxfp8"]
    assert fa.get_recipe("mxfp8-paper+smooth_q").smooth_q_min_ratio == Q_SMOOTHING_MIN_RATIO
    r = fa.get_recipe("mxfp8+smooth_q+smooth_q_min_ratio=0")
    assert r.smooth_q and r.smooth_q_min_ratio == 0.0
    r = fa.get_recipe("mxfp8-paper+proxy=u32+rollback_cap_log2=24")
    assert (r.proxy, r.rollback_cap_log2, r.smooth_k) == ("u32", 24, False)
    derived = PRESETS["mxfp8"].replace(proxy="u32", rollback_cap_log2=24, qk_scale_rule="floor", smooth_q=False)
    assert derived.name == "mxfp8+proxy=u32+rollback_cap_log2=24+smooth_q=False+qk_scale_rule=floor"
    assert fa.get_recipe(derived.name) == derived  # a derived name parses back into the same recipe
    for bad, msg in (("mxfp8+nosuch", "unknown Recipe field"), ("nope", "unknown recipe"),
                     ("mxfp8+smooth_q=maybe", "not a bool"), ("mxfp8+tile_n=x", "not an integer"),
                     ("mxfp8+smooth_q_min_ratio=x", "not a number"), ("mxfp8+smooth_q_min_ratio=-1", "out of range")):
        with pytest.raises(ValueError, match=msg) as info:
            fa.get_recipe(bad)
        assert "\n" not in str(info.value)


def _mixed_heads(s_q=512, s_k=384, d=128, seed=5):
    """(1, 4, S, D) BF16 inputs whose heads 1 and 3 have a shared +3 on every query channel, heads 0 and 2 none."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 4, s, d, generator=g) for s in (s_q, s_k, s_k))
    q[:, 1::2] += 3.0
    return q.bfloat16(), k.bfloat16(), v.bfloat16()


def test_q_smoothing_selects_the_heads_with_a_shared_query_component():
    q, _, _ = _mixed_heads()
    sel = q_smoothing_heads(q, Q_SMOOTHING_MIN_RATIO)
    mu = q.double().mean(dim=2)
    ratio = mu.norm(dim=-1) / (q.double() - mu[:, :, None]).pow(2).sum(-1).mean(-1).sqrt()
    print(f"ratio |q_mean| / rms |q - q_mean| per head: {ratio.tolist()}; selected {sel.tolist()}")
    assert sel.tolist() == [[False, True, False, True]]
    assert torch.equal(sel, ratio > Q_SMOOTHING_MIN_RATIO)
    assert q_smoothing_heads(q, 0.0).all()  # 0: every slice
    assert not q_smoothing_heads(torch.zeros(1, 2, 64, 32), Q_SMOOTHING_MIN_RATIO).any()  # no mean, nothing to take


@pytest.mark.parametrize("numerics", ["mi355x", "sm90"])
@pytest.mark.parametrize("name", ["mxfp8", "mxfp6"])
def test_the_switch_gives_each_head_the_output_of_its_setting(name, numerics):
    """The preset's Q smoothing (the switch at 1.0) = Q smoothing off on heads 0/2 and on every slice on heads 1/3,
    bit for bit."""
    q, k, v = _mixed_heads()
    scale = 128 ** -0.5
    run = lambda r: emulate_attention(q, k, v, r.replace(numerics=numerics), scale=scale, return_lse=True)[:2]  # noqa
    auto, lse = run(PRESETS[name])
    off, lse_off = run(PRESETS[name].replace(smooth_q=False))
    on, lse_on = run(PRESETS[name].replace(smooth_q=True, smooth_q_min_ratio=0.0))
    ref, _ = _exact(q, k, v, scale)
    err = lambda o, hs: float((o[:, hs].double() - ref[:, hs]).norm() / ref[:, hs].norm())  # noqa
    print(f"{name}/{numerics}: offset heads: switch {err(auto, [1, 3]):.4f}, off {err(off, [1, 3]):.4f}, "
          f"every slice {err(on, [1, 3]):.4f}; plain heads: switch {err(auto, [0, 2]):.4f}")
    assert torch.equal(auto[:, 0::2], off[:, 0::2]) and torch.equal(lse[:, 0::2], lse_off[:, 0::2])
    assert torch.equal(auto[:, 1::2], on[:, 1::2]) and torch.equal(lse[:, 1::2], lse_on[:, 1::2])
    assert err(auto, [1, 3]) < SMOOTHING_GAIN_MAX * err(off, [1, 3])


@pytest.mark.parametrize("name", ["mxfp8+smooth_q", "mxfp8+smooth_q+smooth_q_min_ratio=0"])
def test_q_lens_keeps_padded_queries_out_of_q_smoothing(name):
    """With ``q_lens`` Q's mean and the per-slice switch count only the valid queries: garbage in the padded rows
    leaves the valid rows' outputs bit for bit (MI355X semantics: rows are independent), as they are on the valid rows
    alone; without it the garbage moves them (and, at these magnitudes, the switch's decisions)."""
    q, k, v = _mixed_heads(s_q=300)
    n = 233
    q2 = q.clone()
    q2[:, :, n:] = (1e3 * torch.randn(1, 4, 300 - n, 128, generator=torch.Generator().manual_seed(9))).bfloat16()
    run = lambda x, **kw: fa.attention(x, k, v, name, layout="bhsd", backend="emulator", **kw)  # noqa: E731
    alone = run(q[:, :, :n])
    with_lens, garbage_with_lens = run(q, q_lens=[n]), run(q2, q_lens=[n])
    garbage_without = run(q2)
    moved = float((garbage_without[:, :, :n].double() - alone.double()).abs().max())
    print(f"{name}: valid rows, garbage padding with q_lens: max diff "
          f"{float((garbage_with_lens[:, :, :n] - alone).abs().max()):.3g}; without q_lens: {moved:.3g}")
    assert torch.equal(with_lens[:, :, :n], alone) and torch.equal(garbage_with_lens[:, :, :n], alone)
    assert moved > GARBAGE_MOVES_ROWS_MIN  # the case the argument is for
    valid = torch.arange(300)[None, :] < torch.tensor([n])[:, None]
    assert torch.equal(q_smoothing_heads(q2, Q_SMOOTHING_MIN_RATIO, valid),
                       q_smoothing_heads(q[:, :, :n], Q_SMOOTHING_MIN_RATIO))
    assert torch.equal(token_mean(q2, valid), token_mean(q[:, :, :n]))


def test_q_lens_reaches_every_backend_and_one_that_cannot_honour_it_refuses():
    """``q_lens`` is a field of the request every backend takes; a backend that cannot honour it for a Q-smoothing
    recipe refuses such calls (here: passed over with a warning) and runs any other; ``q_lens`` is checked like
    ``kv_lens``."""
    from fsattn_diffusers.backends import AttentionResult, registry

    calls, seen = [], []

    def run(request):
        calls.append(request.recipe.name)
        r = request
        return AttentionResult(*emulate_attention(r.q, r.k, r.v, r.recipe, scale=r.scale, kv_lens=r.kv_lens,
                                                  return_lse=r.return_lse))

    def refuses(request):
        seen.append(None if request.q_lens is None else request.q_lens.tolist())
        if request.q_lens is not None and request.recipe.smooth_q:
            return "no q_lens (Q smoothing's mean over the valid queries)"
        return None

    registry.register_backend(registry.Backend("no_q_lens", run, lambda d: None, refuses))
    q, k, v = _mixed_heads(s_q=64, s_k=64)
    try:
        fa.attention(q, k, v, "mxfp8+smooth_q=false", layout="bhsd", backend="no_q_lens", q_lens=[50])
        with pytest.warns(RuntimeWarning, match="no q_lens"):
            fa.attention(q, k, v, "mxfp8", layout="bhsd", backend="no_q_lens", q_lens=[50])
        fa.attention(q, k, v, "mxfp8", layout="bhsd", backend="no_q_lens")
    finally:
        registry.unregister_backend("no_q_lens")
    print("q_lens the backend saw:", seen)
    assert seen == [[50], [50], None]
    print("calls the backend took:", calls)
    assert calls == ["mxfp8+smooth_q=false", "mxfp8"]
    for bad, msg in (([65], r"q_lens values must lie in \[0, 64\] \(the query length\)"),
                     ([1, 2], r"q_lens must be an int tensor of shape \(1,\)"),
                     (torch.tensor([0.5]), "q_lens must be an int tensor")):
        with pytest.raises(ValueError, match=msg):
            fa.attention(q, k, v, "mxfp8", layout="bhsd", q_lens=bad)

"""Grid softmax for training: forward on hand-computed rows, gradients against finite differences.

The finite-difference references use an independent float64 NumPy model of the interpolated (LERP)
weights, ``np.interp`` over the grid points ``(g_k, exp(g_k - hi))``.
"""

import math

import numpy as np
import pytest
import torch

from fsattn_diffusers.training import (Calibration, EndsFeedback, GridSoftmaxConfig, Rounding, grid_attention,
                                       grid_ends, grid_softmax, grid_softmax_with_ends)
from tolerances import (FINITE_DIFFERENCE_GRAD, FP32_LSE_NATS, FP64_EXP_ON_GRID_REL, FP64_ROUNDOFF, FP64_ROW_SUM,
                        FP64_SAME_GRADIENT, GRID_ENDS_TERM_MIN)

E = math.exp


def _cfg(**kw):
    return GridSoftmaxConfig(**kw)


def _p(row, **kw):
    return grid_softmax(torch.tensor([row], dtype=torch.float64), _cfg(**kw))[0].tolist()


def _norm(w):
    return [x / sum(w) for x in w]


# ---------------------------------------------------------------- forward, hand-computed rows
def test_minmax_lerp_and_hard_rows():
    # K=2 on [0, 4]: delta = 2, grid 0, 2, 4 -> weights rel. max e^-4, e^-2, 1; u = 0, 0.25, 2
    want_lerp = _norm([E(-4), 0.75 * E(-4) + 0.25 * E(-2), 1.0])
    want_hard = _norm([E(-4), E(-4), 1.0])  # u = 0.25 rounds to grid value 0
    got = _p([0.0, 0.5, 4.0], steps=2)
    print("lerp", got, want_lerp)
    assert got == pytest.approx(want_lerp, rel=FP64_ROUNDOFF)
    for r in (Rounding.HARD_PRE, Rounding.HARD_POST):
        assert _p([0.0, 0.5, 4.0], steps=2, rounding=r) == pytest.approx(want_hard, rel=FP64_ROUNDOFF)
    # u = 0.75 rounds up; u = 1.5 is a tie and rounds to even (2)
    assert _p([0.0, 1.5, 3.0, 4.0], steps=2, rounding="hard_pre") == pytest.approx(
        _norm([E(-4), E(-2), 1.0, 1.0]), rel=FP64_ROUNDOFF)


def test_fixed_window_rows():
    # window 6, K=3: delta = 2, lo = -6; -10 is below the window (weight 0); u(-3.2) = 1.4
    row = [-10.0, -3.2, -1.0, 0.0]
    want_lerp = _norm([0.0, 0.6 * E(-4) + 0.4 * E(-2), 0.5 * E(-2) + 0.5, 1.0])
    want_hard = _norm([0.0, E(-4), E(-2), 1.0])  # u(-1) = 2.5 ties to even -> grid value -2
    got = _p(row, steps=3, calibration=Calibration.FIXED_WINDOW)
    print("fixed lerp", got, want_lerp)
    assert got == pytest.approx(want_lerp, rel=FP64_ROUNDOFF, abs=0)
    got_hard = _p(row, steps=3, calibration="fixed_window", rounding="hard_post")
    assert got_hard == pytest.approx(want_hard, rel=FP64_ROUNDOFF)
    lo, hi = grid_ends(torch.tensor([row]), Calibration.FIXED_WINDOW, window=6.0)
    assert (lo.item(), hi.item()) == (-6.0, 0.0)


def test_scores_on_grid_points_give_exact_softmax():
    s = torch.tensor([[0.0, 1.0, 2.0, 4.0, 3.0]], dtype=torch.float64)  # K=4 on [0, 4]: every score on the grid
    for r in Rounding:
        got = grid_softmax(s, _cfg(steps=4, rounding=r))
        assert torch.allclose(got, torch.softmax(s, -1), rtol=FP64_EXP_ON_GRID_REL, atol=0)


def test_masks_degenerate_rows_and_no_mutation():
    s = torch.tensor([[1.0, 2.0, float("-inf"), 5.0], [3.0, 3.0, 3.0, 3.0], [7.0, 1.0, 2.0, 3.0],
                      [1.0, 2.0, 3.0, 4.0]], dtype=torch.float64)
    keep = s.clone()
    mask = torch.tensor([[True, True, False, True], [True, True, True, True], [True, False, False, False],
                         [False, False, False, False]])
    p = grid_softmax(s, _cfg(steps=3), mask)
    assert torch.equal(s, keep)
    assert p[0, 2] == 0 and p[0].sum().item() == pytest.approx(1.0, abs=FP64_ROW_SUM)
    # K=3 on [1, 5]: u = 0, 0.75, 3
    d = 4 / 3
    want = _norm([E(-4), 0.25 * E(-4) + 0.75 * E(-4 + d), 1.0])
    assert p[0, [0, 1, 3]].tolist() == pytest.approx(want, rel=FP64_ROUNDOFF)
    assert p[1].tolist() == pytest.approx([0.25] * 4, abs=FP64_ROW_SUM)  # hi == lo: equal weights
    assert p[2].tolist() == [1.0, 0.0, 0.0, 0.0]  # one valid position
    assert p[3].tolist() == [0.0] * 4  # no valid position


def test_large_k_lerp_approaches_softmax_attention():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 16, 8, generator=g, dtype=torch.float64) for _ in range(3))
    causal = torch.ones(16, 16, dtype=torch.bool).tril()
    ref = torch.softmax((q @ k.transpose(-1, -2) / math.sqrt(8)).masked_fill(~causal, -math.inf), -1) @ v
    errs = [(grid_attention(q, k, v, _cfg(steps=kk), causal) - ref).abs().max().item() for kk in (8, 64, 512)]
    print("max |grid - softmax| attention, K = 8, 64, 512:", errs)
    assert errs[0] > errs[1] > errs[2] and errs[2] < FP32_LSE_NATS


def test_bad_input():
    s = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="steps"):
        GridSoftmaxConfig(steps=0)
    with pytest.raises(ValueError, match="accepted"):
        GridSoftmaxConfig(rounding="nearest")
    with pytest.raises(ValueError, match="window"):
        GridSoftmaxConfig(window=-1.0)
    with pytest.raises(ValueError, match="mask"):
        grid_softmax(s, mask=torch.ones(2, 3))
    with pytest.raises(ValueError, match="broadcast"):
        grid_softmax(s, mask=torch.ones(4, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="floating"):
        grid_softmax(torch.zeros(2, 3, dtype=torch.long))


# ---------------------------------------------------------------- NumPy reference of the LERP surrogate
def _ref_ends(s, calibration, window):
    hi = s.max()
    lo = s.min() if calibration is Calibration.MINMAX else hi - window
    return lo, hi


def _ref_lerp_weights(s, lo, hi, k):
    """exp interpolated linearly between neighbouring grid values; 0 below lo; top segment extended."""
    x = lo + (hi - lo) / k * np.arange(k + 1)
    y = np.exp(x - hi)
    w = np.interp(s, x, y)
    top = s > hi  # np.interp clamps; the operator extends the top segment
    w[top] = y[-1] + (s[top] - x[-1]) * (y[-1] - y[-2]) / (x[-1] - x[-2])
    w[s < lo] = 0.0
    return w


def _fd_grad(fun, s, c, eps=1e-6, one_sided=()):
    """Gradient of sum(c * fun(s)) by central differences (forward differences at ``one_sided``)."""
    g = np.zeros_like(s)
    for j in range(s.size):
        sp, sm = s.copy(), s.copy()
        sp[j] += eps
        if j in one_sided:
            g[j] = (c @ fun(sp) - c @ fun(s)) / eps
        else:
            sm[j] -= eps
            g[j] = (c @ fun(sp) - c @ fun(sm)) / (2 * eps)
    return g


def _rows(seed, n=6, s_k=12):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, s_k, generator=g, dtype=torch.float64) * 2.5, torch.randn(n, s_k, generator=g,
                                                                                      dtype=torch.float64)


def _autograd(scores, c, cfg):
    s = scores.clone().requires_grad_(True)
    (grid_softmax(s, cfg) * c).sum().backward()
    return s.grad


CASES = [(cal, k) for cal in Calibration for k in (4, 32)]


@pytest.mark.parametrize("calibration,k", CASES)
def test_keep_gradient_matches_fd_of_lerp(calibration, k):
    scores, c = _rows(1)
    worst = 0.0
    for rounding in (Rounding.LERP, Rounding.HARD_POST):  # HARD_POST backward = d(normalized LERP)
        got = _autograd(scores, c, _cfg(steps=k, calibration=calibration, rounding=rounding))
        for r in range(scores.shape[0]):
            s, cr = scores[r].numpy(), c[r].numpy()

            def fun(x):
                w = _ref_lerp_weights(x, *_ref_ends(x, calibration, 6.0), k)
                return w / w.sum()

            fd = _fd_grad(fun, s, cr)
            worst = max(worst, np.abs(got[r].numpy() - fd).max())
            assert abs(got[r].sum().item()) < FP64_ROUNDOFF  # shift invariance: the row's gradient sums to 0
    print(f"{calibration.value} K={k} keep: max |autograd - FD| = {worst:.2e}")
    assert worst < FINITE_DIFFERENCE_GRAD


@pytest.mark.parametrize("calibration,k", CASES)
def test_detach_gradient_is_fd_with_frozen_ends(calibration, k):
    scores, c = _rows(2)
    for rounding in (Rounding.LERP, Rounding.HARD_POST):
        cfg = _cfg(steps=k, calibration=calibration, rounding=rounding, ends=EndsFeedback.DETACH)
        got = _autograd(scores, c, cfg)
        # the same function with the ends passed in as constants
        s2 = scores.clone().requires_grad_(True)
        lo, hi = grid_ends(scores, calibration)
        (grid_softmax_with_ends(s2, lo, hi, k, rounding) * c).sum().backward()
        assert torch.equal(got, s2.grad)
        worst = 0.0
        for r in range(scores.shape[0]):
            s, cr = scores[r].numpy(), c[r].numpy()
            lo0, hi0 = _ref_ends(s, calibration, 6.0)

            def fun(x):
                w = _ref_lerp_weights(x, lo0, hi0, k)
                return w / w.sum()

            # at the row minimum (MinMax) the grid starts: the derivative is the one from inside
            fd = _fd_grad(fun, s, cr, one_sided={int(s.argmin())} if calibration is Calibration.MINMAX else ())
            worst = max(worst, np.abs(got[r].numpy() - fd).max())
        print(f"{calibration.value} K={k} detach {rounding.value}: max |autograd - FD(frozen ends)| = {worst:.2e}")
        assert worst < FINITE_DIFFERENCE_GRAD


@pytest.mark.parametrize("calibration", list(Calibration))
def test_detach_cuts_exactly_the_calibration_path(calibration):
    scores, c = _rows(3)
    keep = _autograd(scores, c, _cfg(steps=4, calibration=calibration))
    det = _autograd(scores, c, _cfg(steps=4, calibration=calibration, ends=EndsFeedback.DETACH))
    diff = keep - det
    ends = torch.zeros_like(scores, dtype=torch.bool)
    ends.scatter_(1, scores.argmax(1, keepdim=True), True)
    if calibration is Calibration.MINMAX:
        ends.scatter_(1, scores.argmin(1, keepdim=True), True)
    print(f"{calibration.value}: |keep - detach| off the ends {diff[~ends].abs().max():.1e}, "
          f"at the ends min {diff[ends].abs().min():.3e}; detach row sums {det.sum(1).abs().max():.3e}")
    # everywhere but the positions that set the ends the two gradients agree (up to rounding) ...
    assert diff[~ends].abs().max() < FP64_SAME_GRADIENT
    # ... and at those positions the calibration term is there and sizeable
    assert diff[ends].abs().min() > GRID_ENDS_TERM_MIN
    assert det.sum(1).abs().max() > GRID_ENDS_TERM_MIN  # the detached gradient is not shift invariant


def test_hard_pre_gradient_matches_fd_of_prenormalization_surrogate():
    scores, c = _rows(4)
    for calibration in Calibration:
        for ends in EndsFeedback:
            k = 4
            cfg = _cfg(steps=k, calibration=calibration, rounding=Rounding.HARD_PRE, ends=ends)
            got = _autograd(scores, c, cfg)
            post = _autograd(scores, c, _cfg(steps=k, calibration=calibration, rounding=Rounding.HARD_POST, ends=ends))
            worst = 0.0
            for r in range(scores.shape[0]):
                s, cr = scores[r].numpy(), c[r].numpy()
                lo0, hi0 = _ref_ends(s, calibration, 6.0)
                x = lo0 + (hi0 - lo0) / k * np.arange(k + 1)
                u = (s - lo0) / ((hi0 - lo0) / k)
                hard = np.where(u >= 0, np.exp(x[np.clip(np.round(u), 0, k).astype(int)] - hi0), 0.0)
                offset = hard - _ref_lerp_weights(s, lo0, hi0, k)  # frozen: forward = hard, slope = LERP's

                def fun(xx):
                    e = _ref_ends(xx, calibration, 6.0) if ends is EndsFeedback.KEEP else (lo0, hi0)
                    w = _ref_lerp_weights(xx, *e, k) + offset
                    return w / w.sum()

                one = {int(s.argmin())} if (calibration is Calibration.MINMAX and ends is EndsFeedback.DETACH) else ()
                fd = _fd_grad(fun, s, cr, one_sided=one)
                worst = max(worst, np.abs(got[r].numpy() - fd).max())
            gap = (got - post).abs().max().item()
            print(f"{calibration.value} {ends.value} hard_pre: max |autograd - FD| = {worst:.2e}; "
                  f"max |pre - post| gradient = {gap:.3f}")
            assert worst < FINITE_DIFFERENCE_GRAD
            assert gap > GRID_ENDS_TERM_MIN  # the two surrogate placements do give different feedback

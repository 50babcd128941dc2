"""A differentiable K-step grid softmax for training with an approximate softmax.

Definitions ("How Much Softmax Do You Need in LLMs?", section "What changes when you train": its K-interval operators)
-----------------------------------------------------------------------------------------------------------------
Scores ``s_j`` are the natural-log attention logits of one row (already multiplied by the softmax
scale). A row's grid has ends ``lo <= hi`` and ``K`` *equal* steps

    delta = (hi - lo) / K,        grid values  g_k = lo + k * delta,   k = 0 .. K,

i.e. ``K + 1`` exponential grid values ``exp(g_k)``. (This is the study's step ratio ``R = 1``; the
training study uses uniform steps, so no ratio is offered here.) A score's grid coordinate is
``u_j = (s_j - lo) / delta``.

Grid ends (:class:`Calibration`):

* ``MINMAX``: ``hi = max_j s_j``, ``lo = min_j s_j`` over the row's valid positions, so every valid
  score lies on ``[lo, hi]`` and ``delta = (max - min) / K``.
* ``FIXED_WINDOW``: ``hi = max_j s_j``, ``lo = hi - window`` (``window`` = 6 nats by default), so
  ``delta = window / K`` does not depend on the scores; a score below ``lo`` gets weight 0.

Weights (:class:`Rounding`), written relative to ``hi`` (a common factor the normalization removes):

* ``LERP``: ``w_j = (1 - f) exp(g_i - hi) + f exp(g_{i+1} - hi)`` with ``i = floor(u_j)`` clamped to
  ``[0, K - 1]`` and ``f = u_j - i`` — the piecewise-linear interpolation of ``exp`` between the two
  neighbouring grid values. Forward and backward are this function.
* ``HARD_PRE``: forward ``w_j = exp(g_n - hi)`` with ``n = round_half_even(u_j)`` (nearest grid
  value); backward takes the derivative of the LERP weights ``w_j`` in its place (a straight-through
  surrogate on the *unnormalized* weights), then the normalization's derivative at the hard weights.
* ``HARD_POST``: the same hard forward; backward is the derivative of the *normalized* LERP
  probabilities ``w_j^LERP / sum_k w_k^LERP`` (the surrogate after normalization).

Probabilities are ``p_j = w_j / sum_k w_k`` over valid positions; masked positions and rows without a
valid position give 0.

Feedback through the grid's ends (:class:`EndsFeedback`):

* ``KEEP``: ``lo`` and ``hi`` are functions of the scores, so a score that sets an end also moves the
  whole grid (the calibration path) — exact derivative of the forward (or its surrogate).
* ``DETACH``: ``lo`` and ``hi`` are detached (``.detach()`` on the row min/max). The scores that sit at
  the ends keep their direct derivative through ``u_j``; only the calibration path is cut. This equals
  :func:`grid_softmax_with_ends` with the ends passed in as constants.

With ``KEEP`` the operator is shift invariant (adding ``c`` to a row changes nothing), so its gradient
sums to zero over each row; with ``DETACH`` it generally does not.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..modes import Mode


class EndsFeedback(Mode):
    """Whether gradients flow through the grid's ends (``lo``, ``hi``)."""

    KEEP = "keep"
    DETACH = "detach"


class Calibration(Mode):
    """Where the grid's ends come from."""

    MINMAX = "minmax"
    FIXED_WINDOW = "fixed_window"


class Rounding(Mode):
    """Forward rule and backward surrogate for putting scores on the grid."""

    LERP = "lerp"
    HARD_PRE = "hard_pre"
    HARD_POST = "hard_post"


@dataclass(frozen=True)
class GridSoftmaxConfig:
    """Options of :func:`grid_softmax`.

    Parameters
    ----------
    steps : int
        ``K``, the number of equal steps per row (``K + 1`` grid values), ``K >= 1``.
    calibration : Calibration
        ``MINMAX`` (row min/max) or ``FIXED_WINDOW`` (``window`` nats below the row max).
    ends : EndsFeedback
        ``KEEP`` or ``DETACH`` the feedback through the grid's ends.
    rounding : Rounding
        ``LERP``, ``HARD_PRE`` or ``HARD_POST``.
    window : float
        Width of the fixed window in nats (``FIXED_WINDOW`` only), > 0.

    String values of the enums (e.g. ``"minmax"``) are converted; anything else raises ``ValueError``.
    """

    steps: int = 32
    calibration: Calibration = Calibration.MINMAX
    ends: EndsFeedback = EndsFeedback.KEEP
    rounding: Rounding = Rounding.LERP
    window: float = 6.0

    def __post_init__(self) -> None:
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"steps={self.steps!r} is not valid; accepted: an integer K >= 1")
        if not (isinstance(self.window, (int, float)) and 0.0 < float(self.window) < float("inf")):
            raise ValueError(f"window={self.window!r} is not valid; accepted: a finite number of nats > 0")
        object.__setattr__(self, "calibration", Calibration.parse(self.calibration, "calibration"))
        object.__setattr__(self, "ends", EndsFeedback.parse(self.ends, "ends"))
        object.__setattr__(self, "rounding", Rounding.parse(self.rounding, "rounding"))

    def label(self) -> str:
        """Short name, e.g. ``"K32 minmax lerp keep"``."""
        return f"K{self.steps} {self.calibration.value} {self.rounding.value} {self.ends.value}"


class _StraightThrough(torch.autograd.Function):
    """Forward returns ``hard``; backward sends the incoming gradient to ``surrogate``."""

    @staticmethod
    def forward(ctx, hard: torch.Tensor, surrogate: torch.Tensor) -> torch.Tensor:  # noqa: D401
        return hard.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return None, grad


def _check_scores(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if not isinstance(scores, torch.Tensor) or not scores.is_floating_point() or scores.dim() < 1:
        raise ValueError("scores must be a floating-point tensor of shape (..., S_k)")
    if mask is None:
        return torch.ones_like(scores, dtype=torch.bool)
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise ValueError("mask must be a bool tensor (True = attend) broadcastable to scores (..., S_k)")
    try:
        return torch.broadcast_to(mask, scores.shape)
    except RuntimeError:
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to scores {tuple(scores.shape)}"
        ) from None


def grid_ends(
    scores: torch.Tensor,
    calibration: Calibration | str = Calibration.MINMAX,
    window: float = 6.0,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The grid's ends of each row, differentiable in ``scores``.

    Parameters
    ----------
    scores : torch.Tensor
        Shape ``(..., S_k)``, natural-log logits.
    calibration : Calibration
        ``MINMAX``: ``(min, max)`` of the valid scores; ``FIXED_WINDOW``: ``(max - window, max)``.
    window : float
        Fixed-window width in nats.
    mask : torch.Tensor, optional
        Bool, broadcastable to ``scores``; ``True`` marks valid positions.

    Returns
    -------
    (lo, hi) : tuple of torch.Tensor
        Each of shape ``(..., 1)``. Rows without a valid position get ``lo = hi = 0``.
    """
    calibration = Calibration.parse(calibration, "calibration")
    valid = _check_scores(scores, mask)
    any_valid = valid.any(dim=-1, keepdim=True)
    neg_inf = torch.full_like(scores, float("-inf"))
    hi = torch.where(valid, scores, neg_inf).amax(dim=-1, keepdim=True)
    hi = torch.where(any_valid, hi, torch.zeros_like(hi))
    if calibration is Calibration.MINMAX:
        lo = torch.where(valid, scores, -neg_inf).amin(dim=-1, keepdim=True)
        lo = torch.where(any_valid, lo, torch.zeros_like(lo))
    else:
        lo = hi - float(window)
    return lo, hi


def _normalize(w: torch.Tensor) -> torch.Tensor:
    z = w.sum(dim=-1, keepdim=True)
    return w / torch.where(z > 0, z, torch.ones_like(z))


def grid_softmax_with_ends(
    scores: torch.Tensor,
    lo: torch.Tensor,
    hi: torch.Tensor,
    steps: int,
    rounding: Rounding | str = Rounding.LERP,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Grid softmax on given ends (whatever graph ``lo`` and ``hi`` carry is differentiated through).

    Parameters
    ----------
    scores : torch.Tensor
        Shape ``(..., S_k)``, natural-log logits.
    lo, hi : torch.Tensor
        Grid ends, broadcastable to ``(..., 1)``, ``lo <= hi``. Valid scores below ``lo`` get weight 0;
        scores above ``hi`` are extrapolated on the top segment (LERP) or clamped to the top grid
        value (hard).
    steps : int
        ``K >= 1``.
    rounding : Rounding
        ``LERP``, ``HARD_PRE`` or ``HARD_POST`` (module docstring).
    mask : torch.Tensor, optional
        Bool, broadcastable to ``scores``; ``True`` marks valid positions.

    Returns
    -------
    torch.Tensor
        Probabilities of shape ``(..., S_k)`` and the dtype of ``scores``; each row with a valid
        in-window position sums to 1. A row whose ends coincide (``hi == lo``) gives equal weights
        to its valid positions at ``hi``.
    """
    rounding = Rounding.parse(rounding, "rounding")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps={steps!r} is not valid; accepted: an integer K >= 1")
    valid = _check_scores(scores, mask)
    lo = torch.as_tensor(lo, dtype=scores.dtype, device=scores.device)
    hi = torch.as_tensor(hi, dtype=scores.dtype, device=scores.device)
    k = float(steps)
    delta = (hi - lo) / k
    flat = delta <= 0
    delta_safe = torch.where(flat, torch.ones_like(delta), delta)
    s = torch.where(valid, scores, lo.expand_as(scores))  # masked (maybe -inf) scores never enter the math
    u = torch.where(flat, torch.full_like(s, k), (s - lo) / delta_safe)
    inside = valid & (u >= 0)
    i = torch.floor(u).clamp(0.0, k - 1.0).detach()
    f = u - i
    log_w_lo = -(k - i) * delta  # g_i - hi
    w_lerp = (1.0 - f) * torch.exp(log_w_lo) + f * torch.exp(log_w_lo + delta)
    zero = torch.zeros_like(w_lerp)
    w_lerp = torch.where(inside, w_lerp, zero)
    if rounding is Rounding.LERP:
        return _normalize(w_lerp)
    n = torch.round(u).clamp(0.0, k).detach()
    w_hard = torch.where(inside, torch.exp(-(k - n) * delta), zero).detach()
    if rounding is Rounding.HARD_PRE:
        return _normalize(_StraightThrough.apply(w_hard, w_lerp))
    return _StraightThrough.apply(_normalize(w_hard), _normalize(w_lerp))


def grid_softmax(
    scores: torch.Tensor,
    config: GridSoftmaxConfig | None = None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Grid softmax over the last dimension, with the ends from ``config`` (module docstring).

    Parameters
    ----------
    scores : torch.Tensor
        Shape ``(..., S_k)``, natural-log logits (softmax scale applied). Not modified.
    config : GridSoftmaxConfig, optional
        Steps, calibration, ends feedback, rounding, window; default ``GridSoftmaxConfig()``
        (K = 32, MinMax, keep, LERP).
    mask : torch.Tensor, optional
        Bool, broadcastable to ``scores``; ``True`` marks valid positions (e.g. a causal mask).

    Returns
    -------
    torch.Tensor
        Probabilities, shape ``(..., S_k)``; masked positions and rows without a valid position are 0.
    """
    config = GridSoftmaxConfig() if config is None else config
    if not isinstance(config, GridSoftmaxConfig):
        raise ValueError(f"config must be a GridSoftmaxConfig, got {type(config).__name__}")
    lo, hi = grid_ends(scores, config.calibration, config.window, mask)
    if config.ends is EndsFeedback.DETACH:
        lo, hi = lo.detach(), hi.detach()
    return grid_softmax_with_ends(scores, lo, hi, config.steps, config.rounding, mask)


def grid_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    config: GridSoftmaxConfig | None = None,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """``grid_softmax(scale * q k^T) v`` — attention with the grid softmax in place of softmax.

    Parameters
    ----------
    q : torch.Tensor
        Shape ``(..., S_q, D)``.
    k, v : torch.Tensor
        Shapes ``(..., S_k, D)`` and ``(..., S_k, D_v)``.
    config : GridSoftmaxConfig, optional
        As in :func:`grid_softmax`.
    mask : torch.Tensor, optional
        Bool, broadcastable to ``(..., S_q, S_k)``; ``True`` = attend.
    scale : float, optional
        Softmax scale; default ``D ** -0.5``.

    Returns
    -------
    torch.Tensor
        Shape ``(..., S_q, D_v)``.
    """
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: need q (..., S_q, D), "
            "k (..., S_k, D), v (..., S_k, D_v)"
        )
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    return torch.matmul(grid_softmax(scores, config, mask), v)

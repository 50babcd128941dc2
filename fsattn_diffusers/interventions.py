"""Interventions on the attention probabilities, in exact (float32) arithmetic.

Each intervention replaces ``p = softmax(s)`` of one query row (``s_j = scale * q . k_j`` in nats,
over the row's valid keys) by other weights, renormalized to sum to one over the valid keys:

``exact``
    softmax itself (the control).
``top:F``
    keep the ``ceil(F * n)`` largest scores of the ``n`` valid ones (at least one; ties go to the
    earlier key), zero the rest, renormalize: ``p_j = e^{s_j} [j kept] / sum_kept e^{s_i}``.
``equal:F``
    the same kept positions, every kept position the same weight ``1 / kept``.
``grid:K:R``
    a K-step score grid from the row minimum ``lo`` to the row maximum ``hi`` (span ``D = hi - lo``).
    Step ``i = 0 .. K-1``, counted down from the maximum, has width

        ``w_i = D * R^(i / (K-1)) / sum_{t=0}^{K-1} R^(t / (K-1))``   (``K = 1``: ``w_0 = D``),

    so consecutive widths grow by the constant factor ``R^(1/(K-1))`` away from the maximum and the
    widest over the narrowest step is ``R``: ``R = 1`` is uniform, ``R > 1`` finer near the maximum,
    ``R < 1`` finer near the minimum. The ``K + 1`` grid values are ``g_0 = hi``,
    ``g_j = hi - (w_0 + ... + w_{j-1})``, ``g_K = lo``; each score moves to the nearest grid value
    (a tie to the one nearer the maximum) and ``p_j ∝ e^{g(s_j)}``. A row has at most ``K + 1``
    distinct weights.
``octave:L`` (anchored at the row maximum)
    ``x_j = (s_j - max) log2(e)`` (octaves below the maximum), rounded to the nearest multiple of
    ``1/L`` (half to even), ``w_j = S(x_r)`` with ``S(x) = 2^floor(x) (1 + x - floor(x))``, the line
    through neighbouring powers of two: ``L`` levels per octave, ``{1, 1 + 1/L, ...} * 2^n``.
    ``L = 2`` is Rowmax-H15's ``{1, 1.5} * 2^n`` (:func:`fsattn_diffusers.exponent.rowmax_h15`).
``octave:L:abs[:BITS]`` (a fixed absolute lattice)
    the same levels on the fixed ``log2`` lattice of the probabilities, as post-training log2
    quantizers place it: ``x_j = log2 p_j``, code ``c = round(-L x_j)``; codes above ``2^BITS - 1``
    (default 8 bits) give 0; ``w_j = S(-c / L)``. The row maximum falls between lattice values with a
    different phase in every row. Weights are renormalized like every other intervention, so only the
    anchor differs from ``octave:L``.
``lerp2``
    ``w_j = S(x_j)`` unrounded (linear interpolation between powers of two, anchored at the maximum).
``scale:A``
    ``softmax(A * s)``: ``A < 1`` flattens, ``A > 1`` sharpens.
``flatten:J`` / ``sharpen:J``
    ``scale:A`` with ``A < 1`` / ``A > 1`` chosen per attention call (and batch entry) so that the mean
    row-wise Jensen-Shannon divergence from softmax of :data:`MATCH_ROWS` sampled query rows (fixed seed)
    is ``J`` nats (bisection on ``log A`` within ``[1/MATCH_RANGE, MATCH_RANGE]``; the bound when ``J`` is
    out of reach): flattening and sharpening at equal JSD. :func:`resolve_for_call` turns one into the
    concrete ``scale:A`` of a call; :func:`weights` needs the resolved one.

Rows without a valid key get all-zero weights (and a zero attention output).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import List, Optional, Sequence

import torch

from .exponent import LOG2E

#: Score elements (rows x keys, all heads) held at once by :func:`intervened_attention`.
SLAB_ELEMENTS = 1 << 24
#: Default code width of the absolute log2 lattice.
DEFAULT_ABS_BITS = 8


class Kind(str, Enum):
    EXACT = "exact"
    TOP = "top"
    EQUAL = "equal"
    GRID = "grid"
    OCTAVE = "octave"
    LERP2 = "lerp2"
    SCALE = "scale"
    FLATTEN = "flatten"
    SHARPEN = "sharpen"


ANCHORS = ("row", "abs")
SYNTAX = ("exact, top:F, equal:F (0 < F <= 1), grid:K:R (K >= 1 steps, ratio R > 0), octave:L, "
          "octave:L:abs[:BITS] (L >= 1 levels per octave), lerp2, scale:A (A > 0), flatten:J, sharpen:J "
          "(0 < J < ln 2, JSD in nats)")
#: Query rows, seed, bisection steps and alpha range of the JSD-matched scalings.
MATCH_ROWS, MATCH_SEED, MATCH_ITERS, MATCH_RANGE = 32, 0, 30, 1e3


def jsd_rows(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Row-wise Jensen-Shannon divergence (nats) of distributions on the last axis (0 log 0 = 0)."""
    p, q = p.to(torch.float64), q.to(torch.float64)
    m = 0.5 * (p + q)
    kl = lambda a: (torch.xlogy(a, a) - torch.xlogy(a, m)).sum(dim=-1)  # noqa: E731
    return torch.clamp(0.5 * (kl(p) + kl(q)), min=0.0)



def _number(text: str, what: str, kind: type = float):
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"{what} {text!r} is not a number; accepted: {SYNTAX}") from None


@dataclass(frozen=True)
class Intervention:
    """One intervention (see the module docstring); build with :func:`parse_intervention` or directly.

    Parameters
    ----------
    kind : Kind
    fraction : float
        ``top`` / ``equal``: kept fraction of the valid positions, in (0, 1].
    steps, ratio : int, float
        ``grid``: K steps and the widest / narrowest step ratio R.
    levels : int
        ``octave``: levels per octave L.
    anchor : str
        ``octave``: ``"row"`` (at the row maximum) or ``"abs"`` (fixed lattice of ``log2 p``).
    bits : int
        ``octave`` with ``anchor="abs"``: codes ``0 .. 2^bits - 1``.
    alpha : float
        ``scale``: score multiplier.
    target : float
        ``flatten`` / ``sharpen``: the mean row-wise JSD (nats) to match.
    """

    kind: Kind
    fraction: float = 1.0
    steps: int = 16
    ratio: float = 1.0
    levels: int = 2
    anchor: str = "row"
    bits: int = DEFAULT_ABS_BITS
    alpha: float = 1.0
    target: float = 0.005

    def __post_init__(self):
        object.__setattr__(self, "kind", Kind(self.kind))
        bad = None
        if self.kind in (Kind.TOP, Kind.EQUAL) and not 0.0 < self.fraction <= 1.0:
            bad = f"fraction {self.fraction} (accepted: 0 < F <= 1)"
        elif self.kind is Kind.GRID and (self.steps < 1 or not self.ratio > 0 or not math.isfinite(self.ratio)):
            bad = f"grid K={self.steps}, R={self.ratio} (accepted: K >= 1, finite R > 0)"
        elif self.kind is Kind.OCTAVE and (self.levels < 1 or self.anchor not in ANCHORS or not 1 <= self.bits <= 16):
            bad = f"octave L={self.levels}, anchor={self.anchor!r}, bits={self.bits} " \
                  f"(accepted: L >= 1, anchor row or abs, 1 <= bits <= 16)"
        elif self.kind is Kind.SCALE and (not self.alpha > 0 or not math.isfinite(self.alpha)):
            bad = f"alpha {self.alpha} (accepted: finite A > 0)"
        elif self.kind in (Kind.FLATTEN, Kind.SHARPEN) and not 0.0 < self.target < math.log(2.0):
            bad = f"JSD target {self.target} (accepted: 0 < J < ln 2)"
        if bad:
            raise ValueError(f"unsupported intervention {bad}")

    @property
    def label(self) -> str:
        """Canonical text, accepted back by :func:`parse_intervention`."""
        k = self.kind
        if k in (Kind.EXACT, Kind.LERP2):
            return k.value
        if k in (Kind.TOP, Kind.EQUAL):
            return f"{k.value}:{self.fraction:g}"
        if k is Kind.GRID:
            return f"grid:{self.steps}:{self.ratio:g}"
        if k is Kind.OCTAVE:
            if self.anchor == "row":
                return f"octave:{self.levels}"
            tail = "" if self.bits == DEFAULT_ABS_BITS else f":{self.bits}"
            return f"octave:{self.levels}:abs{tail}"
        if k in (Kind.FLATTEN, Kind.SHARPEN):
            return f"{k.value}:{self.target:g}"
        return f"scale:{self.alpha:g}"

    @property
    def family(self) -> str:
        """Kind and anchor (``octave-abs`` apart from ``octave``): the grouping of plots."""
        return "octave-abs" if self.kind is Kind.OCTAVE and self.anchor == "abs" else self.kind.value


def parse_intervention(text) -> Intervention:
    """An :class:`Intervention` from its label (``"top:0.5"``, ``"grid:16:4"``, ``"octave:2:abs"`` ...)."""
    if isinstance(text, Intervention):
        return text
    parts = [p.strip() for p in str(text).strip().lower().split(":")]
    head, args = parts[0], parts[1:]
    try:
        kind = Kind(head)
    except ValueError:
        raise ValueError(f"unknown intervention {text!r}; accepted: {SYNTAX}") from None
    need = {Kind.EXACT: (0, 0), Kind.LERP2: (0, 0), Kind.TOP: (1, 1), Kind.EQUAL: (1, 1), Kind.GRID: (2, 2),
            Kind.OCTAVE: (1, 3), Kind.SCALE: (1, 1), Kind.FLATTEN: (1, 1), Kind.SHARPEN: (1, 1)}[kind]
    if not need[0] <= len(args) <= need[1]:
        raise ValueError(f"intervention {text!r} has {len(args)} argument(s); accepted: {SYNTAX}")
    if kind in (Kind.TOP, Kind.EQUAL):
        return Intervention(kind, fraction=_number(args[0], "fraction"))
    if kind is Kind.GRID:
        return Intervention(kind, steps=_number(args[0], "steps", int), ratio=_number(args[1], "ratio"))
    if kind is Kind.OCTAVE:
        anchor = args[1] if len(args) > 1 else "row"
        if anchor not in ANCHORS:
            raise ValueError(f"octave anchor {anchor!r} in {text!r}; accepted: row, abs")
        if len(args) > 2 and anchor != "abs":
            raise ValueError(f"intervention {text!r}: BITS applies to the abs anchor only; accepted: {SYNTAX}")
        bits = _number(args[2], "bits", int) if len(args) > 2 else DEFAULT_ABS_BITS
        return Intervention(kind, levels=_number(args[0], "levels", int), anchor=anchor, bits=bits)
    if kind is Kind.SCALE:
        return Intervention(kind, alpha=_number(args[0], "alpha"))
    if kind in (Kind.FLATTEN, Kind.SHARPEN):
        return Intervention(kind, target=_number(args[0], "JSD target"))
    return Intervention(kind)


def parse_interventions(values: Sequence) -> List[Intervention]:
    """Interventions from labels or comma lists of labels; duplicates dropped, order kept."""
    out, seen = [], set()
    for value in values:
        items = [value] if isinstance(value, Intervention) else [v for v in str(value).split(",") if v.strip()]
        for item in items:
            iv = parse_intervention(item)
            if iv.label not in seen:
                seen.add(iv.label)
                out.append(iv)
    if not out:
        raise ValueError(f"no interventions given; accepted: a comma list of {SYNTAX}")
    return out


# -- the weights ------------------------------------------------------------------------------------
def grid_fractions(steps: int, ratio: float) -> torch.Tensor:
    """Cumulative grid offsets ``c_j = (w_0 + ... + w_{j-1}) / D`` (float64, ``c_0 = 0``, ``c_K = 1``)."""
    if steps == 1:
        widths = torch.ones(1, dtype=torch.float64)
    else:
        widths = torch.tensor(float(ratio), dtype=torch.float64) ** (torch.arange(steps, dtype=torch.float64)
                                                                      / (steps - 1))
    c = torch.cat([torch.zeros(1, dtype=torch.float64), torch.cumsum(widths, 0)])
    return c / c[-1]


def pow2_lerp(x: torch.Tensor) -> torch.Tensor:
    """``S(x) = 2^floor(x) (1 + x - floor(x))``; ``-inf`` gives 0."""
    n = torch.floor(x)
    finite = torch.isfinite(n)
    n0 = torch.where(finite, n, torch.zeros_like(n))
    w = torch.ldexp(1.0 + (x - n0), n0.to(torch.int32)) if x.dtype == torch.float32 else \
        torch.exp2(n0) * (1.0 + (x - n0))
    return torch.where(finite, w, torch.zeros_like(w))


def _masked(s: torch.Tensor, valid: Optional[torch.Tensor]) -> torch.Tensor:
    return s if valid is None else torch.where(valid, s, torch.full_like(s, float("-inf")))


def weights(scores: torch.Tensor, iv: Intervention, valid: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Probabilities of ``iv`` for rows of scores.

    Parameters
    ----------
    scores : Tensor (..., S_k)
        ``scale * q . k`` in nats (converted to float32; never modified).
    iv : Intervention
    valid : bool Tensor broadcastable to ``scores``, optional
        Valid keys (default: all).

    Returns
    -------
    Tensor (..., S_k) float32: rows sum to 1 over the valid keys (0 elsewhere; all 0 without a valid key).
    """
    if iv.kind in (Kind.FLATTEN, Kind.SHARPEN):
        raise ValueError(f"{iv.label} chooses its scale per call; resolve it first with resolve_for_call")
    s = _masked(scores.to(torch.float32), valid)
    m = s.amax(dim=-1, keepdim=True)
    has = torch.isfinite(m)
    m = torch.where(has, m, torch.zeros_like(m))
    ok = torch.isfinite(s)
    kind = iv.kind
    if kind is Kind.EXACT:
        w = torch.exp(s - m)
    elif kind is Kind.SCALE:
        w = torch.exp(iv.alpha * (s - m))
    elif kind in (Kind.TOP, Kind.EQUAL):
        n = ok.sum(dim=-1, keepdim=True)
        keep = torch.clamp(torch.ceil(n.to(torch.float64) * iv.fraction).to(torch.int64), min=1)
        order = torch.sort(s, dim=-1, descending=True, stable=True).indices
        ranked = torch.arange(s.shape[-1], device=s.device) < keep
        kept = torch.zeros_like(ok).scatter(-1, order, ranked.expand_as(order)) & ok
        w = torch.where(kept, torch.exp(s - m) if kind is Kind.TOP else torch.ones_like(s), torch.zeros_like(s))
    elif kind is Kind.GRID:
        lo = torch.where(ok, s, torch.full_like(s, float("inf"))).amin(dim=-1, keepdim=True)
        span = torch.where(has, m - lo, torch.zeros_like(m))
        c = grid_fractions(iv.steps, iv.ratio).to(s.device)
        u = torch.where(ok, (m - s).to(torch.float64) / torch.clamp(span, min=1e-30).to(torch.float64),
                        torch.zeros_like(s, dtype=torch.float64))
        idx = torch.bucketize(u, (c[:-1] + c[1:]) / 2.0)  # u on a midpoint -> the value nearer the maximum
        w = torch.exp(-(c[idx] * span.to(torch.float64))).to(torch.float32)
    elif kind is Kind.LERP2:
        w = pow2_lerp((s - m) * LOG2E)
    else:  # octave
        L = float(iv.levels)
        if iv.anchor == "row":
            w = pow2_lerp(torch.round((s - m) * LOG2E * L) / L)
        else:
            lse = torch.logsumexp(torch.where(ok, s - m, torch.full_like(s, float("-inf"))), dim=-1, keepdim=True)
            code = torch.round(-(s - m - lse) * LOG2E * L)  # log2 p on the lattice, code >= 0
            code = torch.clamp(code, min=0.0)
            top = torch.where(ok, code, torch.full_like(code, float("inf"))).amin(dim=-1, keepdim=True)
            top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
            # S(x + n) = 2^n S(x) for integer n: shift by whole octaves so the largest weight is O(1).
            shift = torch.floor(top / L) * L
            w = pow2_lerp(-(code - shift) / L)
            w = torch.where(code <= 2 ** iv.bits - 1, w, torch.zeros_like(w))
    w = torch.where(ok, w, torch.zeros_like(w))
    total = w.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, w / torch.where(total > 0, total, torch.ones_like(total)), torch.zeros_like(w))


def match_scale(scores: torch.Tensor, valid: Optional[torch.Tensor], target: float, sharpen: bool) -> float:
    """The alpha (> 1 with ``sharpen``, else < 1) whose ``scale:alpha`` has mean row-wise JSD ``target``
    from softmax on these rows of scores (..., S_k); bisection on ``log alpha``."""

    exact = Intervention(Kind.EXACT)
    p = weights(scores, exact, valid)
    rows = p.sum(dim=-1) > 0
    if not bool(rows.any()):
        return 1.0
    lo, hi = (0.0, math.log(MATCH_RANGE)) if sharpen else (-math.log(MATCH_RANGE), 0.0)
    for _ in range(MATCH_ITERS):
        mid = 0.5 * (lo + hi)
        q = weights(scores, Intervention(Kind.SCALE, alpha=math.exp(mid)), valid)
        farther = float(jsd_rows(p, q)[rows].mean()) > target  # JSD grows as alpha moves away from 1
        if sharpen:
            lo, hi = (lo, mid) if farther else (mid, hi)
        else:
            lo, hi = (mid, hi) if farther else (lo, mid)
    return math.exp(0.5 * (lo + hi))


def resolve_for_call(iv, q: torch.Tensor, k: torch.Tensor, *, scale: float, kv_len: Optional[int] = None):
    """``iv`` itself, or for ``flatten:J`` / ``sharpen:J`` the ``scale:A`` matched on this call.

    ``q`` (H, S_q, D) and ``k`` (H, S_k, D) of one batch entry; :data:`MATCH_ROWS` query rows are
    sampled with :data:`MATCH_SEED`.
    """
    iv = parse_intervention(iv)
    if iv.kind not in (Kind.FLATTEN, Kind.SHARPEN):
        return iv
    n = q.shape[1]
    sel = torch.arange(n) if n <= MATCH_ROWS else \
        torch.randperm(n, generator=torch.Generator().manual_seed(MATCH_SEED))[:MATCH_ROWS].sort().values
    with torch.no_grad():
        s = torch.matmul(q[:, sel.to(q.device)].to(torch.float32), k.to(torch.float32).transpose(-1, -2)) * scale
        alpha = match_scale(s, valid_keys(k.shape[1], kv_len, q.device), iv.target, iv.kind is Kind.SHARPEN)
    return Intervention(Kind.SCALE, alpha=alpha)


def valid_keys(s_k: int, kv_len: Optional[int], device) -> Optional[torch.Tensor]:
    """Bool (S_k,) of the first ``kv_len`` keys, or ``None`` when all are valid."""
    if kv_len is None or kv_len >= s_k:
        return None
    return torch.arange(s_k, device=device) < kv_len


def _check(q, k, v, kv_lens):
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be (B, H, S, D); got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[:2] != k.shape[:2] or k.shape[:3] != v.shape[:3] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q, k, v shapes do not match as (B, H, S_q, D), (B, H, S_k, D), (B, H, S_k, D_v): "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if kv_lens is not None and tuple(kv_lens.shape) != (q.shape[0],):
        raise ValueError(f"kv_lens must be a (B,) = ({q.shape[0]},) tensor; got shape {tuple(kv_lens.shape)}")


def intervened_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, iv, *, scale: Optional[float] = None,
                         kv_lens: Optional[torch.Tensor] = None, slab_elements: int = SLAB_ELEMENTS) -> torch.Tensor:
    """Attention with the probabilities of ``iv``, in float32, chunked over query rows.

    Parameters
    ----------
    q : Tensor (B, H, S_q, D); k : Tensor (B, H, S_k, D); v : Tensor (B, H, S_k, D_v) — never modified.
    iv : Intervention or label (``flatten`` / ``sharpen`` are resolved per batch entry)
    scale : float, optional
        Softmax scale (default ``D ** -0.5``).
    kv_lens : int64 Tensor (B,), optional
        Valid keys per batch entry (a prefix).
    slab_elements : int
        At most this many scores (heads x rows x keys) are held at once (at least one row of all heads).

    Returns
    -------
    Tensor (B, H, S_q, D_v) float32.
    """
    iv = parse_intervention(iv)
    _check(q, k, v, kv_lens)
    b, h, s_q, d = q.shape
    s_k = k.shape[2]
    scale = d ** -0.5 if scale is None else float(scale)
    rows = max(1, slab_elements // max(1, h * s_k))
    out = torch.empty((b, h, s_q, v.shape[3]), dtype=torch.float32, device=q.device)
    with torch.no_grad():
        for i in range(b):
            kv_len = None if kv_lens is None else int(kv_lens[i])
            valid = valid_keys(s_k, kv_len, q.device)
            ivb = resolve_for_call(iv, q[i], k[i], scale=scale, kv_len=kv_len)
            kb, vb = k[i].to(torch.float32), v[i].to(torch.float32)
            for r0 in range(0, s_q, rows):
                s = torch.matmul(q[i, :, r0:r0 + rows].to(torch.float32), kb.transpose(-1, -2)) * scale
                out[i, :, r0:r0 + rows] = torch.matmul(weights(s, ivb, valid), vb)
    return out


#: The default set of ``fsattn sensitivity``: six kinds x two settings, the exact control, and flattening
#: and sharpening matched to one JSD.
DEFAULT_INTERVENTIONS = ("exact", "top:0.5", "top:0.1", "equal:0.5", "equal:1", "grid:16:1", "grid:16:4",
                         "octave:1", "octave:2", "octave:1:abs", "octave:2:abs", "scale:0.8", "scale:1.25",
                         "flatten:0.005", "sharpen:0.005")

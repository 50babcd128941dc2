"""Non-finite inputs (NaN, +-inf): detection and repair, the same for every backend (NUMERICS.md section 8).

A quantized pipeline spreads one non-finite input much further than exact attention does: the Hadamard
rotation mixes it into every element of its row, a block's shared exponent becomes 2^127 and flushes
the block's other elements, a per-tensor FP8 scale turns the whole tensor into zeros. The contract:

* :func:`detect` — per token, ``torch.aminmax`` of q, k and v over the head dim (NaN propagates, no float32 copy),
  reduced per (batch, head), keys past ``kv_lens`` left out. A token whose max - min overflows float32 only sends the
  call down the slow path, which then finds nothing to repair. One read pass of each input, no host sync.
* :func:`repair` — after one host sync (:class:`StagedFlags`, which waits for the flags only). Only when a slice
  is flagged: the non-finite elements of each tensor are counted; ``strict=True`` raises a one-line ``ValueError``;
  otherwise one warning per process, and the flagged (batch, head) slices of ``out`` (and ``lse``) are overwritten by
  exact float64 softmax attention on the same inputs, so the damage is exactly what exact attention
  produces (one NaN in q: its row; one +inf in k: the rows whose score with that key is +inf).
  Recipes with a per-tensor scale (``fp8_tensor`` V, ``fp8`` Q/K) are first re-run on a copy with the
  non-finite elements set to 0, because one such element changes the scale of every slice.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional, Tuple

import torch

from .formats import QKFormat, VFormat
from .notices import warn_once
from .smoothing import valid_prefix

# Score elements of one float64 block in the exact recomputation (128 MiB).
_EXACT_BLOCK = 1 << 24


def detect(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_lens: Optional[torch.Tensor] = None
           ) -> Optional[torch.Tensor]:
    """Flag the (batch, head) slices whose inputs may hold NaN or inf, without a host sync.

    Parameters
    ----------
    q : Tensor (B, H, S_q, D); k, v : Tensor (B, H, S_k, D) — any strides, never modified.
    kv_lens : int tensor (B,), optional
        Keys at positions >= kv_lens[b] are not read by attention and do not count.

    Returns
    -------
    Tensor (B, H) bool on the inputs' device: True where q, k or v holds a NaN or an inf in that slice.
    Per token, ``torch.aminmax`` over the head dim (one read, NaN propagates, no float32 copy of the input);
    the (B, H, S) extremes are then reduced in float32. ``None`` while ``torch.compile`` traces: the contract is not
    checked inside a compiled graph.
    """
    if torch.compiler.is_compiling():
        return None
    with torch.no_grad():
        valid = valid_prefix(kv_lens, k.shape[2], k.device)
        flags = None
        for i, t in enumerate((q, k, v)):
            lo, hi = torch.aminmax(t, dim=-1)  # (B, H, S)
            per_token = (hi.to(torch.float32) - lo.to(torch.float32))  # NaN or inf iff the token holds one
            if i > 0 and valid is not None:
                per_token = torch.where(valid[:, None, :], per_token, torch.zeros_like(per_token))
            bad = ~torch.isfinite(per_token.sum(dim=-1))
            flags = bad if flags is None else flags | bad
        return flags


def any_flagged(flags: Optional[torch.Tensor]) -> bool:
    """Whether any slice is flagged (a host sync); False while ``torch.compile`` traces (the check is skipped)."""
    if flags is None or torch.compiler.is_compiling():
        return False
    return bool(flags.any())


class StagedFlags:
    """Non-finite flags (B, H) bool on their device and a copy on the host, staged as soon as the flags exist.

    :meth:`any` waits for the work that produced the flags (a CUDA event recorded right after their copy), not for
    what the stream queued after them: the Triton backend stages its pre-pass's flags before it launches the attention
    kernel, so the call's one host sync returns while that kernel runs, and the host queues the next work meanwhile.
    """

    def __init__(self, flags: Optional[torch.Tensor]):
        self.flags = flags
        self._host = self._ready = None
        if flags is not None and flags.is_cuda and not torch.compiler.is_compiling():
            self._host = torch.empty(flags.shape, dtype=flags.dtype, pin_memory=True)
            self._host.copy_(flags, non_blocking=True)
            self._ready = torch.cuda.Event()
            self._ready.record()

    def any(self) -> bool:
        """Whether any slice is flagged (waits for the flags only); False without flags or while tracing."""
        if self._ready is None:
            return any_flagged(self.flags)
        self._ready.synchronize()
        return bool(self._host.any())


def count_nonfinite(q, k, v, flags: torch.Tensor, kv_lens: Optional[torch.Tensor]) -> Dict[str, int]:
    """Non-finite elements of q, k, v (keys past ``kv_lens`` left out) in the flagged slices."""
    with torch.no_grad():
        bi, hi = flags.nonzero(as_tuple=True)
        counts = {"q": int((~torch.isfinite(q[bi, hi])).sum())}
        valid = valid_prefix(kv_lens, k.shape[2], k.device)
        for name, t in (("k", k), ("v", v)):
            bad = (~torch.isfinite(t[bi, hi])).sum(dim=-1)  # (n, S_k)
            if valid is not None:
                bad = bad * valid[bi]
            counts[name] = int(bad.sum())
        return counts


def describe(counts: Dict[str, int]) -> str:
    return ", ".join(f"{name}: {n}" for name, n in counts.items() if n)


def warn_counts(counts: Dict[str, int], slices: int, action: str = "follow exact attention") -> None:
    """The one warning per process of ``strict=False`` (one line, attributed to the caller's frame)."""
    if any(counts.values()):
        warn_once("nonfinite", f"fsattn: non-finite input elements (NaN/inf) in {describe(counts)}; the {slices} affected "
                   f"(batch, head) slice(s) {action} (warned once per process)")


def check_strict(counts: Dict[str, int]) -> None:
    """Raise the one-line ValueError of ``strict=True`` when any count is non-zero."""
    if any(counts.values()):
        raise ValueError(f"fsattn attention: non-finite input elements (NaN/inf) in {describe(counts)}; "
                         f"accepted with strict=True: finite q, k, v (keys past kv_lens are not read)")


def exact_slices(q, k, v, *, scale: float, valid: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """Exact softmax attention in float64 on n gathered slices, IEEE semantics for NaN and inf.

    Parameters
    ----------
    q : Tensor (n, S_q, D); k, v : Tensor (n, S_k, D); valid : bool (n, S_k) or None.

    Returns
    -------
    out : float64 (n, S_q, D), rows with no valid key 0; lse : float64 (n, S_q), natural log of the
    sum over valid keys of exp(scale * q.k), -inf on rows with no valid key.
    """
    n, s_q, _ = q.shape
    s_k = k.shape[1]
    kd, vd = k.double(), v.double()
    if valid is not None:  # a padded key is never read: its garbage must not reach 0 * NaN in P V
        vd = torch.where(valid[..., None], vd, torch.zeros_like(vd))
    rows = max(1, _EXACT_BLOCK // max(1, s_k))
    outs, lses = [], []
    for r0 in range(0, s_q, rows):
        s = torch.matmul(q[:, r0:r0 + rows].double(), kd.transpose(1, 2)) * scale  # (n, r, S_k)
        if valid is not None:
            s = s.masked_fill(~valid[:, None, :], float("-inf"))
        p = torch.softmax(s, dim=-1)
        o = torch.matmul(p, vd)
        lse = torch.logsumexp(s, dim=-1)
        if valid is not None:
            none = ~valid.any(dim=-1)[:, None]  # (n, 1): a row with no valid key gives zeros
            o = torch.where(none[..., None], torch.zeros_like(o), o)
            lse = torch.where(none, torch.full_like(lse, float("-inf")), lse)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs, dim=1), torch.cat(lses, dim=1)


def _sanitized(t: torch.Tensor) -> torch.Tensor:
    return torch.nan_to_num(t, nan=0.0, posinf=0.0, neginf=0.0)


def repair(flags: torch.Tensor, q, k, v, out: torch.Tensor, lse: Optional[torch.Tensor], stats, recipe, *,
           scale: float, kv_lens: Optional[torch.Tensor], strict: bool,
           rerun: Callable[..., Tuple[torch.Tensor, Optional[torch.Tensor], Optional[Dict]]]):
    """The slow path, for flagged calls only (see the module docstring).

    Parameters
    ----------
    flags : bool (B, H) from :func:`detect`; q : (B, H, S_q, D); k, v : (B, H, S_k, D), never modified.
    out : (B, H, S_q, D) backend output (written in place); lse : (B, H, S_q) float32 or None.
    rerun : ``rerun(q, k, v) -> (out, lse, stats)``, the same backend call on other inputs.

    Returns
    -------
    (out, lse, stats) with the flagged slices equal to exact attention's (cast to ``out``'s dtype).
    """
    counts = count_nonfinite(q, k, v, flags, kv_lens)
    if not any(counts.values()):
        return out, lse, stats  # finite values whose max - min overflowed: nothing to repair
    if strict:
        check_strict(counts)
    bi, hi = flags.nonzero(as_tuple=True)
    warn_counts(counts, len(bi), "were computed with exact float64 attention")
    per_tensor = (counts["v"] and recipe.v_format == VFormat.FP8_TENSOR) or \
        ((counts["q"] or counts["k"]) and recipe.qk_format == QKFormat.FP8)
    if per_tensor:  # one element set the scale of every slice: re-run on a cleaned copy
        out, lse, stats = rerun(_sanitized(q), _sanitized(k), _sanitized(v))
    valid = valid_prefix(kv_lens, k.shape[2], k.device)
    for i in range(len(bi)):  # one slice at a time bounds the float64 temporaries
        b, h = bi[i:i + 1], hi[i:i + 1]
        o, l = exact_slices(q[b, h], k[b, h], v[b, h], scale=scale, valid=None if valid is None else valid[b])
        out[b, h] = o.to(out.dtype)
        if lse is not None:
            lse[b, h] = l.to(lse.dtype)
    return out, lse, stats

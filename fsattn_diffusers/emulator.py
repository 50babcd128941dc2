"""Tiled PyTorch reference of Fused-Softmax attention (paper Algorithm 1); see NUMERICS.md.

The loop runs over key tiles; all query rows of a chunk are processed together (query tiles matter only
for the rollback statistics), so no S_q x S_k matrix is ever built: the largest temporary is
(rows of a chunk) x ``tile_n``. Runs on CPU and CUDA.
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

import torch

from .exponent import LN2
from .numerics import MI355XNumerics, key_tile_order, numerics_for
from .numerics_accumulation import fp8_chained_mma, promotes_after
from .recipe import ROLLBACK_FLOOR_LIMIT_LOG2, Recipe
from .smoothing import q_smoothing_heads, smooth_inputs, valid_prefix

# Upper bound on (groups x rows x keys) elements of one score slab: ~256 MB of float32.
_SLAB_ELEMENTS = 1 << 26


def rollback_gate(tile_max: torch.Tensor, m: torch.Tensor, cap_log2: int) -> torch.Tensor:
    """Rows whose peak in this key tile passes the gate: ``rowmax(X_ij) - m > cap`` (Section 4.1).

    In the kernel the test reads the per-32-key block maxima of the affine coordinate; their maximum is
    the row maximum, so the row-level test here is the same predicate.
    """
    return (tile_max - m) > cap_log2


def lowering_gate(tile_max: torch.Tensor, m: torch.Tensor, m_high: torch.Tensor, floor_log2: int) -> torch.Tensor:
    """Rows whose peak in this key tile lies more than ``floor`` doublings below the reference ``m``
    (``Recipe.rollback_floor_log2``), while ``m`` may still go down: it stays above ``m_high`` (the row's highest
    reference) minus :data:`~fsattn_diffusers.recipe.ROLLBACK_FLOOR_LIMIT_LOG2`. A tile with no valid key (peak
    -inf) is not low. The reference is lowered at the second such tile in a row (see :func:`_attend_chunk`)."""
    return torch.isfinite(tile_max) & ((tile_max - m) < -floor_log2) & \
        (m - floor_log2 > m_high - ROLLBACK_FLOOR_LIMIT_LOG2)


def _new_stats() -> Dict[str, int]:
    return {"rollbacks": 0, "tiles": 0, "rollback_tiles": 0}


def _attend_chunk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: Optional[torch.Tensor],
                  post_mult: float, num: MI355XNumerics, stats: Dict[str, int], bias: Optional[torch.Tensor] = None,
                  kept: Optional[torch.Tensor] = None, tiles: Optional[Sequence[int]] = None):
    """Algorithm 1 for rows ``q`` (G, R, D) against keys ``k``/``v`` (G, S_k, D), operands prepared; ``bias``
    (G, S_k), optional, is added to the scores (doublings) before the maximum and the exponential, on the rows where
    ``kept`` (G, R) bool is set (all rows without it). ``tiles``: the key tiles in the order visited (default all,
    from tile 0; :func:`fsattn_diffusers.numerics.key_tile_order`); the first one seeds the frozen reference.

    Returns ``(O (G, R, D), l (G, R), m (G, R))``, unnormalized, m in base-2 units.
    """
    recipe = num.recipe
    g, r, _ = q.shape
    s_k = k.shape[1]
    n = num.tile_n
    neg_inf = torch.tensor(float("-inf"), device=q.device)
    m = torch.full((g, r), float("-inf"), device=q.device)
    m_high = m  # the highest reference so far (bounds a lowering)
    low_before = torch.zeros((g, r), dtype=torch.bool, device=q.device)  # the previous key tile was low
    l = torch.zeros((g, r), device=q.device)
    o = torch.zeros((g, r, v.shape[-1]), device=q.device)
    acc = None  # the FP8 wgmma's accumulator between fp32 promotions (where modelled: ``o_promotion_tiles``)
    n_qt = -(-r // num.tile_m)
    if tiles is None:
        tiles = range(-(-s_k // n))
    for j, t in enumerate(tiles):
        k0, k1 = t * n, min(t * n + n, s_k)
        x, parts = num.tile_scores(q, k[:, k0:k1])  # parts: what the kernel's Stage-A reads in place of x
        if post_mult != 1.0:
            x, parts = x * post_mult, None
        if bias is not None:  # Q smoothing's key term on the rows ``kept``
            x, parts = num.with_key_term(x, parts, bias[:, None, k0:k1], kept)
        vmask = None if valid is None else valid[:, None, k0:k1]
        if vmask is not None:
            x = torch.where(vmask, x, neg_inf)
        tile_max = num.row_peaks(x, m, parts)
        m_gate = m
        if valid is None:
            stats["tiles"] += g * n_qt
        else:
            stats["tiles"] += int(valid[:, k0].sum()) * n_qt  # tiles a kernel visits (kv_lens-bounded)
        if not recipe.frozen_max:
            m_new = torch.maximum(m, tile_max)
            rescale = torch.where(torch.isneginf(m_new), torch.ones_like(m), torch.exp2(m - m_new))
            o, l, m = o * rescale[..., None], l * rescale, m_new
        elif j == 0:
            m = m_high = num.seed(tile_max)  # line 2: the speculative reference, frozen from here on
        elif recipe.rollback:
            fire = rollback_gate(tile_max, m, num.cap_log2)
            if recipe.rollback_floor_log2 is not None:  # lowered at the second low tile in a row: one low tile
                # between high ones (sharp rows) would only bounce the reference down and back up
                low = lowering_gate(tile_max, m, m_high, recipe.rollback_floor_log2)
                fire, low_before = fire | (low & low_before), low
            if bool(fire.any()):  # rare path (lines 8-13): exact power-of-two recovery, up or (lowering) down
                step = torch.maximum(torch.ceil(tile_max - m), m_high - ROLLBACK_FLOOR_LIMIT_LOG2 - m)
                delta = torch.where(fire, step, torch.zeros_like(m))
                m = m + delta
                m_high = torch.maximum(m_high, m)
                down = torch.exp2(-delta)
                o, l = o * down[..., None], l * down
                if acc is not None:
                    acc = acc * down[..., None]
                stats["rollbacks"] += int(fire.sum())
                pad = n_qt * num.tile_m - r
                per_tile = torch.nn.functional.pad(fire, (0, pad)).reshape(g, n_qt, num.tile_m)
                stats["rollback_tiles"] += int(per_tile.any(dim=-1).sum())
        if parts is not None and j > 0:
            parts = parts._replace(m_gate=m_gate)  # a rollback moved m from it
        p = num.stage_a(x, torch.where(torch.isfinite(m), m, torch.zeros_like(m)), parts)
        if vmask is not None:
            p = torch.where(vmask, p, torch.zeros_like(p))
        p_hat, row_sum = num.stage_b(p)
        l = l + row_sum
        if not num.models_pv_accumulation:
            o = o + torch.matmul(p_hat, v[:, k0:k1])
            continue
        acc = fp8_chained_mma(acc, p_hat, v[:, k0:k1], num.acc_mant_bits)
        if promotes_after(j, num.o_promotion_tiles):
            o, acc = o + acc, None
    if acc is not None:
        o = o + acc
    return o, l, m


def _attend_rows(qo, ko, vo, valid, post, num: MI355XNumerics, stats, bias, kept):
    """All query rows ``qo`` (G, S_q, D) in chunks of whole query tiles, each visiting the key tiles in
    ``Recipe.key_order``; returns ``(O, l, m)`` as :func:`_attend_chunk`, for all rows."""
    g, s_q, _ = qo.shape
    s_k = ko.shape[1]
    tm, n = num.tile_m, num.tile_n
    out = [torch.empty((g, s_q, vo.shape[-1]), device=qo.device), torch.empty((g, s_q), device=qo.device),
           torch.empty((g, s_q), device=qo.device)]
    if num.recipe.key_order == "natural":  # every query tile visits the tiles alike: big chunks
        rows = max(tm, (_SLAB_ELEMENTS // max(1, g * n)) // tm * tm)  # one score slab stays bounded
        for r0 in range(0, s_q, rows):
            res = _attend_chunk(qo[:, r0:r0 + rows], ko, vo, valid, post, num, stats, bias,
                                None if kept is None else kept[:, r0:r0 + rows])
            for dst, src in zip(out, res):
                dst[:, r0:r0 + rows] = src
        return tuple(out)
    # Per query tile; the order depends on the number of key tiles holding valid keys, so slices (groups) with the
    # same count go together (without kv_lens: all of them, with no data-dependent step for torch.compile).
    if valid is None:
        groups = [(-(-s_k // n), slice(None))]
    else:
        n_valid = (valid.sum(dim=1).cpu() + n - 1) // n
        groups = [(c, (n_valid == c).nonzero().flatten().to(qo.device)) for c in sorted(set(n_valid.tolist()))]
    n_qt = -(-s_q // tm)
    for count, sel in groups:
        part = None if valid is None else valid[sel]
        for qt in range(n_qt):
            r0, r1 = qt * tm, min(qt * tm + tm, s_q)
            res = _attend_chunk(qo[sel, r0:r1], ko[sel], vo[sel], part, post, num, stats,
                                None if bias is None else bias[sel], None if kept is None else kept[sel, r0:r1],
                                key_tile_order(num.recipe.key_order, qt, n_qt, count))
            for dst, src in zip(out, res):
                dst[sel, r0:r1] = src
    return tuple(out)


def emulate_attention(q, k, v, recipe: Recipe, *, scale: float, kv_lens: Optional[torch.Tensor] = None,
                      return_lse: bool = False, return_stats: bool = False, q_lens: Optional[torch.Tensor] = None
                      ) -> Tuple[torch.Tensor, Optional[torch.Tensor], Optional[Dict]]:
    """Reference Fused-Softmax attention under ``recipe.numerics`` (a :class:`~fsattn_diffusers.recipe.Numerics`; a
    backend's own numerics: :func:`fsattn_diffusers.backends.reference_attention`).

    Parameters
    ----------
    q : Tensor (B, H, S_q, D); k, v : Tensor (B, H, S_k, D) — views of any strides, never modified.
    recipe : Recipe
    scale : float
        Softmax scale alpha.
    kv_lens : int64 tensor (B,), optional
        Valid keys per batch entry.
    q_lens : int64 tensor (B,), optional
        Valid queries per batch entry: Q smoothing's mean and switch count only those (every row is computed).

    Returns
    -------
    out : Tensor (B, H, S_q, D) in q's dtype; rows without a valid key are 0.
    lse : Tensor (B, H, S_q) float32, natural log ``ln(l) + m ln 2`` (less P's constant scale), or None.
    stats : dict with ``rollbacks``, ``tiles``, ``rollback_tiles``, ``rollback_rate``, or None.
    """
    num = numerics_for(recipe)
    b, h, s_q, d = q.shape
    s_k = k.shape[2]
    valid_b = valid_prefix(kv_lens, s_k, q.device)
    valid_q = valid_prefix(q_lens, s_q, q.device)
    with torch.no_grad():
        q_in, k_in, bias, lse_offset = smooth_inputs(q, k, recipe, scale, valid_b, valid_q)
        qo, ko, vo, post, bias, kept = num.operands(q_in, k_in, v, scale, valid_b, bias)
        if bias is not None and kept is None and recipe.smooth_q_min_ratio > 0.0:
            # the rows of the slices Q smoothing's switch takes (the others' term is 0; a kernel runs them without it)
            kept = q_smoothing_heads(q, recipe.smooth_q_min_ratio, valid_q)[:, :, None].expand(b, h, s_q)
        if bias is not None:
            bias = bias.reshape(b * h, s_k)
        if kept is not None:
            kept = kept.reshape(b * h, s_q)
        qo, ko, vo = (t.reshape(b * h, t.shape[2], t.shape[3]) for t in (qo, ko, vo))
        valid = None if valid_b is None else valid_b[:, None, :].expand(b, h, s_k).reshape(b * h, s_k)
        stats = _new_stats()
        o, l, m = _attend_rows(qo, ko, vo, valid, post, num, stats, bias, kept)
        out = torch.where((l == 0)[..., None], torch.zeros_like(o), o / l[..., None]).reshape(b, h, s_q, d).to(q.dtype)
        lse = None
        if return_lse:
            lse = torch.log(l) + (m - num.p_scale_log2) * LN2
            lse = torch.where(l == 0, torch.full_like(lse, float("-inf")), lse).reshape(b, h, s_q)
        if lse is not None and lse_offset is not None:  # the log-sum-exp of the unsmoothed scores
            lse = lse + lse_offset
    if return_stats:
        stats["rollback_rate"] = stats["rollback_tiles"] / max(1, stats["tiles"])
        return out, lse, stats
    return out, lse, None


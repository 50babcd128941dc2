"""Host side of the INT8 Q/K tier's kernel (:mod:`kernels.sm90.fused_attention_gluon_int8`): pre-pass, descriptors,
launch."""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from fsattn_diffusers.exponent import LOG2E
from fsattn_diffusers.recipe import Exponential
from fsattn_diffusers.smoothing import lse_offset, q_smoothing_ratio2

from .ops import _lse_shape, _ones_tile, _out_like, count_rollback_tiles, rollback_tile_words, run_fused, tma_desc
from .prepass import KEY_TILE
from .prepass_int8 import prepare_qk_int8, prepare_v_bf16
from ..token_mean import token_mean

#: Stage-A's exponential per Recipe.exponential: the kernel's EXP2 values (EXP2_SCHRAUDOLPH, EXP2_HW of
#: kernels.sm90.fused_attention_gluon_int8, which imports Triton).
EXP2_MODE = {Exponential.SCHRAUDOLPH: 0, Exponential.EXACT: 1}
# K/V pipeline slots (K8 16 KB + V16 32 KB per slot at D = 128) and registers of the worker partition.
INT8_STAGES = 3
INT8_WORKER_REGS = 240

def prepass_int8(q, k, v, scale: float, kv_lens=None, signs: bool = True, smooth_k: bool = True, flags=None,
                 smooth_q_ratio2: Optional[float] = None, q_lens=None):
    """``(q8, qs, k8, ks, v16, k_mean, bias, q_sel)``: :mod:`kernels.sm90.prepass_int8`'s operands for (B, H, S, D)
    q, k, v; ``flags`` (B * H,) int32, optional: the slices whose q, k or v (keys before ``kv_lens``) hold a NaN or an
    inf set to 1. ``smooth_q_ratio2`` (not None: ``Recipe.smooth_q``): Q smoothing with its per-slice switch at that
    ``float32(min_ratio^2)`` (0: every slice), its mean over the queries before ``q_lens``; ``bias`` (B, H, SKP)
    float32 is then its per-key term in doublings (0 on the slices the switch leaves out), else None; ``q_sel``
    (B * H,) int32, 1 on the slices the switch smooths (None without a switch: every slice or none)."""
    k_mean = token_mean(k, kv_lens) if smooth_k else None
    q_mean = q_sel = None
    if smooth_q_ratio2 is not None:
        if smooth_q_ratio2 > 0:
            q_mean, q_sel = token_mean(q, q_lens, ratio2=smooth_q_ratio2)
        else:
            q_mean = token_mean(q, q_lens)
    k8, ks, bias = prepare_qk_int8(k, 1.0, per_row=False, signs=signs, kv_lens=kv_lens, mean=k_mean, flags=flags,
                                   q_mean=q_mean, bias_mult=scale * LOG2E)
    q8, qs, _ = prepare_qk_int8(q, scale * LOG2E, per_row=True, signs=signs, mean=q_mean, flags=flags)
    return q8, qs, k8, ks, prepare_v_bf16(v, kv_lens, flags), k_mean, bias, q_sel


def attention_int8_from_operands(ops, out, s_q: int, s_k: int, kv_lens=None, lse=None, stats=None, cap=32.0,
                                 floor=math.inf, diagonal=False, m_offset=0.0, exp2=0, stages=INT8_STAGES,
                                 regs=INT8_WORKER_REGS):
    """Launch the kernel on :func:`prepass_int8`'s operands, writing ``out`` (B, H, S_q, D view, any strides);
    ``exp2``: Stage-A's exponential (:data:`EXP2_MODE`'s values). With Q smoothing's per-slice switch (``q_sel``) two
    launches, the slices without the key term first, then those with it; in each, the programs of the other slices
    return at once, so a slice the switch leaves out computes what the recipe without Q smoothing computes."""
    from .fused_attention_gluon_int8 import ONES_N, WG_ROWS, fsattn_fwd_gluon_int8_kernel

    q8, qs, k8, ks, v16 = ops[:5]
    bias = ops[6] if len(ops) > 6 else None
    q_sel = ops[7] if len(ops) > 7 and bias is not None else None
    b, h, sqp, d = q8.shape
    skp = k8.shape[2]
    stats, nkw, tile_bits = rollback_tile_words(b, h, sqp, skp, stats, q8.device)
    q_desc = tma_desc(q8.view(b * h * sqp, d), [WG_ROWS.value, d], "int8")
    k_desc = tma_desc(k8.view(b * h * skp, d), [KEY_TILE, d], "int8")
    v_desc = tma_desc(v16.view(b * h * skp, d), [KEY_TILE, d], "bfloat16")
    ones_desc = tma_desc(_ones_tile(q8.device, torch.bfloat16), [ONES_N.value, KEY_TILE], "bfloat16")
    for has_bias in ((False, True) if q_sel is not None else (bias is not None,)):
        fsattn_fwd_gluon_int8_kernel[(sqp // 128, b * h)](
            q_desc, k_desc, v_desc, ones_desc, qs, ks, bias if bias is not None else qs,
            q_sel if q_sel is not None else stats, out, lse if lse is not None else stats, stats,
            tile_bits if nkw else stats, nkw,
            kv_lens if kv_lens is not None else stats, *out.stride(), h, s_q, s_k, sqp, skp,
            D=d, BN=KEY_TILE, HAS_KVL=kv_lens is not None, WRITE_LSE=lse is not None, CAP=float(cap),
            FLOOR=float(floor), STAGES=stages, REGS=regs, DIAGONAL=diagonal, M_OFFSET=float(m_offset), EXP2=int(exp2),
            HAS_BIAS=has_bias, TERM_SEL=q_sel is not None, num_warps=4)
    count_rollback_tiles(stats, tile_bits)
    return out


def launch_args(recipe) -> dict:
    """The kernel's gate, key-order and exponential settings for an INT8 recipe
    (:func:`attention_int8_from_operands`)."""
    from .plan import FROZEN_MAX_OFFSET_GRID

    return dict(cap=float(recipe.rollback_cap_log2) if recipe.rollback else math.inf,
                floor=float(recipe.rollback_floor_log2) if recipe.rollback and recipe.rollback_floor_log2 else math.inf,
                diagonal=recipe.key_order == "diagonal",
                m_offset=round(recipe.frozen_max_offset_log2 * FROZEN_MAX_OFFSET_GRID) / FROZEN_MAX_OFFSET_GRID,
                exp2=EXP2_MODE[recipe.exponential])


def settings_key(recipe) -> str:
    """What the INT8 kernel takes from ``recipe``, as a string (a custom op's argument, built without leaving a
    ``torch.compile`` graph): the rotation's signs, K smoothing and :func:`launch_args`, comma-separated."""
    a = launch_args(recipe)
    ratio2 = q_smoothing_ratio2(recipe.smooth_q_min_ratio) if recipe.smooth_q else -1.0
    return ",".join(str(x) for x in (int(recipe.hadamard_signs), int(recipe.smooth_k), ratio2, a["cap"], a["floor"],
                                     int(a["diagonal"]), a["m_offset"], a["exp2"]))


def parse_settings_key(key: str):
    """``(signs, smooth_k, smooth_q_ratio2 or None, launch_args)`` from :func:`settings_key`'s string."""
    signs, smooth_k, ratio2, cap, floor, diagonal, m_offset, exp2 = key.split(",")
    return (bool(int(signs)), bool(int(smooth_k)), None if float(ratio2) < 0 else float(ratio2),
            dict(cap=float(cap), floor=float(floor), diagonal=bool(int(diagonal)), m_offset=float(m_offset),
                 exp2=int(exp2)))


def _fused_int8(q, k, v, kv_lens, scale, key, return_lse, out_bshd, want_stats, on_flags=None, q_lens=None):
    """:func:`fused_attention_int8_op`'s work; with ``on_flags`` (eager calls) the pre-pass also writes the non-finite
    flags, (B * H,) int32, and ``on_flags(flags)`` runs before the attention kernel's launch."""
    signs, smooth_k, ratio2, cfg = parse_settings_key(key)
    b, h, s_q, _ = q.shape
    out = _out_like(q, out_bshd)
    lse = torch.empty(_lse_shape(q, return_lse), dtype=torch.float32, device=q.device)
    stats = torch.zeros((2,), dtype=torch.int32, device=q.device)
    flags = torch.zeros((b * h,), dtype=torch.int32, device=q.device) if on_flags is not None else None
    ops = prepass_int8(q, k, v, scale, kv_lens, signs, smooth_k, flags, ratio2, q_lens)
    if on_flags is not None:
        on_flags(flags)
    attention_int8_from_operands(ops, out.transpose(1, 2) if out_bshd else out, s_q, k.shape[2], kv_lens,
                                 lse if return_lse else None, stats if want_stats else None, **cfg)
    if return_lse and ops[5] is not None:  # the log-sum-exp of the unsmoothed scores
        lse += lse_offset(q, ops[5], scale)
    return out, lse, stats


@torch.library.custom_op("fsattn::fused_attention_int8", mutates_args=())
def fused_attention_int8_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_lens: Optional[torch.Tensor],
                            scale: float, key: str, return_lse: bool, out_bshd: bool, want_stats: bool,
                            q_lens: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """INT8 Q/K Fused-Softmax attention on (B, H, S, D) views: ``(out, lse or (0,), stats (2,) int32)`` as
    :func:`kernels.sm90.ops.fused_attention_op` (``key``: :func:`settings_key`)."""
    return _fused_int8(q, k, v, kv_lens, scale, key, return_lse, out_bshd, want_stats, q_lens=q_lens)


@fused_attention_int8_op.register_fake
def _(q, k, v, kv_lens, scale, key, return_lse, out_bshd, want_stats, q_lens=None):
    return (_out_like(q, out_bshd), torch.empty(_lse_shape(q, return_lse), dtype=torch.float32, device=q.device),
            torch.empty((2,), dtype=torch.int32, device=q.device))


def fused_attention_int8(q, k, v, recipe, *, scale: float, kv_lens=None, return_lse=False, return_stats=False,
                         detect_nonfinite=False, q_lens=None):
    """Backend entry for INT8 recipes: (B, H, S, D) views in, ``(out (B, H, S_q, D) view, lse or None, stats or
    None, flags)`` as :func:`kernels.sm90.ops.fused_attention` (``flags``: with ``detect_nonfinite`` the pre-pass's
    :class:`fsattn_diffusers.nonfinite.StagedFlags`, else None)."""
    out_bshd = q.stride(1) < q.stride(2)
    if kv_lens is not None:
        kv_lens = kv_lens.to(device=q.device, dtype=torch.int32).contiguous()
    if q_lens is not None:
        q_lens = q_lens.to(device=q.device, dtype=torch.int32).contiguous()
    args = (q, k, v, kv_lens, float(scale), settings_key(recipe), bool(return_lse), out_bshd, bool(return_stats))
    return run_fused(lambda on_flags: _fused_int8(*args, on_flags=on_flags, q_lens=q_lens),
                     lambda: fused_attention_int8_op(*args, q_lens),
                     q, k, kv_lens, out_bshd, return_lse, return_stats, detect_nonfinite)


def attention_int8(q, k, v, recipe="int8-bf16", scale: Optional[float] = None, kv_lens=None):
    """(B, H, S, D) q, k, v -> (B, H, S_q, D) in q's dtype: the INT8 kernel alone (no backend selection)."""
    from fsattn_diffusers.recipe import get_recipe

    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return fused_attention_int8(q, k, v, get_recipe(recipe), scale=scale, kv_lens=kv_lens)[0]

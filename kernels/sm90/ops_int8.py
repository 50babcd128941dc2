"""Host side of the INT8 Q/K tier's kernel (:mod:`kernels.sm90.fused_attention_gluon_int8`): pre-pass, descriptors,
launch."""

from __future__ import annotations

import math
from typing import NamedTuple, Optional, Tuple

import torch

from fsattn_diffusers.exponent import LOG2E
from fsattn_diffusers.formats import PFormat, VFormat
from fsattn_diffusers.recipe import Exponential
from fsattn_diffusers.smoothing import lse_offset, q_smoothing_ratio2

from .ops import _lse_shape, _ones_tile, _out_like, count_rollback_tiles, rollback_tile_words, run_fused, tma_desc
from .plan import INT8_KERNEL_PV_FORMATS, P_HEADROOM_LOG2, P_SIGMA_FP8
from .prepass import KEY_TILE, prepare_v_fp8_channel
from .prepass_int8 import prepare_qk_int8, prepare_v_bf16
from ..token_mean import token_mean

#: Stage-A's exponential per Recipe.exponential: the kernel's EXP2 values (EXP2_SCHRAUDOLPH, EXP2_HW of
#: kernels.sm90.gluon_int8_stage_a, which imports Triton).
EXP2_MODE = {Exponential.SCHRAUDOLPH: 0, Exponential.EXACT: 1}
# K/V pipeline slots (K8 16 KB + V16 32 KB, or V8T 16 KB, per slot at D = 128; 4 slots: the kernel alone 3.4-5.6%
# faster than with 3 at the paper and Wan2.2 shapes, H100, outputs bit for bit the same) and registers of the worker
# partition (setmaxnreg; 256, gluon_pingpong's, ran whole calls 1-7% slower on the H100, outputs the same).
INT8_STAGES = 4
INT8_WORKER_REGS = 240
# The worker's registers in the launch with Q smoothing's key term: no spills in its key loop (offline sm_90a: at 240
# 64 B spilled there, 9 loads and 7 stores per key tile; at 248 2 local-memory instructions).
INT8_TERM_WORKER_REGS = 256
#: The V formats of the INT8 kernel (plan.INT8_KERNEL_PV_FORMATS): BF16 V (with BF16 P), E4M3 V with one scale per
#: channel (FP8 P).
INT8_V_FORMATS = tuple(dict.fromkeys(VFormat(v) for _, v in INT8_KERNEL_PV_FORMATS))


class Int8Operands(NamedTuple):
    """:func:`prepass_int8`'s operands (B, H as the inputs'; SQP, SKP their query and key counts padded to 128).

    q8, qs : (B, H, SQP, D) int8 and (B, H, SQP) fp32, one scale per query row (``alpha log2 e`` folded in).
    k8, ks : (B, H, SKP, D) int8 and (B, H, SKP / 128) fp32, one scale per key tile.
    v : (B, H, SKP, D) bf16 (V16), or (B, H, D, SKP) float8_e4m3fn (V8T, keys in the FP8 A-fragment order, one
        scale ``amax / 448`` per channel over the valid keys).
    vs : (B, H, D) fp32 V8T's channel scales (``V = V8T^T * vs``), None with V16.
    k_mean : (B, H, 1, D) fp32, K's token mean (K smoothing), else None.
    bias : (B, H, SKP) fp32 Q smoothing's per-key term in doublings (0 on the slices its switch leaves out), else None.
    q_sel : (B * H,) int32, 1 on the slices Q smoothing's switch smooths (None without a switch).
    """

    q8: torch.Tensor
    qs: torch.Tensor
    k8: torch.Tensor
    ks: torch.Tensor
    v: torch.Tensor
    vs: Optional[torch.Tensor]
    k_mean: Optional[torch.Tensor]
    bias: Optional[torch.Tensor]
    q_sel: Optional[torch.Tensor]


def prepass_int8(q, k, v, scale: float, kv_lens=None, signs: bool = True, smooth_k: bool = True, flags=None,
                 smooth_q_ratio2: Optional[float] = None, q_lens=None, v_format: str = VFormat.BF16) -> Int8Operands:
    """:mod:`kernels.sm90.prepass_int8`'s operands (:class:`Int8Operands`) for (B, H, S, D) q, k, v; ``flags``
    (B * H,) int32, optional: the slices whose q, k or v (keys before ``kv_lens``) hold a NaN or an inf set to 1.
    ``smooth_q_ratio2`` (not None: ``Recipe.smooth_q``): Q smoothing with its per-slice switch at that
    ``float32(min_ratio^2)`` (0: every slice), its mean over the queries before ``q_lens``. ``v_format``: one of
    :data:`INT8_V_FORMATS`."""
    if v_format not in INT8_V_FORMATS:
        raise ValueError(f"v_format {v_format!r} for the INT8 kernel; accepted: {', '.join(INT8_V_FORMATS)}")
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
    if v_format == VFormat.BF16:
        vq, vs = prepare_v_bf16(v, kv_lens, flags), None
    else:
        vq, vs = prepare_v_fp8_channel(v, kv_lens, flags)
    return Int8Operands(q8, qs, k8, ks, vq, vs, k_mean, bias, q_sel)


def attention_int8_from_operands(ops: Int8Operands, out, s_q: int, s_k: int, kv_lens=None, lse=None, stats=None,
                                 cap=32.0, floor=math.inf, diagonal=False, m_offset=0.0, exp2=0, pv_fp8=False,
                                 sigma=0.0, stages=INT8_STAGES, regs=INT8_WORKER_REGS,
                                 term_regs=INT8_TERM_WORKER_REGS):
    """Launch the kernel on :func:`prepass_int8`'s operands, writing ``out`` (B, H, S_q, D view, any strides);
    ``exp2``: Stage-A's exponential (:data:`EXP2_MODE`'s values); ``pv_fp8``, ``sigma``: FP8 P and V (``ops.v`` in
    E4M3) with P carried as ``P 2^sigma``, which the kernel computes with the exact exponential only, ``sigma`` =
    ``P_SIGMA_FP8`` and the gate's cap at most ``P_HEADROOM_LOG2`` (:func:`launch_args`). With Q smoothing's per-slice
    switch (``q_sel``) two launches, the slices without the key term first, then those with it; in each, the programs
    of the other slices return at once, so a slice the switch leaves out computes what the recipe without Q smoothing
    computes."""
    from .fused_attention_gluon_int8 import ONES_N, WG_ROWS, fsattn_fwd_gluon_int8_kernel

    if pv_fp8 != (ops.vs is not None):
        raise ValueError(f"pv_fp8={pv_fp8} with V in {ops.v.dtype}; accepted: pv_fp8 with the E4M3 V of "
                         f"prepass_int8(v_format='fp8_channel'), else BF16 V")
    if pv_fp8 and (exp2 != EXP2_MODE[Exponential.EXACT] or sigma != P_SIGMA_FP8 or cap > P_HEADROOM_LOG2):
        raise ValueError(f"FP8 P with exp2={exp2}, sigma={sigma}, cap={cap}; accepted: the exact exponential "
                         f"(exp2={EXP2_MODE[Exponential.EXACT]}), sigma={P_SIGMA_FP8}, cap <= {P_HEADROOM_LOG2}")
    b, h, sqp, d = ops.q8.shape
    skp = ops.k8.shape[2]
    stats, nkw, tile_bits = rollback_tile_words(b, h, sqp, skp, stats, ops.q8.device)
    q_desc = tma_desc(ops.q8.view(b * h * sqp, d), [WG_ROWS.value, d], "int8")
    k_desc = tma_desc(ops.k8.view(b * h * skp, d), [KEY_TILE, d], "int8")
    if pv_fp8:
        v_desc = tma_desc(ops.v.view(b * h * d, skp), [d, KEY_TILE], "float8e4nv")
        ones_desc = tma_desc(_ones_tile(ops.q8.device), [ONES_N.value, KEY_TILE], "float8e4nv")
    else:
        v_desc = tma_desc(ops.v.view(b * h * skp, d), [KEY_TILE, d], "bfloat16")
        ones_desc = tma_desc(_ones_tile(ops.q8.device, torch.bfloat16), [ONES_N.value, KEY_TILE], "bfloat16")
    bias, qs = ops.bias, ops.qs
    # the key terms per key tile, brought with K/V (without the term any fp32 descriptor of that block: Q's scales)
    b_desc = tma_desc((bias if bias is not None else qs).reshape(-1), [KEY_TILE], "float32")
    q_sel = ops.q_sel if bias is not None else None
    for has_bias in ((False, True) if q_sel is not None else (bias is not None,)):
        fsattn_fwd_gluon_int8_kernel[(sqp // 128, b * h)](
            q_desc, k_desc, v_desc, ones_desc, b_desc, qs, ops.ks,
            ops.vs if pv_fp8 else qs, q_sel if q_sel is not None else stats, out, lse if lse is not None else stats,
            stats, tile_bits if nkw else stats, nkw, kv_lens if kv_lens is not None else stats, *out.stride(), h, s_q,
            s_k, sqp, skp,
            D=d, BN=KEY_TILE, HAS_KVL=kv_lens is not None, WRITE_LSE=lse is not None, CAP=float(cap),
            FLOOR=float(floor), STAGES=stages, REGS=term_regs if has_bias else regs, DIAGONAL=diagonal,
            M_OFFSET=float(m_offset), EXP2=int(exp2),
            HAS_BIAS=has_bias, TERM_SEL=q_sel is not None, PV_FP8=bool(pv_fp8), SIGMA=float(sigma), num_warps=4)
    count_rollback_tiles(stats, tile_bits)
    return out


def launch_args(recipe) -> dict:
    """The kernel's gate, key-order, exponential and P/V settings for an INT8 recipe
    (:func:`attention_int8_from_operands`); FP8 P (``p_format="fp8_row"``) keeps the gate's cap at most
    ``P_HEADROOM_LOG2`` and is carried as ``P 2^P_SIGMA_FP8`` (sm90_numerics difference 13)."""
    from .plan import FROZEN_MAX_OFFSET_GRID

    pv_fp8 = recipe.p_format == PFormat.FP8_ROW
    cap = float(recipe.rollback_cap_log2) if recipe.rollback else math.inf
    return dict(cap=min(cap, float(P_HEADROOM_LOG2)) if pv_fp8 else cap,
                floor=float(recipe.rollback_floor_log2) if recipe.rollback and recipe.rollback_floor_log2 else math.inf,
                diagonal=recipe.key_order == "diagonal",
                m_offset=round(recipe.frozen_max_offset_log2 * FROZEN_MAX_OFFSET_GRID) / FROZEN_MAX_OFFSET_GRID,
                exp2=EXP2_MODE[recipe.exponential], pv_fp8=pv_fp8, sigma=float(P_SIGMA_FP8) if pv_fp8 else 0.0)


def settings_key(recipe) -> str:
    """What the INT8 kernel takes from ``recipe``, as a string (a custom op's argument, built without leaving a
    ``torch.compile`` graph): the rotation's signs, K smoothing, V's format and :func:`launch_args`,
    comma-separated."""
    a = launch_args(recipe)
    ratio2 = q_smoothing_ratio2(recipe.smooth_q_min_ratio) if recipe.smooth_q else -1.0
    return ",".join(str(x) for x in (int(recipe.hadamard_signs), int(recipe.smooth_k), ratio2, recipe.v_format,
                                     a["cap"], a["floor"], int(a["diagonal"]), a["m_offset"], a["exp2"],
                                     int(a["pv_fp8"]), a["sigma"]))


def parse_settings_key(key: str):
    """``(signs, smooth_k, smooth_q_ratio2 or None, v_format, launch_args)`` from :func:`settings_key`'s string."""
    signs, smooth_k, ratio2, v_format, cap, floor, diagonal, m_offset, exp2, pv_fp8, sigma = key.split(",")
    return (bool(int(signs)), bool(int(smooth_k)), None if float(ratio2) < 0 else float(ratio2), VFormat(v_format),
            dict(cap=float(cap), floor=float(floor), diagonal=bool(int(diagonal)), m_offset=float(m_offset),
                 exp2=int(exp2), pv_fp8=bool(int(pv_fp8)), sigma=float(sigma)))


def prepass_for(q, k, v, scale: float, key: str, kv_lens=None, flags=None, q_lens=None):
    """``(operands, launch)``: :func:`prepass_int8`'s operands for the recipe of :func:`settings_key`'s ``key`` and
    the keyword arguments :func:`attention_int8_from_operands` takes for it (the public call and the benchmark's)."""
    signs, smooth_k, ratio2, v_format, launch = parse_settings_key(key)
    return prepass_int8(q, k, v, scale, kv_lens, signs, smooth_k, flags, ratio2, q_lens, v_format), launch


def _fused_int8(q, k, v, kv_lens, scale, key, return_lse, out_bshd, want_stats, on_flags=None, q_lens=None):
    """:func:`fused_attention_int8_op`'s work; with ``on_flags`` (eager calls) the pre-pass also writes the non-finite
    flags, (B * H,) int32, and ``on_flags(flags)`` runs before the attention kernel's launch."""
    b, h, s_q, _ = q.shape
    out = _out_like(q, out_bshd)
    lse = torch.empty(_lse_shape(q, return_lse), dtype=torch.float32, device=q.device)
    stats = torch.zeros((2,), dtype=torch.int32, device=q.device)
    flags = torch.zeros((b * h,), dtype=torch.int32, device=q.device) if on_flags is not None else None
    ops, cfg = prepass_for(q, k, v, scale, key, kv_lens, flags, q_lens)
    if on_flags is not None:
        on_flags(flags)
    attention_int8_from_operands(ops, out.transpose(1, 2) if out_bshd else out, s_q, k.shape[2], kv_lens,
                                 lse if return_lse else None, stats if want_stats else None, **cfg)
    if return_lse and ops.k_mean is not None:  # the log-sum-exp of the unsmoothed scores
        lse += lse_offset(q, ops.k_mean, scale)
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

"""Pre-pass of the INT8 Q/K tier (``qk_format="int8"``): BF16 rounding, K smoothing, the signed Walsh-Hadamard
rotation, ``alpha log2 e`` (Q), one BF16 rounding, then symmetric INT8 with one fp32 scale ``amax / 127`` per query
row (Q) or per 128-key tile (K), in one Triton kernel per tensor; V to BF16 in a zero-padded layout.

Outputs (the attention kernel's operands, :mod:`kernels.sm90.fused_attention_gluon_int8`):

* Q8 (B, H, SQP, D) int8, QS (B, H, SQP) fp32: ``Q_value = Q8 * QS`` per row (zero rows: code 0, scale 1).
* K8 (B, H, SKP, D) int8, KS (B, H, SKP / 128) fp32: ``K_value = K8 * KS`` per key tile; keys at or past
  ``kv_lens`` are quantized as zeros, so they cannot move their tile's scale.
* V16 (B, H, SKP, D) bf16: V rounded to BF16, zero at and past ``kv_lens`` (the kernel's P is 0 there, and a zero row
  keeps a padded key's garbage out of ``0 * V``).

Each kernel can also flag the (batch, head) slices whose input holds a NaN or an inf (keys past ``kv_lens`` left out),
as :func:`kernels.nonfinite_flags.flag_nonfinite` does, from its own reads.

Rounding follows :func:`fsattn_diffusers.operands.prequantize_qk` and
:func:`fsattn_diffusers.formats.fake_quantize_int8_rows`: ``code = rne(y / s)`` with IEEE divisions, clamped to
[-127, 127].
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from fsattn_diffusers.formats import INT8_MAX as _INT8_MAX

from ..common import RNE_MAGIC, flag_nonfinite_rows, load_slice_rows
from .prepass import (INTERPRET, KEY_TILE, ROWS, _bf16_value, _hadamard_pm1, padded, rotate_scaled,
                      smoothed_bf16_rows, store_key_term)

# The largest INT8 code (codes -127..127), as a Triton constant.
INT8_MAX = tl.constexpr(float(_INT8_MAX))
# Warps per pre-pass program.
WARPS = 8


@triton.jit
def _int8_qk_kernel(X, sxb, sxh, sxs, sxd, OUT, SC, HM, MEAN, KVL, FLAGS, QMEAN, BIAS, bias_mult, H, S, SP, rsqrt_d,
                    mult, D: tl.constexpr, BS: tl.constexpr, PER_ROW: tl.constexpr, HAS_MEAN: tl.constexpr,
                    HAS_KVL: tl.constexpr, DOT_F32: tl.constexpr, HW_CVT: tl.constexpr,
                    HAS_FLAGS: tl.constexpr = False, HAS_BIAS: tl.constexpr = False):
    """Program (row tile, batch x head): ``BS`` rows to INT8 codes in OUT and their scale(s) in SC; ``HAS_BIAS`` (K):
    also Q smoothing's per-key term ``bias_mult * (QMEAN . k)`` of the smoothed rows into BIAS (B, H, SP), 0 on padded
    rows (smoothing.key_bias, fp32 sums in the kernel's order)."""
    pid_s = tl.program_id(0)
    bh = tl.program_id(1)
    x, rows, n = load_slice_rows(X, sxb, sxh, sxs, sxd, KVL, H, S, pid_s, bh, BS, D, HAS_KVL)
    if HAS_FLAGS:
        flag_nonfinite_rows(x, FLAGS, bh)
    cols = tl.arange(0, D)
    x = smoothed_bf16_rows(x.to(tl.float32), rows, n, cols, MEAN, bh, 1, D, HAS_MEAN,
                           X.dtype.element_ty == tl.bfloat16, HW_CVT)
    if HAS_BIAS:
        store_key_term(x, rows, cols, QMEAN, BIAS, bias_mult, bh, SP, D)
    y = rotate_scaled(x, tl.load(HM + cols[:, None] * D + cols[None, :]), rsqrt_d, mult, DOT_F32, False, HW_CVT)
    if PER_ROW:
        amax = tl.max(tl.abs(y), axis=1)
        sc = tl.where(amax == 0.0, 1.0, tl.math.div_rn(amax, tl.full(amax.shape, INT8_MAX, tl.float32)))
        t = tl.math.div_rn(y, tl.broadcast_to(sc[:, None], y.shape))
    else:
        amax = tl.max(tl.max(tl.abs(y), axis=1), axis=0)
        sc = tl.where(amax == 0.0, 1.0, tl.math.div_rn(amax, INT8_MAX))
        t = tl.math.div_rn(y, tl.full(y.shape, 1.0, tl.float32) * sc)
    code = tl.minimum(tl.maximum((t + RNE_MAGIC) - RNE_MAGIC, -INT8_MAX), INT8_MAX)
    tl.store(OUT + bh.to(tl.int64) * SP * D + rows[:, None] * D + cols[None, :], code.to(tl.int8))
    if PER_ROW:
        tl.store(SC + bh.to(tl.int64) * SP + rows, sc)
    else:
        tl.store(SC + bh * (SP // BS) + pid_s, sc)


@triton.jit
def _v_bf16_kernel(V, svb, svh, svs, svd, KVL, OUT, FLAGS, H, S, SP, D: tl.constexpr, BS: tl.constexpr,
                   HAS_KVL: tl.constexpr, HAS_FLAGS: tl.constexpr, HW_CVT: tl.constexpr):
    """Program (key tile, batch x head): ``BS`` keys of V to BF16 (nearest-even) in OUT, zero at and past the valid
    keys."""
    pid_s = tl.program_id(0)
    bh = tl.program_id(1)
    x, rows, n = load_slice_rows(V, svb, svh, svs, svd, KVL, H, S, pid_s, bh, BS, D, HAS_KVL)
    if HAS_FLAGS:
        flag_nonfinite_rows(x, FLAGS, bh)
    cols = tl.arange(0, D)
    if V.dtype.element_ty != tl.bfloat16:  # the interpreter's fp32 -> bf16 cast truncates: round first
        x = _bf16_value(x.to(tl.float32), HW_CVT)
    tl.store(OUT + bh.to(tl.int64) * SP * D + rows[:, None] * D + cols[None, :], x.to(tl.bfloat16))


def prepare_qk_int8(x: torch.Tensor, multiplier: float, per_row: bool, signs: bool, kv_lens=None, mean=None,
                    flags=None, q_mean=None, bias_mult: float = 1.0):
    """Q (``per_row=True``, one scale per row) or K (one scale per 128 keys) as INT8 codes and fp32 scales.

    Parameters
    ----------
    x : Tensor (B, H, S, D), any strides, fp16/bf16/fp32, CUDA (or CPU under TRITON_INTERPRET=1).
    multiplier : float
        ``alpha log2 e`` for Q, 1 for K (folded in before the BF16 rounding).
    signs : bool
        ``Recipe.hadamard_signs``: the rotation's fixed signs.
    kv_lens : int32 tensor (B,), optional (K): rows at or past ``kv_lens[b]`` are zeros.
    mean : Tensor (B, H, 1, D) float32, optional: subtracted from every valid row (``Recipe.smooth_k``).
    flags : (B * H,) int32, optional: set to 1 for the slices whose input (rows before ``kv_lens``) holds a NaN or an
        inf (never cleared).
    q_mean : Tensor (B, H, 1, D) float32, optional (K): Q smoothing's mean (0 on the slices its switch leaves out);
        then the per-key term ``bias_mult * (q_mean . k)`` of the smoothed keys is a third output.

    Returns
    -------
    codes : Tensor (B, H, SP, D) int8, SP = S rounded up to 128, padded rows zero.
    scales : Tensor (B, H, SP) (per row) or (B, H, SP / 128) float32.
    bias : Tensor (B, H, SP) float32 (with ``q_mean``; padded keys 0), else None.
    """
    b, h, s, d = x.shape
    sp = padded(s, ROWS)
    out = torch.empty((b, h, sp, d), dtype=torch.int8, device=x.device)
    scales = torch.empty((b, h, sp if per_row else sp // ROWS), dtype=torch.float32, device=x.device)
    hm = _hadamard_pm1(d, "bfloat16", str(x.device), signs)
    bias = torch.empty((b, h, sp), dtype=torch.float32, device=x.device) if q_mean is not None else None
    _int8_qk_kernel[(sp // ROWS, b * h)](
        x, *x.stride(), out, scales, hm, mean.reshape(b * h, d).contiguous() if mean is not None else scales,
        kv_lens if kv_lens is not None else scales, flags if flags is not None else scales,
        q_mean.reshape(b * h, d).contiguous() if q_mean is not None else scales,
        bias if bias is not None else scales, float(bias_mult), h, s, sp,
        1.0 / math.sqrt(d), float(multiplier), D=d, BS=ROWS, PER_ROW=per_row, HAS_MEAN=mean is not None,
        HAS_KVL=kv_lens is not None, DOT_F32=INTERPRET, HW_CVT=not INTERPRET, HAS_FLAGS=flags is not None,
        HAS_BIAS=q_mean is not None, num_warps=WARPS)
    return out, scales, bias


def prepare_v_bf16(v: torch.Tensor, kv_lens=None, flags=None) -> torch.Tensor:
    """V (B, H, S, D), any strides, as BF16 in a (B, H, SKP, D) zero-padded layout, keys at or past ``kv_lens[b]``
    zero (never read); ``flags`` as :func:`prepare_qk_int8`'s."""
    b, h, s, d = v.shape
    sp = padded(s, KEY_TILE)
    out = torch.empty((b, h, sp, d), dtype=torch.bfloat16, device=v.device)
    _v_bf16_kernel[(sp // KEY_TILE, b * h)](v, *v.stride(), kv_lens if kv_lens is not None else out, out,
                                            flags if flags is not None else out, h, s, sp, D=d, BS=KEY_TILE,
                                            HAS_KVL=kv_lens is not None, HAS_FLAGS=flags is not None,
                                            HW_CVT=not INTERPRET, num_warps=WARPS)
    return out

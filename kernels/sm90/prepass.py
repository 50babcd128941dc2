"""Fused pre-pass (paper Section 4.4): BF16 rounding, ``alpha log2 e`` (Q), the Walsh-Hadamard rotation and
MX quantization of Q and K in one kernel per tensor; V to FP8 (one scale per tensor or per
channel) or MX along the key axis.

Outputs are FP8 E4M3 tensors in the kernel's own padded layouts plus power-of-two exponents (see
:mod:`kernels.sm90.plan` for how MX values are carried in E4M3):

* Q8 (B, H, SQP, D), QE (B, H, SQP / 128) int32: ``Q_value = Q8 * 2^QE`` per 128-row query tile.
* K8 (B, H, SKP, D), KE (B, H, SKP / 128) int32: ``K_value = K8 * 2^KE`` per key tile.
* V8T (B, H, D, SKP) (transposed: K-major for the FP8 PV GEMM), VS (B, H, D) fp32: ``V = V8T^T * VS``.

Rounding follows :mod:`fsattn_diffusers.operands`: inputs to BF16; MXFP8 rounds the rotation (with
1/sqrt(d)) to BF16 and the scaled value again; MXFP6/MXFP4 round ``rotate * rsqrt(d) * multiplier`` once.
"""

from __future__ import annotations

import functools
import math
import os

import torch
import triton
import triton.language as tl

from fsattn_diffusers import sm90_numerics

from ..common import (flag_nonfinite_rows, load_slice_rows, pow2, round_bf16, round_e2m1, round_e2m3_scaled,
                      round_e4m3, round_elem, shared_exp)
from .plan import ELEM, FMT_E2M1, FMT_E4M3, RULE_ROUND_UP_175, KernelPlan

# Key-tile width of the attention kernel; K's reference exponent is shared by one tile (Section 3: N = 128).
KEY_TILE = sm90_numerics.TILE
# Rows per pre-pass program.
ROWS = 128
# Warps per pre-pass program (Q/K kernel, V kernels).
QK_WARPS = 8
V_WARPS = 8
# Persistent Q/K pre-pass: programs per SM (0: one program per 128-row tile) and software-pipeline stages of its loop.
# H200, paper shape, whole mxfp8 pre-pass: (0, 1) 0.48 ms, (2, 1) 0.45, (2, 2) 0.42, (1, 3) 0.47 (docs/design.md,
# "The pre-pass"). (2, 2) uses 112 KB of shared memory per program.
QK_PROGRAMS_PER_SM = 2
QK_STAGES = 2
# MXFP4 Q/K (E2M1 elements) takes one stage: 0.193 ms per tensor at (2, 1) against 0.264 at (2, 2) (H200; the
# same kernel as MXFP6 but for its constants, which went 0.205 -> 0.180 with the second stage).
QK_STAGES_E2M1 = 1
# Registers per thread (ptxas ``maxnreg``; None: no cap) of the Q/K pre-pass and of the MX V quantization kernel. 128
# keeps two 8-warp programs per SM where K with its mean and the non-finite flags took 160-182 registers (offline
# sm_90a, the runtime's unit-stride specialization; 4-80 spilled bytes at the cap), MX V 220 for MXFP4. H200, paper shape:
# K 0.308 -> 0.231 ms (mxfp8), 0.297 -> 0.215 (mxfp6), 0.349 -> 0.263 (mxfp4); MXFP4 V 0.592 -> 0.512 (record
# prepass_formats_h200.txt, docs/design.md "The pre-pass"). The per-tensor V kernel (80 registers) is left uncapped:
# capped it took 0.200 instead of 0.176 ms (record kernel_probes_h200/prepass_v_cap_mxfp8.txt).
QK_MAX_REGS = 128
V_MAX_REGS = 128
# MX element rounding by the short forms (_round_elems: E2M3 by the hardware E4M3 cast on a GPU, E2M1 on the fp32 bits)
# instead of common.round_elem; both give the same values (the E2M3 form keeps a negative zero's sign, as
# formats.round_to_elem does). H200, paper shape, MXFP6: Q 0.220 -> 0.171 ms, K 0.352 -> 0.297, V 0.520 -> 0.449.
FAST_ELEM_ROUNDING = True
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def _qk_prepass_kernel(X, sxb, sxh, sxs, sxd, OUT, OUTE, HM, H, S, SP, rsqrt_d, mult, N_TILES,
                       D: tl.constexpr, BS: tl.constexpr, HAD: tl.constexpr, ROUND_TWICE: tl.constexpr,
                       RULE: tl.constexpr, T0: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr,
                       MAXV: tl.constexpr, EMAX: tl.constexpr, TILE_REF: tl.constexpr,
                       DOT_F32: tl.constexpr, NAN_PAD: tl.constexpr, HAS_KVL: tl.constexpr, KVL,
                       HW_CVT: tl.constexpr = False, STAGES: tl.constexpr = 1, MEAN=None, HAS_MEAN: tl.constexpr = False,
                       QMEAN=None, BIAS=None, bias_mult=1.0, HAS_BIAS: tl.constexpr = False, QFLOOR=None,
                       HAS_QFLOOR: tl.constexpr = False, FLAGS=None, HAS_FLAGS: tl.constexpr = False,
                       FAST_ELEM: tl.constexpr = False, QSEL=None, HAS_QSEL: tl.constexpr = False):
    """Persistent: program ``p`` of ``P`` quantizes the (row tile, batch x head) pairs ``t = p, p + P, ...`` of the
    ``N_TILES`` (row tiles fastest), loading the Hadamard matrix once."""
    cols = tl.arange(0, D)
    if HAD:
        hm = tl.load(HM + cols[:, None] * D + cols[None, :])
    n_s = SP // BS
    for t in tl.range(tl.program_id(0), N_TILES, tl.num_programs(0), num_stages=STAGES):
        _qk_tile(X, sxb, sxh, sxs, sxd, OUT, OUTE, hm if HAD else cols, H, S, SP, rsqrt_d, mult, t % n_s, t // n_s,
                 D, BS, HAD, ROUND_TWICE, RULE, T0, MBITS, EMIN, MAXV, EMAX, TILE_REF, DOT_F32, NAN_PAD, HAS_KVL, KVL,
                 HW_CVT, MEAN, HAS_MEAN, QMEAN, BIAS, bias_mult, HAS_BIAS, QFLOOR, HAS_QFLOOR, FLAGS, HAS_FLAGS,
                 FAST_ELEM, QSEL, HAS_QSEL)


@triton.jit
def _qk_tile(X, sxb, sxh, sxs, sxd, OUT, OUTE, hm, H, S, SP, rsqrt_d, mult, pid_s, bh,
             D: tl.constexpr, BS: tl.constexpr, HAD: tl.constexpr, ROUND_TWICE: tl.constexpr,
             RULE: tl.constexpr, T0: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr,
             MAXV: tl.constexpr, EMAX: tl.constexpr, TILE_REF: tl.constexpr,
             DOT_F32: tl.constexpr, NAN_PAD: tl.constexpr, HAS_KVL: tl.constexpr, KVL, HW_CVT: tl.constexpr,
             MEAN, HAS_MEAN: tl.constexpr, QMEAN, BIAS, bias_mult, HAS_BIAS: tl.constexpr, QFLOOR,
             HAS_QFLOOR: tl.constexpr, FLAGS, HAS_FLAGS: tl.constexpr, FAST_ELEM: tl.constexpr, QSEL,
             HAS_QSEL: tl.constexpr):
    """One BS-row tile of one (batch, head): smoothing and BF16 rounding (:func:`smoothed_bf16_rows`; ``HAS_MEAN``:
    minus the token mean MEAN (B, H, D)), rotation by ``hm`` (the +-1 matrix ``diag(s) H``, (D, D)), scaling, MX
    quantization, E4M3 carry; writes its rows of OUT and its exponent(s) in OUTE. ``HAS_BIAS`` (K): also the per-key
    term ``bias_mult * (QMEAN . k_smoothed)`` of Q smoothing into BIAS (B, H, SP), 0 on padded rows. ``HAS_QFLOOR``
    (Q, one exponent per tile): the tile exponent is at least QFLOOR[bh] (sm90_numerics difference 9; an all-zero
    tile takes it). ``HAS_FLAGS``: FLAGS[bh] set to 1 when the tile's input holds a NaN or an inf
    (kernels.nonfinite_flags' contract, keys past kv_lens left out). ``HAS_QSEL``: Q smoothing's per-slice switch
    QSEL (B * H) int32; where it is 0 the Q pass skips subtracting its (zero) mean."""
    # K with kv_lens: rows at or past kv_lens[b] are zero, so they cannot raise the key tile's reference exponent.
    x, rows, n = load_slice_rows(X, sxb, sxh, sxs, sxd, KVL, H, S, pid_s, bh, BS, D, HAS_KVL)
    if HAS_FLAGS:
        flag_nonfinite_rows(x, FLAGS, bh)
    cols = tl.arange(0, D)
    q_on = 1
    if HAS_QSEL:  # QSEL is Q's: K's mean always; Q's where the switch takes the slice (elsewhere it is 0)
        q_on = tl.load(QSEL + bh)
    x = smoothed_bf16_rows(x.to(tl.float32), rows, n, cols, MEAN, bh, q_on, D, HAS_MEAN,
                           X.dtype.element_ty == tl.bfloat16, HW_CVT)
    if HAS_BIAS:  # 0 on the slices the switch leaves out, whose q_mean is 0: not gated, a branch here spilled ~370
        # bytes under the 128-register cap
        store_key_term(x, rows, cols, QMEAN, BIAS, bias_mult, bh, SP, D)
    if HAD:
        y = rotate_scaled(x, hm, rsqrt_d, mult, DOT_F32, ROUND_TWICE, HW_CVT)
    else:
        y = _bf16_value(x * mult, HW_CVT)
    y3 = tl.reshape(y, (BS, D // 32, 32))
    s = shared_exp(tl.max(tl.abs(y3), axis=2), RULE, EMAX, MAXV)  # (BS, D/32)
    elem, e6 = _round_elems(y3 * pow2(-s)[:, :, None], MBITS, EMIN, MAXV, HW_CVT, FAST_ELEM)
    if TILE_REF:
        ref = tl.max(tl.max(s, axis=1), axis=0)
        if HAS_QFLOOR:
            fl = tl.load(QFLOOR + bh) + T0
            ref = tl.where(ref <= -127, fl, tl.maximum(ref, fl))
        else:
            ref = tl.where(ref <= -127, 0, ref)  # an all-zero group: any exponent carries its zeros; -127 would put
        shift = s - ref + T0                     # 2^(QE + KE) below fp32's normal range in the attention kernel
    else:
        ref = tl.max(s, axis=1)
        ref = tl.where(ref <= -127, 0, ref)
        shift = s - ref[:, None] + T0
    # E4M3 carry: exact inside the window, else the nearest-even E4M3 value (the sm90 deviation).
    q8 = tl.reshape(elem * pow2(shift + e6)[:, :, None], (BS, D))
    if not HW_CVT:  # the CPU interpreter's fp32 -> fp8 cast is not nearest-even: round first there
        q8 = round_e4m3(q8)
    if NAN_PAD:
        q8 = tl.where(rows[:, None] < n, q8, float("nan"))
    q8 = q8.to(tl.float8e4nv)
    tl.store(OUT + bh.to(tl.int64) * SP * D + rows[:, None] * D + cols[None, :], q8)
    if TILE_REF:
        tl.store(OUTE + bh * (SP // BS) + pid_s, ref - T0)
    else:
        tl.store(OUTE + bh.to(tl.int64) * SP + rows, ref - T0)


@triton.jit
def _round_elems(t, MBITS: tl.constexpr, EMIN: tl.constexpr, MAXV: tl.constexpr, HW_CVT: tl.constexpr,
                 FAST: tl.constexpr):
    """Block-scaled values ``t`` (|t| < 2^(emax + 1), as every scale rule leaves them) rounded to the element grid, as
    ``(elem, e6)``: ``elem`` holds the rounded values times ``2^-e6``. E4M3 by the hardware cast on a GPU; with ``FAST``
    E2M3 by the hardware E4M3 cast at 2^-6 on a GPU (``e6 = 6``) and E2M1 on the fp32 bits; else bit arithmetic."""
    if HW_CVT and MBITS == 3 and EMIN == -6:  # MXFP8: the element grid is E4M3's, whose cast is nearest-even
        return t.to(tl.float8e4nv).to(tl.float32), 0
    elif FAST and HW_CVT and MBITS == 3 and EMIN == 0:  # E2M3
        return round_e2m3_scaled(t), 6
    elif FAST and MBITS == 1 and EMIN == 0:  # E2M1
        return round_e2m1(t, MAXV), 0
    else:
        return round_elem(t, MBITS, EMIN, MAXV), 0


@triton.jit
def rotate_scaled(x, hm, rsqrt_d, mult, DOT_F32: tl.constexpr, ROUND_TWICE: tl.constexpr, HW_CVT: tl.constexpr):
    """``x @ hm`` (the +-1 rotation, (D, D)) times ``rsqrt_d * multiplier`` on the BF16 grid, as
    :func:`fsattn_diffusers.operands.prequantize_qk` rounds it: once, or (``ROUND_TWICE``, MXFP8) after each factor."""
    if DOT_F32:  # the CPU interpreter's BF16 dot is wrong; fp32 gives the same exact products
        y = tl.dot(x, hm.to(tl.float32), input_precision="ieee")
    else:
        y = tl.dot(x.to(tl.bfloat16), hm)  # +-1 entries: exact products, fp32 sums
    if ROUND_TWICE:
        return _bf16_value(_bf16_value(y * rsqrt_d, HW_CVT) * mult, HW_CVT)
    return _bf16_value((y * rsqrt_d) * mult, HW_CVT)


@triton.jit
def _bf16_value(x, HW_CVT: tl.constexpr):
    """fp32 -> nearest-even BF16 value as fp32: the hardware cast on a GPU, bit arithmetic in the interpreter."""
    if HW_CVT:
        return x.to(tl.bfloat16).to(tl.float32)
    else:
        return round_bf16(x)


@triton.jit
def smoothed_bf16_rows(x, rows, n, cols, MEAN, bh, subtract, D: tl.constexpr, HAS_MEAN: tl.constexpr,
                       IS_BF16: tl.constexpr, HW_CVT: tl.constexpr):
    """A (BS, D) tile of float32 input rows as the BF16 values the pre-passes rotate (smoothing.subtract_mean): with
    ``HAS_MEAN`` and ``subtract`` != 0, ``BF16(x - MEAN[bh])`` (one rounding, from the input's own values) on the
    valid rows (``rows < n``; 0 past them); else ``x`` on the BF16 grid (``IS_BF16``: it already is)."""
    if HAS_MEAN:
        if subtract != 0:
            mu = tl.load(MEAN + bh * D + cols)
            x = tl.where(rows[:, None] < n, _bf16_value(x - mu[None, :], HW_CVT), 0.0)
        elif not IS_BF16:
            x = _bf16_value(x, HW_CVT)
    elif not IS_BF16:
        x = _bf16_value(x, HW_CVT)
    return x


@triton.jit
def store_key_term(x, rows, cols, QMEAN, BIAS, bias_mult, bh, SP, D: tl.constexpr):
    """Q smoothing's per-key term of a tile of smoothed key rows (smoothing.key_bias): ``bias_mult * (QMEAN[bh] . k)``
    (fp32 sums in the kernel's order) into BIAS (B, H, SP)."""
    qm = tl.load(QMEAN + bh * D + cols)
    tl.store(BIAS + bh.to(tl.int64) * SP + rows, tl.sum(x * qm[None, :], axis=1) * bias_mult)


@triton.jit
def _v_amax_kernel(V, svb, svh, svs, svd, KVL, AMAX, H, S,
                   D: tl.constexpr, BS: tl.constexpr, PER_CHANNEL: tl.constexpr, HAS_KVL: tl.constexpr,
                   FLAGS=None, HAS_FLAGS: tl.constexpr = False):
    bh = tl.program_id(1)
    v, _, _ = load_slice_rows(V, svb, svh, svs, svd, KVL, H, S, tl.program_id(0), bh, BS, D, HAS_KVL)
    if HAS_FLAGS:
        flag_nonfinite_rows(v, FLAGS, bh)
    x = tl.abs(round_bf16(v.to(tl.float32)))
    cols = tl.arange(0, D)
    if PER_CHANNEL:
        tl.atomic_max(AMAX + bh * D + cols, tl.max(x, axis=0))
    else:
        tl.atomic_max(AMAX, tl.max(tl.max(x, axis=1), axis=0))


@triton.jit
def _v_quant_kernel(V, svb, svh, svs, svd, KVL, AMAX, OUT, VS, H, S, SP,
                    D: tl.constexpr, BS: tl.constexpr, MX: tl.constexpr, HAS_KVL: tl.constexpr,
                    RULE: tl.constexpr, T0: tl.constexpr, MBITS: tl.constexpr, EMIN: tl.constexpr,
                    MAXV: tl.constexpr, EMAX: tl.constexpr, PERM_V: tl.constexpr = False,
                    HW_CVT: tl.constexpr = False, FAST_ELEM: tl.constexpr = False,
                    PER_CHANNEL: tl.constexpr = False):
    pid_s = tl.program_id(0)
    bh = tl.program_id(1)
    x, rows, _ = load_slice_rows(V, svb, svh, svs, svd, KVL, H, S, pid_s, bh, BS, D, HAS_KVL)
    cols = tl.arange(0, D)
    if V.dtype.element_ty == tl.bfloat16:  # already on the BF16 grid
        x = x.to(tl.float32)
    else:
        x = _bf16_value(x.to(tl.float32), HW_CVT)
    if MX:
        x3 = tl.reshape(x, (BS // 32, 32, D))
        s = shared_exp(tl.max(tl.abs(x3), axis=1), RULE, EMAX, MAXV)  # (BS/32, D)
        elem, e6 = _round_elems(x3 * pow2(-s)[:, None, :], MBITS, EMIN, MAXV, HW_CVT, FAST_ELEM)
        ref = shared_exp(tl.load(AMAX + bh * D + cols), RULE, EMAX, MAXV)  # = max over the channel's blocks
        v8 = tl.reshape(elem * pow2(s - ref[None, :] + T0 + e6)[:, None, :], (BS, D))
        vs = pow2(ref - T0)
    elif PER_CHANNEL:  # E4M3 with one scale amax / 448 per channel (fp8_channel)
        amax = tl.load(AMAX + bh * D + cols)
        vs = tl.where(amax > 0, tl.math.div_rn(amax, tl.full((D,), 448.0, tl.float32)), 1.0)
        v8 = tl.math.div_rn(x, tl.broadcast_to(vs[None, :], x.shape))
    else:
        amax = tl.load(AMAX)
        scale = tl.where(amax > 0, tl.math.div_rn(amax, 448.0), 1.0)
        v8 = tl.math.div_rn(x, scale)
        vs = tl.zeros((D,), tl.float32) + scale
    if not HW_CVT:  # the CPU interpreter's fp32 -> fp8 cast is not nearest-even: round first there
        v8 = round_e4m3(v8)
    if PERM_V:  # the attention kernels' P column order (fused_attention._perm_p): key c at a = c0 + 2c3 + 4c1 + 8c2
        # in registers (rows as (group, c3, c2, c1, c0) -> (group, c2, c1, c3, c0)) so the store stays contiguous
        v8 = tl.reshape(tl.permute(tl.reshape(v8, (BS // 16, 2, 2, 2, 2, D)), (0, 2, 3, 1, 4, 5)), (BS, D))
    tl.store(OUT + bh.to(tl.int64) * D * SP + cols[:, None] * SP + rows[None, :], tl.trans(v8.to(tl.float8e4nv)))
    if pid_s == 0:
        tl.store(VS + bh * D + cols, vs)


@functools.lru_cache(maxsize=None)
def _hadamard_pm1(d: int, dtype_name: str, device: str, signs: bool = False) -> torch.Tensor:
    """Unnormalized Sylvester Hadamard matrix (+-1), (d, d), in BF16 on ``device``; with ``signs`` its rows times the
    fixed signs of :func:`fsattn_diffusers.hadamard.rotation_signs` (``x @ diag(s) H``)."""
    from fsattn_diffusers.hadamard import hadamard_matrix, rotation_signs

    hm = torch.round(hadamard_matrix(d, dtype=torch.float64) * math.sqrt(d))
    if signs:
        hm = rotation_signs(d).double()[:, None] * hm
    return hm.to(getattr(torch, dtype_name)).to(device).contiguous()


def padded(n: int, tile: int) -> int:
    return -(-n // tile) * tile


def prepare_qk(x: torch.Tensor, plan: KernelPlan, multiplier: float, tile_ref: bool, kv_lens=None,
               nan_pad: bool = False, mean=None, q_mean=None, bias_mult: float = 1.0, floor=None, flags=None,
               q_sel=None):
    """Q (``tile_ref=False``, per-row exponents) or K (``tile_ref=True``, one exponent per 128 keys).

    Parameters
    ----------
    x : Tensor (B, H, S, D), any strides, fp16/bf16/fp32, CUDA (or CPU under TRITON_INTERPRET=1).

    Returns
    -------
    x8 : Tensor (B, H, SP, D) float8_e4m3fn, SP = S rounded up to 128, padded rows zero.
    exps : Tensor (B, H, SP) or (B, H, SP / 128) int32.

    With ``kv_lens`` (K), rows at or past ``kv_lens[b]`` are quantized as zeros (a padded key's value
    must not change the shared exponent of its key tile). With ``nan_pad`` (K), rows at or past
    ``kv_lens[b]`` (or S) are written as E4M3 NaN: the attention kernel's scores there are NaN, which its
    max and clamp drop (masking without a select).

    ``mean`` (B, H, 1, D) float32, optional: subtracted from every valid row (``Recipe.smooth_k``/``smooth_q``).
    ``q_mean`` (B, H, 1, D), optional (K only): also return the per-key bias ``bias_mult * (q_mean . k)`` of Q
    smoothing, (B, H, SP) float32, as a third output (``None`` without ``q_mean``).
    ``floor`` (B, H) int32, optional (``tile_ref``): the smallest tile exponent (sm90_numerics difference 9).
    ``flags`` (B * H,) int32, optional: set to 1 for the slices whose input (rows before ``kv_lens``) holds a NaN or
    an inf, as :func:`kernels.nonfinite_flags.flag_nonfinite` flags them (never cleared).
    ``q_sel`` (B * H,) int32, optional: Q smoothing's per-slice switch (kernels.token_mean); where it is 0, Q's
    ``mean`` (zero there) is not subtracted (Q only).
    """
    if floor is not None and not tile_ref:
        raise ValueError("prepare_qk: floor (the smallest tile exponent) needs tile_ref=True; accepted: floor=None "
                         "with per-row exponents")
    b, h, s, d = x.shape
    sp = padded(s, ROWS)
    out = torch.empty((b, h, sp, d), dtype=torch.float8_e4m3fn, device=x.device)
    exps = torch.empty((b, h, sp // ROWS if tile_ref else sp), dtype=torch.int32, device=x.device)
    hm = _hadamard_pm1(d, "bfloat16", str(x.device), plan.hadamard_signs)
    mbits, emin, maxv, emax = ELEM[plan.qk_fmt]
    mean_arg = mean.reshape(b * h, d).contiguous() if mean is not None else exps
    bias = torch.empty((b, h, sp), dtype=torch.float32, device=x.device) if q_mean is not None else None
    qm_arg = q_mean.reshape(b * h, d).contiguous() if q_mean is not None else exps
    n_tiles = (sp // ROWS) * b * h
    _qk_prepass_kernel[(_persistent_programs(n_tiles, x.device),)](
        x, *x.stride(), out, exps, hm, h, s, sp, 1.0 / math.sqrt(d), float(multiplier), n_tiles,
        D=d, BS=ROWS, HAD=plan.hadamard, ROUND_TWICE=plan.qk_fmt == 0, RULE=plan.qk_rule, T0=plan.qk_t0,
        MBITS=mbits, EMIN=emin, MAXV=maxv, EMAX=emax, TILE_REF=tile_ref, DOT_F32=INTERPRET,
        NAN_PAD=nan_pad, HAS_KVL=kv_lens is not None, KVL=kv_lens if kv_lens is not None else exps,
        HW_CVT=not INTERPRET, STAGES=QK_STAGES_E2M1 if plan.qk_fmt == FMT_E2M1 else QK_STAGES,
        MEAN=mean_arg, HAS_MEAN=mean is not None, QMEAN=qm_arg, BIAS=bias if bias is not None else exps,
        bias_mult=float(bias_mult), HAS_BIAS=q_mean is not None,
        QFLOOR=floor.to(torch.int32).contiguous() if floor is not None else exps, HAS_QFLOOR=floor is not None,
        FLAGS=flags if flags is not None else exps, HAS_FLAGS=flags is not None, FAST_ELEM=FAST_ELEM_ROUNDING,
        QSEL=q_sel if q_sel is not None else exps, HAS_QSEL=q_sel is not None, num_warps=QK_WARPS,
        **_max_regs(QK_MAX_REGS))
    return out, exps, bias


def _max_regs(cap):
    """Launch option capping a kernel's registers per thread (none in the interpreter, which has no ptxas)."""
    return {} if cap is None or INTERPRET else {"maxnreg": cap}


def _persistent_programs(n_tiles: int, device) -> int:
    """Programs of the persistent Q/K pre-pass: ``QK_PROGRAMS_PER_SM`` per SM (0: one per tile); in the interpreter
    three, so that the tests walk the strided loop."""
    if INTERPRET:
        return max(1, min(n_tiles, 3))
    if QK_PROGRAMS_PER_SM <= 0:
        return max(1, n_tiles)
    return max(1, min(n_tiles, QK_PROGRAMS_PER_SM * _sm_count(device)))


@functools.lru_cache(maxsize=None)
def _sm_count(device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def prepare_v(v: torch.Tensor, plan: KernelPlan, kv_lens=None, perm: bool = False, flags=None):
    """V to the PV GEMM's B operand.

    Parameters
    ----------
    v : Tensor (B, H, S_k, D), any strides. Keys at or past ``kv_lens[b]`` are zeroed first.

    Returns
    -------
    v8t : Tensor (B, H, D, SKP) float8_e4m3fn (keys contiguous), padded keys zero. With ``perm`` (the
        attention kernels' P column order) the keys of every aligned group of 16 are stored in the order of the FP8
        wgmma A fragment (key c at position c0 + 2 c3 + 4 c1 + 8 c2, bits of c mod 16).
    vs : Tensor (B, H, D) float32, per-channel factor: V = v8t^T * vs.

    ``flags`` (B * H,) int32, optional: as :func:`prepare_qk`'s.
    """
    return _quantize_v(v, kv_lens, flags, perm, plan.v_mx, plan.v_mx, plan.v_fmt, plan.v_rule, plan.v_t0)


def prepare_v_fp8_channel(v: torch.Tensor, kv_lens=None, flags=None):
    """V in E4M3 with one fp32 scale ``amax / 448`` per (batch, head, channel) over the valid keys (``v_format``
    ``fp8_channel``), keys in the FP8 A-fragment order: ``(v8t, vs)`` as :func:`prepare_v`'s with ``perm``."""
    return _quantize_v(v, kv_lens, flags, True, False, True, FMT_E4M3, RULE_ROUND_UP_175, 0)


def _quantize_v(v, kv_lens, flags, perm: bool, mx: bool, per_channel: bool, fmt: int, rule: int, t0: int):
    """:func:`prepare_v`'s work: the channel (``per_channel``) or tensor maxima over the valid keys, then MX (``mx``:
    element format ``fmt``, scale rule ``rule``, carry ``t0``) or E4M3 quantization of V into V8T and VS."""
    b, h, s, d = v.shape
    sp = padded(s, KEY_TILE)
    amax = torch.zeros((b, h, d) if per_channel else (1,), dtype=torch.float32, device=v.device)
    has_kvl = kv_lens is not None
    kvl = kv_lens if has_kvl else amax
    grid = (sp // KEY_TILE, b * h)
    _v_amax_kernel[grid](v, *v.stride(), kvl, amax, h, s, D=d, BS=KEY_TILE, PER_CHANNEL=per_channel,
                         HAS_KVL=has_kvl, FLAGS=flags if flags is not None else amax, HAS_FLAGS=flags is not None,
                         num_warps=V_WARPS)
    out = torch.empty((b, h, d, sp), dtype=torch.float8_e4m3fn, device=v.device)
    vs = torch.empty((b, h, d), dtype=torch.float32, device=v.device)
    mbits, emin, maxv, emax = ELEM[fmt]
    _v_quant_kernel[grid](v, *v.stride(), kvl, amax, out, vs, h, s, sp, D=d, BS=KEY_TILE, MX=mx,
                          HAS_KVL=has_kvl, RULE=rule, T0=t0, MBITS=mbits, EMIN=emin,
                          MAXV=maxv, EMAX=emax, PERM_V=perm, HW_CVT=not INTERPRET,
                          FAST_ELEM=FAST_ELEM_ROUNDING, PER_CHANNEL=per_channel and not mx, num_warps=V_WARPS,
                          **_max_regs(V_MAX_REGS if mx else None))
    return out, vs

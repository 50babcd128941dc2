"""Fused-Softmax attention forward for NVIDIA Hopper (sm_90) in Triton: paper Algorithm 1's steady state.

Per query tile of BM rows and key tile j of BN keys (operands from :mod:`kernels.sm90.prepass`):

1. ``acc = Q8 K8_j^T`` on FP8 tensor cores; the MX product is ``X = acc * 2^(QE + KE_j)`` (powers of two).
2. Tile 0 (peeled) freezes ``m = ceil(128 rowmax(X)) / 128`` (Section 4.1; on the 1/128 grid so that the
   Stage-A constant below is an exact fp32 integer).
3. Gate (j >= 1): one FMNMX pass gives the row maxima of ``acc``; a row whose maximum passes ``m + cap``
   fires the rare rollback branch (whole CTA): ``m += ceil(max - m)``, ``O, l *= 2^-delta``. With ``LOWER``
   (``Recipe.rollback_floor_log2``) a row whose maximum lies below ``lo = m - floor`` in this and the previous key
   tile fires the same branch with a negative ``delta`` (``lo`` is -inf once ``m`` would pass
   ``m_high - ROLLBACK_FLOOR_LIMIT_LOG2``).
4. Stage-A + Stage-B (Sections 4.2-4.3): one FMA carries the whole Schraudolph affine map, the frozen
   maximum and P's scale: ``f = acc * 2^(QE+KE_j+7) + (1.5*2^23 + 128*(127 - eps') + 128*sigma - 128 m)``.
   ``max(f, 1.5*2^23)`` clamps, and the low 16 bits of ``f`` are the BF16 pattern of ``P * 2^sigma``;
   ``bits << 16`` reads them as fp32 (no exp2, no float->int conversion). The FP8 PV operand is the E4M3
   rounding of that value (fp8_row) or of its MXFP6 quantization (mxfp6 P).
5. ``l += rowsum`` of the quantized P values; P's key columns are permuted into the FP8 wgmma A-fragment
   order (V8T is stored to match) and ``O += P8 V8_j``, the tile's product summed in a zero accumulator and added to
   O in fp32.
6. ``out = O * VS / l``; LSE = ``(log2 l - sigma + m) ln 2``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from fsattn_diffusers import sm90_numerics
from fsattn_diffusers.exponent import LN2 as _LN2

from ..common import RNE_MAGIC as MAGIC, pow2, round_bf16, round_e4m3, round_elem
from .constants import E2M3_MAX_SCALED, FLOOR_LIMIT, MXFP6_ANCHOR_OFFSET, MXFP6_E128_MIN, QX_MIN_LOG2

# f = MAGIC + pattern keeps the pattern (< 2^22) in the low mantissa bits, rounded half-even (common.RNE_MAGIC).
# Schraudolph's bias on the BF16 grid, 128 * (127 - eps') with eps' = 7/128 (sm90_numerics difference 2).
D_BITS = tl.constexpr(float(sm90_numerics.D_BITS))
# 7 * MAGIC + 8 * D_BITS - D_BITS_F16: 8 c - F16_SHIFT is the FP16-grid Stage-A constant
# MAGIC + 1024 (15 - eps') + 1024 sigma - 1024 m (sm90_numerics difference 7), exactly (integers below 2^27).
F16_SHIFT = tl.constexpr(float(7 * int(MAGIC.value) + 8 * sm90_numerics.D_BITS - sm90_numerics.D_BITS_F16))
# Saturation patterns without the gate: FP16's largest finite value, and BF16's 0xFFFF.
F16_MAX_BITS = tl.constexpr(float(sm90_numerics.F16_MAX_BITS))
BF16_MAX_BITS = tl.constexpr(65535.0)
LN2 = tl.constexpr(_LN2)
# Rowmax-H15 (sm90_numerics difference 8): n's clamp and MAGIC's fp32 bits (f - MAGIC = n on the integer grid).
H15_MIN_N = tl.constexpr(float(sm90_numerics.H15_MIN_N))
MAGIC_BITS = tl.constexpr(0x4B400000)


@triton.jit
def lowering_trigger(m, m_high, FLOOR: tl.constexpr):
    """The score (doublings) below which a key tile's peak lowers the reference: ``m - floor``, or -inf once that
    would leave ``m_high - FLOOR_LIMIT`` (emulator.lowering_gate)."""
    return tl.where(m - FLOOR > m_high - FLOOR_LIMIT, m - FLOOR, float("-inf"))


@triton.jit
def _stage_ab_f16(acc, s128, c, SATURATE: tl.constexpr, RNE_CVT: tl.constexpr):
    """fp8_row P: Stage-A on FP16's bit layout (the low 16 bits of ``f`` are the FP16 pattern of P * 2^sigma),
    Stage-B (E4M3 PV operand) and the row sum of the E4M3 values (sm90_numerics differences 5 and 7).
    ``s128``, ``c`` are the BF16-grid scale and constant (scaled by 8 here, exactly)."""
    f = tl.maximum(acc * (s128 * 8.0) + (c * 8.0 - F16_SHIFT)[:, None], MAGIC)
    if SATURATE:  # no gate: saturate at FP16's largest finite pattern instead of wrapping
        f = tl.minimum(f, MAGIC + F16_MAX_BITS)
    p = ((f.to(tl.int32, bitcast=True) & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True)).to(tl.float32)
    # E4M3 rounding in fp32 (exact, then the cast is exact): the sum is taken on these values rather than on
    # P8 cast back to fp32 (that form gave wrong, run-to-run varying results on the H200 in one of two suite runs).
    p = round_e4m3(p)
    return p.to(tl.float8e4nv), tl.sum(p, axis=1)


@triton.jit
def _stage_ab_h15(acc, s2, c, H15_EXP: tl.constexpr, RNE_CVT: tl.constexpr):
    """fp8_row P under Rowmax-H15 (sm90_numerics difference 8): ``2X - 2m`` in one FMA (``s2 = 2^(e+1)``,
    ``c = -2m``), then MAGIC's addition rounds it half-even onto the integer grid of ``f``: ``n``, clamped at
    H15_MIN_N (masked and NaN scores too). ``(1 + 0.5 (n mod 2)) 2^(n div 2 + sigma)`` is built from n's bits
    (``H15_EXP = 127 + sigma``) after its E4M3 rounding, done on n, so the cast to E4M3 is exact; the row sum
    adds the same values."""
    f = tl.maximum((acc * s2 + c[:, None]) + MAGIC, MAGIC + H15_MIN_N)
    n = f.to(tl.int32, bitcast=True) - MAGIC_BITS
    # E4M3 rounding on n: 2^j and 1.5 * 2^j are exact down to 2^-9 and 1.5 * 2^-8 (j = n div 2 + sigma); with
    # n9 the n of 2^-9, 1.5 * 2^-9 (n9 + 1) and 1.5 * 2^-10 (n9 - 1) round up one step, 2^-10 and below to 0.
    n9 = 2 * (118 - H15_EXP)  # 2 * (-9 - sigma)
    n = tl.where((n == n9 - 1) | (n == n9 + 1), n + 1, n)
    p = ((((n >> 1) + H15_EXP) << 23) | ((n & 1) << 22)).to(tl.float32, bitcast=True)
    p = tl.where(n < n9 - 1, 0.0, p)
    return p.to(tl.float8e4nv), tl.sum(p, axis=1)


@triton.jit
def _stage_ab_ungated(acc, s128, c, P_MX: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                      RNE_CVT: tl.constexpr):
    """Stage-A (bit-constructed 16-bit proxy of P * 2^sigma) and Stage-B (FP8 PV operand) without the gate:
    the proxy saturates at its largest pattern instead of wrapping.

    Returns (p8 (BM, BN) fp8, row sum (BM,) of the quantized values: E4M3 (fp8_row) or MXFP6).
    """
    if not P_MX:
        return _stage_ab_f16(acc, s128, c, True, RNE_CVT)
    f = acc * s128[:, None] + c[:, None]
    f = tl.maximum(f, MAGIC)
    f = tl.minimum(f, MAGIC + BF16_MAX_BITS)  # saturate the pattern at 0xFFFF instead of wrapping
    p = (f.to(tl.int32, bitcast=True) << 16).to(tl.float32, bitcast=True)
    if P_MX:
        p3 = tl.reshape(p, (BM, BN // 32, 32))
        bmax = tl.max(p3, axis=2)
        # MXFP6 floor rule on the scaled values: floor(log2 blockmax) - 2 (E2M3 emax).
        sb = ((bmax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 129
        sb = tl.maximum(sb, -127)
        q = round_elem(p3 * pow2(-sb)[:, :, None], 3, 0, 7.5) * pow2(sb)[:, :, None]
        p = tl.reshape(q, (BM, BN))
    psum = tl.sum(p, axis=1)
    if RNE_CVT:  # the CPU interpreter's fp32->fp8 cast is not nearest-even; round first there
        p = round_e4m3(p)
    return p.to(tl.float8e4nv), psum


@triton.jit
def _perm_p(p8, BM: tl.constexpr, BN: tl.constexpr):
    """P's key columns in the order of the FP8 wgmma A fragment: column a holds key
    phi(a) = a0 + 2 a2 + 4 a3 + 8 a1 (bits of a within each 16 keys), so that every thread's accumulator
    elements are its own A-operand bytes (no SHFL/SEL). V8T is stored in the same order (pre-pass PERM_V)."""
    p6 = tl.reshape(p8, (BM, BN // 16, 2, 2, 2, 2))  # (rows, c>>4, c3, c2, c1, c0)
    return tl.reshape(tl.permute(p6, (0, 1, 3, 4, 2, 5)), (BM, BN))


@triton.jit
def _block_max(acc, BM: tl.constexpr, BN: tl.constexpr):
    """Maxima of 32-key blocks, reduced register axes first (see _stage_ab_gated)."""
    a6 = tl.reshape(acc, (BM, BN // 32, 2, 2, 4, 2))
    m = tl.max(tl.max(tl.max(a6, axis=5, keep_dims=True), axis=3, keep_dims=True), axis=2, keep_dims=True)
    return tl.max(m, axis=4, keep_dims=True)  # (BM, BN // 32, 1, 1, 1, 1): stays in a6's layout family


@triton.jit
def _stage_ab_gated(acc, amax, s128, c, P_MX: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                    RNE_CVT: tl.constexpr, H15: tl.constexpr = False, H15_EXP: tl.constexpr = 0):
    """Stage-A + Stage-B of the gated kernel (the gate keeps every proxy pattern in range).

    fp8_row: as :func:`_stage_ab_ungated` without the saturation. mxfp6 P: the block maximum of the 16-bit proxy patterns is taken on ``acc``
    (the FMA and the clamp are monotone), its exponent field ``E`` gives the floor-rule scale
    ``s = E - 129``, and adding ``128 (123 - E)`` to the FMA's constant moves the block onto E4M3's grid
    with ``2^s -> 2^-6``: there E4M3's nearest-even conversion IS E2M3 rounding (3 mantissa bits, subnormal
    quantum 2^-9 = 2^(s-3) scaled), once the value is clamped at 7.5 * 2^-6 (E2M3's saturation). The
    E4M3 code ``e`` is then rescaled by ``2^(s+6)`` in f16 (exact) and converted again (exact: the
    reference's E4M3 of the MXFP6 value). Row sum: ``sum_b 2^(s_b+6) * sum(e_b)`` (block sums exact in f16).
    Blocks whose maximum is below 2^-120 are treated as E = 7 (their P8 is 0 either way; their row-sum
    contribution is below 2^-110, under l's half ulp).
    """
    if P_MX:
        # 32-key blocks as (rows, block, c4, c3, c2c1, c0) (bits of the column inside the block): in the
        # wgmma accumulator c4, c3, c0 are registers and c2c1 the lanes of a quad, so every per-block
        # tensor below shares one layout (no shuffles to convert); amax comes from _block_max.
        a6 = tl.reshape(acc, (BM, BN // 32, 2, 2, 4, 2))
        c6 = c[:, None, None, None, None, None]
        fmax = tl.maximum(amax * s128 + c6, MAGIC)  # s128: a scalar; amax (BM, BN // 32, 1, 1, 1, 1)
        e128 = tl.maximum(fmax.to(tl.int32, bitcast=True) & 0x7F80, MXFP6_E128_MIN)  # 128 * max(E, 7)
        # c_b = c + 128 (123 - E), exact: (2^23 + 128 E) - (2^23 + 15744) is an exact small integer.
        cb = c6 - ((e128 | 0x4B000000).to(tl.float32, bitcast=True) - MXFP6_ANCHOR_OFFSET)
        g = tl.maximum(a6 * s128 + cb, MAGIC)
        x = (g.to(tl.int32, bitcast=True) << 16).to(tl.float32, bitcast=True)
        if RNE_CVT:
            x = round_e4m3(x)
        e16 = x.to(tl.float8e4nv).to(tl.float16)
        e16 = tl.minimum(e16, tl.full(e16.shape, E2M3_MAX_SCALED, tl.float16))
        kexp = (e128 >> 7) - 123  # s + 6
        sc16 = ((tl.maximum(kexp, -10) + 15) << 10).to(tl.int16).to(tl.float16, bitcast=True)
        y = e16 * sc16
        if RNE_CVT:
            y = round_e4m3(y.to(tl.float32))
        p8 = tl.reshape(y.to(tl.float8e4nv), (BM, BN))
        # Per-thread partial block sums over the register axes (exact in f16: < 1, on the 2^-9 grid), scaled
        # per block in fp32; one cross-lane reduction per row instead of one per block.
        part = tl.sum(tl.sum(tl.sum(e16, axis=5, keep_dims=True), axis=3, keep_dims=True), axis=2, keep_dims=True)
        w = part.to(tl.float32) * ((kexp + 127) << 23).to(tl.float32, bitcast=True)
        psum = tl.sum(tl.sum(tl.sum(tl.sum(tl.sum(w, axis=5), axis=3), axis=2), axis=1), axis=1)  # lanes last
    elif H15:
        p8, psum = _stage_ab_h15(acc, s128, c, H15_EXP, RNE_CVT)
    else:
        p8, psum = _stage_ab_f16(acc, s128, c, False, RNE_CVT)
    return p8, psum


@triton.jit
def _accumulate(acc, bmax, s128, c, o, l, vt_ptrs, GATE: tl.constexpr, P_MX: tl.constexpr,
                BM: tl.constexpr, BN: tl.constexpr, RNE_CVT: tl.constexpr, H15: tl.constexpr = False,
                H15_EXP: tl.constexpr = 0):
    """Lines 15-18 of Algorithm 1 for one key tile: Stage-A/B, the row sum and the PV GEMM. ``s128`` is the
    Stage-A scale ``2^(e+7)`` (Rowmax-H15: ``2^(e+1)``)."""
    if GATE:
        p8, psum = _stage_ab_gated(acc, bmax, s128, c, P_MX, BM, BN, RNE_CVT, H15, H15_EXP)
    else:
        p8, psum = _stage_ab_ungated(acc, s128, c, P_MX, BM, BN, RNE_CVT)
    l += psum
    p8 = _perm_p(p8, BM, BN)
    # The tile's P V into a zero accumulator, added to O in fp32: the FP8 tensor cores accumulate with ~13 mantissa
    # bits below the largest exponent they add, so chained onto O they cut every later tile's products at O's
    # magnitude (sm90_numerics, "Accumulation").
    o = o + tl.dot(p8, tl.trans(tl.load(vt_ptrs)))
    return o, l


@triton.jit
def _add_bias(acc, bias_ptrs, e_t, keep, HAS_BIAS: tl.constexpr):
    """Q smoothing's per-key term (doublings) in the GEMM's units ``2^-e_t``, times ``keep`` (1, or 0 on a query tile
    that drops it, sm90_numerics difference 9): one exact scaling and one rounding, the emulator's ``X + bias``."""
    if HAS_BIAS:
        acc = acc + tl.load(bias_ptrs)[None, :] * (pow2(-e_t) * keep)
    return acc


@triton.jit
def _tile(q, qe, o, l, m, c, m_high, lo, low_before, nrows, ntiles, k_ptrs, vt_ptrs, KE_row, t, n_keys, row_ok,
          BN: tl.constexpr, MASKED: tl.constexpr, GATE: tl.constexpr, CAP: tl.constexpr,
          P_MX: tl.constexpr, BM: tl.constexpr, RNE_CVT: tl.constexpr, bias_ptrs=None, HAS_BIAS: tl.constexpr = False,
          H15: tl.constexpr = False, H15_EXP: tl.constexpr = 0, LOWER: tl.constexpr = False,
          FLOOR: tl.constexpr = 0.0, keep=1.0):
    """One steady-state key tile (lines 6-18 of Algorithm 1); ``LOWER``: the gate also lowers the reference by
    whole doublings when this tile's peak and the previous one's (``low_before``) are below ``lo`` (``m_high`` the
    row's highest reference)."""
    k = tl.load(k_ptrs)
    acc = tl.dot(q, tl.trans(k))
    e_t = qe + tl.load(KE_row + t)
    acc = _add_bias(acc, bias_ptrs, e_t, keep, HAS_BIAS)
    if MASKED:
        kidx = t * BN + tl.arange(0, BN)
        acc = tl.where((kidx < n_keys)[None, :], acc, float("-inf"))
    bmax = acc  # unused unless P_MX
    if P_MX:  # the block maxima give P's scales and, reduced once more, the gate's row maxima
        bmax = _block_max(acc, BM, BN)
    if GATE:
        if P_MX:
            amax = tl.reshape(tl.max(bmax, axis=1), (BM,))
        else:
            amax = tl.max(acc, axis=1)
        fire = amax > (m + CAP) * pow2(-e_t)
        if LOWER:
            low = amax * pow2(e_t) < lo
            fire = fire | (low & low_before)
            low_before = low
        if tl.max(fire.to(tl.int32), axis=0) > 0:  # rare rollback (lines 8-13), up or (LOWER) down
            step = tl.math.ceil(amax * pow2(e_t) - m)
            if LOWER:
                step = tl.maximum(step, m_high - FLOOR_LIMIT - m)
            delta = tl.where(fire, step, 0.0)
            m = m + delta
            if LOWER:
                m_high = tl.maximum(m_high, m)
                lo = lowering_trigger(m, m_high, FLOOR)
            c = c - (2.0 if H15 else 128.0) * delta  # c's step per doubling of m: Stage-A's grid
            down = tl.exp2(-delta)
            o = o * down[:, None]
            l = l * down
            nrows += tl.sum((fire & row_ok).to(tl.int32), axis=0)
            ntiles += 1
    o, l = _accumulate(acc, bmax, pow2(e_t + (1 if H15 else 7)), c, o, l, vt_ptrs, GATE, P_MX, BM, BN, RNE_CVT, H15,
                       H15_EXP)
    return o, l, m, c, m_high, lo, low_before, nrows, ntiles


# SK is never specialized: Triton would compile S_k == 1 as the constant 1, which folds the key loop to a constant
# empty range, and that build wrote NaN or run-to-run varying outputs on the H200 (the seeded fuzz: 4 of the 6 cases
# with S_k = 1 and no kv_lens; with kv_lens, where the key count is loaded at run time, all passed).
@triton.jit(do_not_specialize=["SK"])
def fsattn_fwd_kernel(Q8, QE, K8, KE, V8T, VS, OUT, LSE, STATS, KVL,
                      sob, soh, sos, sod, H, SQ, SK, SQP, SKP,
                      D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, HAS_KVL: tl.constexpr,
                      WRITE_LSE: tl.constexpr, P_MX: tl.constexpr, GATE: tl.constexpr, CAP: tl.constexpr,
                      SIGMA: tl.constexpr, NUM_STAGES: tl.constexpr, RNE_CVT: tl.constexpr,
                      BIAS=None, KG=None, HAS_BIAS: tl.constexpr = False, H15: tl.constexpr = False,
                      H15_EXP: tl.constexpr = 0, LOWER: tl.constexpr = False, FLOOR: tl.constexpr = 0.0,
                      DIAGONAL: tl.constexpr = False, M_OFFSET: tl.constexpr = 0.0):
    """One (BM-row query tile, batch x head) per program (BM divides 128). ``DIAGONAL``: the key tiles are visited
    from ``floor(q_tile * n_tiles / (SQP / 128))`` on, wrapping around (``q_tile`` the program's 128-row tile,
    ``n_tiles`` those holding valid keys; ``numerics.key_tile_order``), every one masked; else from tile 0.
    ``M_OFFSET``: doublings added to the frozen reference (``Recipe.frozen_max_offset_log2``, a multiple of 1/128)."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    n_keys = SK
    if HAS_KVL:
        n_keys = tl.load(KVL + b).to(tl.int32)
    rows = pid_m * BM + tl.arange(0, BM)
    dcol = tl.arange(0, D)
    kcol = tl.arange(0, BN)
    bh64 = bh.to(tl.int64)
    q = tl.load(Q8 + bh64 * SQP * D + rows[:, None] * D + dcol[None, :])
    qe = tl.load(QE + bh * (SQP // 128) + (pid_m * BM) // 128)  # Q's exponent per 128-row tile
    k_ptrs = K8 + bh64 * SKP * D + kcol[:, None] * D + dcol[None, :]
    vt_ptrs = V8T + bh64 * D * SKP + dcol[:, None] * SKP + kcol[None, :]
    KE_row = KE + bh * (SKP // BN)
    bias_ptrs = BIAS + bh64 * SKP + kcol
    keep = 1.0
    if HAS_BIAS:  # the query tile keeps Q smoothing's key term unless 2^(-QE - G) is below E4M3 (difference 9)
        keep = tl.where(-qe - tl.load(KG + bh) >= QX_MIN_LOG2, 1.0, 0.0)
    row_ok = rows < SQ

    o = tl.zeros((BM, D), tl.float32)
    l = tl.zeros((BM,), tl.float32)
    m = tl.full((BM,), float("-inf"), tl.float32)
    nrows = pid_m * 0  # int32 scalars carried through the loop
    ntiles = pid_m * 0
    if n_keys > 0:
        n_tiles = (n_keys + BN - 1) // BN
        j0 = 0
        if DIAGONAL:
            j0 = (((pid_m * BM) // 128) * n_tiles) // (SQP // 128)
        # The first tile visited (peeled): the frozen reference (line 2), then lines 15-18 as in the loop.
        acc = tl.dot(q, tl.trans(tl.load(k_ptrs + j0 * BN * D)))
        e0 = qe + tl.load(KE_row + j0)
        acc = _add_bias(acc, bias_ptrs + j0 * BN, e0, keep, HAS_BIAS)
        acc = tl.where((j0 * BN + kcol < n_keys)[None, :], acc, float("-inf"))
        m = tl.math.ceil(tl.max(acc, axis=1) * pow2(e0 + 7)) * (1.0 / 128.0) + M_OFFSET
        if H15:
            c = -2.0 * m
        else:
            c = (MAGIC + D_BITS + 128.0 * SIGMA) - 128.0 * m
        m_high = m
        lo = lowering_trigger(m, m_high, FLOOR)  # used only with LOWER
        low_before = m != m  # all False: the first tile set the reference
        bmax0 = acc
        if GATE and P_MX:
            bmax0 = _block_max(acc, BM, BN)
        o, l = _accumulate(acc, bmax0, pow2(e0 + (1 if H15 else 7)), c, o, l, vt_ptrs + j0 * BN, GATE, P_MX, BM, BN,
                           RNE_CVT, H15, H15_EXP)
        if DIAGONAL:  # the other tiles from j0 + 1 on, wrapping; each masked (the partial one may come anywhere)
            for j in tl.range(1, n_tiles, num_stages=NUM_STAGES):
                t = j0 + j
                t = tl.where(t >= n_tiles, t - n_tiles, t)
                o, l, m, c, m_high, lo, low_before, nrows, ntiles = _tile(
                    q, qe, o, l, m, c, m_high, lo, low_before, nrows, ntiles, k_ptrs + t * BN * D, vt_ptrs + t * BN,
                    KE_row, t, n_keys, row_ok, BN, True, GATE, CAP, P_MX, BM, RNE_CVT, bias_ptrs + t * BN, HAS_BIAS,
                    H15, H15_EXP, LOWER, FLOOR, keep)
        else:  # tiles 1 .. n_full - 1 unmasked, then the partial one
            n_full = n_keys // BN
            for t in tl.range(1, n_full, num_stages=NUM_STAGES):
                o, l, m, c, m_high, lo, low_before, nrows, ntiles = _tile(
                    q, qe, o, l, m, c, m_high, lo, low_before, nrows, ntiles, k_ptrs + t * BN * D, vt_ptrs + t * BN,
                    KE_row, t, n_keys, row_ok, BN, False, GATE, CAP, P_MX, BM, RNE_CVT, bias_ptrs + t * BN, HAS_BIAS,
                    H15, H15_EXP, LOWER, FLOOR, keep)
            if (n_full >= 1) & (n_full * BN < n_keys):
                o, l, m, c, m_high, lo, low_before, nrows, ntiles = _tile(
                    q, qe, o, l, m, c, m_high, lo, low_before, nrows, ntiles, k_ptrs + n_full * BN * D,
                    vt_ptrs + n_full * BN, KE_row, n_full, n_keys, row_ok, BN, True, GATE, CAP, P_MX, BM, RNE_CVT,
                    bias_ptrs + n_full * BN, HAS_BIAS, H15, H15_EXP, LOWER, FLOOR, keep)
    vs = tl.load(VS + bh * D + dcol)
    inv = tl.where(l > 0, 1.0 / l, 0.0)
    out = o * inv[:, None] * vs[None, :]
    if RNE_CVT and OUT.dtype.element_ty == tl.bfloat16:  # the CPU interpreter's fp32 -> bf16 cast truncates
        out = round_bf16(out)
    optr = OUT + b.to(tl.int64) * sob + h.to(tl.int64) * soh + rows[:, None].to(tl.int64) * sos + dcol[None, :] * sod
    tl.store(optr, out.to(OUT.dtype.element_ty), mask=row_ok[:, None])
    if WRITE_LSE:
        lse = (tl.log2(l) - SIGMA + m) * LN2
        tl.store(LSE + bh64 * SQ + rows, lse, mask=row_ok)
    if ntiles > 0:
        tl.atomic_add(STATS, nrows)
        tl.atomic_add(STATS + 1, ntiles)

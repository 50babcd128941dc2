"""Triton helpers shared by the pre-pass and the attention kernel: powers of two by bit construction, MX
shared exponents (formats.shared_exponent), element rounding (formats.round_to_elem), and the masked load of a row
tile of one (batch, head) slice (the pre-pass and the non-finite flags)."""

from __future__ import annotations

import triton
import triton.language as tl

# fp32 bit fields.
F32_EXP_MASK = 0x7F800000
F32_MANT_ONES = 0x007FFFFF
# AITER's MXFP8 rule: adding 2^21 to the fp32 bits of amax carries into the exponent iff mantissa >= 1.75.
ROUND_UP_175_ADD = 0x00200000
# 1.5 * 2^23: adding it to |t| < 2^22 leaves round-half-even(t) in the low mantissa bits (ulp = 1); Stage-A's
# FMA lands the 16-bit proxy pattern there the same way (Section 4.2).
RNE_MAGIC = tl.constexpr(12582912.0)
# 1.5 * 2^22, whose ulp is 0.5: the same for E2M1's quantum below 2 (round_e2m1).
E2M1_MAGIC = tl.constexpr(6291456.0)
# 2^-6: E2M3's grid times it is E4M3's from E4M3's subnormals up (the pre-pass's round_e2m3_scaled).
E2M3_TO_E4M3 = tl.constexpr(0.015625)
# E2M3's largest value 7.5 on that scaled grid (7.5 * 2^-6): the clamp that saturates as E2M3 does.
E2M3_MAX_SCALED = tl.constexpr(0.1171875)


@triton.jit
def pow2(e):
    """2^e for an int32 tensor, built from the exponent field; e is clamped to [-126, 127]."""
    e = tl.minimum(tl.maximum(e, -126), 127)
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def shared_exp(amax, RULE: tl.constexpr, EMAX: tl.constexpr, MAXV: tl.constexpr):
    """Unbiased E8M0 exponent (int32, clamped to [-127, 127]) of blocks with absolute maximum ``amax``.

    RULE 0: round_up_175 (E4M3), 1: floor (OCP), 2: ceil (amax / MAXV rounded to fp32 first; finite amax).
    """
    if RULE == 0:
        bits = amax.to(tl.int32, bitcast=True)
        biased = ((bits + 0x00200000) & 0x7F800000) >> 23
        s = tl.where(biased == 255, 254, tl.maximum(biased - EMAX, 0)) - 127
    elif RULE == 1:
        bits = amax.to(tl.int32, bitcast=True)
        s = ((bits >> 23) & 0xFF) - 127 - EMAX
    else:
        # ceil(log2(fl(amax / MAXV))) without the division: for MAXV of a short mantissa (7.5, 6 and 448 checked for every
        # fp32 amax) fl(amax / MAXV) is a power of two only where amax / MAXV is one, so the exponent is amax's minus
        # MAXV's, plus one where amax's mantissa field exceeds MAXV's; at least -126 (a subnormal quotient), and -127
        # where the quotient rounds to zero (amax <= MAXV * 2^-150, i.e. bits <= MAXV / 2).
        bits = amax.to(tl.int32, bitcast=True)
        mv = tl.full((), MAXV, tl.float32)
        mb = mv.to(tl.int32, bitcast=True)
        s = ((bits >> 23) & 0xFF) - ((mb >> 23) & 0xFF) + ((bits & 0x007FFFFF) > (mb & 0x007FFFFF)).to(tl.int32)
        s = tl.where(bits > (mv * 0.5).to(tl.int32), tl.maximum(s, -126), -127)
    return tl.minimum(tl.maximum(s, -127), 127)


@triton.jit
def round_elem(y, MBITS: tl.constexpr, EMIN: tl.constexpr, MAXV: tl.constexpr):
    """Round fp32 ``y`` to an element grid (MBITS mantissa bits, smallest normal exponent EMIN, largest
    finite MAXV): nearest-even, saturating, subnormals kept. Same values as formats.round_to_elem."""
    ay = tl.abs(y)
    e = ((ay.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    qexp = tl.maximum(e, EMIN) - MBITS
    t = ay * pow2(-qexp)
    r = (t + RNE_MAGIC) - RNE_MAGIC
    val = tl.minimum(r * pow2(qexp), MAXV)
    return tl.where(y < 0, -val, val)


@triton.jit
def round_e4m3(x):
    """``round_elem(x, 3, -6, 448.0)``: the nearest-even, saturating FP8 E4M3 value of fp32 ``x`` by bit arithmetic
    (subnormals kept; same values as the hardware cast on sm_90 and as formats.round_to_elem for E4M3)."""
    return round_elem(x, 3, -6, 448.0)


@triton.jit
def round_e2m3_scaled(t):
    """``round_elem(t, 3, 0, 7.5) * 2^-6`` by the hardware E4M3 cast (nearest-even on sm_90; not the interpreter's):
    E2M3's grid scaled by 2^-6 is E4M3's from its subnormals (0.125 * 2^-6 = 2^-9) to 7.5 * 2^-6, so the cast rounds
    ``t * 2^-6`` as E2M3 rounds ``t``, and the clamp at ``E2M3_MAX_SCALED`` saturates as E2M3 does. ``|t| < 8``."""
    r = (t * E2M3_TO_E4M3).to(tl.float8e4nv).to(tl.float32)
    return tl.minimum(tl.maximum(r, -E2M3_MAX_SCALED), E2M3_MAX_SCALED)


@triton.jit
def round_e2m1(t, MAXV: tl.constexpr):
    """``round_elem(t, 1, 0, MAXV)`` (E2M1, MAXV = 6: 0, 0.5, 1, 1.5, 2, 3, 4, 6) in fewer instructions, exact in fp32
    and in the interpreter: below 2 the quantum is 0.5 (``E2M1_MAGIC``'s ulp), from 2 up one mantissa bit kept
    nearest-even on the fp32 bits (as ``round_bf16`` keeps seven), then saturation at MAXV."""
    at = tl.abs(t)
    small = (at + E2M1_MAGIC) - E2M1_MAGIC
    bits = at.to(tl.int32, bitcast=True)
    big = ((bits + 0x1FFFFF + ((bits >> 22) & 1)) & -4194304).to(tl.float32, bitcast=True)
    r = tl.minimum(tl.where(at < 2.0, small, big), MAXV)
    return tl.where(t < 0, -r, r)


@triton.jit
def round_bf16(x):
    """fp32 -> nearest-even BF16 value, as fp32 (bit arithmetic; finite inputs)."""
    bits = x.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def load_slice_rows(X, sxb, sxh, sxs, sxd, KVL, H, S, pid_s, bh, BS: tl.constexpr, D: tl.constexpr,
                    HAS_KVL: tl.constexpr):
    """Rows ``pid_s * BS`` .. ``+ BS - 1`` of slice ``bh = b * H + h`` of X (B, H, S, D; any strides), the rows at or
    past S (``HAS_KVL``: past ``kv_lens[b]`` in KVL) read as 0: ``(x (BS, D) in X's dtype, rows (BS,), n)``, ``n`` the
    slice's valid row count."""
    b = bh // H
    h = bh % H
    n = S
    if HAS_KVL:
        n = tl.minimum(tl.load(KVL + b).to(tl.int32), S)
    rows = pid_s * BS + tl.arange(0, BS)
    cols = tl.arange(0, D)
    ptrs = X + b.to(tl.int64) * sxb + h.to(tl.int64) * sxh + rows[:, None].to(tl.int64) * sxs + cols[None, :] * sxd
    return tl.load(ptrs, mask=rows[:, None] < n, other=0.0), rows, n


@triton.jit
def flag_nonfinite_rows(x, FLAGS, bh):
    """Set ``FLAGS[bh]`` to 1 when the tile ``x`` (any float dtype) holds a NaN or an inf (rows read as 0 count as
    finite). ``|x| < inf`` is false exactly for NaN and +-inf, with no false positive for large finite values."""
    bad = tl.max(tl.max(tl.where(tl.abs(x.to(tl.float32)) < float("inf"), 0, 1), axis=1), axis=0)
    if bad > 0:
        tl.atomic_max(FLAGS + bh, 1)

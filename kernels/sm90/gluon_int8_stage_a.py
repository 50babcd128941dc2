"""Stage-A of the INT8 Q/K kernel (:mod:`kernels.sm90.fused_attention_gluon_int8`) in Gluon: the int32 scores as
biased fp32 values, Q smoothing's key term, the gate's row peaks, Stage-A's exponential (Schraudolph's BF16 proxy or
the hardware ``ex2``, with BF16 or FP8 E4M3 P) and P's register words for the PV GEMM. The numerics are the kernel's
module docstring's (sm90_numerics differences 10-14).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .fused_attention_gluon_pingpong import MAGIC, _words_to_fp8, a_fragment_quads

# 1.5 * 2^23 as fp32 bits: an int32 s < 2^22 in magnitude added to them gives the fp32 value 1.5 * 2^23 + s.
I2F_BITS = gl.constexpr(0x4B400000)
I2F_MAGIC = MAGIC  # their fp32 value, the Stage-A clamp constant (common.RNE_MAGIC)
# Stage-A's grid: 2^7 steps per doubling (BF16's mantissa).
GRID = gl.constexpr(128.0)
# Stage-A's exponentials (the EXP2 constexpr; kernels.sm90.ops_int8.EXP2_MODE maps Recipe.exponential onto them).
EXP2_SCHRAUDOLPH = gl.constexpr(0)
EXP2_HW = gl.constexpr(1)


@gluon.jit
def _scores(s):
    """The int32 scores as the biased fp32 values ``Xb = 1.5 * 2^23 + s`` (exact for |s| < 2^22), one integer add on
    the bits; Stage-A's per-row constant takes the bias off (sm90_numerics difference 14)."""
    return (s + I2F_BITS).to(gl.float32, bitcast=True)


@gluon.jit
def _mask_tail(x, t, n_keys, BN: gl.constexpr, scol: gl.constexpr):
    """-inf on the columns of key tile ``t`` at or past ``n_keys`` (only the last tile has any)."""
    if (t + 1) * BN > n_keys:
        cols = t * BN + gl.arange(0, BN, layout=scol)
        x = gl.where((cols < n_keys)[None, :], x, float("-inf"))
    return x


@gluon.jit
def _bf16_words(f, p_layout: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr):
    """The BF16 PV operand as int32 words of two patterns, shape (BM, BN // 2): per word one PRMT of the low halves
    of two Stage-A words (element ``2 w`` in the low half)."""
    f = gl.convert_layout(f, p_layout)
    e0, e1 = gl.split(gl.reshape(f, [BM, BN // 2, 2]))
    return gl.inline_asm_elementwise("prmt.b32 $0, $1, $2, 0x5410;", "=r,f,f", [e0, e1], dtype=gl.int32,
                                     is_pure=True, pack=1)


@gluon.jit
def _with_key_term(x, a, b_tile, scol: gl.constexpr):
    """Q smoothing's key term: the tile's scores in doublings, ``fma(x, a, b_j)`` with ``b_j`` (fp32) of the key tile
    (one rounding; masked keys stay -inf). ``b_tile``: the tile's ``BN`` terms in shared memory, brought by TMA with
    its K/V slot (``_load_kv`` of the kernel's module); each thread reads the columns it holds."""
    return (x - I2F_MAGIC) * a[:, None] + b_tile.load(scol)[None, :]


@gluon.jit
def _row_peaks(x, a, SCALED: gl.constexpr):
    """The tile's row peaks in doublings: ``max(x)`` where ``x`` already is in doublings (``SCALED``: with the key
    term), else the integer scores' maximum (unbiased, exactly) times ``a`` (per row)."""
    if SCALED:
        return gl.max(x, axis=1)
    else:
        return (gl.max(x, axis=1) - I2F_MAGIC) * a


@gluon.jit
def _gate_and_stage_a(x, a, c, m, EXP2: gl.constexpr, SCALED: gl.constexpr, SIGMA: gl.constexpr,
                      PV_FP8: gl.constexpr):
    """``(xmax, p)``: :func:`_row_peaks` and :func:`_stage_a`'s words; ``SCALED`` (Schraudolph only): ``x`` is
    already in doublings (with the key term), so ``a`` is not applied, else ``x`` is :func:`_scores`."""
    xmax = _row_peaks(x, a, SCALED)
    if SCALED:
        gl.static_assert(EXP2 == EXP2_SCHRAUDOLPH, "the exact exponential folds the key term (_tile_stage_a)")
        p = gl.maximum(x * GRID + c[:, None], MAGIC)
    else:
        p = _stage_a(x, a, c, m, EXP2, SIGMA, PV_FP8)
    return xmax, p


@gluon.jit
def _tile_stage_a(x, a, c, m, b_tile, EXP2: gl.constexpr, HAS_BIAS: gl.constexpr, SIGMA: gl.constexpr,
                  PV_FP8: gl.constexpr, scol: gl.constexpr):
    """``(xmax, p, keep)`` of one key tile from its biased scores ``x`` (:func:`_scores`): :func:`_gate_and_stage_a`,
    and with Q smoothing's key term (``HAS_BIAS``; ``b_tile`` the tile's terms in shared memory, sm90_numerics
    difference 12) under ``EXP2_HW`` Stage-A's argument ``z = fma(Xb, a, -k) + b_j`` (``k`` as without the term: two
    roundings, both at the argument's magnitude; one FMA and one add per score) with the row peaks
    ``max(z) + (m - SIGMA)``, under Schraudolph the scores in doublings (:func:`_with_key_term`) first. ``keep``: what
    a rollback's Stage-A starts from (:func:`_stage_a_again`): the scores in doublings, or ``x`` (nothing with the
    folded term: a rollback scales ``p``)."""
    if HAS_BIAS:
        if EXP2 == EXP2_HW:
            m2 = m - SIGMA
            z = _fma_rows(x, a, -gl.fma(a, I2F_MAGIC, m2)) + b_tile.load(scol)[None, :]
            xmax = gl.max(z, axis=1) + m2
            p = gl.exp2(z)
            keep = m2  # not read
        else:
            keep = _with_key_term(x, a, b_tile, scol)
            xmax, p = _gate_and_stage_a(keep, a, c, m, EXP2, True, SIGMA, PV_FP8)
    else:
        keep = x
        xmax, p = _gate_and_stage_a(x, a, c, m, EXP2, False, SIGMA, PV_FP8)
    return xmax, p, keep


@gluon.jit
def _stage_a_again(keep, p, a, c, m, shift, EXP2: gl.constexpr, HAS_BIAS: gl.constexpr, SIGMA: gl.constexpr,
                   PV_FP8: gl.constexpr):
    """Stage-A of a rolled-back tile under the new references ``m`` (``c`` their constants) from
    :func:`_tile_stage_a`'s ``keep``; with the folded key term (``EXP2_HW``) the tile's ``p`` times ``2^-shift``,
    ``shift`` the rows' step of the reference (an integer number of doublings, 0 on the rows that did not fire: an
    exact scaling), else Stage-A redone."""
    if HAS_BIAS and EXP2 == EXP2_HW:
        p = p * gl.exp2(-shift)[:, None]
    else:
        p = _gate_and_stage_a(keep, a, c, m, EXP2, HAS_BIAS, SIGMA, PV_FP8)[1]
    return p


@gluon.jit
def _stage_a(x, a, c, m, EXP2: gl.constexpr, SIGMA: gl.constexpr, PV_FP8: gl.constexpr):
    """Stage-A on the scores ``x`` (:func:`_scores`) of one key tile with the row factors ``a`` and constants ``c`` /
    references ``m`` (per row): the fp32 words whose BF16 patterns (low halves) or values (``EXP2_HW``, ``P 2^SIGMA``)
    are P (:mod:`kernels.sm90.fused_attention_gluon_int8`'s docstring). One FMA per element; the bias of the scores goes
    into the tile's row constant ``k`` (one FMA per row, one rounding; sm90_numerics difference 14). FP8 P: an explicit
    FMA in every copy (:func:`_fma_rows`); BF16 P: written ``x a - k``, which the rollback re-run may round as ``Xb a``
    first (:mod:`kernels.sm90.fused_attention_gluon_int8`'s docstring)."""
    if EXP2 == EXP2_HW:
        k = gl.fma(a, I2F_MAGIC, m - SIGMA)
        if PV_FP8:
            p = gl.exp2(_fma_rows(x, a, -k))
        else:
            p = gl.exp2(x * a[:, None] - k[:, None])
    else:
        ag = a * GRID
        k = gl.fma(ag, I2F_MAGIC, -c)
        p = gl.maximum(x * ag[:, None] - k[:, None], MAGIC)
    return p


@gluon.jit
def _fma_rows(x, f, g):
    """``fma(x, f, g)`` with ``f``, ``g`` per row: one rounding in every copy of Stage-A. Written as ``x * f + g``,
    the compiler shares the product ``x f`` between Stage-A and its rollback re-run and rounds it there first
    (FMUL + FADD), which with the biased scores is a rounding at ulp(1.5 2^23 f), not at the result's ulp."""
    x, fb = gl.broadcast(x, f[:, None])
    x, gb = gl.broadcast(x, g[:, None])
    return gl.fma(x, fb, gb)


@gluon.jit
def _e4m3_words(f, p_layout: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr):
    """FP8 P: the fp32 values ``f`` (``P 2^SIGMA``) as the E4M3 PV operand, int32 words of four bytes, shape
    (BM, BN // 4), key columns in the FP8 A-fragment order (:func:`a_fragment_quads`): two
    ``cvt.rn.satfinite.e4m3x2.f32`` per word (nearest-even), byte ``i`` of a word P's element ``4 w + i`` in
    ``p_layout`` order (the packing :func:`_words_to_fp8` undoes)."""
    e0, e1, e2, e3 = a_fragment_quads(f, p_layout, BM, BN)
    return gl.inline_asm_elementwise(
        "{ .reg .b16 lo, hi; cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1; cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3; "
        "mov.b32 $0, {lo, hi}; }", "=r,f,f,f,f", [e0, e1, e2, e3], dtype=gl.int32, is_pure=True, pack=1)


@gluon.jit
def _p_words(f, p_layout: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, EXP2: gl.constexpr,
             PV_FP8: gl.constexpr):
    """:func:`_stage_a`'s words as the PV operand: :func:`_bf16_words`, or for ``EXP2_HW`` one
    ``cvt.rn.bf16x2.f32`` per two values (element ``2 w`` in the low half); ``PV_FP8``: :func:`_e4m3_words`."""
    if PV_FP8:
        w = _e4m3_words(f, p_layout, BM, BN)
    elif EXP2 == EXP2_HW:
        e0, e1 = gl.split(gl.reshape(gl.convert_layout(f, p_layout), [BM, BN // 2, 2]))
        w = gl.inline_asm_elementwise("cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,f,f", [e0, e1], dtype=gl.int32,
                                      is_pure=True, pack=1)
    else:
        w = _bf16_words(f, p_layout, BM, BN)
    return w


@gluon.jit
def _words_to_bf16(w, p_layout: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr):
    """The inverse of :func:`_bf16_words`' packing: the (BM, BN) BF16 A operand in ``p_layout`` (no instructions)."""
    w2 = gl.convert_layout(gl.reshape(gl.join(w, w), [BM, BN]), p_layout)
    return gl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r,r", [w2], dtype=gl.bfloat16, is_pure=True, pack=2)


@gluon.jit
def _words_to_p(w, p_layout: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, PV_FP8: gl.constexpr):
    """The PV GEMM's A operand from the carried words: :func:`_words_to_fp8` or :func:`_words_to_bf16`."""
    if PV_FP8:
        return _words_to_fp8(w, p_layout, BM, BN)
    else:
        return _words_to_bf16(w, p_layout, BM, BN)

"""MXFP6 P (E2M3 elements, one E8M0 scale per 32 keys, the ``mxfp6`` and ``mxfp4`` recipes) in the gluon_pingpong
kernel: block maxima, Stage-A on the BF16 grid with one constant per (row, 32-key block), E2M3 rounding by E4M3's
nearest-even conversion, and the row sum of the MXFP6 values.

The values are those of ``kernels.sm90.fused_attention._stage_ab_gated`` (P_MX) and of
:func:`fsattn_diffusers.sm90_numerics.mxfp6_p_scaled_e4m3` (sm90 differences 4 and 5):

* ``E`` = the BF16 exponent field of a block's largest proxy (the FMA and the clamp are monotone, so it is taken on
  the raw block maximum of the scores), the block's floor-rule scale ``s = E - 129``;
* adding ``128 (123 - E)`` to Stage-A's constant maps ``2^s`` onto E4M3's smallest normal ``2^-6``: E4M3's
  nearest-even conversion there is E2M3's rounding (3 mantissa bits, quantum ``2^(s-3)`` below ``2^s``), clamped at
  ``7.5 * 2^-6`` (E2M3's largest value);
* the code times ``2^(s+6)`` (FP16, exact) rounded to E4M3 is the PV operand; the row sum adds the codes of each
  four keys (FP16, exact: multiples of 2^-9 below 0.12), times ``2^(s+6)`` in fp32, then the row in fp32 (on the H200
  the same outputs and LSE as the triton kernel, tests/test_kernel_gpu.py).

Blocks whose maximum is below 2^-120 are taken as ``E = 7`` (their P8 is 0 either way, their sums below 2^-110).
"""

from __future__ import annotations

import struct

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from fsattn_diffusers import sm90_numerics
from fsattn_diffusers.formats import MX_BLOCK

from ..common import RNE_MAGIC
from .constants import E2M3_MAX_SCALED, MXFP6_ANCHOR_OFFSET, MXFP6_E128_MIN

MAGIC = RNE_MAGIC
# 128 * (127 - eps') with eps' = 7/128: Schraudolph's bias on BF16's 1/128 grid (sm90_numerics.D_BITS).
D_BITS = gl.constexpr(float(sm90_numerics.D_BITS))
# Keys per MX block of P.
BLOCK = gl.constexpr(MX_BLOCK)
# f16x2 splat of E2M3_MAX_SCALED, the clamp of Stage-B's inline assembly.
_CLAMP_F16X2 = struct.unpack("<I", struct.pack("<ee", E2M3_MAX_SCALED.value, E2M3_MAX_SCALED.value))[0]


@gluon.jit
def block_max(s, BM: gl.constexpr, BN: gl.constexpr):
    """(BM, BN // 32) maxima of ``s`` (BM, BN) over each 32-key block (NaN, the gluon kernel's padding, dropped)."""
    return gl.max(gl.reshape(s, [BM, BN // BLOCK, BLOCK]), axis=2)


@gluon.jit
def stage_a_mxfp6(s, bmax, s128, c, BM: gl.constexpr, BN: gl.constexpr):
    """Stage-A of MXFP6 P: ``(g, e128)``. ``g`` (BM, BN // 32, 32) fp32 words whose low 16 bits are the BF16 pattern of
    P * 2^sigma moved so that the block scale ``2^s`` reads ``2^-6``; ``e128`` (BM, BN // 32) int32, 128 E.

    ``s`` (BM, BN) raw GEMM scores, ``bmax`` their :func:`block_max`, ``s128 = 2^(e + 7)`` (``e`` the tile's power of
    two), ``c`` (BM,) the row's BF16-grid constant ``MAGIC + D_BITS + 128 sigma - 128 m``."""
    cl = gl.convert_layout(c, gl.SliceLayout(1, bmax.type.layout))[:, None]
    fmax = gl.maximum(bmax * s128 + cl, MAGIC)
    e128 = gl.maximum(fmax.to(gl.int32, bitcast=True) & 0x7F80, MXFP6_E128_MIN)
    cb = cl - ((e128 | 0x4B000000).to(gl.float32, bitcast=True) - MXFP6_ANCHOR_OFFSET)  # c + 128 (123 - E), exact
    g = gl.maximum(gl.reshape(s, [BM, BN // BLOCK, BLOCK]) * s128 + cb[:, :, None], MAGIC)
    return g, e128


# Per word of four keys (one 32-key block): the four BF16 patterns as fp32 values (shifts), E4M3 rounding at the
# anchored scale (E2M3's), back to f16x2, the clamp at 7.5 * 2^-6, the block's 2^(s+6), E4M3 again; and the sum of the
# four clamped codes (exact in FP16) as fp32. $2..$5 the words g, $6 the f16x2 splat of 2^(s+6).
STAGE_B_ASM = gl.constexpr(
    "{ .reg .b32 x0, x1, x2, x3, ha, hb, cl; .reg .b16 a, b, u, v; "
    "shl.b32 x0, $2, 16; shl.b32 x1, $3, 16; shl.b32 x2, $4, 16; shl.b32 x3, $5, 16; "
    "cvt.rn.satfinite.e4m3x2.f32 a, x1, x0; cvt.rn.satfinite.e4m3x2.f32 b, x3, x2; "
    "cvt.rn.f16x2.e4m3x2 ha, a; cvt.rn.f16x2.e4m3x2 hb, b; "
    f"mov.b32 cl, {_CLAMP_F16X2:#010x}; "
    "min.f16x2 ha, ha, cl; min.f16x2 hb, hb, cl; "
    "add.rn.f16x2 cl, ha, hb; mov.b32 {u, v}, cl; add.rn.f16 u, u, v; cvt.f32.f16 $1, u; "
    "mul.rn.f16x2 ha, ha, $6; mul.rn.f16x2 hb, hb, $6; "
    "cvt.rn.satfinite.e4m3x2.f16x2 a, ha; cvt.rn.satfinite.e4m3x2.f16x2 b, hb; mov.b32 $0, {a, b}; }")


@gluon.jit
def stage_b_mxfp6(g, e128, p_layout: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, PERM: gl.constexpr):
    """Stage-B of MXFP6 P: ``(words, psum)``. ``words`` (BM, BN // 4) int32, the E4M3 PV operand in ``p_layout``,
    four E4M3 bytes per word, key columns in the FP8 A-fragment order (``PERM``, the kernel's permutation);
    ``psum`` (BM,) the row sum of the MXFP6 values times 2^sigma (fp32)."""
    kexp = (e128 >> 7) - 123  # s + 6
    h16 = (gl.maximum(kexp, -10) + 15) << 10  # FP16 bits of 2^(s+6) (exact: s + 6 >= -10 is kept, below P8 is 0)
    scale = ((kexp + 127) << 23).to(gl.float32, bitcast=True)  # 2^(s+6) for the row sum, unclamped
    sc = gl.reshape(gl.broadcast((h16 | (h16 << 16))[:, :, None], g)[0], [BM, BN])
    sw = gl.reshape(gl.broadcast(scale[:, :, None], g)[0], [BM, BN])
    f = gl.convert_layout(PERM(gl.reshape(g, [BM, BN]), BM, BN), p_layout)
    lo, hi = gl.split(gl.reshape(f, [BM, BN // 4, 2, 2]))  # elements (0, 2) and (1, 3) of each group of four
    e0, e2 = gl.split(lo)
    e1, e3 = gl.split(hi)
    sc0, _ = gl.split(gl.split(gl.reshape(gl.convert_layout(PERM(sc, BM, BN), p_layout), [BM, BN // 4, 2, 2]))[0])
    sw0, _ = gl.split(gl.split(gl.reshape(gl.convert_layout(PERM(sw, BM, BN), p_layout), [BM, BN // 4, 2, 2]))[0])
    words, csum = gl.inline_asm_elementwise(STAGE_B_ASM, "=r,=f,r,r,r,r,r", [e0, e1, e2, e3, sc0],
                                            dtype=(gl.int32, gl.float32), is_pure=True, pack=1)
    w = csum * sw0  # the codes' sum of each word (one block) times 2^(s+6)
    return words, gl.sum(w, axis=1)

"""Q smoothing's key term for the attention kernels (sm90_numerics difference 9) in one Triton pass per (batch, head):
the shift G from the largest ``|b_j| 2^-KE_j``, the E4M3 terms of ``x_j = b_j 2^(G - KE_j)`` (the gluon_pingpong
kernel's chained-wgmma operand Kx) and the carried term ``bias_eff_j`` (what the triton kernel adds). The same
values as :func:`fsattn_diffusers.sm90_numerics.key_term` (tests/test_kernel_key_term_gpu.py compares them).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fsattn_diffusers import sm90_numerics

from ..common import pow2, round_e4m3
from .constants import KEY_TERM_COLS

KEY_TILE = sm90_numerics.TILE
KEY_TERM_LEAD = tl.constexpr(sm90_numerics.KEY_TERM_LEAD)
G_MAX = tl.constexpr(sm90_numerics.KEY_TERM_G_MAX)
# The terms' capacity m_cap 2^e_cap, m_cap in [1, 2) (sm90_numerics.key_term_shift).
E_CAP = tl.constexpr(sm90_numerics.KEY_TERM_CAP_EXP)
M_CAP = tl.constexpr(sm90_numerics.KEY_TERM_CAP_MANT)
WARPS = 4


@triton.jit
def _e4m3(x, HW_CVT: tl.constexpr):
    """Nearest-even, saturating E4M3 value of fp32 ``x`` (the hardware cast on a GPU, bit arithmetic in the
    interpreter, whose cast is not nearest-even)."""
    if HW_CVT:
        return x.to(tl.float8e4nv).to(tl.float32)
    else:
        return round_e4m3(x)


@triton.jit
def _key_term_kernel(BIAS, KE, KX, BEFF, G, SEL, SKP, HW_CVT: tl.constexpr, WRITE_KX: tl.constexpr,
                     BN: tl.constexpr, COLS: tl.constexpr, HAS_SEL: tl.constexpr):
    """Program ``bh``: two passes over its SKP keys (BN per step), the maximum, then the terms. ``HAS_SEL``: a slice
    with ``SEL[bh] = 0`` (left out by Q smoothing's switch: its term is 0) gets G = G_MAX, as a zero term gives it,
    and zero ``bias_eff``; Kx is not written (the gluon_pingpong kernel skips the term there)."""
    bh = tl.program_id(0)
    keys = tl.arange(0, BN)
    base = bh.to(tl.int64) * SKP
    n_t = SKP // BN
    on = 1
    if HAS_SEL:
        on = tl.load(SEL + bh)
    if on != 0:
        _key_term_slice(BIAS, KE, KX, BEFF, G, bh, base, keys, n_t, HW_CVT, WRITE_KX, BN, COLS)
    else:  # bias_eff written for every kernel variant: no operand holds unwritten memory
        tl.store(G + bh, G_MAX)
        for t in range(0, n_t):
            tl.store(BEFF + base + t * BN + keys, tl.zeros((BN,), tl.float32))


@triton.jit
def _key_term_slice(BIAS, KE, KX, BEFF, G, bh, base, keys, n_t, HW_CVT: tl.constexpr, WRITE_KX: tl.constexpr,
                    BN: tl.constexpr, COLS: tl.constexpr):
    """The two passes of :func:`_key_term_kernel` for slice ``bh``."""
    amax = tl.zeros((BN,), tl.float32)
    for t in range(0, n_t):
        b = tl.load(BIAS + base + t * BN + keys)
        amax = tl.maximum(amax, tl.abs(b) * pow2(-tl.load(KE + bh * n_t + t)))
    a = tl.max(amax, axis=0)
    # the largest g with a 2^g <= m_cap 2^e_cap: a = m 2^e with m in [1, 2) (sm90_numerics.key_term_shift)
    bits = a.to(tl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) - 127
    m = (bits & 0x007FFFFF | 0x3F800000).to(tl.float32, bitcast=True)
    g = tl.where(m <= M_CAP, E_CAP - e, E_CAP - 1 - e)
    g = tl.where(a > 0, tl.minimum(tl.maximum(g, -G_MAX), G_MAX), G_MAX)
    tl.store(G + bh, g)
    words = tl.arange(0, COLS // 4)
    for t in range(0, n_t):
        b = tl.load(BIAS + base + t * BN + keys)
        ke = tl.load(KE + bh * n_t + t)
        x = b * pow2(g - ke)  # exact
        lead = _e4m3(tl.math.div_rn(x, KEY_TERM_LEAD * 1.0), HW_CVT)
        r = x - KEY_TERM_LEAD * lead
        total = KEY_TERM_LEAD * lead
        last = tl.zeros((BN,), tl.int32)  # the refinements' four bytes, the row's last int32 word
        for i in tl.static_range(COLS - KEY_TERM_LEAD):
            ti = _e4m3(r, HW_CVT)
            r = r - ti
            total = total + ti
            last = last | (_byte(ti) << (8 * i))
        tl.store(BEFF + base + t * BN + keys, total * pow2(ke - g))
        if WRITE_KX:  # Kx's row as COLS / 4 int32 words: the lead byte four times per word, then the last word
            # (built from bytes: a (BN, COLS) FP8 tensor stored directly came out with half its lead columns zero)
            lead4 = _byte(lead) * 0x01010101
            row = tl.where(words[None, :] < KEY_TERM_LEAD // 4, lead4[:, None], last[:, None])
            tl.store(KX + (base + t * BN + keys)[:, None] * (COLS // 4) + words[None, :], row)




@triton.jit
def _byte(e):
    """The E4M3 byte (int32, 0..255) of an fp32 value that is already an E4M3 value (exact cast)."""
    return e.to(tl.float8e4nv).to(tl.uint8, bitcast=True).to(tl.int32)


def key_term_operands(bias: torch.Tensor, ke: torch.Tensor, write_kx: bool, interpret: bool, sel=None):
    """The key term from the K pre-pass's outputs.

    Parameters
    ----------
    bias : Tensor (B, H, SKP) float32, doublings, 0 on padded keys; ke : Tensor (B, H, SKP / 128) int32.
    write_kx : also write the gluon_pingpong kernel's operand.
    sel : Tensor (B * H,) int32, optional: Q smoothing's per-slice switch (kernels.token_mean); slices with 0 have a
        zero term (bias 0) and get G and bias_eff as a zero term gives them, without the passes; their Kx rows are
        left unwritten (the gluon_pingpong kernel does not load them).

    Returns
    -------
    bias_eff : Tensor (B, H, SKP) float32; kx : Tensor (B * H * SKP, 32) float8_e4m3fn or None;
    g : Tensor (B * H,) int32; q_floor : Tensor (B, H) int32, ``-G - QX_MAX_LOG2``.
    """
    b, h, skp = bias.shape
    bias_eff = torch.empty_like(bias)
    g = torch.empty((b * h,), dtype=torch.int32, device=bias.device)
    kx = (torch.empty((b * h * skp, KEY_TERM_COLS.value), dtype=torch.float8_e4m3fn, device=bias.device)
          if write_kx else None)
    _key_term_kernel[(b * h,)](bias, ke, kx.view(torch.int32) if write_kx else g, bias_eff, g,
                               sel if sel is not None else g, skp, HW_CVT=not interpret, WRITE_KX=write_kx,
                               BN=KEY_TILE, COLS=KEY_TERM_COLS.value, HAS_SEL=sel is not None, num_warps=WARPS)
    return bias_eff, kx, g, (-g - sm90_numerics.QX_MAX_LOG2).view(b, h)

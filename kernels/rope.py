"""Wan's interleaved rotary embedding as one Triton pass (read BF16 x once, write it once).

diffusers' ``apply_rotary_emb`` (and :func:`fsattn_diffusers.integration.processors._rope_interleaved`) runs it as
about eight elementwise kernels with FP32 intermediates over the whole (B, S, H, D) tensor, twice per attention call;
this kernel computes the same FP32 operations in the same order (products rounded, then the difference / sum, no
fused multiply-add) and rounds once to the output dtype, so its output is bit-identical.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .common import round_bf16

# Rows (sequence positions) per program.
ROPE_ROWS = 32
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def _rope_kernel(X, sxb, sxs, sxh, sxd, COS, SIN, scb, scs, scd, ssb, sss, ssd, OUT, H, S,
                 D: tl.constexpr, BS: tl.constexpr, RNE_BF16: tl.constexpr):
    bh = tl.program_id(0)  # heads on the fast grid axis: programs in flight share their rows' cos/sin in L2
    pid_s = tl.program_id(1)
    b = bh // H
    h = bh % H
    rows = pid_s * BS + tl.arange(0, BS)
    pair = tl.arange(0, D // 2)
    ok = rows[:, None] < S
    cols = tl.arange(0, D)
    x = tl.load(X + b.to(tl.int64) * sxb + h.to(tl.int64) * sxh + rows[:, None].to(tl.int64) * sxs
                + cols[None, :] * sxd, mask=ok, other=0.0).to(tl.float32)
    even, odd = tl.split(tl.reshape(x, (BS, D // 2, 2)))
    c = tl.load(COS + b.to(tl.int64) * scb + rows[:, None].to(tl.int64) * scs + (2 * pair)[None, :] * scd,
                mask=ok, other=0.0)
    s = tl.load(SIN + b.to(tl.int64) * ssb + rows[:, None].to(tl.int64) * sss + (2 * pair + 1)[None, :] * ssd,
                mask=ok, other=0.0)
    out_even = even * c - odd * s
    out_odd = even * s + odd * c
    y = tl.reshape(tl.join(out_even, out_odd), (BS, D))
    if RNE_BF16:  # the CPU interpreter's fp32 -> bf16 cast is not nearest-even: round first there
        y = round_bf16(y)
    tl.store(OUT + ((b.to(tl.int64) * S + rows[:, None].to(tl.int64)) * H + h) * D + cols[None, :],
             y.to(OUT.dtype.element_ty), mask=ok)


def rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs ``(x[2i], x[2i+1])`` of ``x`` by Wan's angles, in one pass.

    Parameters
    ----------
    x : Tensor (B, S, H, D), any strides, bf16 / fp16 / fp32; D even and a power of two.
    cos, sin : Tensor (1 or B, S, 1, D) float32: ``cos[..., 2i]`` and ``sin[..., 2i + 1]`` are the pair's angle.

    Returns
    -------
    Tensor (B, S, H, D), contiguous, ``x``'s dtype: ``x[2i] cos - x[2i+1] sin``, ``x[2i] sin + x[2i+1] cos``
    computed in float32 and rounded once.
    """
    b, s, h, d = x.shape
    out = torch.empty((b, s, h, d), dtype=x.dtype, device=x.device)
    cs = cos.expand(b, s, 1, d).stride()
    ss = sin.expand(b, s, 1, d).stride()
    _rope_kernel[(b * h, triton.cdiv(s, ROPE_ROWS))](
        x, x.stride(0), x.stride(1), x.stride(2), x.stride(3), cos, sin, cs[0], cs[1], cs[3], ss[0], ss[1], ss[3],
        out, h, s, D=d, BS=ROPE_ROWS, RNE_BF16=INTERPRET and x.dtype == torch.bfloat16, enable_fp_fusion=False,
        num_warps=4)
    return out

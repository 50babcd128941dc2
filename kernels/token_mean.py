"""K's (and Q's) token mean on the GPU for the pre-pass: :func:`fsattn_diffusers.smoothing.token_mean`'s values from
one read of the input, ``kv_lens`` read on the device (no host sync), two launches.

``smoothing.token_mean`` defines the mean as the float64 sum of the tokens' BF16 values over their count, rounded to
float32 and then to BF16; a float64 sum of BF16 values is exact for any realistic activation, so the order in which
these kernels add (per chunk of tokens, then over the chunks) gives the same bits as PyTorch's.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .common import load_slice_rows, round_bf16

# Tokens per program of the partial sums (32 programs per (batch, head) at S = 32768), rows per load.
CHUNK = 1024
ROWS = 16
WARPS = 4
# Chunks the finishing kernel adds per step.
FINISH_CHUNKS = 16


@triton.jit
def _token_sum_kernel(X, sxb, sxh, sxs, sxd, KVL, PART, PART2, H, S, N_CHUNKS,
                      D: tl.constexpr, CHUNK: tl.constexpr, BS: tl.constexpr, HAS_KVL: tl.constexpr,
                      SQUARES: tl.constexpr):
    """Program (c, bh): float64 sum of the BF16 values of tokens ``c * CHUNK`` .. ``+ CHUNK - 1`` of slice ``bh`` (rows
    at or past S or ``kv_lens[b]`` read as 0) into ``PART[bh, c, :]``; ``SQUARES``: also the sum of their squares into
    ``PART2[bh, c, :]``."""
    c = tl.program_id(0)
    bh = tl.program_id(1)
    acc = tl.zeros((BS, D), tl.float64)  # one partial sum per row slot, reduced once at the end (a reduction across
    acc2 = tl.zeros((BS, D), tl.float64)  # the rows after every load synchronized the warps each step)
    for i in tl.static_range(CHUNK // BS):
        x, _, _ = load_slice_rows(X, sxb, sxh, sxs, sxd, KVL, H, S, c * (CHUNK // BS) + i, bh, BS, D, HAS_KVL)
        if X.dtype.element_ty == tl.bfloat16:
            x = x.to(tl.float32)
        else:  # nearest-even BF16 by bit arithmetic (the same on the GPU and in the interpreter)
            x = round_bf16(x.to(tl.float32))
        x = x.to(tl.float64)
        acc += x
        if SQUARES:
            acc2 += x * x
    tl.store(PART + (bh.to(tl.int64) * N_CHUNKS + c) * D + tl.arange(0, D), tl.sum(acc, axis=0))
    if SQUARES:
        tl.store(PART2 + (bh.to(tl.int64) * N_CHUNKS + c) * D + tl.arange(0, D), tl.sum(acc2, axis=0))


@triton.jit
def _token_mean_finish_kernel(PART, PART2, KVL, MEAN, SEL, ratio2, H, S, N_CHUNKS, D: tl.constexpr, FC: tl.constexpr,
                              HAS_KVL: tl.constexpr, SELECT: tl.constexpr):
    """Program bh: ``MEAN[bh, :] = BF16(float32(sum of PART[bh, :, :] / n))``, n = S or ``min(kv_lens[b], S)``; 0
    when n = 0 (as smoothing.token_mean). ``SELECT`` (Q smoothing's per-slice switch,
    smoothing.q_smoothing_heads): ``SEL[bh] = |mu|^2 > ratio2 (ms - |mu|^2)`` from the float64 mean ``mu`` and mean
    square ``ms`` (PART2), and the mean written as 0 where it is not."""
    bh = tl.program_id(0)
    n = S
    if HAS_KVL:
        n = tl.minimum(tl.load(KVL + bh // H).to(tl.int32), S)
    cols = tl.arange(0, D)
    total = tl.zeros((D,), tl.float64)
    total2 = tl.zeros((D,), tl.float64)
    for c0 in range(0, N_CHUNKS, FC):
        chunk = c0 + tl.arange(0, FC)
        offs = (bh.to(tl.int64) * N_CHUNKS + chunk[:, None]) * D + cols[None, :]
        total += tl.sum(tl.load(PART + offs, mask=chunk[:, None] < N_CHUNKS, other=0.0), axis=0)
        if SELECT:
            total2 += tl.sum(tl.load(PART2 + offs, mask=chunk[:, None] < N_CHUNKS, other=0.0), axis=0)
    mu = total / tl.maximum(n, 1).to(tl.float64)
    mean = tl.where(n > 0, round_bf16(mu.to(tl.float32)), 0.0)
    if SELECT:
        mm = tl.sum(mu * mu, axis=0)
        ms = tl.sum(total2, axis=0) / tl.maximum(n, 1).to(tl.float64)
        sel = (mm > ratio2 * (ms - mm)) & (n > 0)
        tl.store(SEL + bh, sel.to(tl.int32))
        mean = tl.where(sel, mean, 0.0)
    tl.store(MEAN + bh * D + cols, mean)


def token_mean(x: torch.Tensor, kv_lens: Optional[torch.Tensor] = None, ratio2: float = 0.0):
    """Mean over the tokens of ``x``, as :func:`fsattn_diffusers.smoothing.token_mean` gives it.

    Parameters
    ----------
    x : Tensor (B, H, S, D), any strides, fp16/bf16/fp32, CUDA (or CPU under TRITON_INTERPRET=1); never modified.
        D a power of two >= 16.
    kv_lens : int tensor (B,), optional: only tokens before ``kv_lens[b]`` count (smoothing's ``valid`` prefix).
    ratio2 : float, optional
        > 0: Q smoothing's per-slice switch at ``float32(Recipe.smooth_q_min_ratio^2)`` (``KernelPlan.smooth_q_ratio2``,
        :func:`smoothing.q_smoothing_heads`); the mean is returned as 0 on the slices it leaves out, and the
        selection as a second output.

    Returns
    -------
    Tensor (B, H, 1, D) float32, BF16 values; with ``ratio2`` > 0 also ``(B * H,)`` int32, 1 where the slice
    is smoothed.
    """
    b, h, s, d = x.shape
    if d < 16 or d & (d - 1):
        raise ValueError(f"token_mean kernel: head dim {d}; accepted: powers of two >= 16")
    n_chunks = max(1, triton.cdiv(s, CHUNK))
    select = ratio2 > 0.0
    part = torch.empty((b * h, n_chunks, d), dtype=torch.float64, device=x.device)
    part2 = torch.empty_like(part) if select else part
    mean = torch.empty((b, h, 1, d), dtype=torch.float32, device=x.device)
    sel = torch.empty((b * h,), dtype=torch.int32, device=x.device) if select else None
    has_kvl = kv_lens is not None
    kvl = kv_lens.to(device=x.device, dtype=torch.int32) if has_kvl else mean
    _token_sum_kernel[(n_chunks, b * h)](x, *x.stride(), kvl, part, part2, h, s, n_chunks, D=d, CHUNK=CHUNK, BS=ROWS,
                                         HAS_KVL=has_kvl, SQUARES=select, num_warps=WARPS)
    _token_mean_finish_kernel[(b * h,)](part, part2, kvl, mean, sel if select else mean, float(ratio2), h, s,
                                        n_chunks, D=d, FC=FINISH_CHUNKS, HAS_KVL=has_kvl, SELECT=select,
                                        num_warps=WARPS)
    return (mean, sel) if select else mean


__all__ = ["token_mean"]

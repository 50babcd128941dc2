"""The FP8 wgmma's accumulation, and O's fp32 promotion interval (``Recipe.o_promotion_tiles``; NUMERICS.md §6).

Hopper's FP8 tensor cores (``wgmma ... .e4m3``, 32 products of K per instruction) do not add into their fp32
accumulator in fp32: the products of one instruction and the accumulator are aligned to the largest exponent among
them and every bit below ``2^(E - FP8_MMA_ACC_MANT_BITS)`` is dropped (truncation toward zero; about 14 significant
bits retained, DeepSeek-V3's report). Chained over many instructions onto a growing sum, every later product is cut
at the sum's magnitude: the loss grows with the number of chained additions and is biased toward zero. The fp32
promotion (adding a zeroed accumulator's partial result to O in registers every ``n`` key tiles) bounds the chain.

:func:`fp8_chained_mma` models it: per 32-key chunk, ``acc <- sum(trunc_E(acc), trunc_E(p_k v_k))`` with ``E`` the
floor log2 of the largest magnitude among the accumulator and the chunk's products, per output element. Products of
two E4M3 values are exact in float32, and so is the sum of 33 terms on one grid of 2^14 steps.
"""

from __future__ import annotations

from typing import Optional

import torch

#: Mantissa bits the FP8 wgmma keeps below the largest exponent it adds (13: 14 significant bits).
FP8_MMA_ACC_MANT_BITS = 13
#: Products of K per FP8 wgmma instruction (its K for E4M3 operands).
FP8_MMA_K = 32
#: The model's finest grid, 2^-100 (sums that small are kept whole; 2^100 stays a finite float32 multiplier).
GRID_MIN_EXP = -100


def truncate_to_grid(x: torch.Tensor, exp: torch.Tensor, mant_bits: int) -> torch.Tensor:
    """``x`` truncated toward zero to the grid ``2^(exp - mant_bits)`` (float32; ``exp`` int32 broadcastable)."""
    q = (exp - mant_bits).to(torch.int32)
    return torch.ldexp(torch.trunc(torch.ldexp(x, -q)), q)


def fp8_chained_mma(acc: Optional[torch.Tensor], p: torch.Tensor, v: torch.Tensor,
                    mant_bits: int = FP8_MMA_ACC_MANT_BITS, k_step: int = FP8_MMA_K) -> torch.Tensor:
    """``acc + p @ v`` as chained FP8 wgmmas of ``k_step`` products each accumulate it (module docstring).

    Parameters
    ----------
    acc : (G, R, D) float32 accumulator, or None (a zeroed one).
    p : (G, R, N) float32, E4M3 values (P of one key tile); v : (G, N, D) float32, V's E4M3 values times its scale
        (a power of two: the products are exact; ``fp8_tensor``/``fp8_channel``: they round once to float32, where the
        kernel multiplies by the scale after the GEMM).
    mant_bits : bits kept below the largest exponent of each chained addition.

    Returns
    -------
    (G, R, D) float32, the accumulator after the ``ceil(N / k_step)`` chained instructions.
    """
    g, r, n = p.shape
    out = torch.zeros((g, r, v.shape[-1]), dtype=torch.float32, device=p.device) if acc is None else acc
    for k0 in range(0, n, k_step):
        prods = p[:, :, k0:k0 + k_step, None] * v[:, None, k0:k0 + k_step, :]  # (G, R, k, D), exact
        big = torch.maximum(prods.abs().amax(dim=2), out.abs())
        _, e = torch.frexp(big)  # big = f 2^e, f in [0.5, 1): floor(log2 big) = e - 1
        q = torch.clamp(e - 1 - mant_bits, min=GRID_MIN_EXP).to(torch.int32)  # the grid's exponent
        inv = torch.ldexp(torch.ones_like(big), -q)  # exact powers of two: x * inv, integer sums times 2^q are exact
        units = torch.trunc(out * inv) + torch.trunc(prods.mul_(inv[:, :, None, :])).sum(dim=2)
        out = torch.ldexp(units, q)
    return out


def promotes_after(tile_index: int, interval: Optional[int]) -> bool:
    """Whether O takes the accumulator's partial sum in fp32 after the ``tile_index``-th key tile visited (0-based)
    under ``Recipe.o_promotion_tiles = interval`` (None: never; the last tile's sum is always taken at the end)."""
    return interval is not None and (tile_index + 1) % interval == 0

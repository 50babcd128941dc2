"""Wan's interleaved RoPE by one Triton pass (``kernels.rope``; bit-identical to the PyTorch form of
:func:`fsattn_diffusers.integration.processors._rope_interleaved`, timing in docs/design.md,
"Fused Wan RoPE").

On by default for CUDA tensors; ``FSATTN_FUSED_ROPE=0`` turns it off.
"""

from __future__ import annotations

import os
from typing import Optional

import torch

FUSED_ROPE = os.environ.get("FSATTN_FUSED_ROPE", "1") != "0"
# The kernel's grid puts the row blocks on CUDA's second grid axis (at most 65535 blocks of ROPE_ROWS rows).
_FUSED_ROPE_MAX_TOKENS = 65535 * 32


def fused_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> Optional[torch.Tensor]:
    """Wan's RoPE on ``x`` (B, S, H, D) by the Triton pass, or None when it is off or does not take these operands
    (then the caller computes the PyTorch form).

    ``cos``, ``sin``: float32 (1 or B, S, 1, D). Returns a new tensor of ``x``'s shape and dtype."""
    d = x.shape[-1]
    if (FUSED_ROPE and x.is_cuda and x.dim() == 4 and d >= 2 and d & (d - 1) == 0
            and x.shape[1] <= _FUSED_ROPE_MAX_TOKENS
            and cos.dtype == sin.dtype == torch.float32 and cos.dim() == sin.dim() == 4
            and tuple(cos.shape[1:]) == tuple(sin.shape[1:]) == (x.shape[1], 1, d)
            and cos.shape[0] in (1, x.shape[0]) and sin.shape[0] in (1, x.shape[0])):
        from ..kernels.rope import rope_interleaved

        return rope_interleaved(x, cos, sin)
    return None

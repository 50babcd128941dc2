"""Where the kernel tests run: a CUDA GPU of sm_90 or newer, or (``FSATTN_KERNEL_TEST_CPU=1`` with
``TRITON_INTERPRET=1``) Triton's interpreter on the CPU; the seeded inputs they share (:func:`make`), the relative
error they report (:func:`rel`), the kernels' PyTorch reference (:func:`sm90_reference_attention`) and one kernel call
on its pre-pass's operands (:func:`kernel_on_operands`)."""

import functools
import math
import os

import pytest
import torch

from fsattn_diffusers.backends import reference_attention
from fsattn_diffusers.testing import relative_error as rel  # noqa: F401 (the error the kernel tests report)

CPU_INTERPRET = os.environ.get("FSATTN_KERNEL_TEST_CPU") == "1" and os.environ.get("TRITON_INTERPRET") == "1"
DEV = "cpu" if CPU_INTERPRET else "cuda"


def skip_module_without_sm90() -> None:
    """Skip the calling test module unless the interpreter mode is on or an sm_90+ CUDA GPU is present."""
    if CPU_INTERPRET:
        return
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU", allow_module_level=True)
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("needs sm_90+", allow_module_level=True)


def make(b, h, s_q, s_k, d, layout, seed=0, dtype=torch.bfloat16, spiky=False):
    """Seeded standard-normal q (B, H, S_q, D), k, v (B, H, S_k, D) on DEV; ``layout="bshd"``: BHSD views of BSHD
    memory with the same values, as diffusers passes them. ``spiky``: a few keys far above the rest and q x 2, which
    force the gate (and the reference) to roll back."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, s, d, generator=g) for s in (s_q, s_k, s_k))
    if spiky:
        k[:, :, 3 * s_k // 4] *= 12.0
        k[:, :, s_k // 2 + 5] *= 8.0
        q *= 2.0
    q, k, v = (t.to(dtype).to(DEV) for t in (q, k, v))
    if layout == "bshd":
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    return q, k, v


#: What the Hopper kernels compute, in PyTorch: ``(out, lse, stats)`` of the ``triton`` backend's numerics.
sm90_reference_attention = functools.partial(reference_attention, "triton")


def a_fragment_position(c: torch.Tensor) -> torch.Tensor:
    """Where the attention kernels' V operand (V8T) stores key ``c``: c0 + 2 c3 + 4 c1 + 8 c2 within each aligned 16."""
    r = c & 15
    return (c - r) + (r & 1) + ((r >> 3) & 1) * 2 + ((r >> 1) & 1) * 4 + ((r >> 2) & 1) * 8


def poison_allocator(nbytes=64 << 20) -> None:
    """Leave NaN in the caching allocator's free blocks so torch.empty hands back NaN (on a GPU)."""
    if DEV == "cuda":
        torch.full((nbytes // 4,), float("nan"), device=DEV)
        torch.cuda.synchronize()


def kernel_on_operands(q, k, v, recipe_name, kv, variant, q_lens=None):
    """``(out, lse, stats, ops)``: the attention kernel ``variant`` (gluon_pingpong or triton) on the operands its
    pre-pass writes for ``recipe_name``, the allocator poisoned and out (B, H, S_q, D) / lse (B, H, S_q) NaN-filled
    first; the LSE is that of the unsmoothed scores (K smoothing's offset added back), as the public call returns it."""
    from fsattn_diffusers.kernels.sm90.ops import attention_from_operands, prepass
    from fsattn_diffusers.kernels.sm90.plan import plan_for
    from fsattn_diffusers.recipe import get_recipe
    from fsattn_diffusers.smoothing import lse_offset

    plan = plan_for(get_recipe(recipe_name))
    scale = 1.0 / math.sqrt(q.shape[-1])
    ops = prepass(q, k, v, plan, scale, kv, variant=variant, q_lens=q_lens)
    poison_allocator(16 << 20)
    out = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:3], float("nan"), device=DEV)
    st = torch.zeros((2,), dtype=torch.int32, device=DEV)
    attention_from_operands(ops, out, plan, q.shape[2], k.shape[2], kv, lse, st, variant=variant)
    if ops.k_mean is not None:
        lse = lse + lse_offset(q, ops.k_mean, scale)
    return out, lse, st, ops

"""The Triton Fused-Softmax kernel for NVIDIA sm_90+ (see ``kernels/``; numerics in ``sm90_numerics``)."""

from __future__ import annotations

from ..formats import QKFormat
from .registry import Backend, register_backend


def _available(device):
    if device.type != "cuda":
        return "no CUDA device"
    import torch

    if getattr(torch.version, "hip", None):
        return "ROCm device (the Triton kernel targets NVIDIA sm_90+)"
    index = device.index if device.index is not None else torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    if major < 9:
        return f"compute capability {major}.{minor} (the Triton kernel needs sm_90+: FP8 tensor cores)"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not installed"
    return None


def _unsupported(q, k, v, recipe, *, kv_lens, return_lse, q_lens=None):
    from ..kernels.sm90.plan import unsupported_reason

    return unsupported_reason(recipe, q.shape[-1])


def _run(q, k, v, recipe, *, scale, kv_lens, return_lse, return_stats, detect_nonfinite=False, q_lens=None):
    if recipe.qk_format == QKFormat.INT8:  # the INT8 Q/K kernel (kernels/sm90/fused_attention_gluon_int8.py)
        from ..kernels.sm90.ops_int8 import fused_attention_int8

        return fused_attention_int8(q, k, v, recipe, scale=scale, kv_lens=kv_lens, return_lse=return_lse,
                                    return_stats=return_stats, detect_nonfinite=detect_nonfinite, q_lens=q_lens)
    from ..kernels.sm90.ops import fused_attention  # imports triton: only where the kernel runs
    from ..kernels.sm90.plan import plan_for

    return fused_attention(q, k, v, plan_for(recipe), scale=scale, kv_lens=kv_lens, return_lse=return_lse,
                           return_stats=return_stats, detect_nonfinite=detect_nonfinite, q_lens=q_lens)


# The pre-pass reads every element of q, k, v (keys before kv_lens) and flags the non-finite slices itself.
register_backend(Backend("triton", _run, _available, _unsupported, detects_nonfinite=True, takes_q_lens=True,
                         computes="sm90"))

"""The Triton Fused-Softmax kernel for NVIDIA sm_90+ (see ``kernels/``)."""

from __future__ import annotations

from . import Backend, register_backend


def _available(device):
    if device.type != "cuda":
        return "no CUDA device"
    return "the Triton kernel is not built yet"


def _unsupported(q, k, v, recipe, *, kv_lens, return_lse):
    return None


def _run(q, k, v, recipe, *, scale, kv_lens, return_lse, return_stats):
    raise RuntimeError("the Triton kernel is not built yet")


register_backend(Backend("triton", _run, _available, _unsupported))

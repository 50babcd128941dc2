"""The Triton Fused-Softmax kernel for NVIDIA sm_90+ (see ``kernels/``; numerics in ``sm90_numerics``)."""

from __future__ import annotations

import importlib
import importlib.util
import pathlib
import sys

from . import Backend, register_backend


def kernels_package():
    """``fsattn_diffusers.kernels``; from a source checkout on ``PYTHONPATH`` (not installed), the
    top-level ``kernels/`` folder is loaded under that name."""
    name = "fsattn_diffusers.kernels"
    if name in sys.modules:  # a dict read (torch.compile traces it; an import call would break the graph)
        return sys.modules[name]
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:
            raise
    root = pathlib.Path(__file__).resolve().parents[2] / "kernels"
    spec = importlib.util.spec_from_file_location(name, root / "__init__.py", submodule_search_locations=[str(root)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


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


def _unsupported(q, k, v, recipe, *, kv_lens, return_lse):
    kernels_package()
    from ..kernels.plan import unsupported_reason

    return unsupported_reason(recipe, q.shape[-1])


def _run(q, k, v, recipe, *, scale, kv_lens, return_lse, return_stats):
    kernels_package()
    from ..kernels.ops import fused_attention
    from ..kernels.plan import plan_for

    return fused_attention(q, k, v, plan_for(recipe), scale=scale, kv_lens=kv_lens, return_lse=return_lse,
                           return_stats=return_stats)


register_backend(Backend("triton", _run, _available, _unsupported))

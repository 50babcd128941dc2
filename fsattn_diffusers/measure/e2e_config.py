"""Model configurations of ``fsattn e2e`` beyond the BF16 eager transformer, applied alike to every policy.

* :func:`quantize_fp8_gemms` — ``--gemms fp8``: the linear layers of the transformer's repeated blocks
  quantized with torchao's float8 dynamic activation / weight quantization, one scale per row
  (``Float8DynamicActivationFloat8WeightConfig(granularity=PerRow())``: E4M3 weights quantized once,
  activations per call, ``torch._scaled_mm``). Needs an NVIDIA GPU of compute capability 8.9 or higher.
* :func:`compile_blocks` — ``--compile``: the repeated blocks compiled with ``torch.compile`` (diffusers'
  ``compile_repeated_blocks``), ``fullgraph=True``; :func:`warm_compiled` falls back to
  ``fullgraph=False`` for a policy whose graph breaks, and says where.

torchao is imported only here, when ``--gemms fp8`` is asked for (importing it prints warnings).
"""

from __future__ import annotations

from typing import Callable, Dict, Optional

import torch

GEMMS = ("bf16", "fp8")
#: FP8 tensor cores: Ada (8.9) and Hopper (9.0) or newer.
FP8_MIN_CAPABILITY = (8, 9)
# torch._scaled_mm needs both GEMM dimensions to be multiples of 16.
_SCALED_MM_ALIGN = 16


def fp8_gemms_refusal(device: torch.device) -> Optional[str]:
    """Why ``--gemms fp8`` cannot run on ``device`` (``None`` when it can): one line."""
    if device.type != "cuda" or not torch.cuda.is_available() or getattr(torch.version, "hip", None):
        return (f"--gemms fp8 needs an NVIDIA GPU with FP8 tensor cores (compute capability >= 8.9: Ada, Hopper); "
                f"this run is on {device.type}; accepted: --gemms bf16 on any device")
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < FP8_MIN_CAPABILITY:
        return (f"--gemms fp8 needs compute capability >= 8.9 (FP8 tensor cores), this GPU is {major}.{minor}; "
                f"accepted: --gemms bf16")
    try:
        import torchao  # noqa: F401
        from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, quantize_  # noqa: F401
    except Exception as exc:  # ImportError, or an incompatible torch
        return (f"--gemms fp8 needs torchao with Float8DynamicActivationFloat8WeightConfig (pip install torchao); "
                f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    return None


def _repeated_block_classes(model) -> tuple:
    return tuple(getattr(model, "_repeated_blocks", None) or ())


def block_linear_filter(model) -> Callable[[torch.nn.Module, str], bool]:
    """``filter_fn(module, fqn)`` for torchao: BF16 ``nn.Linear`` layers inside the repeated blocks whose
    dimensions ``_scaled_mm`` takes (the embeddings, the time projection and the output head stay BF16)."""
    names = set(_repeated_block_classes(model)) - {"HunyuanVideoPatchEmbed"}
    inside = set()
    for name, module in model.named_modules():
        if type(module).__name__ in names:
            inside.update(f"{name}.{sub}" if sub else name for sub, _ in module.named_modules())

    def filter_fn(module: torch.nn.Module, fqn: str) -> bool:
        return (isinstance(module, torch.nn.Linear) and fqn in inside and module.weight.dtype == torch.bfloat16
                and module.in_features % _SCALED_MM_ALIGN == 0 and module.out_features % _SCALED_MM_ALIGN == 0)

    return filter_fn


def quantize_fp8_gemms(model) -> Dict[str, int]:
    """Quantize the repeated blocks' linear layers of ``model`` in place (float8 dynamic, per-row scales).

    Returns ``{"quantized": n, "linear_total": m}`` (layers quantized / all ``nn.Linear`` in the model).
    Call :func:`fp8_gemms_refusal` first.
    """
    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, quantize_

    filter_fn = block_linear_filter(model)
    chosen = [n for n, m in model.named_modules() if filter_fn(m, n)]
    total = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    quantize_(model, Float8DynamicActivationFloat8WeightConfig(granularity=PerRow()), filter_fn=filter_fn)
    return {"quantized": len(chosen), "linear_total": total}


def raise_recompile_limit(limit: int = 64) -> None:
    """Room for one compiled graph per policy (each policy's processors change the blocks' guards)."""
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), limit))


def compile_blocks(model, fullgraph: bool = True, backend: str = "inductor") -> int:
    """``torch.compile`` every repeated block of ``model`` in place; returns how many were compiled."""
    raise_recompile_limit()
    classes = set(_repeated_block_classes(model))
    if not classes:
        raise ValueError(f"{type(model).__name__} declares no repeated blocks; accepted: Wan and HunyuanVideo "
                         f"transformers of diffusers 0.42")
    n = 0
    for module in model.modules():
        if type(module).__name__ in classes:
            module.compile(fullgraph=fullgraph, backend=backend)
            n += 1
    return n


def graph_breaks() -> int:
    """Graph breaks Dynamo has counted in this process."""
    from torch._dynamo.utils import counters

    return sum(counters["graph_break"].values())


def warm_compiled(model, run: Callable[[], None], backend: str = "inductor") -> dict:
    """Run ``run()`` (the warm-up forwards) on compiled blocks; when ``fullgraph=True`` fails (a graph
    break), recompile the blocks with ``fullgraph=False``, run again, and report the first break.

    Returns ``{"fullgraph": bool, "graph_breaks": int, "break": str or None}``.
    """
    before = graph_breaks()
    try:
        run()
        return {"fullgraph": True, "graph_breaks": graph_breaks() - before, "break": None}
    except Exception as exc:  # torch._dynamo.exc.Unsupported and friends, raised at the first compiled call
        if "torch._dynamo" not in type(exc).__module__ and "graph break" not in str(exc).lower():
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    compile_blocks(model, fullgraph=False, backend=backend)
    before = graph_breaks()
    run()
    return {"fullgraph": False, "graph_breaks": graph_breaks() - before, "break": first}


def block_inputs(model, block, forward: Callable[[], None]):
    """``(args, kwargs)`` that ``block`` receives during ``forward()`` (its first call), captured by a hook."""
    seen = {}

    def hook(module, args, kwargs):
        seen.setdefault("call", (args, kwargs))

    handle = block.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            forward()
    finally:
        handle.remove()
    return seen["call"]


def explain_block(block, args, kwargs) -> dict:
    """``torch._dynamo.explain`` of one block call: ``{"graphs", "graph_breaks", "reasons"}`` where each
    reason is ``"<why> at <file>:<line> in <function>"`` (the innermost user frame)."""
    torch._dynamo.reset()
    with torch.no_grad():
        ex = torch._dynamo.explain(block)(*args, **kwargs)
    reasons = []
    for r in ex.break_reasons:
        where = r.user_stack[-1] if r.user_stack else None
        loc = f" at {where.filename}:{where.lineno} in {where.name}" if where is not None else ""
        reasons.append(str(r.reason).strip().splitlines()[0] + loc)
    torch._dynamo.reset()
    return {"graphs": ex.graph_count, "graph_breaks": ex.graph_break_count, "reasons": reasons}


__all__ = ["GEMMS", "fp8_gemms_refusal", "quantize_fp8_gemms", "block_linear_filter", "compile_blocks",
           "warm_compiled", "graph_breaks", "raise_recompile_limit", "block_inputs", "explain_block"]

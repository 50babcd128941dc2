"""Backend registry, per-call selection with one-time fallback warnings, and the non-finite contract around every call.

Every backend takes one :class:`~.contract.AttentionRequest` and returns one :class:`~.contract.AttentionResult`
(:mod:`.contract`); each backend module registers itself (:mod:`.registry`) with the devices it takes, why it refuses
a call, its speed class and the numerics it computes. :func:`run_checked` is the one place that handles non-finite
inputs (NUMERICS.md section 8) around whichever backend runs. :func:`computed_numerics` says what a backend computes
for a recipe, :func:`reference_attention` the same numerics in PyTorch (a kernel's reference), :data:`LAST_RAN` which
backend ran a recipe last in this process (for the result files' records), and :func:`fast_path` which backend
``"auto"`` would pick on a device and at what speed class.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Callable, Dict, List, Optional, Tuple

import torch

from .. import nonfinite
from ..emulator import emulate_attention
from .contract import AttentionRequest, AttentionResult, Speed, SpeedClass  # noqa: F401 (the public contract)
from .registry import (_REGISTRY, _WARNED, Backend, CudaCapability, forget_devices,  # noqa: F401 (public table)
                       register_backend, unregister_backend, warn_once)

#: Recipe name -> the backend that ran the latest eager call of it in this process (not updated while
#: ``torch.compile`` traces).
LAST_RAN: Dict[str, str] = {}
_LOADED: List[str] = []


def computed_numerics(backend: str, recipe) -> str:
    """The numerics ``backend`` computes for ``recipe``: its fixed ones (``Backend.computes``) or the recipe's."""
    fixed = registered()[backend].computes
    return str(fixed) if fixed is not None else recipe.numerics


def reference_attention(backend: str, q, k, v, recipe, *, scale: float, kv_lens: Optional[torch.Tensor] = None,
                        q_lens: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor, Dict[str, int]]:
    """What ``backend`` computes for ``recipe``, in PyTorch: the emulator in :func:`computed_numerics`.

    Parameters
    ----------
    backend : str
        A registered backend whose numerics the emulator models (``Recipe.numerics`` takes them).
    q : Tensor (B, H, S_q, D); k, v : Tensor (B, H, S_k, D)
        Any device; never modified.
    recipe : Recipe
    scale : float
        Softmax scale alpha.
    kv_lens, q_lens : int64 Tensor (B,), optional
        Valid keys and queries per batch entry (as :func:`fsattn_diffusers.emulator.emulate_attention`).

    Returns
    -------
    out : Tensor (B, H, S_q, D) in q's dtype
    lse : float32 Tensor (B, H, S_q), natural log
    stats : dict with ``rollbacks``, ``tiles``, ``rollback_tiles``, ``rollback_rate``
    """
    return emulate_attention(q, k, v, recipe.replace(numerics=computed_numerics(backend, recipe)), scale=scale,
                             kv_lens=kv_lens, return_lse=True, return_stats=True, q_lens=q_lens)


def _ensure_loaded() -> None:
    # Every ``*_backend`` module of this package registers itself; imported lazily so that importing the package
    # never needs triton or aiter (the modules import them only when probed or run).
    if _LOADED:
        return
    for info in pkgutil.iter_modules(__path__):
        if info.name.endswith("_backend"):
            importlib.import_module(f"{__name__}.{info.name}")
            _LOADED.append(info.name)


def registered() -> Dict[str, Backend]:
    _ensure_loaded()
    return dict(_REGISTRY)


def auto_order() -> List[str]:
    """The backends ``backend="auto"`` tries, in order (``Backend.auto_rank``; the emulator runs everywhere last)."""
    ranked = [(be.auto_rank, name) for name, be in registered().items() if be.auto_rank is not None]
    return [name for _, name in sorted(ranked)]


def availability(device: torch.device) -> Dict[str, Optional[str]]:
    """Map each backend name to ``None`` (usable on ``device``) or the reason it is not."""
    return {name: be.available_on(device) for name, be in registered().items()}


def fast_path(recipe, device: torch.device, backend: str = "auto") -> Optional[Tuple[str, Speed]]:
    """Which backend a call of ``recipe`` on ``device`` would run (``backend``, or ``"auto"``'s first one usable
    there) and its :class:`~.contract.Speed` for that recipe; None when none is usable. The device is probed afresh
    (not remembered): this is asked when a policy is installed, not per call."""
    backends = registered()
    order = auto_order() if backend == "auto" else [backend] + auto_order()
    for name in order:
        if name in backends and backends[name].available(device) is None:
            return name, backends[name].speed_for(recipe)
    return None


def pick(name: str, request: AttentionRequest, device: Optional[torch.device] = None) -> Tuple[Backend, List[str]]:
    """The backend that runs ``request`` (``name``, or ``"auto"``'s first taker), and the refusals worth a warning.

    ``device`` defaults to the operands' device. A backend absent from this machine is passed over silently under
    ``"auto"``; one that is here but refuses the call, or the one asked for by name, is worth a warning."""
    backends = registered()
    if name == "auto":
        candidates = auto_order()
    elif name in backends:
        candidates = [name] + [n for n in auto_order() if n != name]
    else:
        raise ValueError(f"unknown backend {name!r}; accepted: auto, {', '.join(sorted(backends))}")
    device = request.q.device if device is None else device
    reasons, notable = [], []
    for cand in candidates:
        be = backends[cand]
        missing = be.available_on(device)
        why = missing or be.refuses(request)
        if why is None:
            return be, notable
        reasons.append(f"{cand}: {why}")
        if missing is None or cand == name:
            notable.append(f"{cand}: {why}")
    raise RuntimeError(f"no fsattn backend can run this call ({'; '.join(reasons)})")


def warn_if_slow(name: str) -> None:
    """The one-time notice that backend ``name`` is a slow PyTorch reference (at its first call, or earlier: before
    a run's progress bars start, :func:`fsattn_diffusers.integration.runner.announce_backend`)."""
    if registered()[name].slow:
        warn_once(f"slow:{name}", f"fsattn: using the {name!r} backend; it is a PyTorch reference and slow")


def run_backend(name: str, request: AttentionRequest) -> AttentionResult:
    """Run ``request`` on backend ``name`` (or pick one for ``"auto"``), falling back with a one-time warning."""
    be, notable = pick(name, request)
    if notable:
        warn_once(f"fallback:{be.name}:{';'.join(notable)}",
                  f"fsattn: falling back to the {be.name!r} backend ({'; '.join(notable)})")
    warn_if_slow(be.name)
    if not torch.compiler.is_compiling():
        LAST_RAN[request.recipe.name] = be.name
    return be.run(request)


def detect_nonfinite(q, k, v, kv_lens) -> Optional[torch.Tensor]:
    """:func:`fsattn_diffusers.nonfinite.detect`'s flags, (B, H) bool or ``None`` while ``torch.compile`` traces.

    A backend usable on the operands' device that has its own detection pass (``Backend.flag_nonfinite``) finds
    them; elsewhere, and for operands that pass does not take, the PyTorch form."""
    if torch.compiler.is_compiling():
        return None
    for name in auto_order():
        be = registered()[name]
        if be.flag_nonfinite is not None and be.available_on(q.device) is None:
            with torch.no_grad():
                flags = be.flag_nonfinite(q, k, v, kv_lens)
            if flags is not None:
                return flags
    return nonfinite.detect(q, k, v, kv_lens)


def run_checked(run: Callable[[AttentionRequest], AttentionResult], request: AttentionRequest, *, strict: bool,
                repair: bool = True) -> AttentionResult:
    """``run(request)`` under the non-finite contract (NUMERICS.md section 8): the one place that handles NaN and inf
    inputs, whichever backend (or the differentiable path) computes.

    Parameters
    ----------
    run : ``run(request) -> AttentionResult``
        E.g. ``lambda r: run_backend(name, r)``. Asked for the flags (``request.detect_nonfinite``) unless ``strict``
        found them first; a result without them (``Backend.detects_nonfinite`` false) costs one detection pass.
    request : AttentionRequest
    strict : bool
        Detect before any work and raise the one-line ValueError when an element is non-finite.
    repair : bool
        Overwrite the flagged (batch, head) slices with exact float64 attention
        (:func:`fsattn_diffusers.nonfinite.repair`; a per-tensor scale is first re-run on cleaned inputs); False when
        ``run`` computes exact arithmetic already (then only the one-time warning).

    Returns
    -------
    AttentionResult
        ``run``'s result with the flagged slices repaired. Nothing is checked while ``torch.compile`` traces.
    """
    q, k, v, kv_lens = request.q, request.k, request.v, request.kv_lens
    flags = detect_nonfinite(q, k, v, kv_lens) if strict else None  # strict: fail before any work
    flagged = nonfinite.any_flagged(flags) if strict else None
    if flagged:
        nonfinite.check_strict(nonfinite.count_nonfinite(q, k, v, flags, kv_lens))
    detect = flags is None and not torch.compiler.is_compiling()
    res = run(request.with_operands(q, k, v, detect_nonfinite=detect))
    if detect:  # the backend's own flags (staged before its last kernel), else one detection pass now
        staged = res.nonfinite if res.nonfinite is not None else nonfinite.StagedFlags(
            detect_nonfinite(q, k, v, kv_lens))
        flags, flagged = staged.flags, staged.any()
    if not flagged:
        return res
    if not repair:
        nonfinite.warn_counts(nonfinite.count_nonfinite(q, k, v, flags, kv_lens), int(flags.sum()))
        return res

    def rerun(q_, k_, v_):
        r = run(request.with_operands(q_, k_, v_, detect_nonfinite=False))
        return r.out, r.lse, r.stats

    out, lse, stats = nonfinite.repair(flags, q, k, v, res.out, res.lse, res.stats, request.recipe,
                                       scale=request.scale, kv_lens=kv_lens, strict=strict, rerun=rerun)
    return AttentionResult(out, lse, stats, res.nonfinite)


__all__ = ["AttentionRequest", "AttentionResult", "Backend", "CudaCapability", "Speed", "SpeedClass", "LAST_RAN",
           "auto_order", "availability", "computed_numerics", "detect_nonfinite", "fast_path", "forget_devices", "pick",
           "reference_attention", "register_backend", "registered", "run_backend", "run_checked", "unregister_backend",
           "warn_if_slow", "warn_once"]

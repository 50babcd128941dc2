"""Backend registry and per-call selection with one-time fallback warnings.

A backend is a function ``fn(q, k, v, recipe, *, scale, kv_lens, return_lse, return_stats)`` taking
(B, H, S, D) views (any strides) and returning ``(out (B, H, S_q, D) in q's dtype, lse or None,
stats or None)``. Each backend also says whether it is usable here (``available() -> str | None``,
the reason when not) and whether it can take one particular call (``unsupported(...) -> str | None``).
A backend that finds non-finite inputs as a by-product of its own reads says so (``detects_nonfinite``): its ``fn``
then also takes ``detect_nonfinite`` and returns the flags as a fourth value. One that honours ``attention``'s
``q_lens`` (Q smoothing's valid queries) says so (``takes_q_lens``) and takes it as a keyword, in ``fn`` and in
``unsupported``.
A backend that computes other numerics than ``Recipe.numerics`` names them (``Backend.computes``): the Hopper
kernels compute the ``sm90`` variant of every recipe. :func:`computed_numerics` says what a backend computes for a
recipe, and :data:`LAST_RAN` which backend ran a recipe last in this process (for the result files' records).
"""

from __future__ import annotations

from typing import Dict, Optional

import torch

from .registry import (_REGISTRY, _WARNED, AUTO_ORDER, Backend, register_backend,  # noqa: F401 (the public table)
                       unregister_backend, warn_once)


#: Recipe name -> the backend that ran the latest eager call of it in this process (not updated while
#: ``torch.compile`` traces).
LAST_RAN: Dict[str, str] = {}


def computed_numerics(backend: str, recipe) -> str:
    """The numerics ``backend`` computes for ``recipe``: its fixed ones (``Backend.computes``) or the recipe's."""
    fixed = registered()[backend].computes
    return fixed if fixed is not None else recipe.numerics


def _ensure_loaded() -> None:
    # Imported lazily so that importing the package never needs triton or aiter.
    from . import emulator_backend  # noqa: F401
    from . import triton_backend  # noqa: F401
    from . import aiter_backend  # noqa: F401
    from . import fa3_backend  # noqa: F401  (a baseline: by name only, never under "auto")


def registered() -> Dict[str, Backend]:
    _ensure_loaded()
    return dict(_REGISTRY)


def availability(device: torch.device) -> Dict[str, Optional[str]]:
    """Map each backend name to ``None`` (usable on ``device``) or the reason it is not."""
    return {name: be.available_on(device) for name, be in registered().items()}


def detect_nonfinite(q, k, v, kv_lens) -> Optional[torch.Tensor]:
    """:func:`fsattn_diffusers.nonfinite.detect`'s flags, (B, H) bool or ``None`` while ``torch.compile`` traces.

    Where the Triton backend runs (a CUDA sm_90+ device with triton), one exact read of each tensor by
    ``kernels.nonfinite_flags``; elsewhere, and for head dims that kernel does not take, the PyTorch form."""
    from .. import nonfinite

    if torch.compiler.is_compiling():
        return None
    if q.is_cuda and registered()["triton"].available_on(q.device) is None:
        from ..kernels.nonfinite_flags import flag_nonfinite, supports

        if supports(q.shape[-1]):
            with torch.no_grad():
                return flag_nonfinite(q, k, v, kv_lens)
    return nonfinite.detect(q, k, v, kv_lens)


def warn_if_slow(name: str) -> None:
    """The one-time notice that backend ``name`` is a slow PyTorch reference (at its first call, or earlier: before
    a run's progress bars start, :func:`fsattn_diffusers.integration.runner.announce_backend`)."""
    if registered()[name].slow:
        warn_once(f"slow:{name}", f"fsattn: using the {name!r} backend; it is a PyTorch reference and slow")


def run_backend(name: str, q, k, v, recipe, *, scale, kv_lens, return_lse, return_stats, detect_nonfinite=False,
                q_lens=None):
    """Run the call on backend ``name`` (or pick one for ``"auto"``), falling back with a warning. ``q_lens``
    (valid queries per batch entry) matters only to Q smoothing; such calls run on backends that take it.

    Returns ``(out, lse, stats, flags)``: ``flags`` a :class:`~fsattn_diffusers.nonfinite.StagedFlags` of the
    (B, H) non-finite flags when ``detect_nonfinite`` and the backend that ran finds them itself
    (``Backend.detects_nonfinite``), else None (the caller detects).
    """
    backends = registered()
    if name == "auto":
        candidates = [n for n in AUTO_ORDER if n in backends]
    elif name in backends:
        candidates = [name] + [n for n in AUTO_ORDER if n in backends and n != name]
    else:
        raise ValueError(f"unknown backend {name!r}; accepted: auto, {', '.join(sorted(backends))}")
    reasons, notable = [], []
    for cand in candidates:
        be = backends[cand]
        missing = be.available_on(q.device)
        lens = dict(q_lens=q_lens) if be.takes_q_lens else {}
        why = missing or be.unsupported(q, k, v, recipe, kv_lens=kv_lens, return_lse=return_lse, **lens)
        if why is None and q_lens is not None and recipe.smooth_q and not be.takes_q_lens:
            why = "no q_lens (Q smoothing's mean over the valid queries)"
        if why is not None:
            reasons.append(f"{cand}: {why}")
            # A backend absent from this machine is normal under "auto"; one that is here but cannot
            # take this call (or one the caller asked for by name) is worth a warning.
            if missing is None or cand == name:
                notable.append(f"{cand}: {why}")
            continue
        if notable:
            warn_once(f"fallback:{cand}:{';'.join(notable)}",
                      f"fsattn: falling back to the {cand!r} backend ({'; '.join(notable)})")
        warn_if_slow(cand)
        if not torch.compiler.is_compiling():
            LAST_RAN[recipe.name] = cand
        args = dict(scale=scale, kv_lens=kv_lens, return_lse=return_lse, return_stats=return_stats, **lens)
        if be.detects_nonfinite:
            return be.fn(q, k, v, recipe, **args, detect_nonfinite=detect_nonfinite)
        return (*be.fn(q, k, v, recipe, **args), None)
    raise RuntimeError(f"no fsattn backend can run this call ({'; '.join(reasons)})")

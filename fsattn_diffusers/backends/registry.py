"""The backend table: what a backend is and registering one (see :mod:`..backends`); one-time warnings come from
:func:`fsattn_diffusers.notices.warn_once`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import torch

from ..notices import _WARNED, warn_once  # noqa: F401 (re-exported: the backends and integration use it)


@dataclass
class Backend:
    name: str
    fn: Callable
    available: Callable[[torch.device], Optional[str]]
    unsupported: Callable[..., Optional[str]]
    slow: bool = False
    #: ``fn`` also takes ``detect_nonfinite`` (bool) and returns a fourth value: with it, the (B, H) flags of
    #: :func:`fsattn_diffusers.nonfinite.detect` found by its own reads of q, k, v, as a
    #: :class:`~fsattn_diffusers.nonfinite.StagedFlags` (else None), so that the call needs no detection pass.
    detects_nonfinite: bool = False
    #: ``fn`` and ``unsupported`` also take ``q_lens`` (int64 (B,) or None): the valid queries that Q smoothing's mean
    #: and switch count. A call with ``q_lens`` and a Q-smoothing recipe runs only on backends that take it.
    takes_q_lens: bool = False
    #: The numerics this backend computes whatever ``Recipe.numerics`` says (the Hopper kernels: ``"sm90"``; AITER's
    #: kernels: ``"mi355x"``; FlashAttention-3: ``"fa3"``); None: the recipe's own ``numerics`` (the emulator).
    computes: Optional[str] = None
    #: ``available`` per (probe, device type, index), filled on first use: later lookups are a dict read, which
    #: ``torch.compile`` traces (the probes themselves import modules and query the device).
    _seen: Dict[tuple, Optional[str]] = field(default_factory=dict, repr=False, compare=False)

    def available_on(self, device: torch.device) -> Optional[str]:
        key = (self.available, device.type, device.index)  # a replaced probe (tests) is asked again
        if key not in self._seen:
            self._seen[key] = self.available(device)
        return self._seen[key]


_REGISTRY: Dict[str, Backend] = {}
#: Order tried by ``backend="auto"``; the emulator runs everywhere and closes the list.
AUTO_ORDER: List[str] = ["triton", "aiter", "emulator"]


def register_backend(backend: Backend) -> None:
    """Add or replace a backend (used by the emulator, the Triton kernel and the AITER adapter)."""
    _REGISTRY[backend.name] = backend


def unregister_backend(name: str) -> None:
    """Remove a backend added with :func:`register_backend` (no error when absent)."""
    _REGISTRY.pop(name, None)

"""The backend table: what a backend is and how it registers itself (see :mod:`..backends`); one-time warnings come
from :func:`fsattn_diffusers.notices.warn_once`.

Each backend module registers one :class:`Backend`: its ``run`` (:class:`~.contract.AttentionRequest` in,
:class:`~.contract.AttentionResult` out), which devices it takes (``available``: an exact rule such as
:class:`CudaCapability`), why it refuses a call (``refuses``), its speed class per recipe (``speed``), the numerics it
computes (``computes``), whether ``backend="auto"`` tries it (``auto_rank``), whether it finds non-finite inputs in
its own reads (``detects_nonfinite``, ``flag_nonfinite``) and the package of its own kernels (``kernels``: the
measurement harnesses reach them through :meth:`Backend.kernel`, never by path). Every module of this package named
``*_backend`` is imported on first use of the table, so a new hardware target is one kernel folder and one such module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Tuple, Union

import importlib

import torch

from ..notices import _WARNED, warn_once  # noqa: F401 (re-exported: the backends and integration use it)
from .contract import AttentionRequest, AttentionResult, Speed, SpeedClass


def device_capability(device: torch.device) -> Tuple[int, int]:
    """``(major, minor)`` compute capability of CUDA ``device`` (its index, else the current device): the one query
    every capability rule asks (tests fake it here or through ``torch.cuda.get_device_capability``)."""
    return tuple(torch.cuda.get_device_capability(device.index))


@dataclass(frozen=True)
class CudaCapability:
    """A device rule: NVIDIA CUDA devices of exactly these compute capabilities (no "or newer": a later architecture
    may lack the instructions the kernels use), with the Python modules the kernels import.

    Calling it with a device returns ``None`` when the device is taken, else one clause saying why not: on a CUDA
    device of another capability, the capabilities taken (with their ``sm_`` names) and the device's own.
    """

    #: The (major, minor) capabilities taken.
    capabilities: Tuple[Tuple[int, int], ...]
    #: What the kernels are, for messages ("Hopper kernels").
    label: str
    #: Modules that must import (e.g. ``("triton",)``).
    modules: Tuple[str, ...] = ()
    #: The ptxas ``-arch`` the kernels are compiled for (offline compile reports), when one.
    ptxas_arch: Optional[str] = None

    @property
    def arch_names(self) -> Tuple[str, ...]:
        """The capabilities as CUDA names the arch (``sm_`` and the digits)."""
        return tuple(f"sm_{major}{minor}" for major, minor in self.capabilities)

    def __call__(self, device: torch.device) -> Optional[str]:
        if device.type != "cuda":
            return "no CUDA device"
        wanted = " or ".join(f"{major}.{minor} ({name})" for (major, minor), name in
                             zip(self.capabilities, self.arch_names))
        if getattr(torch.version, "hip", None):
            return f"ROCm device ({self.label} need an NVIDIA GPU of compute capability {wanted})"
        major, minor = device_capability(device)
        if (major, minor) not in self.capabilities:
            return f"{self.label} need compute capability {wanted}; this device is {major}.{minor}"
        for module in self.modules:
            try:
                __import__(module)
            except ImportError:
                return f"{module} is not installed"
        return None


def anywhere(device: torch.device) -> Optional[str]:
    """A device rule taking every device."""
    return None


def takes_every_call(request: AttentionRequest) -> Optional[str]:
    """A ``refuses`` rule refusing nothing."""
    return None


@dataclass
class Backend:
    """One registered backend (see the module docstring)."""

    name: str
    #: ``run(request) -> AttentionResult``.
    run: Callable[[AttentionRequest], AttentionResult]
    #: ``available(device) -> None | why not`` (one clause).
    available: Callable[[torch.device], Optional[str]] = anywhere
    #: ``refuses(request) -> None | why not`` (one clause): a call this backend cannot take on a device it takes.
    refuses: Callable[[AttentionRequest], Optional[str]] = takes_every_call
    #: The speed class, or ``speed(recipe) -> Speed`` when it depends on the recipe's formats. A PyTorch reference
    #: (:attr:`SpeedClass.REFERENCE`) warns once per process when it runs.
    speed: Union[Speed, Callable] = Speed(SpeedClass.NATIVE)
    #: The numerics this backend computes whatever ``Recipe.numerics`` says (the Hopper kernels: their own variant;
    #: AITER's kernels: ``"mi355x"``; FlashAttention-3: ``"fa3"``); None: the recipe's own ``numerics``.
    computes: Optional[str] = None
    #: Position in ``backend="auto"``'s order (lower first); None: by name only (baselines, harness backends).
    auto_rank: Optional[int] = None
    #: ``run`` fills ``AttentionResult.nonfinite`` when the request asks (its own reads of q, k, v find them).
    detects_nonfinite: bool = False
    #: ``flag_nonfinite(q, k, v, kv_lens) -> (B, H) bool flags or None``: the same flags as
    #: :func:`fsattn_diffusers.nonfinite.detect` by this backend's own pass, on the devices it takes (None: it does
    #: not take these operands, the PyTorch form runs).
    flag_nonfinite: Optional[Callable] = None
    #: The dotted package of this backend's own kernels (e.g. its ``ops`` and ``plan`` modules), for the harnesses that
    #: call them directly (:meth:`kernel`); None: it has none of its own.
    kernels: Optional[str] = None
    #: ``available`` per (probe, device type, index), filled on first use: later lookups are a dict read, which
    #: ``torch.compile`` traces (the probes themselves import modules and query the device).
    _seen: Dict[tuple, Optional[str]] = field(default_factory=dict, repr=False, compare=False)

    @property
    def slow(self) -> bool:
        """Whether this is a PyTorch reference (speed class :attr:`SpeedClass.REFERENCE` for every recipe)."""
        return isinstance(self.speed, Speed) and self.speed.speed_class == SpeedClass.REFERENCE

    def speed_for(self, recipe) -> Speed:
        """The speed class of ``recipe`` here."""
        return self.speed if isinstance(self.speed, Speed) else self.speed(recipe)

    def kernel(self, module: str):
        """The module ``module`` of this backend's kernel package (:attr:`kernels`), imported.

        Parameters
        ----------
        module : str
            A module of the package, e.g. ``"plan"`` or ``"ops"``.

        Returns
        -------
        module
            The imported module (importing it may import triton).

        Raises
        ------
        ValueError
            When this backend registers no kernel package.
        """
        if self.kernels is None:
            raise ValueError(f"backend {self.name!r} registers no kernel package; backends with one: "
                             f"{', '.join(n for n, b in _REGISTRY.items() if b.kernels) or 'none'}")
        return importlib.import_module(f"{self.kernels}.{module}")

    def available_on(self, device: torch.device) -> Optional[str]:
        key = (self.available, device.type, device.index)  # a replaced probe (tests) is asked again
        if key not in self._seen:
            self._seen[key] = self.available(device)
        return self._seen[key]


_REGISTRY: Dict[str, Backend] = {}


def register_backend(backend: Backend) -> None:
    """Add or replace a backend (each backend module registers itself; harnesses add temporary ones)."""
    _REGISTRY[backend.name] = backend


def unregister_backend(name: str) -> None:
    """Remove a backend added with :func:`register_backend` (no error when absent)."""
    _REGISTRY.pop(name, None)


def forget_devices() -> None:
    """Drop every backend's remembered availability (a faked or changed device is probed again)."""
    for backend in _REGISTRY.values():
        backend._seen.clear()

"""fsattn as an xDiT (``xfuser`` 0.7) attention kernel, under Ulysses, ring and USP.

xDiT's ``USP(q, k, v, ...)`` (``xfuser/model_executor/layers/usp.py``) does the Ulysses all-to-all
itself and, for ring, hands the kernel to torch's ``_templated_ring_attention``; the kernel is looked
up at every call as ``ATTENTION_FUNCTION_REGISTRY[backend]`` (``xfuser/core/distributed/
attention_backend.py``), keyed by the closed enum ``AttentionBackendType``. The kernel contract::

    fn(query, key, value, dropout_p, is_causal, attention_kwargs=None) -> (out, lse)

with (B, H_local, S, D) operands, scale ``D ** -0.5`` chosen by the kernel, ``out`` (B, H, S_q, D) in
the query's dtype and ``lse`` the natural-log log-sum-exp (B, H, S_q) in fp32 (``None`` is allowed
when ring_degree is 1). :func:`install` puts :class:`XDiTAttention` into one slot whose stock kernel
returns an LSE and which xDiT accepts with ``ring_degree > 1`` (``SDPA_FLASH`` by default) and moves
cross-attention to another such slot, so it stays on its bf16 kernel.

The denoising step comes from a :class:`~fsattn_diffusers.integration.tracker.StepTracker` following
the pipeline's scheduler (:meth:`XDiTHandle.follow`), not from xDiT's forward-call counter: under
classifier-free guidance without CFG-parallel each step is two transformer calls (cond, uncond), and
Wan2.2 switches experts mid-run; scheduler steps count neither twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, List, Optional

import torch

from ..api import attention, supported_head_dim
from ..backends import warn_once
from ..integration.install import step_summary, warn_slow_steps
from ..integration.policy import Entry, entry_name, get_policy
from ..integration.tracker import CallRecord, StepTracker, run_eagerly

#: xDiT slots whose stock kernel returns an LSE and which xDiT accepts with ring_degree > 1.
RING_SLOTS = ("SDPA_FLASH", "SDPA_EFFICIENT", "CUDNN", "FLASH", "FLASH_3")
DEFAULT_SLOT = "SDPA_FLASH"
#: Where cross-attention goes when it would otherwise resolve to our slot.
DEFAULT_CROSS_SLOT, ALTERNATE_CROSS_SLOT = "CUDNN", "SDPA_FLASH"
_UNSET = object()


def default_cross_slot(slot: str) -> str:
    """A ring-accepted bf16 slot other than ``slot`` for cross-attention."""
    return ALTERNATE_CROSS_SLOT if slot.upper() == DEFAULT_CROSS_SLOT else DEFAULT_CROSS_SLOT


def _unsupported_call(entry, query, dropout_p, is_causal, attention_kwargs) -> Optional[str]:
    """Why fsattn cannot take this xDiT call (``None`` when it can)."""
    why = supported_head_dim(entry, query.shape[-1])
    if why is None and is_causal:
        why = "causal attention"
    if why is None and dropout_p:
        why = "dropout"
    if why is None and attention_kwargs:
        masked = [k for k in ("attn_mask", "indices_k") if attention_kwargs.get(k) is not None]
        if masked:
            why = f"masked attention ({', '.join(masked)})"
    return why


class XDiTAttention:
    """The xDiT kernel contract around :func:`fsattn_diffusers.attention`.

    Parameters
    ----------
    policy : str, Recipe, mapping or Policy
        See :func:`fsattn_diffusers.integration.policy.get_policy`; ``bf16`` entries and calls fsattn
        cannot take run ``fallback``.
    fallback : callable
        The stock kernel of the slot (same contract).
    backend : str
        Passed to :func:`fsattn_diffusers.attention`.
    tracker : StepTracker, optional
        Source of the denoising step and sink of per-call records.
    need_lse : callable, optional
        ``need_lse() -> bool``; when it returns False the LSE is not computed and ``None`` is returned
        (xDiT reads it only with ring_degree > 1). Default: always compute it.
    name : str
        Label for the records (e.g. ``"xdit:SDPA_FLASH"``).
    """

    def __init__(self, policy, fallback: Callable, *, backend: str = "auto", tracker: Optional[StepTracker] = None,
                 need_lse: Optional[Callable[[], bool]] = None, name: str = "xdit"):
        if not callable(fallback):
            raise ValueError(f"fallback must be the slot's stock kernel (callable), got {type(fallback).__name__}")
        run_eagerly(XDiTAttention, "_choose")
        self.policy = get_policy(policy)
        self.fallback = fallback
        self.backend = backend
        self.tracker = tracker if tracker is not None else StepTracker(record=False)
        self.need_lse = need_lse
        self.name = name
        self.following = False

    def __call__(self, query, key, value, dropout_p=0.0, is_causal=False, attention_kwargs=None):
        entry = self._choose(query, dropout_p, is_causal, attention_kwargs)
        if entry is None:
            return self.fallback(query, key, value, dropout_p=dropout_p, is_causal=is_causal,
                                 attention_kwargs=attention_kwargs)
        want_lse = True if self.need_lse is None else bool(self.need_lse())
        result = attention(query, key, value, entry, layout="bhsd", return_lse=want_lse, backend=self.backend)
        self.tracker.ran_on(entry)
        return result if want_lse else (result, None)

    # run_eagerly (from __init__): eager bookkeeping, no graph guards on step counters under compile
    def _choose(self, query, dropout_p, is_causal, attention_kwargs) -> Entry:
        if not self.policy.is_fixed and not self.following:
            warn_once(f"xdit:unfollowed:{self.policy.name}",
                      f"fsattn: policy {self.policy.name!r} changes with the denoising step but no pipeline is "
                      f"followed; using its first step until XDiTHandle.follow(pipe) is called")
        step, num_steps = self.tracker.position()
        planned = self.policy.entry_at(step, num_steps)
        note = None if planned is None else _unsupported_call(planned, query, dropout_p, is_causal, attention_kwargs)
        if note is not None:
            warn_once(f"xdit:{note}", f"fsattn: using the stock xDiT kernel instead ({note})")
        entry = None if note is not None else planned
        if self.tracker.record:
            self.tracker.add(CallRecord(step, num_steps, self.tracker.timestep, self.tracker.transformer, self.name,
                                        entry_name(entry), entry_name(planned),
                                        "stock" if entry is None else self.backend, note))
        return entry

    def __repr__(self) -> str:
        return f"XDiTAttention(policy={self.policy.name!r}, backend={self.backend!r}, slot={self.name!r})"


@dataclass
class XDiTHandle:
    """What :func:`install` changed; :meth:`uninstall` restores it."""

    function: XDiTAttention
    registry: dict
    slot: object
    original: Callable
    runtime_state: object = None
    saved_backend: object = _UNSET
    saved_cross: object = _UNSET
    followed: List[str] = field(default_factory=list)

    @property
    def records(self) -> List[CallRecord]:
        return self.function.tracker.records

    def summary(self) -> List[str]:
        """Per-step lines of what the latest run used (under ring, one record per K/V shard)."""
        return step_summary(self.records)

    def follow(self, pipe) -> "XDiTHandle":
        """Take the denoising step from ``pipe``'s scheduler (a pipeline) or timestep (a transformer)."""
        tracker = self.function.tracker
        if isinstance(pipe, torch.nn.Module):
            tracker.attach_transformer(pipe, "transformer")
            self.followed.append("transformer")
        else:
            components = getattr(pipe, "components", None)
            if not isinstance(components, dict):
                raise ValueError(f"follow() needs a diffusers pipeline or transformer, got {type(pipe).__name__}")
            models = [(n, m) for n, m in sorted(components.items())
                      if n.startswith("transformer") and isinstance(m, torch.nn.Module)]
            tracker.attach_pipeline(pipe, models)
            self.followed.extend(n for n, _ in models)
        self.function.following = True
        return self

    def configure_runtime(self, runtime_state, cross_slot: Optional[str] = None) -> None:
        """Point xDiT's runtime state at our slot and keep cross-attention on a stock slot.

        ``runtime_state`` is xDiT's ``get_runtime_state()`` (or an object with ``attention_backend``,
        ``cross_attention_backend``, ``set_attention_backend``, ``set_cross_attention_backend`` and
        ``get_cross_attention_backend``). Both setters validate against xDiT's parallel configuration.
        """
        enum = type(self.slot)
        self.runtime_state = runtime_state
        if runtime_state.attention_backend != self.slot:
            self.saved_backend = runtime_state.attention_backend
            runtime_state.set_attention_backend(self.slot)
        if runtime_state.get_cross_attention_backend() == self.slot:
            cross = (cross_slot or default_cross_slot(self.slot.name)).upper()
            if cross not in RING_SLOTS or cross == self.slot.name:
                raise ValueError(f"cross_slot {cross_slot!r} must be a stock slot other than {self.slot.name}; "
                                 f"accepted: {', '.join(s for s in RING_SLOTS if s != self.slot.name)}")
            self.saved_cross = runtime_state.cross_attention_backend
            runtime_state.set_cross_attention_backend(enum[cross])

    def uninstall(self) -> None:
        """Restore the slot's stock kernel, xDiT's backend choices and stop following the pipeline."""
        if self.registry.get(self.slot) is self.function:
            self.registry[self.slot] = self.original
        state = self.runtime_state
        if state is not None and self.saved_backend is not _UNSET:
            state.attention_backend = self.saved_backend
        if state is not None and self.saved_cross is not _UNSET:
            state.cross_attention_backend = self.saved_cross
        self.function.tracker.detach()
        self.function.following = False


def _xfuser_objects():
    """xfuser's registry, backend enum, runtime state (``None`` before initialisation) and ring size."""
    try:
        from xfuser.core.distributed import get_ring_parallel_world_size, get_runtime_state
        from xfuser.core.distributed.attention_backend import ATTENTION_FUNCTION_REGISTRY, AttentionBackendType
        from xfuser.core.distributed.runtime_state import runtime_state_is_initialized
    except Exception as exc:  # ImportError, or xfuser's own RuntimeError on a CPU-only torch
        raise RuntimeError(f"xfuser (xDiT) cannot be imported here ({type(exc).__name__}: {exc}); it needs a CUDA "
                           f"build of torch and triton; accepted: pip install xfuser on a GPU machine") from None
    def ring_active() -> bool:
        try:
            return get_ring_parallel_world_size() > 1
        except AssertionError:  # parallel groups not initialised yet: compute the LSE to be safe
            return True

    state = get_runtime_state() if runtime_state_is_initialized() else None
    return ATTENTION_FUNCTION_REGISTRY, AttentionBackendType, state, ring_active


def install(policy="hybrid", pipe=None, *, slot: str = DEFAULT_SLOT, cross_slot: Optional[str] = None,
            backend: str = "auto", record: bool = True, registry: Optional[dict] = None, backend_types=None,
            runtime_state=None, need_lse: Optional[Callable[[], bool]] = None) -> XDiTHandle:
    """Put fsattn into xDiT's attention-function registry.

    Parameters
    ----------
    policy : str, Recipe, mapping or Policy
        ``"mxfp8"``, ``"mxfp6"``, ``"mxfp4"``, ``"hybrid"``, the Hopper hybrids (``"hybrid-int8-mxfp8"``,
        ``"hybrid-int8"``), a schedule ``"mxfp6:3,mxfp4:14,mxfp6:3"``, ... On a Hopper GPU a policy with MXFP6/MXFP4
        steps warns once that they run no faster than mxfp8 there.
    pipe : diffusers pipeline or transformer, optional
        Followed for the denoising step (also later with :meth:`XDiTHandle.follow`).
    slot : str
        ``AttentionBackendType`` name to occupy; one of :data:`RING_SLOTS`. Run xDiT with
        ``--attention_backend`` set to it (or let :meth:`XDiTHandle.configure_runtime` set it).
    cross_slot : str, optional
        Slot for cross-attention when it would resolve to ``slot`` (default :func:`default_cross_slot`).
    backend : str
        Passed to :func:`fsattn_diffusers.attention`.
    record : bool
        Keep a per-call record (``handle.records``, ``handle.summary()``).
    registry, backend_types, runtime_state, need_lse : optional
        xfuser's ``ATTENTION_FUNCTION_REGISTRY``, ``AttentionBackendType``, ``get_runtime_state()`` and
        a ring-size test; taken from xfuser when ``registry`` is None (tests pass stand-ins).

    Returns
    -------
    XDiTHandle
    """
    if registry is None:
        registry, backend_types, found_state, found_need = _xfuser_objects()
        runtime_state = runtime_state if runtime_state is not None else found_state
        need_lse = need_lse if need_lse is not None else found_need
    if backend_types is None:
        raise ValueError("backend_types (xfuser's AttentionBackendType) is required with a custom registry")
    name = str(slot).upper()
    if name not in RING_SLOTS:
        raise ValueError(f"slot {slot!r} cannot host fsattn (its stock kernel must return an LSE and accept ring "
                         f"attention); accepted: {', '.join(RING_SLOTS)}")
    key = backend_types[name]
    current = registry.get(key)
    if isinstance(current, XDiTAttention):  # installed before: replace, keep the true stock kernel
        current.tracker.detach()
        current = current.fallback
    if current is None:
        raise ValueError(f"xDiT registry has no kernel in slot {name}; accepted: an xfuser 0.7 registry")
    tracker = StepTracker(record=record)
    fn = XDiTAttention(policy, current, backend=backend, tracker=tracker, need_lse=need_lse, name=f"xdit:{name}")
    warn_slow_steps(fn.policy, backend)
    registry[key] = fn
    handle = XDiTHandle(fn, registry, key, current)
    try:
        if runtime_state is not None:
            handle.configure_runtime(runtime_state, cross_slot)
        if pipe is not None:
            handle.follow(pipe)
    except Exception:
        handle.uninstall()  # leave xDiT as it was
        raise
    return handle


__all__ = ["XDiTAttention", "XDiTHandle", "install", "RING_SLOTS", "DEFAULT_SLOT", "default_cross_slot"]

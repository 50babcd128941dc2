"""``apply`` / ``remove``: install fsattn on the self-attention of every transformer of a pipeline.

Self-attention means ``attn1`` of each ``WanTransformerBlock`` (Wan2.1, Wan2.2: ``transformer`` and
``transformer_2``) and the joint attention of HunyuanVideo's dual- and single-stream blocks. Wan's
cross-attention (``attn2``) and HunyuanVideo's token refiner keep their stock processors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch

from ..backends import Speed, SpeedClass, fast_path
from .policy import (HOPPER_HYBRID, HOPPER_HYBRID_ENDS, HOPPER_HYBRID_MIDDLE, HYBRID_REFERENCE_STEPS, Policy,
                     get_policy)
from .processors import HunyuanVideoFSAttnProcessor, WanFSAttnProcessor
from .tracker import CallRecord, StepTracker

_HANDLE_ATTR = "_fsattn_handle"


def _processor_class_for(module) -> Optional[type]:
    """The fsattn processor class for a self-attention module we support, else ``None``."""
    from diffusers.models.transformers.transformer_hunyuan_video import HunyuanVideoAttnProcessor2_0
    from diffusers.models.transformers.transformer_wan import WanAttention

    if isinstance(module, WanAttention):
        return None if module.is_cross_attention else WanFSAttnProcessor
    proc = getattr(module, "processor", None)
    if isinstance(proc, (HunyuanVideoAttnProcessor2_0, HunyuanVideoFSAttnProcessor)):
        return HunyuanVideoFSAttnProcessor
    return None


def self_attention_modules(model: torch.nn.Module) -> List[Tuple[str, torch.nn.Module, type]]:
    """``(name, module, fsattn processor class)`` for every supported self-attention of ``model``."""
    found = []
    for name, module in model.named_modules():
        cls = _processor_class_for(module)
        if cls is not None:
            found.append((name, module, cls))
    return found


def _transformers_of(pipe) -> List[Tuple[str, torch.nn.Module]]:
    if isinstance(pipe, torch.nn.Module):  # a bare transformer
        return [("transformer", pipe)]
    components = getattr(pipe, "components", None)
    if not isinstance(components, dict):
        raise ValueError(f"apply() needs a diffusers pipeline or transformer, got {type(pipe).__name__}")
    return [(name, comp) for name, comp in sorted(components.items()) if isinstance(comp, torch.nn.Module)]


@dataclass
class FSAttnHandle:
    """What :func:`apply` installed; ``records`` holds the per-call records of the latest run.

    ``active`` turns False when :func:`remove` restores the stock processors or a later :func:`apply`
    replaces this installation; the handle then keeps the records it had and records nothing more.
    """

    policy: Policy
    backend: str
    tracker: StepTracker
    #: transformer name -> [(module name, module, stock processor)]
    saved: Dict[str, List[Tuple[str, torch.nn.Module, object]]] = field(default_factory=dict)
    #: False once removed or replaced (no more records).
    active: bool = True
    #: A diffusers-backend policy (``sage``): what :func:`remove` restores (:func:`set_diffusers_backend`).
    diffusers_backend: Optional["DiffusersBackendState"] = None

    @property
    def records(self) -> List[CallRecord]:
        return self.tracker.records

    @property
    def num_layers(self) -> int:
        return sum(len(v) for v in self.saved.values())

    def summary(self) -> List[str]:
        """Per-step lines (consecutive equal steps merged) of what the latest run used."""
        return step_summary(self.records)

    def plan(self, num_steps: int) -> List[str]:
        """The policy's entry names per step for ``num_steps`` steps."""
        return self.policy.plan_names(num_steps)


def step_summary(records: List[CallRecord]) -> List[str]:
    """Compact per-step summary: ``steps 0-2: mxfp6 (transformer) 8 calls/step``."""
    per_step: Dict[int, dict] = {}
    for r in records:
        s = per_step.setdefault(r.step, {"recipes": {}, "models": [], "calls": 0, "notes": set()})
        s["recipes"][r.recipe] = s["recipes"].get(r.recipe, 0) + 1
        if r.transformer not in s["models"]:
            s["models"].append(r.transformer)
        s["calls"] += 1
        if r.note:
            s["notes"].add(r.note)
    runs: List[list] = []
    for step in sorted(per_step):
        s = per_step[step]
        key = (tuple(sorted(s["recipes"])), tuple(s["models"]), s["calls"], tuple(sorted(s["notes"])))
        if runs and runs[-1][2] == key and runs[-1][1] == step - 1:
            runs[-1][1] = step
        else:
            runs.append([step, step, key])
    lines = []
    for first, last, (recipes, models, calls, notes) in runs:
        steps = f"step  {first}" if first == last else f"steps {first}-{last}"
        text = f"{steps}: {'+'.join(recipes)} ({', '.join(str(m) for m in models)}) {calls} attention calls/step"
        if notes:
            text += f" [fallback: {'; '.join(notes)}]"
        lines.append(text)
    return lines


# diffusers stores its attention backend and context-parallel config on the installed processor
# (``enable_parallelism`` sets them on whatever is installed at that moment); swaps must carry them.
_CARRIED_ATTRS = ("_attention_backend", "_parallel_config")


def _swap_processor(module, new) -> None:
    """``module.set_processor(new)`` keeping the attention backend and parallel config of the old one."""
    old = module.processor
    for attr in _CARRIED_ATTRS:
        value = getattr(old, attr, None)
        if value is not None:
            setattr(new, attr, value)
    module.set_processor(new)


#: :func:`~fsattn_diffusers.notices.warn_once` key of the notice that a policy's steps run no faster than a cheaper
#: preset on this device's kernels (MXFP6/MXFP4 on the Hopper kernels: no faster than mxfp8).
SLOW_STEPS_NOTICE = "steps no faster than a cheaper preset"


def this_device() -> Optional[torch.device]:
    """The device a pipeline's attention runs on by default: the current CUDA device, None without CUDA."""
    return torch.device("cuda") if torch.cuda.is_available() else None


def slow_steps(policy: Policy, device: Optional[torch.device] = None, backend: str = "auto",
               num_steps: Optional[int] = None) -> Tuple[List[str], Optional[Speed]]:
    """The recipes of ``policy`` whose fast path on ``device`` is no faster than a cheaper preset.

    Parameters
    ----------
    policy : Policy
        A resolved policy (:func:`~fsattn_diffusers.integration.policy.get_policy`).
    device : torch.device, optional
        Default :func:`this_device`; None (no CUDA): nothing is slow here.
    backend : str
        The backend the calls ask for (``"auto"``: the registry's pick on ``device``).
    num_steps : int, optional
        Steps to plan over; default the policy's ``reference_steps`` (every segment of a schedule as written), or
        ``HYBRID_REFERENCE_STEPS`` when it has none.

    Returns
    -------
    (names, speed)
        Names of the recipes, in step order without repeats, that the backend runs at speed class
        :attr:`~fsattn_diffusers.backends.SpeedClass.WIDENED` (:func:`fsattn_diffusers.backends.fast_path`), and
        the first one's :class:`~fsattn_diffusers.backends.Speed` (None when there are none).
    """
    device = this_device() if device is None else device
    if device is None:
        return [], None
    steps = num_steps or policy.reference_steps or HYBRID_REFERENCE_STEPS
    names, first = [], None
    for entry in policy.schedule(steps):
        if entry is None or entry.name in names:
            continue
        path = fast_path(entry, device, backend)
        if path is not None and path[1].speed_class == SpeedClass.WIDENED:
            names.append(entry.name)
            first = first or path[1]
    return names, first


def warn_slow_steps(policy: Policy, backend: str = "auto") -> None:
    """Say once per process that ``policy``'s steps named by :func:`slow_steps` run no faster than a cheaper preset
    on this device, naming the Hopper hybrid.

    The one-line :class:`~fsattn_diffusers.notices.FSAttnWarning` (:func:`~fsattn_diffusers.notices.warn_once`,
    key :data:`SLOW_STEPS_NOTICE`). Nothing on devices whose kernels run every step at full speed, with the emulator,
    or for policies without such steps.

    Parameters
    ----------
    policy : Policy
        The resolved policy being installed.
    backend : str
        The backend its calls ask for.
    """
    slow, speed = slow_steps(policy, backend=backend)
    if slow:
        from ..notices import warn_once

        verb = "runs" if len(slow) == 1 else "run"
        warn_once(SLOW_STEPS_NOTICE,
                  f"fsattn: policy {policy.name}: {' and '.join(slow)} {verb} no faster than {speed.as_fast_as} on "
                  f"this GPU ({speed.why}); use {speed.as_fast_as}, or policy '{HOPPER_HYBRID}' for more precision "
                  f"on the first and last steps ({HOPPER_HYBRID_ENDS} there, {HOPPER_HYBRID_MIDDLE} between)")


def apply(pipe, policy="hybrid", backend: str = "auto", *, record: bool = True) -> FSAttnHandle:
    """Install fsattn processors on the self-attention of every transformer of ``pipe``.

    Parameters
    ----------
    pipe : DiffusionPipeline or transformer model
        A Wan2.1 / Wan2.2 / HunyuanVideo pipeline (every transformer, e.g. ``transformer`` and
        ``transformer_2``), or one such transformer.
    policy : str, Recipe, mapping or Policy
        ``"bf16"``, ``"mxfp8"``, ``"mxfp6"``, ``"mxfp4"``, ``"int8-bf16"``, ``"int8-fp8"``, ``"hybrid"``, the
        Hopper hybrids ``"hybrid-int8-mxfp8"`` and ``"hybrid-int8"``, a schedule string ``"mxfp6:3,mxfp4:14,mxfp6:3"`` or
        ``{"ends": ..., "middle": ..., "n_ends": ...}``. A policy with steps that this device's kernels run no
        faster than a cheaper preset (MXFP6/MXFP4 on a Hopper GPU: no faster than mxfp8) warns once
        (:func:`warn_slow_steps`).
    backend : str
        Passed to :func:`fsattn_diffusers.attention` on every call (``"auto"`` picks per call).
    record : bool
        Keep a per-call record of the recipe used (``handle.records``; cleared at each run).

    Returns
    -------
    FSAttnHandle
        Also stored on ``pipe``; :func:`remove` restores the stock processors. Applying again
        replaces the previous installation and warns once (an
        :class:`~fsattn_diffusers.notices.FSAttnWarning`): the earlier handle becomes inactive
        (``handle.active`` is False) and records nothing more; use the handle this call returns.
    """
    policy = get_policy(policy)
    warn_slow_steps(policy, backend)
    attention_backend = getattr(policy, "attention_backend", None)
    if attention_backend is not None:  # refuse before anything changes
        refuse_masked_models(pipe, policy.name, attention_backend)
    previous = installed(pipe)
    if previous is not None:
        from ..notices import warn

        warn(f"fsattn: apply() replaces the installation of policy {previous.policy.name} on this "
             f"{type(pipe).__name__}; its handle stops recording, use the handle this call returns "
             f"(call fsattn_diffusers.remove(pipe) first to avoid this warning)")
    remove(pipe)
    tracker = StepTracker(record=record)
    handle = FSAttnHandle(policy=policy, backend=backend, tracker=tracker)
    followed = []
    for tname, model in _transformers_of(pipe):
        targets = self_attention_modules(model)
        if not targets:
            continue
        handle.saved[tname] = [(name, module, module.processor) for name, module, _ in targets]
        for name, module, cls in targets:
            _swap_processor(module, cls(policy, backend=backend, tracker=tracker, layer=f"{tname}.{name}"))
        followed.append((tname, model))
    if not followed:
        raise ValueError(f"no Wan or HunyuanVideo self-attention found in {type(pipe).__name__}; accepted: "
                         f"WanPipeline (Wan2.1, Wan2.2), HunyuanVideoPipeline or their transformers")
    if attention_backend is not None:
        try:
            handle.diffusers_backend = set_diffusers_backend([m for _, m in followed], attention_backend)
        except ValueError:
            for entries in handle.saved.values():
                for _, module, stock in entries:
                    _swap_processor(module, stock)
            raise
    if isinstance(pipe, torch.nn.Module):
        tracker.attach_transformer(pipe, followed[0][0])
    else:
        tracker.attach_pipeline(pipe, followed)
    object.__setattr__(pipe, _HANDLE_ATTR, handle)
    return handle


@dataclass
class DiffusersBackendState:
    """The attention backends that :func:`set_diffusers_backend` replaced: every attention module's processor's
    ``_attention_backend`` and diffusers' process-wide active backend (``set_attention_backend`` changes it too)."""

    modules: List[Tuple[torch.nn.Module, object]]
    active: object

    def restore(self) -> None:
        """Put the saved backends back on the processors installed now, and the active backend."""
        from diffusers.models.attention_dispatch import _AttentionBackendRegistry

        for module, value in self.modules:
            if hasattr(module.processor, "_attention_backend"):
                module.processor._attention_backend = value
        _AttentionBackendRegistry.set_active_backend(self.active)


def _attention_modules(model: torch.nn.Module) -> List[torch.nn.Module]:
    from diffusers.models.attention import AttentionModuleMixin
    from diffusers.models.attention_processor import Attention

    return [m for m in model.modules() if isinstance(m, (Attention, AttentionModuleMixin))]


def set_diffusers_backend(models, backend: str) -> DiffusersBackendState:
    """``model.set_attention_backend(backend)`` on every model of ``models``, as a diffusers user selects it; returns
    what to restore. One-line ValueError when diffusers refuses the backend."""
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    state = DiffusersBackendState([(m, getattr(m.processor, "_attention_backend", None))
                                   for model in models for m in _attention_modules(model)],
                                  _AttentionBackendRegistry._active_backend)
    try:
        for model in models:
            model.set_attention_backend(backend)
    except (RuntimeError, ValueError) as exc:
        state.restore()
        raise ValueError(f"diffusers' set_attention_backend({backend!r}) refused: {str(exc).splitlines()[0]}") \
            from None
    return state


def refuse_masked_models(pipe, policy: str, backend: str) -> None:
    """One-line ValueError when ``pipe`` holds a HunyuanVideo transformer: it passes an attention mask on every call,
    which diffusers' SageAttention backend ``sage`` does not take (it raises at the first call)."""
    for _, model in _transformers_of(pipe):
        if any(cls is HunyuanVideoFSAttnProcessor for _, _, cls in self_attention_modules(model)):
            raise ValueError(f"the {policy} policy runs diffusers' {backend} backend, which takes no attention mask, "
                             f"and HunyuanVideo's transformer passes one on every call; accepted: the {policy} "
                             "policy on Wan2.1 / Wan2.2")


def remove(pipe) -> bool:
    """Restore the processors that :func:`apply` replaced. Returns False when nothing was installed."""
    handle = getattr(pipe, _HANDLE_ATTR, None)
    if handle is None:
        return False
    for entries in handle.saved.values():
        for _, module, stock in entries:
            _swap_processor(module, stock)
    if handle.diffusers_backend is not None:
        handle.diffusers_backend.restore()
    handle.tracker.detach()
    handle.active = False
    object.__delattr__(pipe, _HANDLE_ATTR)
    return True


def installed(pipe) -> Optional[FSAttnHandle]:
    """The handle of the current installation on ``pipe`` (``None`` when none)."""
    return getattr(pipe, _HANDLE_ATTR, None)

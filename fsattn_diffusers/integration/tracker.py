"""Follow the denoising step, not the number of transformer calls.

A :class:`StepTracker` is shared by every fsattn processor of a pipeline. It learns the step from the
pipeline's scheduler: ``scheduler.set_timesteps`` starts a run (and gives the number of steps) and
each completed ``scheduler.step`` advances the step. Transformer calls between two scheduler steps
(the conditional and unconditional calls of classifier-free guidance, whichever expert of Wan2.2
runs) therefore share one step, whether or not the pipeline passes a step index (HunyuanVideo does
not). Without a scheduler (a bare transformer), a change of the ``timestep`` argument between
transformer calls starts a new step.

The tracker also keeps a per-call record (:class:`CallRecord`) of the recipe each attention call used
in the latest run.
"""

from __future__ import annotations

import functools
import math
from typing import Iterable, List, NamedTuple, Optional, Tuple

import torch

from ..recipe import Recipe


def run_eagerly(cls, *names: str) -> None:
    """``torch.compiler.disable`` the methods ``names`` defined on ``cls``, once (their constructors call this).

    Applied when the first instance is made rather than as a decorator: ``torch.compiler.disable`` imports
    ``torch._dynamo`` (about 3 s of CPU), which a process that builds no tracker or processor (``fsattn --help``, the
    command line's argument checks) then never imports. Instances are made before a model is compiled, so compiled
    code sees the same disabled methods either way."""
    for name in names:
        method = cls.__dict__[name]
        if not getattr(method, "_fsattn_run_eagerly", False):
            eager = torch.compiler.disable(method)
            eager._fsattn_run_eagerly = True
            setattr(cls, name, eager)


class CallRecord(NamedTuple):
    """One attention call: the step it belonged to and the numerics it ran.

    ``recipe`` is what ran (``"bf16"`` = stock attention); ``planned`` what the policy asked for;
    they differ only when a call fell back to stock attention (``note`` says why). ``backend`` is the backend that
    ran the call (``"emulator"``, ``"triton"``, ...; ``"stock"`` for stock attention), the one asked for
    (``"auto"``) only for calls traced by ``torch.compile``.
    """

    step: int
    num_steps: Optional[int]
    timestep: Optional[float]
    transformer: Optional[str]
    layer: Optional[str]
    recipe: str
    planned: str
    backend: str
    note: Optional[str] = None


def _first_timestep(args, kwargs) -> Optional[torch.Tensor]:
    t = kwargs.get("timestep")
    if t is None and len(args) > 1:
        t = args[1]
    return t if isinstance(t, torch.Tensor) else None


class StepTracker:
    """Current denoising step and the per-call records of the latest run.

    Parameters
    ----------
    num_steps : int, optional
        Steps of the run when no scheduler reports it (a bare transformer).
    record : bool
        Keep a :class:`CallRecord` per attention call (cleared when a new run starts).
    """

    def __init__(self, num_steps: Optional[int] = None, record: bool = True):
        run_eagerly(StepTracker, "_on_transformer_call")
        self.num_steps = num_steps
        self.record = record
        self.records: List[CallRecord] = []
        self.transformer: Optional[str] = None
        self.timestep: Optional[float] = None
        self._scheduler = None
        self._scheduler_calls = 0
        self._order = 1
        self._last_t: Optional[float] = None
        self._t_step = -1
        self._hooks: list = []
        self._pipe = None

    # -- position -------------------------------------------------------------------------------
    @property
    def step(self) -> int:
        """0-based denoising step of the current transformer call."""
        if self._scheduler is not None:
            return self._scheduler_calls // self._order
        return max(self._t_step, 0)

    def position(self) -> Tuple[int, Optional[int]]:
        """``(step, num_steps)``; ``num_steps`` is ``None`` when unknown."""
        return self.step, self.num_steps

    def begin_run(self, num_steps: Optional[int]) -> None:
        """Start a new run of ``num_steps`` steps: step 0, records cleared."""
        self.num_steps = num_steps
        self.records = []
        self._scheduler_calls = 0
        self._last_t, self._t_step = None, -1

    def add(self, record: CallRecord) -> None:
        if self.record:
            self.records.append(record)

    def ran_on(self, recipe: Recipe) -> None:
        """Name, in the latest record, the backend that ran its call of ``recipe`` (what ``backend="auto"`` or a
        fallback picked: :data:`fsattn_diffusers.backends.LAST_RAN`). Eager calls only: while ``torch.compile``
        traces, records keep the backend asked for."""
        from ..backends import LAST_RAN

        if self.record and self.records and not torch.compiler.is_compiling() and recipe.name in LAST_RAN:
            self.records[-1] = self.records[-1]._replace(backend=LAST_RAN[recipe.name])

    # -- scheduler ------------------------------------------------------------------------------
    def attach_scheduler(self, scheduler) -> None:
        """Wrap ``scheduler.set_timesteps`` and ``scheduler.step`` (instance attributes, undone by
        :meth:`detach`)."""
        self._detach_scheduler()
        orig_set, orig_step = scheduler.set_timesteps, scheduler.step

        @functools.wraps(orig_set)
        def set_timesteps(*args, **kwargs):
            out = orig_set(*args, **kwargs)
            self._order = max(int(getattr(scheduler, "order", 1) or 1), 1)
            self.begin_run(self._steps_of(scheduler))
            return out

        @functools.wraps(orig_step)
        def step(*args, **kwargs):
            out = orig_step(*args, **kwargs)
            self._scheduler_calls += 1
            return out

        set_timesteps._fsattn_tracker = step._fsattn_tracker = self
        scheduler.set_timesteps, scheduler.step = set_timesteps, step
        self._scheduler = scheduler
        self._order = max(int(getattr(scheduler, "order", 1) or 1), 1)
        # Attached after set_timesteps (the pipeline's scheduler was replaced): a run has begun; resume
        # from the scheduler's own step counter.
        self.begin_run(self._steps_of(scheduler) or self.num_steps)
        self._scheduler_calls = int(getattr(scheduler, "step_index", None) or 0)

    def _steps_of(self, scheduler) -> Optional[int]:
        ts = getattr(scheduler, "timesteps", None)
        if ts is None or len(ts) == 0:
            return None
        return math.ceil(len(ts) / self._order)

    def _detach_scheduler(self) -> None:
        sched, self._scheduler = self._scheduler, None
        if sched is None:
            return
        for attr in ("set_timesteps", "step"):
            fn = sched.__dict__.get(attr)
            if fn is not None and getattr(fn, "_fsattn_tracker", None) is self:
                del sched.__dict__[attr]

    # -- transformers ---------------------------------------------------------------------------
    def attach_transformer(self, model: torch.nn.Module, name: str = "transformer") -> None:
        """Note which transformer runs and its timestep before each of its calls."""

        def pre_hook(module, args, kwargs):
            self._on_transformer_call(name, _first_timestep(args, kwargs))

        self._hooks.append(model.register_forward_pre_hook(pre_hook, with_kwargs=True))

    def attach_pipeline(self, pipe, transformers: Iterable[Tuple[str, torch.nn.Module]]) -> None:
        """Follow ``pipe``'s scheduler (re-attached if the user swaps it) and its transformers."""
        self._pipe = pipe
        if getattr(pipe, "scheduler", None) is not None:
            self.attach_scheduler(pipe.scheduler)
        for name, model in transformers:
            self.attach_transformer(model, name)

    # run_eagerly (from __init__): bookkeeping runs eagerly, no graph guards on step counters under compile
    def _on_transformer_call(self, name: str, t: Optional[torch.Tensor]) -> None:
        self.transformer = name
        pipe_sched = getattr(self._pipe, "scheduler", None) if self._pipe is not None else None
        if pipe_sched is not None and pipe_sched is not self._scheduler:
            self.attach_scheduler(pipe_sched)
        if t is None:
            return
        value = float(t.detach().flatten()[0].float().cpu())
        self.timestep = value
        if self._scheduler is None and value != self._last_t:
            self._t_step += 1
            self._last_t = value

    def detach(self) -> None:
        """Remove every hook and scheduler wrapper this tracker installed."""
        self._detach_scheduler()
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self._pipe = None

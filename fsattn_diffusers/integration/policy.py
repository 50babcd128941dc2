"""Which attention numerics each denoising step uses.

A policy maps ``(step, num_steps)`` to a :class:`~fsattn_diffusers.recipe.Recipe`, or to ``None``
meaning *the stock diffusers attention* (the ``bf16`` entry: bit-identical to not installing anything).

Accepted specifications (:func:`get_policy`):

* ``"bf16"`` (alias ``"stock"``): stock attention on every step.
* a preset name (``"mxfp8"``, ``"mxfp6"``, ``"mxfp4"``, ``"exact"``, ...) or a preset with changes
  (``"mxfp8+proxy=u32"``, every form :func:`fsattn_diffusers.recipe.get_recipe` takes): that recipe on every step.
* ``"hybrid"``: paper Section 5.3, MXFP6 on the first and last 3 of 20 steps and MXFP4 in between,
  the number of end steps scaled to other step counts (:class:`EndsPolicy`). For AITER on MI355X and quality studies:
  on Hopper MXFP6/MXFP4 run no faster than mxfp8 (:func:`fsattn_diffusers.integration.install.slow_steps` names a
  policy's such steps on a device).
* ``"hybrid-int8-mxfp8"``: the same idea mapped to what is fast on Hopper, ``int8-bf16`` (the accurate tier) on the
  first and last 3 of 20 steps and ``mxfp8`` in between, scaled alike.
* ``"hybrid-int8"``: ``int8-bf16`` on the same end steps and the INT8 speed tier ``int8-fp8`` (INT8 Q/K, FP8 P and V:
  SageAttention 2's operand formats on the fused softmax) in between.
* a schedule string ``"mxfp6:3,mxfp4:14,mxfp6:3"``: segments in step order for the reference length
  (the sum), scaled proportionally to other step counts (:class:`SchedulePolicy`); each entry is a stock name or a
  recipe in any of the forms above (``"mxfp8+smooth_q=false:3,mxfp4:14,mxfp8+smooth_q=false:3"``).
* a mapping ``{"ends": "bf16", "middle": "mxfp4", "n_ends": 2}`` (optional ``reference_steps``).
* a :class:`Recipe`, or a :class:`Policy`.
* ``"fa3"`` / ``"fa3-fp8"``: baseline kernels, FlashAttention-3 BF16 / FP8 with per-(batch, head) scales
  on every step (:data:`BASELINE_POLICIES`; needs the ``fa3-fwd`` package).
* ``"sage"``: SageAttention through diffusers' own ``"sage"`` attention backend on every step, selected as a
  diffusers user does (``transformer.set_attention_backend("sage")``, which :func:`fsattn_diffusers.apply` calls;
  :data:`DIFFUSERS_BACKEND_POLICIES`; needs a ``sageattention`` that diffusers accepts: SageAttention 2).

The named policies are one table, :data:`NAMED_POLICIES` (name -> entries and step rule). ``None`` is refused with
a ValueError: pass ``"bf16"`` for stock attention (``apply`` defaults to ``"hybrid"``).
"""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass
from typing import List, Mapping, Optional, Sequence, Tuple, Union

from ..recipe import INT8_BF16, INT8_FP8, PRESETS, Recipe, get_recipe
from .step_counts import apportion

#: Policy entry names that mean "the stock diffusers attention".
STOCK_NAMES = ("bf16", "stock")
#: Paper Section 5.3: MXFP6 on the first and last 3 of 20 denoising steps, MXFP4 in between.
HYBRID_ENDS, HYBRID_MIDDLE, HYBRID_N_ENDS, HYBRID_REFERENCE_STEPS = "mxfp6", "mxfp4", 3, 20
#: The Hopper hybrid: the accurate tier on the same end steps, mxfp8 in between.
HOPPER_HYBRID, HOPPER_HYBRID_ENDS, HOPPER_HYBRID_MIDDLE = "hybrid-int8-mxfp8", INT8_BF16, "mxfp8"
#: The INT8 Hopper hybrid: the accurate tier on the same end steps, the INT8 speed tier in between.
HOPPER_HYBRID_INT8 = "hybrid-int8"

Entry = Optional[Recipe]  # None = stock attention
_ENDS_KEYS = ("ends", "middle", "n_ends", "reference_steps")


def entry_name(entry: Entry) -> str:
    """Readable name of a policy entry: ``"bf16"`` for stock attention, else the recipe's name."""
    return "bf16" if entry is None else entry.name


def policy_names() -> list:
    """Every policy name :func:`get_policy` accepts (besides schedules and mappings), in display order."""
    return [name for name in NAMED_POLICIES if name not in STOCK_NAMES[1:]]


#: The forms a policy string takes besides the names, as errors and ``--help`` list them.
POLICY_STRING_FORMS = ("a preset with changes like 'mxfp8+proxy=u32', or a schedule like 'mxfp6:3,mxfp4:14,mxfp6:3' "
                       "whose entries take either form ('mxfp8+smooth_q=false:3,mxfp4:14,mxfp8+smooth_q=false:3')")


def _accepted() -> str:
    return f"a name ({', '.join(policy_names())}), {POLICY_STRING_FORMS}; in Python also a mapping " \
           f"{{ends, middle, n_ends}}, a Recipe or a Policy"


def parse_entry(spec) -> Entry:
    """Resolve one schedule entry: a stock name, a recipe (a preset, a preset with changes) or a Recipe."""
    if spec is None:
        return None
    if isinstance(spec, str) and spec.strip().lower() in STOCK_NAMES:
        return None
    if isinstance(spec, str) and spec.strip().lower().partition("+")[0].strip() in STOCK_NAMES:
        raise ValueError(f"policy entry {spec!r}: bf16 is stock attention and takes no changes; accepted: bf16, or "
                         f"the emulator's BF16 recipe with changes ('bf16-emulated+proxy=u32')")
    try:
        return get_recipe(spec)
    except ValueError:
        if isinstance(spec, str) and spec.strip().lower().partition("+")[0].strip() in PRESETS:
            raise  # a preset with a bad change: the recipe's own error names the field and what it accepts
        raise ValueError(f"unknown policy entry {spec!r}; accepted: bf16 (stock attention), a preset "
                         f"({', '.join(PRESETS)}), a preset with changes like 'mxfp8+proxy=u32', or a Recipe") from None


def _round_half_up(x: float) -> int:
    return int(math.floor(x + 0.5))


class Policy:
    """Base class: subclasses implement :meth:`schedule` for a known number of steps."""

    name = "policy"
    #: Steps assumed when the number of steps is unknown (no scheduler seen).
    reference_steps: Optional[int] = None
    #: Backend every call runs, overriding the processor's (baseline kernels: ``fa3``); None: the processor's.
    backend: Optional[str] = None

    def schedule(self, num_steps: int) -> List[Entry]:
        """One entry per step for a run of ``num_steps`` steps."""
        raise NotImplementedError

    @property
    def is_fixed(self) -> bool:
        """True when every step uses the same entry (no step tracking needed)."""
        return False

    def entry_at(self, step: int, num_steps: Optional[int]) -> Entry:
        """Entry of step ``step`` (0-based) in a run of ``num_steps`` steps (``None``: unknown)."""
        n = num_steps if num_steps else (self.reference_steps or step + 1)
        plan = self._cached(max(n, 1))
        return plan[min(max(step, 0), len(plan) - 1)]

    def _cached(self, n: int) -> List[Entry]:
        cache = self.__dict__.setdefault("_plans", {})
        if n not in cache:
            cache[n] = self.schedule(n)
        return cache[n]

    def plan_names(self, num_steps: int) -> List[str]:
        """Entry names per step, for summaries and tests."""
        return [entry_name(e) for e in self.schedule(num_steps)]

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


class FixedPolicy(Policy):
    """The same entry on every step."""

    def __init__(self, entry: Entry):
        self.entry = entry
        self.name = entry_name(entry)
        self.reference_steps = 1

    @property
    def is_fixed(self) -> bool:
        return True

    def schedule(self, num_steps: int) -> List[Entry]:
        return [self.entry] * num_steps


class SchedulePolicy(Policy):
    """Segments ``[(entry, steps), ...]`` in step order, defined for ``sum(steps)`` steps.

    For another step count the segments are apportioned by :func:`apportion`: each keeps at least one
    step while there are at least as many steps as segments, every segment whose share is at least one
    step gets its share rounded down or up (so it stays within one step of it), and a symmetric
    schedule (``"bf16:1,mxfp6:2,mxfp4:14,mxfp6:2,bf16:1"``) stays symmetric.
    """

    def __init__(self, segments: Sequence[Tuple[object, int]], name: Optional[str] = None):
        if not segments:
            raise ValueError(f"a schedule needs at least one segment; accepted: {_accepted()}")
        parsed = []
        for spec, count in segments:
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise ValueError(f"schedule segment {spec!r} has step count {count!r}; accepted: an int >= 1")
            parsed.append((parse_entry(spec), count))
        self.segments = parsed
        self.reference_steps = sum(c for _, c in parsed)
        self.name = name or ",".join(f"{entry_name(e)}:{c}" for e, c in parsed)

    def counts(self, num_steps: int) -> List[int]:
        """Steps per segment for a run of ``num_steps`` steps (see :func:`apportion`)."""
        return apportion([c for _, c in self.segments], num_steps, palindrome=self._is_palindrome())

    def _is_palindrome(self) -> bool:
        keys = [(entry_name(e), c) for e, c in self.segments]
        return len(keys) > 1 and keys == keys[::-1]

    def schedule(self, num_steps: int) -> List[Entry]:
        plan: List[Entry] = []
        for (entry, _), c in zip(self.segments, self.counts(num_steps)):
            plan.extend([entry] * c)
        return plan


class EndsPolicy(Policy):
    """``ends`` on the first and last ``n_ends`` steps, ``middle`` in between.

    With ``reference_steps`` the number of end steps scales with the run:
    ``round(n_ends * num_steps / reference_steps)``, at least 1 when ``n_ends >= 1``, and at most half
    the run (rounded up, so a 1-step run uses ``ends``). Without it, ``n_ends`` is absolute; a run too
    short for a middle step then uses ``ends`` only and warns once (:class:`~fsattn_diffusers.notices.FSAttnWarning`).
    """

    def __init__(self, ends="mxfp6", middle="mxfp4", n_ends: int = HYBRID_N_ENDS,
                 reference_steps: Optional[int] = None, name: Optional[str] = None):
        if isinstance(n_ends, bool) or not isinstance(n_ends, int) or n_ends < 0:
            raise ValueError(f"n_ends={n_ends!r} is not supported; accepted: an int >= 0")
        if reference_steps is not None and (not isinstance(reference_steps, int) or reference_steps < 1):
            raise ValueError(f"reference_steps={reference_steps!r} is not supported; accepted: an int >= 1 or None")
        self.ends, self.middle = parse_entry(ends), parse_entry(middle)
        self.n_ends = n_ends
        self.reference_steps = reference_steps or (2 * n_ends + 1)
        self._scaled = reference_steps is not None
        self.name = name or f"ends={entry_name(self.ends)}x{n_ends},middle={entry_name(self.middle)}"

    def n_end_steps(self, num_steps: int) -> int:
        """End steps on each side for a run of ``num_steps`` steps."""
        n = self.n_ends
        if self._scaled:
            n = _round_half_up(n * num_steps / self.reference_steps)
            if self.n_ends >= 1:
                n = max(n, 1)
        return min(n, (num_steps + 1) // 2)

    def schedule(self, num_steps: int) -> List[Entry]:
        n = self.n_end_steps(num_steps)
        if not self._scaled and self.n_ends >= 1 and 2 * n >= num_steps and self.middle is not self.ends:
            from ..notices import warn

            warn(f"fsattn: policy {self.name}: n_ends={self.n_ends} end steps on each side cover all {num_steps} "
                 f"steps, so middle={entry_name(self.middle)} never runs; accepted: n_ends < {num_steps / 2:g}, "
                 f"or reference_steps to scale n_ends with the run")
        return [self.ends if (i < n or i >= num_steps - n) else self.middle for i in range(num_steps)]


def hybrid_policy() -> EndsPolicy:
    """Paper Section 5.3: MXFP6 for the first and last 3 of 20 steps, MXFP4 in between, scaled (``"hybrid"``)."""
    return get_policy("hybrid")


def hopper_hybrid_policy() -> EndsPolicy:
    """The paper's hybrid mapped to what is fast on Hopper (``"hybrid-int8-mxfp8"``): ``int8-bf16`` on the end
    steps, ``mxfp8`` in between, the end steps scaled exactly as :func:`hybrid_policy`'s."""
    return get_policy(HOPPER_HYBRID)


def parse_schedule(text: str) -> SchedulePolicy:
    """Parse ``"name:steps,name:steps,..."`` (e.g. ``"mxfp6:3,mxfp4:14,mxfp6:3"``)."""
    segments = []
    for part in text.split(","):
        name, sep, count = part.strip().partition(":")
        if not sep or not name.strip() or not re.fullmatch(r"[0-9]+", count.strip()) or int(count) < 1:
            raise ValueError(f"bad schedule {text!r}: segment {part.strip()!r} is not NAME:STEPS with STEPS >= 1; "
                             f"accepted: {_accepted()}")
        segments.append((name.strip(), int(count)))
    return SchedulePolicy(segments, name=text.replace(" ", ""))


# -- the named policies ---------------------------------------------------------------------------------
class StepRule(enum.Enum):
    """How a named policy's entries map to the denoising steps."""
    #: ``entries[0]`` on every step.
    EVERY_STEP = "every step"
    #: ``entries[0]`` on the first and last ``HYBRID_N_ENDS`` of ``HYBRID_REFERENCE_STEPS`` steps, ``entries[1]``
    #: in between, the end steps scaled to the run (:class:`EndsPolicy`).
    ENDS = "ends and middle"
    #: ``entries[0]`` (a baseline kernel's recipe) on every step, computed by ``backend`` (needs its package).
    BASELINE_KERNEL = "baseline kernel"
    #: stock processors on every step, attention computed by diffusers' attention backend ``backend``.
    DIFFUSERS_BACKEND = "diffusers backend"


@dataclass(frozen=True)
class NamedPolicy:
    """One row of :data:`NAMED_POLICIES`: the entries (stock names or recipe names) and how they follow the steps."""
    entries: Tuple[str, ...]
    rule: StepRule
    #: Backend every call runs (``BASELINE_KERNEL``: ours; ``DIFFUSERS_BACKEND``: diffusers'); None: the processor's.
    backend: Optional[str] = None


#: Policy name -> entries and step rule, in display order. ``"stock"`` is an alias of ``"bf16"``.
NAMED_POLICIES = {
    "bf16": NamedPolicy(("bf16",), StepRule.EVERY_STEP),
    "stock": NamedPolicy(("bf16",), StepRule.EVERY_STEP),
    **{name: NamedPolicy((name,), StepRule.EVERY_STEP) for name in PRESETS},
    "hybrid": NamedPolicy((HYBRID_ENDS, HYBRID_MIDDLE), StepRule.ENDS),
    HOPPER_HYBRID: NamedPolicy((HOPPER_HYBRID_ENDS, HOPPER_HYBRID_MIDDLE), StepRule.ENDS),
    HOPPER_HYBRID_INT8: NamedPolicy((HOPPER_HYBRID_ENDS, INT8_FP8), StepRule.ENDS),
    "fa3": NamedPolicy(("fa3",), StepRule.BASELINE_KERNEL, backend="fa3"),
    "fa3-fp8": NamedPolicy(("fa3-fp8",), StepRule.BASELINE_KERNEL, backend="fa3"),
    "sage": NamedPolicy((), StepRule.DIFFUSERS_BACKEND, backend="sage"),
}
#: Policy name -> (recipe, backend): attention kernels a user would otherwise pick, run through our
#: processors so that sweeps and ``fsattn e2e`` compare them with the fsattn recipes.
BASELINE_POLICIES = {name: (row.entries[0], row.backend) for name, row in NAMED_POLICIES.items()
                     if row.rule is StepRule.BASELINE_KERNEL}
#: Policy name -> diffusers attention backend (``set_attention_backend``): stock processors on every call, the
#: attention computed by that diffusers backend (SageAttention: what Wan users run on Hopper).
DIFFUSERS_BACKEND_POLICIES = {name: row.backend for name, row in NAMED_POLICIES.items()
                              if row.rule is StepRule.DIFFUSERS_BACKEND}


def baseline_policy(name: str) -> "FixedPolicy":
    """The fixed policy of baseline ``name`` (see :data:`BASELINE_POLICIES`); its ``backend`` attribute
    names the kernel every call runs. One-line ValueError when the kernel's package is not importable."""
    from ..backends import fa3_backend

    recipe_name, backend = BASELINE_POLICIES[name]
    fa3_backend.require_fa3(name)
    policy = FixedPolicy(fa3_backend.FA3_RECIPES[recipe_name])
    policy.backend = backend
    return policy


class DiffusersBackendPolicy(FixedPolicy):
    """Stock attention processors on every step, computed by diffusers' attention backend ``attention_backend``.

    :func:`fsattn_diffusers.apply` calls ``set_attention_backend(attention_backend)`` on every transformer (every
    attention module, cross-attention included, as for a diffusers user) and restores the previous backends on
    :func:`fsattn_diffusers.remove`; the processors record ``name`` with the backend each call ran on.
    """

    def __init__(self, name: str, attention_backend: str):
        super().__init__(None)
        self.name = name
        self.attention_backend = attention_backend

    def plan_names(self, num_steps: int) -> List[str]:
        return [self.name] * num_steps


def diffusers_backend_policy(name: str) -> DiffusersBackendPolicy:
    """The policy of :data:`DIFFUSERS_BACKEND_POLICIES` ``name``. One-line ValueError when its package is not
    importable or diffusers refuses the backend (``sage``: diffusers checks the installed distribution's version)."""
    from . import sage

    identity = sage.require_sage(f"the {name} policy")
    why = sage.diffusers_refusal(identity)
    if why is not None:
        raise ValueError(f"the {name} policy runs diffusers' {DIFFUSERS_BACKEND_POLICIES[name]} backend; {why}")
    return DiffusersBackendPolicy(name, DIFFUSERS_BACKEND_POLICIES[name])


def _named_policy(name: str, row: NamedPolicy) -> Policy:
    """Build the policy of row ``row`` of :data:`NAMED_POLICIES`."""
    if row.rule is StepRule.EVERY_STEP:
        return FixedPolicy(parse_entry(row.entries[0]))
    if row.rule is StepRule.ENDS:
        return EndsPolicy(*row.entries, HYBRID_N_ENDS, reference_steps=HYBRID_REFERENCE_STEPS, name=name)
    if row.rule is StepRule.BASELINE_KERNEL:
        return baseline_policy(name)
    return diffusers_backend_policy(name)


def get_policy(spec: Union[str, Recipe, Policy, Mapping]) -> Policy:
    """Resolve a policy specification (see the module docstring). One-line ValueError when invalid,
    ``None`` included (say ``"bf16"`` for stock attention)."""
    if isinstance(spec, Policy):
        return spec
    if spec is None:  # stock attention or the hybrid default? neither is what every reader would guess
        raise ValueError(f"policy=None is not a policy; accepted: 'bf16' (stock diffusers attention), 'hybrid' "
                         f"(the default of apply), {_accepted()}")
    if isinstance(spec, Recipe):
        return FixedPolicy(parse_entry(spec))
    if isinstance(spec, Mapping):
        unknown = sorted(set(spec) - set(_ENDS_KEYS))
        if unknown or not {"ends", "middle", "n_ends"} <= set(spec):
            raise ValueError(f"bad policy mapping {dict(spec)!r}; accepted keys: ends, middle, n_ends "
                             f"(required) and reference_steps")
        return EndsPolicy(spec["ends"], spec["middle"], spec["n_ends"], spec.get("reference_steps"))
    if isinstance(spec, str):
        key = spec.strip().lower()
        if key in NAMED_POLICIES:
            return _named_policy(key, NAMED_POLICIES[key])
        if ":" in key or "," in key:
            return parse_schedule(key)
        if "+" in key and key.partition("+")[0].strip() in (*PRESETS, *STOCK_NAMES):
            return FixedPolicy(parse_entry(key))  # a preset with changes, as attention() takes it
        raise ValueError(f"unknown policy {spec!r}; accepted: {_accepted()}")
    raise ValueError(f"policy must be a string, Recipe, mapping or Policy, got {type(spec).__name__}; "
                     f"accepted: {_accepted()}")


def describe(policy: Policy, num_steps: int) -> List[Tuple[int, int, str]]:
    """Runs of equal entries: ``[(first_step, last_step, name), ...]`` for ``num_steps`` steps."""
    runs: List[Tuple[int, int, str]] = []
    for i, name in enumerate(policy.plan_names(num_steps)):
        if runs and runs[-1][2] == name:
            runs[-1] = (runs[-1][0], i, name)
        else:
            runs.append((i, i, name))
    return runs


def schedule_line(policy: Policy, num_steps: int) -> str:
    """One line saying what ``policy`` runs at ``num_steps`` steps, e.g.
    ``"hybrid at 4 steps: step 0 mxfp6, steps 1-2 mxfp4, step 3 mxfp6 (defined for 20 steps, scaled)"``."""
    runs = ", ".join(f"step {a} {name}" if a == b else f"steps {a}-{b} {name}"
                     for a, b, name in describe(policy, num_steps))
    text = f"{policy.name} at {num_steps} step{'s' if num_steps != 1 else ''}: {runs}"
    ref = None if policy.is_fixed else policy.reference_steps
    if ref is not None and ref != num_steps and (isinstance(policy, SchedulePolicy) or getattr(policy, "_scaled", 0)):
        text += f" (defined for {ref} steps, scaled)"
    return text


__all__ = ["schedule_line", "Policy", "FixedPolicy", "SchedulePolicy", "EndsPolicy", "get_policy", "hybrid_policy",
           "hopper_hybrid_policy",
           "parse_schedule", "parse_entry", "entry_name", "describe", "STOCK_NAMES", "BASELINE_POLICIES",
           "baseline_policy", "DIFFUSERS_BACKEND_POLICIES", "DiffusersBackendPolicy", "diffusers_backend_policy"]

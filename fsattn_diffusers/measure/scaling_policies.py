"""Which policies the sequence-parallel scaling runs (:mod:`.cp_scaling`, :mod:`.xdit_scaling`) measure, and how.

A ``--policies`` entry is one of:

* ``bf16`` (or ``stock``): the framework's stock attention (the speedup baseline, always measured first);
* a diffusers attention-backend policy of :data:`~fsattn_diffusers.integration.policy.DIFFUSERS_BACKEND_POLICIES`
  (``sage``: SageAttention 2 through diffusers' ``sage`` backend, as Wan users run it; under xDiT its own ``SAGE``
  slot): stock processors, that backend computing every attention call;
* any name the library resolves to one fixed recipe: a policy name of
  :func:`~fsattn_diffusers.integration.policy.get_policy` (``mxfp8``, ``int8-bf16``, ...) or a recipe name of
  :func:`~fsattn_diffusers.recipe.get_recipe` (``int8-bf16+exponential=exact``): fsattn's processors on
  self-attention;
* a policy that changes with the step (``hybrid``, ``hybrid-int8-mxfp8``, a schedule string): not timed as such;
  each of its recipes is measured, and the policy is projected over its plan of
  :data:`~fsattn_diffusers.measure.e2e.PAPER_STEPS` steps from those step times
  (:func:`fsattn_diffusers.measure.e2e.summarize`'s ``projections``).
"""

from __future__ import annotations

import enum
from typing import Dict, List, Tuple

from . import e2e

#: The speedup baseline: stock attention.
STOCK = "bf16"


class PolicyKind(str, enum.Enum):
    """What computes a measured policy's self-attention."""

    STOCK = "stock"  # the framework's stock attention
    RECIPE = "recipe"  # one fsattn recipe through fsattn's processors (diffusers) / xDiT slot (xDiT)
    ATTENTION_BACKEND = "attention_backend"  # stock processors on a named attention backend (sage)


def _accepted() -> str:
    from ..integration.policy import policy_names

    return (f"{', '.join(policy_names())}, a recipe name such as 'int8-bf16+exponential=exact', or a schedule like "
            "'mxfp6:3,mxfp4:14,mxfp6:3'")


def policy_kind(name: str) -> PolicyKind:
    """The kind of a measured policy name (one :func:`expand_policies` returned)."""
    from ..integration.policy import DIFFUSERS_BACKEND_POLICIES, STOCK_NAMES

    if name in STOCK_NAMES:
        return PolicyKind.STOCK
    if name in DIFFUSERS_BACKEND_POLICIES:
        return PolicyKind.ATTENTION_BACKEND
    return PolicyKind.RECIPE


def attention_backend(name: str) -> str:
    """The diffusers attention backend of an :attr:`PolicyKind.ATTENTION_BACKEND` policy (``sage`` -> ``"sage"``)."""
    from ..integration.policy import DIFFUSERS_BACKEND_POLICIES

    return DIFFUSERS_BACKEND_POLICIES[name]


def processor_policy(name: str):
    """What fsattn's processors (and :func:`fsattn_diffusers.xdit.install`) take for a measured policy: the name
    when :func:`get_policy` resolves it, else the :class:`Recipe` :func:`get_recipe` resolves (modifier names)."""
    from ..integration.policy import get_policy
    from ..recipe import get_recipe

    try:
        get_policy(name)
        return name
    except ValueError:
        return get_recipe(name)


def _resolve(name: str):
    """The resolved policy of one ``--policies`` entry; one-line ValueError naming what is accepted."""
    from ..integration.policy import DIFFUSERS_BACKEND_POLICIES, FixedPolicy, get_policy
    from ..recipe import get_recipe

    if name in DIFFUSERS_BACKEND_POLICIES:
        return get_policy(name)  # its own one-line ValueError when the package or diffusers refuses it
    try:
        return get_policy(name)
    except ValueError:
        pass
    try:
        return FixedPolicy(get_recipe(name))
    except ValueError:
        raise ValueError(f"unknown policy {name!r}; accepted: {_accepted()}") from None


def expand_policies(names: List[str]) -> Tuple[List[str], Dict[str, List[str]]]:
    """The policies to measure and the step-scheduled ones to project from them.

    Parameters
    ----------
    names : list of str
        ``--policies`` entries (see the module docstring).

    Returns
    -------
    measured : list of str
        ``bf16`` first, then every fixed policy and every recipe of a step-scheduled one, in the order given,
        without repeats (a recipe by the name of its :class:`Recipe`).
    projections : dict
        Step-scheduled policy name -> its plan (recipe name per step) over ``e2e.PAPER_STEPS`` steps.
    """
    from ..integration.policy import STOCK_NAMES, entry_name

    measured, projections = [STOCK], {}
    for raw in names:
        name = raw.strip()
        if name.lower() in STOCK_NAMES:
            continue
        policy = _resolve(name)
        if getattr(policy, "attention_backend", None) is not None:
            new = [policy.name]
        elif policy.is_fixed:
            new = [entry_name(policy.entry)]
        else:
            plan = policy.plan_names(e2e.PAPER_STEPS)
            projections[policy.name] = plan
            new = list(dict.fromkeys(plan))
        measured += [p for p in new if p not in measured]
    return measured, projections


def context_parallel_refusal(name: str) -> str:
    """Why diffusers cannot run an :attr:`PolicyKind.ATTENTION_BACKEND` policy under its context parallelism (one
    line), or ``""`` when its backend is registered with ``supports_context_parallel`` (the ring then merges the
    backend's own LSE)."""
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

    backend = attention_backend(name)
    if _AttentionBackendRegistry._is_context_parallel_available(AttentionBackendName(backend)):
        return ""
    return f"not supported by diffusers' {backend} backend (not registered with supports_context_parallel)"


__all__ = ["PolicyKind", "STOCK", "policy_kind", "attention_backend", "processor_policy", "expand_policies",
           "context_parallel_refusal"]

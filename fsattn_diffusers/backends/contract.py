"""The backend contract: one request in, one result out, the same for every backend.

A backend's ``run`` takes an :class:`AttentionRequest` and returns an :class:`AttentionResult`; its ``refuses`` takes
the same request and says why it cannot run it (``None`` when it can). What a call asks for (LSE, statistics, the
non-finite flags) is a field of the request, never an extra argument or an extra return value. What a backend is and
how it registers itself: :mod:`.registry`.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Dict, Optional

import torch

from ..nonfinite import StagedFlags
from ..recipe import Recipe


@dataclass
class AttentionRequest:
    """One attention call as every backend takes it.

    Attributes
    ----------
    q : Tensor (B, H, S_q, D); k, v : Tensor (B, H, S_k, D)
        Views of any strides, one dtype and device; a backend never modifies them.
    recipe : Recipe
        The numerics asked for (a backend with fixed numerics computes its own: ``Backend.computes``).
    scale : float
        Softmax scale alpha.
    kv_lens : int64 Tensor (B,) or None
        Valid keys per batch entry (keys at positions >= kv_lens[b] are not read).
    q_lens : int64 Tensor (B,) or None
        Valid queries per batch entry: Q smoothing's mean and per-slice switch count only those (every row is still
        computed). A backend that cannot honour it for a Q-smoothing recipe refuses the call.
    return_lse : bool
        Fill ``AttentionResult.lse``.
    return_stats : bool
        Fill ``AttentionResult.stats``.
    detect_nonfinite : bool
        Ask a backend that finds non-finite inputs in its own reads (``Backend.detects_nonfinite``) to report them
        in ``AttentionResult.nonfinite``; the others ignore it (the caller then detects them itself).
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    recipe: Recipe
    scale: float
    kv_lens: Optional[torch.Tensor] = None
    q_lens: Optional[torch.Tensor] = None
    return_lse: bool = False
    return_stats: bool = False
    detect_nonfinite: bool = False

    def with_operands(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **changes) -> "AttentionRequest":
        """The same request on other operands (of the same shapes), with ``changes`` to its other fields."""
        return dataclasses.replace(self, q=q, k=k, v=v, **changes)


@dataclass
class AttentionResult:
    """What every backend returns.

    Attributes
    ----------
    out : Tensor (B, H, S_q, D) in q's dtype
        Rows without a valid key are 0.
    lse : float32 Tensor (B, H, S_q) or None
        Natural-log log-sum-exp of the scaled scores (-inf on rows without a valid key); set when the request asked.
    stats : dict or None
        ``rollbacks``, ``tiles``, ``rollback_tiles``, ``rollback_rate``; set when the request asked.
    nonfinite : StagedFlags or None
        The (B, H) non-finite flags the backend found in its own reads of q, k, v, when the request asked and the
        backend detects (``Backend.detects_nonfinite``); None otherwise.
    """

    out: torch.Tensor
    lse: Optional[torch.Tensor] = None
    stats: Optional[Dict] = None
    nonfinite: Optional[StagedFlags] = None


class SpeedClass(str, enum.Enum):
    """How fast a backend runs a recipe on the devices it takes."""

    #: A kernel that runs the recipe's operand formats in the device's own tensor-core instructions.
    NATIVE = "native"
    #: A kernel that carries some of the recipe's formats in a wider one the device runs: no faster than that one.
    WIDENED = "widened"
    #: A PyTorch reference: correct everywhere, slow.
    REFERENCE = "reference"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Speed:
    """A backend's speed class for one recipe; for :attr:`SpeedClass.WIDENED`, the preset it runs no faster than
    (``as_fast_as``) and why (``why``, one clause)."""

    speed_class: SpeedClass
    as_fast_as: Optional[str] = None
    why: Optional[str] = None


__all__ = ["AttentionRequest", "AttentionResult", "SpeedClass", "Speed"]

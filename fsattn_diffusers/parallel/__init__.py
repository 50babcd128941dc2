"""Sequence parallelism: fsattn inside xDiT (Ulysses / ring / USP) and diffusers context parallelism.

* :func:`install` (also :mod:`fsattn_diffusers.xdit`): fsattn as a kernel of xDiT's attention-function
  registry; see :mod:`.xdit_adapter`.
* :func:`context_parallel_attention`: fsattn through diffusers' own ring / Ulysses templates; the Wan
  processor uses it when ``enable_parallelism`` gave it a ``_parallel_config``.
* :func:`merge_by_lse`: the LSE merge of key-sharded results, as a reference.
"""

from ..integration.context_parallel import context_parallel_attention, fsattn_forward_op
from .lse import merge_by_lse
from .xdit_adapter import DEFAULT_SLOT, RING_SLOTS, XDiTAttention, XDiTHandle, default_cross_slot, install

__all__ = ["install", "XDiTAttention", "XDiTHandle", "RING_SLOTS", "DEFAULT_SLOT", "default_cross_slot",
           "context_parallel_attention", "fsattn_forward_op", "merge_by_lse"]

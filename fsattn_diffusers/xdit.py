"""xDiT integration: ``fsattn_diffusers.xdit.install(policy=...)``; see :mod:`fsattn_diffusers.parallel`."""

from .parallel.xdit_adapter import DEFAULT_SLOT, RING_SLOTS, XDiTAttention, XDiTHandle, default_cross_slot, install

__all__ = ["install", "XDiTAttention", "XDiTHandle", "RING_SLOTS", "DEFAULT_SLOT", "default_cross_slot"]

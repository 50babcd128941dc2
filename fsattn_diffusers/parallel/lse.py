"""Merging partial attention results by their log-sum-exp.

Attention over keys split into shards ``K = [K_1; ...; K_n]`` is the LSE-weighted mean of the per-shard
outputs: ``O = sum_i exp(lse_i - lse) O_i`` with ``lse = logsumexp_i(lse_i)``. This is what ring
attention does step by step (xDiT through ``torch``'s ``_templated_ring_attention``, diffusers through
``TemplatedRingAttention``); :func:`merge_by_lse` does it in one go, as a reference.
"""

from __future__ import annotations

from typing import Sequence, Tuple

import torch


def merge_by_lse(outs: Sequence[torch.Tensor], lses: Sequence[torch.Tensor], *,
                 layout: str = "bhsd") -> Tuple[torch.Tensor, torch.Tensor]:
    """Merge per-key-shard attention outputs with their natural-log LSEs.

    Parameters
    ----------
    outs : sequence of Tensor (B, H, S, D) (``layout="bhsd"``) or (B, S, H, D) (``"bshd"``)
    lses : sequence of Tensor (B, H, S), natural log, one per output
        A shard whose rows saw no key has LSE ``-inf`` and weight 0.
    layout : str
        Layout of ``outs``; the LSE is always (B, H, S) as :func:`fsattn_diffusers.attention` returns it.

    Returns
    -------
    out : Tensor in the first output's dtype and layout
    lse : Tensor (B, H, S) float32, the LSE over all shards
    """
    if len(outs) != len(lses) or not outs:
        raise ValueError(f"need one LSE per output and at least one of each, got {len(outs)} outputs and "
                         f"{len(lses)} LSEs")
    if layout not in ("bhsd", "bshd"):
        raise ValueError(f"unknown layout {layout!r}; accepted: bhsd, bshd")
    stacked = torch.stack([lse.float() for lse in lses])  # (n, B, H, S)
    total = torch.logsumexp(stacked, dim=0)
    safe_total = torch.where(torch.isfinite(total), total, torch.zeros_like(total))
    weights = torch.exp(stacked - safe_total)  # rows with no key anywhere: all weights 0
    if layout == "bshd":
        weights = weights.transpose(2, 3)
    merged = sum(w[..., None] * o.float() for w, o in zip(weights, outs))
    return merged.to(outs[0].dtype), total


__all__ = ["merge_by_lse"]

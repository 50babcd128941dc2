"""The PyTorch reference emulator as a backend: runs on any device, slowly, the numerics the recipe names."""

from __future__ import annotations

from .contract import AttentionRequest, AttentionResult, Speed, SpeedClass
from .registry import Backend, register_backend


def run(request: AttentionRequest) -> AttentionResult:
    from ..emulator import emulate_attention

    r = request
    out, lse, stats = emulate_attention(r.q, r.k, r.v, r.recipe, scale=r.scale, kv_lens=r.kv_lens,
                                        return_lse=r.return_lse, return_stats=r.return_stats, q_lens=r.q_lens)
    return AttentionResult(out, lse, stats)


# Every device, every call; last in "auto"'s order.
register_backend(Backend("emulator", run, speed=Speed(SpeedClass.REFERENCE), auto_rank=100))

"""Inputs whose key tiles sit at chosen score levels, for tests of the rollback and lowering gates."""

import torch

#: Score level of a key tile (times the query norm 8, over sqrt(128): ~8 doublings up, ~10 down).
LEVELS = {"H": 8.0, "L": -10.0}


def patterned_tiles(pattern: str, rows: int = 64, d: int = 128, tile: int = 128, seed: int = 6, device="cpu"):
    """bf16 (1, 1, S, d) q, k, v: every query is ``8 u`` (u a unit vector) plus noise 0.05, and key tile ``t`` of
    ``tile`` keys is ``LEVELS[pattern[t]] u`` plus the same noise, so its scores sit ~8 doublings above zero (``H``) or
    ~10 below (``L``); v is N(0, 1)."""
    g = torch.Generator().manual_seed(seed)
    u = torch.nn.functional.normalize(torch.randn(d, generator=g), dim=0)
    q = (8.0 * u + 0.05 * torch.randn(1, 1, rows, d, generator=g)).to(torch.bfloat16)
    level = torch.tensor([LEVELS[c] for c in pattern]).repeat_interleave(tile)
    k = (level[:, None] * u + 0.05 * torch.randn(1, 1, level.numel(), d, generator=g)).to(torch.bfloat16)
    v = torch.randn(1, 1, level.numel(), d, generator=g).to(torch.bfloat16)
    return tuple(t.to(device) for t in (q, k, v))

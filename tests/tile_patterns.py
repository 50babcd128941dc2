"""Inputs with a chosen tile structure: key tiles at chosen score levels (the rollback and lowering gates), and a
query tile far above the others (Q smoothing's key term, sm90_numerics difference 9)."""

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


def query_tile_far_above(scale_log2: int = 16, seed: int = 3, device="cpu"):
    """bf16 (1, 1, 256, 128) q, k, v: query tile 0 is N(3, 1) (a shared offset), query tile 1 is ``2^scale_log2``
    times N(0, 1) in pairs of opposite rows (so it leaves Q's mean alone); k, v N(0, 1). With Q smoothing,
    ``2^(-QE - G)`` of tile 1 lies below E4M3's range: that tile drops the key term, tile 0 keeps it."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 1, 256, 128, generator=g) + 3.0
    big = torch.randn(1, 1, 64, 128, generator=g) * 2.0 ** scale_log2
    q[:, :, 128::2], q[:, :, 129::2] = big, -big
    k = torch.randn(1, 1, 256, 128, generator=g)
    v = torch.randn(1, 1, 256, 128, generator=g)
    return tuple(t.bfloat16().to(device) for t in (q, k, v))

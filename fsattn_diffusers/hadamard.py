"""Normalized Walsh-Hadamard rotation over the head dimension (paper Section 4.4).

``H_d / sqrt(d)`` in Sylvester order (``H[i, j] = (-1)^popcount(i & j)``) is orthogonal and symmetric,
so rotating Q and K by it leaves ``Q K^T`` unchanged while spreading outliers across MX blocks.
"""

from __future__ import annotations

import math

import torch


def _check_dim(d: int) -> None:
    if d < 1 or d & (d - 1):
        raise ValueError(f"Hadamard rotation needs a power-of-two head dim, got {d}; accepted: 1, 2, 4, ..., 64, 128, 256")


def hadamard_matrix(d: int, *, dtype=torch.float32, device=None) -> torch.Tensor:
    """The normalized Sylvester-Hadamard matrix (d, d); ``H @ H.T == I``."""
    _check_dim(d)
    idx = torch.arange(d, device=device)
    overlap = idx[:, None] & idx[None, :]
    parity = torch.zeros_like(overlap)
    for bit in range(max(d.bit_length() - 1, 0)):
        parity ^= (overlap >> bit) & 1
    return (1.0 - 2.0 * parity.to(dtype)) / math.sqrt(d)


def fwht_unnormalized(x: torch.Tensor) -> torch.Tensor:
    """Butterfly Walsh-Hadamard transform along the last axis in float32, without the 1/sqrt(d).

    Parameters
    ----------
    x : Tensor (..., d), d a power of two.

    Returns
    -------
    Tensor (..., d), float32: ``x @ H_unnormalized``, butterflies over pairs at distance 1, 2, 4, ...
    (the order of AITER's reference rotation).
    """
    d = x.shape[-1]
    _check_dim(d)
    y = x.to(torch.float32)
    h = 1
    while h < d:
        pairs = y.reshape(*y.shape[:-1], -1, 2, h)
        left, right = pairs[..., 0, :], pairs[..., 1, :]
        y = torch.cat((left + right, left - right), dim=-1).reshape(*x.shape)
        h *= 2
    return y


def hadamard_transform(x: torch.Tensor) -> torch.Tensor:
    """Normalized rotation ``x @ H / sqrt(d)`` along the last axis, float32."""
    return fwht_unnormalized(x) * (1.0 / math.sqrt(x.shape[-1]))


#: Seed of the fixed sign vector of the signed rotation ``H diag(s)`` (``Recipe.hadamard_signs``).
ROTATION_SIGN_SEED = 0x5EED5


def rotation_signs(d: int) -> torch.Tensor:
    """The fixed +-1 vector ``s`` (d,) float32 of the signed rotation ``H diag(s)``.

    Drawn from SplitMix64 seeded with :data:`ROTATION_SIGN_SEED` (bit 63 of each draw), so it is the same on every
    machine and in every framework version; the kernels' pre-pass builds its matrix from this vector.
    """
    _check_dim(d)
    mask = (1 << 64) - 1
    state, signs = ROTATION_SIGN_SEED, []
    for _ in range(d):
        state = (state + 0x9E3779B97F4A7C15) & mask
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        z ^= z >> 31
        signs.append(-1.0 if z >> 63 else 1.0)
    return torch.tensor(signs, dtype=torch.float32)

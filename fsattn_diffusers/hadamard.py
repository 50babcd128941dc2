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

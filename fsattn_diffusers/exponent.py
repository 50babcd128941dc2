"""Stage-A exponentials: exact exp2, Schraudolph's bit construction and Rowmax-H15.

Every function takes ``y = X - m`` (base-2 score minus the row reference, float32) and returns the
probability proxy as float32 values. ``y = -inf`` (masked key) gives 0 for ``exact`` and
``schraudolph``; callers zero masked keys explicitly for ``rowmax_h15``.
"""

from __future__ import annotations

import math

import torch

#: log2(e): scores times ``alpha * LOG2E`` are base-2 exponents (the pre-scaled Q of Section 4.4).
LOG2E = 1.0 / math.log(2.0)
#: ln(2): base-2 log-sum-exp back to natural units.
LN2 = math.log(2.0)
# Schraudolph's tuned offset minimizing the RMS relative error of the ramp (paper Section 4.2, Eq. 9).
SCHRAUDOLPH_EPS = 0.05798
# (mantissa bits M, exponent bias b, pattern width W) of each proxy (paper Section 4.2, Table 8).
PROXY_LAYOUT = {"u32": (23, 127, 32), "u16": (7, 127, 16), "u8": (3, 7, 8)}
# The U8 pattern is read as FP8 E4M3, whose 0x7F is NaN: saturate at 0x7E (448).
U8_MAX_CODE = 0x7E
# Rowmax-H15 keeps results normal: n >= -252 gives at least 2^-126 (Rowmax-H15 of "How Much Softmax Do You Need in LLMs?").
ROWMAX_H15_MIN_N = -252


def exp2_exact(y: torch.Tensor) -> torch.Tensor:
    """``2^y`` in float32."""
    return torch.exp2(y.to(torch.float32))


def schraudolph_pattern(y: torch.Tensor, proxy: str = "u16") -> torch.Tensor:
    """The unsigned Stage-A bit pattern ``round(2^M * y + 2^M * (b - eps))``, clamped, as int64.

    The affine map is evaluated in float64 (the ideal pattern of Eq. 9; a doubling is 2^M units),
    rounded to nearest-even, clamped to [0, 2^W - 1] (U8: to 0x7E).
    """
    mbits, bias, width = PROXY_LAYOUT[proxy]
    t = torch.round(y.to(torch.float64) * 2.0 ** mbits + 2.0 ** mbits * (bias - SCHRAUDOLPH_EPS))
    top = U8_MAX_CODE if proxy == "u8" else 2 ** width - 1
    return torch.clamp(torch.nan_to_num(t, nan=float(top)), 0, top).to(torch.int64)


def _u32_bits_as_float(bits: torch.Tensor) -> torch.Tensor:
    """Reinterpret unsigned 32-bit patterns held in int64 as float32."""
    return torch.where(bits >= 2 ** 31, bits - 2 ** 32, bits).to(torch.int32).view(torch.float32)


def pattern_to_float(pattern: torch.Tensor, proxy: str) -> torch.Tensor:
    """Read a Stage-A pattern as FP32 (u32), BF16 (u16) or FP8 E4M3 (u8); returns float32 values."""
    if proxy == "u32":
        return _u32_bits_as_float(pattern)
    if proxy == "u16":
        return _u32_bits_as_float(pattern << 16)  # a BF16 pattern is the top half of an FP32 one
    return pattern.to(torch.uint8).view(torch.float8_e4m3fn).to(torch.float32)


def schraudolph_u16(y: torch.Tensor) -> torch.Tensor:
    """The paper's U16/BF16 proxy of ``2^y`` (Section 4.2-4.3)."""
    return pattern_to_float(schraudolph_pattern(y, "u16"), "u16")


def schraudolph(y: torch.Tensor, proxy: str = "u16") -> torch.Tensor:
    """Schraudolph proxy of ``2^y`` of the given width (``u32``, ``u16`` or ``u8``)."""
    return pattern_to_float(schraudolph_pattern(y, proxy), proxy)


def rowmax_h15(y: torch.Tensor) -> torch.Tensor:
    """Rowmax-H15 ("How Much Softmax Do You Need in LLMs?" (Zhu, Hu, Kozlowski)): ``n = round_half_even(2y)``, ``(1 + 0.5 (n mod 2)) * 2^(n div 2)``."""
    n = torch.clamp(torch.round(2.0 * y.to(torch.float32)), min=ROWMAX_H15_MIN_N)
    finite = torch.isfinite(n)
    n = torch.where(finite, n, torch.zeros_like(n))
    half = torch.floor(n / 2.0)
    odd = n - 2.0 * half
    w = torch.ldexp(1.0 + 0.5 * odd, half.to(torch.int32))
    return torch.where(finite, w, torch.where(torch.isnan(y), y, torch.full_like(w, float("inf"))))


def stage_a(y: torch.Tensor, exponential: str, proxy: str) -> torch.Tensor:
    """Dispatch on the recipe's exponential."""
    if exponential == "exact":
        return exp2_exact(y)
    if exponential == "schraudolph":
        return schraudolph(y, proxy)
    if exponential == "rowmax_h15":
        return rowmax_h15(y)
    raise ValueError(f"unknown exponential {exponential!r}; accepted: exact, schraudolph, rowmax_h15")

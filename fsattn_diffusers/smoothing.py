"""Token-mean smoothing of Q and K (``Recipe.smooth_k``, ``Recipe.smooth_q``; NUMERICS.md §7).

Softmax is invariant to a constant per row, so subtracting K's mean over the keys from every key moves each row's
scores by ``q_i . k_mean`` and changes nothing else; subtracting Q's mean from every query removes ``q_mean . k_j``
from the scores, a term per key that is added back before the exponential (float32 in the MI355X semantics; on Hopper
as the kernel's chained-wgmma E4M3 terms, the Hopper numerics' ``key_term``). What stays for the
quantized GEMM are the parts that vary between tokens. These functions are shared by the emulator and the kernels'
host code, so both see the same means, bias and LSE correction bit for bit on one device.
"""

from __future__ import annotations

import struct
from typing import Optional

import torch

from .formats import round_to_bf16
from .operands import LOG2E


#: :func:`token_mean` sums the tokens in at most this many chunks (a float64 copy of one chunk at a time bounds the
#: temporary to a quarter of a BF16 input's own size).
MEAN_CHUNKS = 16


def valid_prefix(lens: Optional[torch.Tensor], length: int, device) -> Optional[torch.Tensor]:
    """The tokens before ``lens[b]`` (``kv_lens`` or ``q_lens``, (B,) ints) of each batch entry: (B, length) bool on
    ``device``, or None when ``lens`` is None (every token valid). The ``valid`` masks the functions here take."""
    if lens is None:
        return None
    return torch.arange(length, device=device)[None, :] < lens.to(device)[:, None]


def _token_sum(x: torch.Tensor, squares: bool = False) -> torch.Tensor:
    """Float64 sum over dim 2 of ``BF16(x)`` (B, H, S, D), or of its squares, in chunks of tokens: (B, H, 1, D)."""
    step = max(1, -(-x.shape[2] // MEAN_CHUNKS))
    total = None
    for s0 in range(0, x.shape[2], step):
        part = x[:, :, s0:s0 + step]
        if part.dtype != torch.bfloat16:
            part = part.to(torch.bfloat16)
        part = part.to(torch.float64)
        part = (part * part if squares else part).sum(dim=2, keepdim=True)
        total = part if total is None else total + part
    return total


def _mean_from_sum(total: torch.Tensor, count: int) -> torch.Tensor:
    """``BF16(float32(total / count))`` as float32, ``total`` float64: the last step of :func:`token_mean`."""
    return round_to_bf16((total / count).to(torch.float32))


def token_mean(x: torch.Tensor, valid: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Mean over the tokens of ``x`` (B, H, S, D), rounded to BF16: (B, H, 1, D) float32.

    ``valid`` (B, S) bool, optional, a prefix of each batch entry's tokens (keys before ``kv_lens``): only those
    count; an entry without a valid token has mean 0. Any vector subtracted from every key (or query) leaves the
    attention unchanged in real arithmetic, so the mean needs no particular precision; what it needs is to be the same
    vector wherever it is computed (emulator, kernels' pre-pass; CPU, GPU). It is the float64 sum of the tokens' BF16
    values, divided by their count in float64, rounded to float32 and then to BF16. A float64 sum of BF16 values is
    exact, so independent of the summation order, whenever the largest and smallest non-zero magnitudes of a channel
    lie within 2^(45 - log2 S) of each other (any realistic activation); beyond that the orders differ in the
    float64 sum's last bit, which moves the BF16 mean only when it sits on a rounding boundary.
    ``kernels.token_mean`` computes the same values on the GPU in one read, without a host sync.
    """
    if valid is None:
        return _mean_from_sum(_token_sum(x), x.shape[2])
    empty = torch.zeros((1, x.shape[1], 1, x.shape[3]), dtype=torch.float32, device=x.device)
    return _per_entry_prefix(x, valid, token_mean, empty)


def _per_entry_prefix(x: torch.Tensor, valid: torch.Tensor, fn, empty: torch.Tensor) -> torch.Tensor:
    """``fn`` of each batch entry's valid prefix of ``x`` (B, H, S, ...), ``valid`` (B, S) bool a prefix per entry,
    concatenated along the batch; ``empty`` (one entry's result) where an entry has no valid token."""
    return torch.cat([fn(x[i:i + 1, :, :n]) if n > 0 else empty for i, n in enumerate(valid.sum(dim=1).tolist())])


def q_smoothing_heads(q: torch.Tensor, min_ratio: float, valid: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The (batch, head) slices Q smoothing takes under ``Recipe.smooth_q_min_ratio``: (B, H) bool.

    With ``mu`` the float64 mean of the BF16 queries and ``ms`` the float64 mean of their squared norms,
    ``|mu|^2 > min_ratio^2 (ms - |mu|^2)``: the mean's norm exceeds ``min_ratio`` times the queries' rms distance
    from it. ``kernels.token_mean`` decides the same way on the GPU (sums in another order: a slice whose ratio lies
    within ~1e-12 of ``min_ratio`` may be decided differently). ``min_ratio`` 0: every slice. ``valid`` (B, S) bool,
    optional, a prefix of each batch entry's queries (those before ``q_lens``): only those count, and an entry
    without one is not smoothed.
    """
    b, h, s, _ = q.shape
    if min_ratio <= 0.0 or s == 0:
        return torch.full((b, h), min_ratio <= 0.0, dtype=torch.bool, device=q.device)
    if valid is not None:
        return _per_entry_prefix(q, valid, lambda x: q_smoothing_heads(x, min_ratio),
                                 torch.zeros((1, h), dtype=torch.bool, device=q.device))
    mu = _token_sum(q)[:, :, 0] / s
    ms = _token_sum(q, squares=True)[:, :, 0].sum(dim=-1) / s
    mm = (mu * mu).sum(dim=-1)
    return mm > q_smoothing_ratio2(min_ratio) * (ms - mm)


def q_smoothing_ratio2(min_ratio: float) -> float:
    """``float32(min_ratio^2)``: the threshold of :func:`q_smoothing_heads` as the GPU kernel takes it (an fp32
    scalar; ``KernelPlan.smooth_q_ratio2``)."""
    return struct.unpack("<f", struct.pack("<f", min_ratio * min_ratio))[0]


def subtract_mean(x: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
    """``BF16(x - mean)`` as float32 (B, H, S, D), the difference taken in float32 from the input's own values (one
    rounding: an fp16 or fp32 input is not rounded to BF16 first): the smoothed operand the pre-pass quantizes."""
    return round_to_bf16(x.to(torch.float32) - mean)


def key_bias(q_mean: torch.Tensor, k_smoothed: torch.Tensor, multiplier: float) -> torch.Tensor:
    """The per-key score term of Q smoothing, ``multiplier * (q_mean . k_j)``: (B, H, S_k) float32.

    q_mean : (B, H, 1, D) from :func:`token_mean`; k_smoothed : (B, H, S_k, D) float32, the K the GEMM sees (after
    K smoothing when that is on). ``multiplier`` is ``alpha log2 e`` (scores in doublings).
    """
    return torch.matmul(k_smoothed, q_mean.transpose(-1, -2))[..., 0] * multiplier


#: Query rows per block of :func:`lse_offset` (bounds its float32 temporary).
LSE_OFFSET_ROWS = 4096


def lse_offset(q: torch.Tensor, k_mean: torch.Tensor, scale: float) -> torch.Tensor:
    """What K smoothing removed from row i's scores, ``alpha (q_i . k_mean)``: (B, H, S_q) float32, added to the LSE.

    q : (B, H, S_q, D) any float dtype (its BF16 values are used); k_mean : (B, H, 1, D) float32.
    """
    kt = k_mean.transpose(-1, -2)
    parts = [torch.matmul(round_to_bf16(q[:, :, r:r + LSE_OFFSET_ROWS].to(torch.float32)), kt)[..., 0]
             for r in range(0, q.shape[2], LSE_OFFSET_ROWS)]
    return torch.cat(parts, dim=2) * scale


def smooth_inputs(q: torch.Tensor, k: torch.Tensor, recipe, scale: float, valid: Optional[torch.Tensor] = None,
                  valid_q: Optional[torch.Tensor] = None):
    """Apply ``recipe.smooth_q`` / ``recipe.smooth_k`` to (B, H, S, D) inputs. ``valid`` (B, S_k) and ``valid_q``
    (B, S_q) bool, optional: the keys (before ``kv_lens``) and queries (before ``q_lens``) that K's and Q's means and
    Q's per-slice switch count; every query is smoothed by its entry's mean all the same.

    Returns
    -------
    q, k : the operands to quantize (the inputs themselves when smoothing is off; else float32 BF16 values).
    bias : (B, H, S_k) float32 per-key score term in doublings (``smooth_q``; 0 on the slices that
        ``smooth_q_min_ratio`` leaves out, whose q is then ``BF16(q)``, the value every quantizer starts from), or None.
    lse_offset : (B, H, S_q) float32 to add to the natural-log LSE (``smooth_k``), or None.
    """
    bias = offset = None
    if recipe.smooth_k:
        k_mean = token_mean(k, valid)
        offset = lse_offset(q, k_mean, scale)
        k = subtract_mean(k, k_mean)
    if recipe.smooth_q:
        q_mean = token_mean(q, valid_q)
        if recipe.smooth_q_min_ratio > 0.0:  # the other slices: Q as it is, no key term
            heads = q_smoothing_heads(q, recipe.smooth_q_min_ratio, valid_q)
            q_mean = torch.where(heads[:, :, None, None], q_mean, torch.zeros_like(q_mean))
        k_seen = k if recipe.smooth_k else round_to_bf16(k.to(torch.float32))
        bias = key_bias(q_mean, k_seen, scale * LOG2E)
        q = subtract_mean(q, q_mean)
    return q, k, bias, offset

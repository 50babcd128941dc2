"""Reference attention and error measures shared by tests and accuracy measurements.

* :func:`exact_attention` — softmax attention in float64 (or float32), chunked over query rows so
  large shapes fit in memory; returns the output and the natural-log LSE.
* :func:`relative_error` — the global relative error ``||out - ref||_F / ||ref||_F`` (the paper's
  measure; never NaN: an all-zero ``ref`` counts as norm :data:`REF_NORM_FLOOR`); :func:`error_and_cosine` gives it
  with the cosine.
* :func:`cosine` — cosine similarity of the flattened tensors.
* :func:`within_kernel_rule` — the rule a kernel meets against its own reference numerics (both errors against exact
  attention): ``|err_kernel - err_reference| <= KERNEL_ERR_ATOL + KERNEL_ERR_REL * err_reference``; with
  :data:`KERNEL_REF_MAX`, the bound on ``||kernel - reference|| / ||reference||``.
* :func:`errors_agree` — two computations of the same numerics split differently (sequence shards, key halves
  merged by LSE): ``|err_a - err_b| <= SPLIT_RELATIVE * err_b + SPLIT_FLOOR``.
"""

from __future__ import annotations

import math

from typing import Optional, Sequence, Tuple, Union

import torch


#: The kernel rule. A kernel computes its reference's numerics (the Hopper variant) with one arithmetic difference the
#: reference does not model: the FP8 tensor cores sum each score's products with ~13 mantissa bits below the largest
#: exponent they add (not fp32; no simple model of it matched the H200 bit for bit). A score that moves by that much
#: flips some of Stage-A's and P's roundings (an E4M3 step is 1/16 to 1/8 of P), so an element moves by about
#: sqrt(shift * step): the two outputs differ by up to ~2% (1.3% on normal inputs with mxfp8; 2.0% with Q smoothing's
#: chained key-term GEMM), while the error against exact attention stays the reference's, since each output is one
#: realization of the same quantization. Hence: the kernel's error equals its reference's within 0.05 pp plus 2% of
#: it, and the outputs lie within KERNEL_REF_MAX of each other. A deviation the numerics do not explain breaks the
#: first rule on inputs whose recipe error is small (``clustered``): O accumulated across key tiles on the tensor
#: cores gave 3.7% against the reference's 0.8% at S = 8192.
KERNEL_ERR_ATOL = 5e-4
KERNEL_ERR_REL = 0.02
KERNEL_REF_MAX = 2e-2
#: The INT8 Q/K kernel against its reference (the Hopper INT8 numerics): its scores are exact integers and Stage-A one
#: FMA the reference reproduces (on the biased scores, sm90_numerics difference 14), so what is left is the fp32
#: summation order of O and l on the tensor cores and, on the rows with Q smoothing's key term, one score in ~2^12 whose
#: fp32 value rounds across a step of Stage-A's 1/128 grid (one BF16 unit of one P). Both move the output far below its
#: BF16 rounding (2^-8): outputs within 2^-10. In a row dominated by one key that one BF16 unit of P moves l by up to
#: 2^-7: LSE within ln(1 + 2^-7) + 1e-3 nats (H100: outputs within 1.2e-4, LSE within 3.4e-3 on the structured families,
#: 7.8e-3 on the rollback test's rows).
INT8_KERNEL_REF_MAX = 2.0 ** -10
INT8_LSE_MAX = math.log1p(2.0 ** -7) + 1e-3
#: The INT8 kernel with FP8 P and V (``int8-fp8``) against its reference: Stage-A's argument is the FMA of the biased
#: scores the reference models (sm90_numerics difference 14); what is left is ``ex2.approx.f32`` (2 ulp) against the
#: reference's exp2, which puts a rare P on the other side of an E4M3 rounding boundary (one E4M3 step, 1/16 to 1/8 of
#: that P), and the FP8 tensor cores' sums of one key tile. Outputs within 2^-8 (with Stage-A from the rounded scores,
#: about one P in 10^4 moved: H100 up to 1.30e-3 on the structured families at D 128).
INT8_FP8_KERNEL_REF_MAX = 2.0 ** -8
#: Split computations: errors within 15% of each other, plus a floor for fp32 rounding of the merge.
SPLIT_RELATIVE = 0.15
SPLIT_FLOOR = 1e-5

# Elements of one score slab (B * H * rows * S_k) per chunk: 2^25 float64 values = 256 MiB.
_SLAB_ELEMENTS = 1 << 25


def exact_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: Optional[float] = None,
                    kv_lens: Optional[Union[torch.Tensor, Sequence[int]]] = None, layout: str = "bhsd",
                    dtype: torch.dtype = torch.float64, slab_elements: int = _SLAB_ELEMENTS
                    ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Exact (non-causal) softmax attention, computed in ``dtype`` on q's device.

    Parameters
    ----------
    q : Tensor (B, H, S_q, D) for ``layout="bhsd"`` or (B, S_q, H, D) for ``"bshd"``
    k, v : Tensor (B, H, S_k, D) or (B, S_k, H, D)
        Any float dtype; read, never modified.
    scale : float, optional
        Softmax scale; default ``D ** -0.5``.
    kv_lens : int tensor (B,) or sequence of ints, optional
        Valid keys per batch entry; keys at positions >= kv_lens[b] are ignored, whatever they hold (NaN and inf
        included). Rows with no valid key give 0 and LSE = -inf; a NaN (or +inf) score makes its row NaN, as
        softmax does.
    layout : ``"bhsd"`` or ``"bshd"``
        Layout of the inputs and of the output.
    dtype : torch.float64 (default) or torch.float32
        Arithmetic precision.
    slab_elements : int
        Upper bound on B * H * rows * S_k per chunk of query rows.

    Returns
    -------
    out : Tensor in ``layout``, (B, H, S_q, D) or (B, S_q, H, D), in ``dtype``
    lse : Tensor (B, H, S_q) in ``dtype``: natural-log log-sum-exp of the scaled scores.
    """
    if layout not in ("bhsd", "bshd"):
        raise ValueError(f"unknown layout {layout!r}; accepted: bhsd, bshd")
    if dtype not in (torch.float64, torch.float32):
        raise ValueError(f"dtype must be torch.float64 or torch.float32, got {dtype}")
    if layout == "bshd":
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    b, h, s_q, d = q.shape
    s_k = k.shape[2]
    scale = d ** -0.5 if scale is None else float(scale)
    mask = None
    if kv_lens is not None:
        lens = torch.as_tensor(kv_lens, device=q.device).to(torch.int64).reshape(b)
        mask = torch.arange(s_k, device=q.device)[None, :] < lens[:, None]  # (B, S_k)
        mask = mask[:, None, None, :]
    kd, vd = k.to(dtype), v.to(dtype)
    if mask is not None:  # a padded key is never read: garbage there (NaN, inf) must not reach 0 * NaN in P V
        vd = torch.where(mask[:, :, 0, :, None], vd, torch.zeros_like(vd))
    rows = max(1, slab_elements // max(1, b * h * s_k))
    outs, lses = [], []
    for r0 in range(0, s_q, rows):
        s = torch.matmul(q[:, :, r0:r0 + rows].to(dtype), kd.transpose(-1, -2)) * scale
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        lse = torch.logsumexp(s, dim=-1)
        empty = lse == float("-inf")  # no valid key: 0 (a NaN score keeps its row NaN, as in softmax)
        p = torch.exp(s - torch.where(empty, torch.zeros_like(lse), lse)[..., None])
        p = torch.where(empty[..., None], torch.zeros_like(p), p)
        outs.append(torch.matmul(p, vd))
        lses.append(lse)
        del s, p
    out = torch.cat(outs, dim=2)
    lse = torch.cat(lses, dim=2)
    if layout == "bshd":
        out = out.transpose(1, 2)
    return out, lse


#: :func:`relative_error` divides by at least this norm: an all-zero ``ref`` gives 0 for an all-zero ``out`` and a
#: huge finite error otherwise, never NaN.
REF_NORM_FLOOR = 1e-30


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Global relative error ``||out - ref||_F / ||ref||_F`` in float64 (paper Table 4's measure), on ``ref``'s device;
    ``||ref||_F`` is taken as at least :data:`REF_NORM_FLOOR`."""
    o, r = out.to(ref.device).double(), ref.double()
    return float((o - r).norm() / r.norm().clamp_min(REF_NORM_FLOOR))


def error_and_cosine(out: torch.Tensor, ref: torch.Tensor):
    """:func:`relative_error` and the flattened cosine similarity (float64, on ``ref``'s device)."""
    o, r = out.to(ref.device).double().flatten(), ref.double().flatten()
    return relative_error(o, r), torch.nn.functional.cosine_similarity(o, r, dim=0).item()


def cosine(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Cosine similarity of ``out`` and ``ref`` flattened, in float64."""
    return error_and_cosine(out, ref)[1]


def nonfinite_where_finite(out: torch.Tensor, ref: torch.Tensor) -> int:
    """Number of elements of ``out`` that are NaN or inf where ``ref`` is finite."""
    o = out.to(ref.device)
    return int((~torch.isfinite(o) & torch.isfinite(ref)).sum().item())


def within_kernel_rule(err_kernel: float, err_reference: float) -> bool:
    """``|err_kernel - err_reference| <= KERNEL_ERR_ATOL + KERNEL_ERR_REL * err_reference`` (see KERNEL_ERR_ATOL)."""
    return abs(err_kernel - err_reference) <= KERNEL_ERR_ATOL + KERNEL_ERR_REL * err_reference


def errors_agree(err_a: float, err_b: float) -> bool:
    """``|err_a - err_b| <= SPLIT_RELATIVE * err_b + SPLIT_FLOOR``."""
    return abs(err_a - err_b) <= SPLIT_RELATIVE * err_b + SPLIT_FLOOR

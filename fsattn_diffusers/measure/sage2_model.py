"""A CPU model of SageAttention 2's Hopper kernel (``sageattn`` on Hopper), a measurement peer for the structured suite.

What ``sageattn(q, k, v, tensor_layout="HND", is_causal=False)`` computes on an H200 (SageAttention 2.2.0, d1a57a5:
``sageattention/core.py``'s Hopper entry, :data:`fsattn_diffusers.integration.sage.HOPPER_ENTRY`, with its defaults
``qk_quant_gran="per_thread"``, ``smooth_k=True``, ``pv_accum_dtype="fp32+fp32"``; ``triton/quant_per_thread.py``;
``quant.per_channel_fp8`` with ``smooth_v=False``; the CUDA source of that entry's kernel in ``csrc/qattn/``,
``attn_utils.cuh`` ``update_mdo``):

* **K smoothing**: ``km = k.mean(seq)`` in the input dtype, ``k - km`` rounded to the input dtype.
* **INT8 Q/K, per thread**: Q in groups of two rows, ``{16 b + t, 16 b + t + 8}`` (t < 8); K in groups of 32 keys of
  each 128-key tile, ``{128 b + 8 i + 2 t + e}`` (i < 16, e < 2, t < 4). Scale ``amax / 127 + 1e-7`` (fp32), code
  ``trunc(x / scale + 0.5 sign)`` (half away from zero). Q is not pre-scaled.
* **Scores** in doublings: the exact integer dot product ``S`` times ``sm' = float32(float32(alpha log2 e) *
  float32(s_q s_k))``, formed inside one FMA with the running maximum: ``fma(S, sm', -m)``; the last key tile as
  ``fma(float32(S * float32(s_q s_k)), float32(alpha log2 e), -m)``.
* **Online softmax with ex2**: per 128-key tile, ``m = max(m, fma(rowmax S, sm', -8.807))`` (so P peaks at
  2^8.807 = 448, E4M3's maximum), O and the row sum ``d`` scaled by ``2^(m_old - m)``, ``P = 2^(score - m)`` in fp32
  (``ex2.approx``; modelled as exact), ``d += P`` (the unquantized P), ``P8 = E4M3(P)`` (RNE, saturating).
* **PV**: ``O_tile = P8 V8`` in a zeroed accumulator (4 chained FP8 wgmmas of 32 keys), added to the fp32 O.
  With ``acc_mant_bits`` the tile's chained FP8 accumulation is modelled as
  :func:`fsattn_diffusers.numerics_accumulation.fp8_chained_mma` does; None sums in fp32.
* **V**: E4M3 with one fp32 scale ``amax / 448`` per channel over all keys (``v * (448 / amax)``, then RNE); the
  scale is applied to the normalized output.
* **Output**: ``O / d * v_scale``, rounded to the input dtype.

Not modelled: ``ex2.approx``'s and ``rcp.approx``'s last-ulp errors and the fp32 summation order of ``d``.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from ..formats import E4M3, round_to_elem
from ..numerics_accumulation import fp8_chained_mma

#: The kernel's key tile (CTA_K) and the exponent offset that maps the running maximum to E4M3's 448.
SAGE_TILE_K = 128
SAGE_FP8_OFFSET = 8.807
#: INT8 scale guard and the per-thread groups (rows of a Q group; keys of a K group).
SAGE_SCALE_EPS = 1e-7
SAGE_Q_WARP = 16
SAGE_K_GROUPS = 4


def _int8_groups(x: torch.Tensor, group: torch.Tensor):
    """Sage's per-thread INT8: codes and per-element scales for ``x`` (G, S, D) float32, ``group`` (S,) the group id
    of each token. Returns (codes (G, S, D) float32, scale (G, S) float32)."""
    g, s, d = x.shape
    n_groups = int(group.max()) + 1 if s else 0
    amax = torch.zeros(g, n_groups).scatter_reduce(1, group.expand(g, s), x.abs().amax(dim=-1), reduce="amax")
    scale = (amax / 127.0 + SAGE_SCALE_EPS).to(torch.float32)[:, group]  # fp32 division, then + 1e-7
    y = x / scale[..., None]
    codes = torch.trunc(y + 0.5 * torch.where(y >= 0, 1.0, -1.0))
    return codes, scale


def _q_groups(s: int) -> torch.Tensor:
    r = torch.arange(s)
    return (r // SAGE_Q_WARP) * 8 + (r % 8)


def _k_groups(s: int) -> torch.Tensor:
    r = torch.arange(s)
    return (r // SAGE_TILE_K) * SAGE_K_GROUPS + (r % 8) // 2


def sage2_hopper_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: Optional[float] = None,
                         q_rows: Optional[torch.Tensor] = None, acc_mant_bits: Optional[int] = None) -> torch.Tensor:
    """SageAttention 2's ``sageattn`` on Hopper as modelled above, on the CPU.

    Parameters
    ----------
    q : (B, H, S_q, D); k, v : (B, H, S_k, D), float16 or bfloat16 (never modified).
    scale : softmax scale (default D^-0.5).
    q_rows : (R,) int64, optional: compute only these query rows (their INT8 groups are those of the full Q; pass
        whole 16-row blocks to keep every group). Default all.
    acc_mant_bits : model each key tile's chained FP8 PV accumulation with this many mantissa bits (None: fp32).

    Returns
    -------
    (B, H, R, D) in q's dtype.
    """
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"sage2_hopper_attention takes float16 or bfloat16 inputs, got {q.dtype}; accepted: "
                         f"torch.float16, torch.bfloat16")
    b, h, s_q, d = q.shape
    s_k = k.shape[2]
    alpha = d ** -0.5 if scale is None else float(scale)
    sm = torch.tensor(alpha, dtype=torch.float32) * torch.tensor(math.log2(math.e), dtype=torch.float32)
    km = k.mean(dim=2, keepdim=True)
    ks = (k - km).to(torch.float32).reshape(b * h, s_k, d)
    qf = q.to(torch.float32).reshape(b * h, s_q, d)
    qc, qs = _int8_groups(qf, _q_groups(s_q))
    kc, kscale = _int8_groups(ks, _k_groups(s_k))
    if q_rows is not None:
        qc, qs = qc[:, q_rows], qs[:, q_rows]
    vf = v.to(torch.float32).reshape(b * h, s_k, d)
    vamax = vf.abs().amax(dim=1, keepdim=True)
    v_scale = vamax / 448.0
    v8 = round_to_elem(vf * (448.0 / vamax), E4M3)
    g, r = qc.shape[:2]
    m = torch.full((g, r), -5000000.0)
    den = torch.zeros((g, r))
    o = torch.zeros((g, r, d))
    n_tiles = -(-s_k // SAGE_TILE_K)
    for t in range(n_tiles):
        k0, k1 = t * SAGE_TILE_K, min(s_k, (t + 1) * SAGE_TILE_K)
        s_int = torch.matmul(qc, kc[:, k0:k1].transpose(1, 2))  # exact: integers below 2^24 (D <= 128)
        dq = (qs[..., None] * kscale[:, None, k0:k1]).float()  # float32(s_q s_k) per (row, key group)
        if t < n_tiles - 1:  # fma(S, float32(sm * dq), .): the product exact in float64, one rounding
            a, mult = s_int.double(), (sm * dq).double()
        else:  # the last tile: float32(S * dq), then fma(., sm, .)
            a, mult = (s_int * dq).double(), sm.double()
        prod = a * mult
        m_tmp = (prod.amax(dim=-1) - SAGE_FP8_OFFSET).float()  # fma(rowmax, sm', -8.807) per group, then the max
        m_new = torch.maximum(m, m_tmp)
        o_scale = torch.exp2(m - m_new)
        den, o, m = den * o_scale, o * o_scale[..., None], m_new
        p = torch.exp2((prod - m.double()[..., None]).float())  # fma, then ex2
        den = den + p.sum(dim=-1)
        p8 = round_to_elem(p, E4M3)
        if acc_mant_bits is None:
            o = o + torch.matmul(p8, v8[:, k0:k1])
        else:
            o = o + fp8_chained_mma(torch.zeros_like(o), p8, v8[:, k0:k1], acc_mant_bits)
    out = o / den[..., None] * v_scale
    return out.reshape(b, h, r, d).to(q.dtype)

"""A CPU stand-in for the ``fa3_fwd_interface`` module of PyPI ``fa3-fwd`` (tests only).

It has FA3's two entry points with their signatures (``flash_attn_func``, ``flash_attn_varlen_func``),
checks the arguments the way FA3 does (BSHD / packed THD layouts, BF16 or FP8 E4M3 operands, descales of
shape (B, H_k) in FP32, int32 ``cu_seqlens``/``seqused_k``) and computes the attention in FP32 through a
``torch.library`` custom op with a fake implementation, as the real package does, so ``torch.compile``
traces through it. ``CALLS`` keeps the arguments of every eager call.
"""

from __future__ import annotations

import dataclasses
import sys
import types
from typing import Optional, Tuple

import torch

CALLS = []


def _deq(x: torch.Tensor, descale: Optional[torch.Tensor], batch_of_row: Optional[torch.Tensor] = None):
    y = x.float()
    if descale is None:
        return y
    if batch_of_row is None:  # (B, S, H, D)
        return y * descale[:, None, :, None]
    return y * descale[batch_of_row][:, :, None]  # (T, H, D)


@torch.library.custom_op("fsattn_test::fa3_fwd", mutates_args=())
def _fa3_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_descale: Optional[torch.Tensor],
             k_descale: Optional[torch.Tensor], v_descale: Optional[torch.Tensor],
             cu_seqlens_q: Optional[torch.Tensor], cu_seqlens_k: Optional[torch.Tensor],
             seqused_k: Optional[torch.Tensor], scale: float) -> Tuple[torch.Tensor, torch.Tensor]:
    if cu_seqlens_q is None:  # (B, S, H, D)
        qf, kf, vf = _deq(q, q_descale), _deq(k, k_descale), _deq(v, v_descale)
        s = torch.einsum("bqhd,bkhd->bhqk", qf, kf) * scale
        lse = torch.logsumexp(s, dim=-1)
        out = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, dim=-1), vf)
        return out.to(torch.bfloat16), lse
    outs, lses = [], []
    for b in range(cu_seqlens_q.numel() - 1):
        q0, q1 = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
        k0 = int(cu_seqlens_k[b])
        k1 = k0 + int(seqused_k[b]) if seqused_k is not None else int(cu_seqlens_k[b + 1])
        qf = q[q0:q1].float() * (1.0 if q_descale is None else q_descale[b][None, :, None])
        kf = k[k0:k1].float() * (1.0 if k_descale is None else k_descale[b][None, :, None])
        vf = v[k0:k1].float() * (1.0 if v_descale is None else v_descale[b][None, :, None])
        s = torch.einsum("qhd,khd->hqk", qf, kf) * scale
        lses.append(torch.logsumexp(s, dim=-1))
        outs.append(torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), vf))
    return torch.cat(outs).to(torch.bfloat16), torch.cat(lses, dim=1)


@_fa3_fwd.register_fake
def _(q, k, v, q_descale, k_descale, v_descale, cu_seqlens_q, cu_seqlens_k, seqused_k, scale):
    out = torch.empty(q.shape, dtype=torch.bfloat16, device=q.device)
    if cu_seqlens_q is None:
        lse = torch.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32, device=q.device)
    else:
        lse = torch.empty((q.shape[1], q.shape[0]), dtype=torch.float32, device=q.device)
    return out, lse


def _check(q, k, v, descales, rank):
    assert q.dim() == k.dim() == v.dim() == rank, "FA3 layout: BSHD (dense) or THD (varlen)"
    assert q.stride(-1) == 1 and k.stride(-1) == 1, "FA3 needs a unit stride on the head dim"
    assert q.dtype in (torch.bfloat16, torch.float8_e4m3fn), f"this build runs bf16/fp8, got {q.dtype}"
    assert q.dtype == k.dtype == v.dtype
    fp8 = q.dtype == torch.float8_e4m3fn
    assert all((d is not None) == fp8 for d in descales) or all(d is None for d in descales)
    for d in descales:
        if d is not None:
            assert d.dtype == torch.float32 and d.dim() == 2, "descale: float32 (batch, heads_k)"


def flash_attn_func(q, k, v, softmax_scale=None, causal=False, qv=None, q_descale=None, k_descale=None,
                    v_descale=None, window_size=(-1, -1), attention_chunk=0, softcap=0.0, num_splits=1,
                    pack_gqa=None, deterministic=False, sm_margin=0, return_attn_probs=False):
    _check(q, k, v, (q_descale, k_descale, v_descale), 4)
    assert not causal and qv is None
    if q_descale is not None:
        assert tuple(q_descale.shape) == (q.shape[0], k.shape[2])
    if not torch.compiler.is_compiling():
        CALLS.append(dict(entry="dense", q=q, k=k, v=v, softmax_scale=softmax_scale, q_descale=q_descale,
                          k_descale=k_descale, v_descale=v_descale))
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    out, lse = _fa3_fwd(q, k, v, q_descale, k_descale, v_descale, None, None, None, float(scale))
    return (out, lse) if return_attn_probs else out


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q=None,
                           seqused_k=None, softmax_scale=None, causal=False, qv=None, q_descale=None,
                           k_descale=None, v_descale=None, window_size=(-1, -1), attention_chunk=0, softcap=0.0,
                           num_splits=1, pack_gqa=None, deterministic=False, sm_margin=0, return_attn_probs=False):
    _check(q, k, v, (q_descale, k_descale, v_descale), 3)
    assert cu_seqlens_q.dtype == cu_seqlens_k.dtype == torch.int32
    assert seqused_k is None or seqused_k.dtype == torch.int32
    if q_descale is not None:
        assert tuple(q_descale.shape) == (cu_seqlens_q.numel() - 1, k.shape[1])
    if not torch.compiler.is_compiling():
        CALLS.append(dict(entry="varlen", q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                          max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, seqused_k=seqused_k,
                          softmax_scale=softmax_scale, q_descale=q_descale, k_descale=k_descale,
                          v_descale=v_descale))
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    out, lse = _fa3_fwd(q, k, v, q_descale, k_descale, v_descale, cu_seqlens_q, cu_seqlens_k, seqused_k,
                        float(scale))
    return (out, lse) if return_attn_probs else out


def install(monkeypatch) -> types.ModuleType:
    """Put this module in ``sys.modules`` as ``fa3_fwd_interface`` and let the fa3 backend run on CPU."""
    from fsattn_diffusers import backends
    from fsattn_diffusers.backends import fa3_backend

    CALLS.clear()
    monkeypatch.setitem(sys.modules, fa3_backend.FA3_MODULE, sys.modules[__name__])
    original = backends.registered()["fa3"]
    monkeypatch.setitem(backends._REGISTRY, "fa3", dataclasses.replace(original, available=lambda device: None,
                                                                       _seen={}))
    return sys.modules[__name__]

"""Gradients: a differentiable PyTorch path for the unquantized recipes, a clear error for the others.

The backends are inference kernels (no backward). When grad mode is on and q, k or v requires grad,
:func:`fsattn_diffusers.attention` runs the backend for the other recipes (forward-only use without
``torch.no_grad`` keeps working) and joins its output to the graph so that ``backward()`` raises one
clear ``ValueError``; it sends recipes without quantized operands and with the exact exponential (the
``exact`` and ``bf16`` presets) here: the conventional softmax in float32 on the
recipe's operand roundings (BF16 rounding is a cast, whose gradient passes straight through), so
autograd differentiates it. ``frozen_max`` and ``hadamard`` change only the rounding of such recipes,
not the function, and are not reproduced; the emulator's forward values and these agree within the
recipe's rounding. The (S_q, S_k) score matrix of every (batch, head) is materialized.
"""

from __future__ import annotations

from typing import Dict, Optional

import torch

from .formats import PFormat
from .recipe import Recipe
from .smoothing import valid_prefix

_BF16 = "bf16"


def wants_grad(q, k, v) -> bool:
    """True when autograd would record this call: grad mode on and an input that requires grad."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))


def supports(recipe: Recipe) -> bool:
    """True for the recipes this module differentiates: no quantized operand, the exact exponential."""
    return not recipe.is_quantized and recipe.exponential == "exact"


def refusal(recipe: Recipe) -> str:
    """The one-line message of a gradient through a recipe that has no differentiable path."""
    kind = "quantized" if recipe.is_quantized else f"{recipe.exponential}-exponential"
    return (f"fsattn attention is inference-only for {kind} recipe {recipe.name!r}; use recipe='bf16-emulated' or "
            f"'exact' (differentiable) or torch.nn.functional.scaled_dot_product_attention for training")


def check_recipe(recipe: Recipe) -> None:
    """Raise the one-line ValueError of :func:`refusal` for a recipe that has no differentiable path."""
    if not supports(recipe):
        raise ValueError(refusal(recipe))


class _InferenceOnly(torch.autograd.Function):
    """Passes the outputs through; a gradient that reaches them raises the recipe's one-line ValueError."""

    @staticmethod
    def forward(ctx, message, out, lse, *inputs):
        ctx.message = message
        return out.view_as(out), (lse.view_as(lse) if lse is not None else None)

    @staticmethod
    def backward(ctx, *grads):
        raise ValueError(ctx.message)


def inference_only(out: torch.Tensor, lse: Optional[torch.Tensor], recipe: Recipe, q, k, v):
    """``(out, lse)`` joined to the graph of ``q, k, v``: the forward values are the backend's, and
    ``backward()`` through them raises ``ValueError(refusal(recipe))`` instead of failing inside torch
    (outside a ``torch.compile`` graph; inside one the outputs stay detached)."""
    if torch.compiler.is_compiling():
        return out, lse
    return _InferenceOnly.apply(refusal(recipe), out, lse, q, k, v)


def _operand(x: torch.Tensor, fmt: str) -> torch.Tensor:
    x = x.to(torch.float32)
    return x.to(torch.bfloat16).to(torch.float32) if fmt == _BF16 else x


def attention(q, k, v, recipe: Recipe, *, scale: float, kv_lens: Optional[torch.Tensor], return_lse: bool,
              return_stats: bool):
    """Differentiable conventional softmax attention.

    Parameters
    ----------
    q : Tensor (B, H, S_q, D); k, v : Tensor (B, H, S_k, D), any strides; recipe passed :func:`check_recipe`.
    kv_lens : int64 (B,) or None — keys at positions >= kv_lens[b] get probability 0; a row without a
        valid key gives 0 (and LSE -inf) with zero gradient.

    Returns
    -------
    out : (B, H, S_q, D) in q's dtype, with a ``grad_fn``; lse : float32 (B, H, S_q) or None;
    stats : dict (``rollbacks`` 0: no frozen maximum here) or None.
    """
    qf, kf, vf = _operand(q, recipe.qk_format), _operand(k, recipe.qk_format), _operand(v, recipe.v_format)
    s = torch.matmul(qf, kf.transpose(-1, -2)) * scale  # (B, H, S_q, S_k) float32
    s_k = k.shape[2]
    has_key = None
    if kv_lens is not None:
        valid = valid_prefix(kv_lens, s_k, q.device)[:, None, None, :]
        s = s.masked_fill(~valid, float("-inf"))
        has_key = (kv_lens > 0)[:, None, None, None]  # (B, 1, 1, 1)
        s = torch.where(has_key, s, torch.zeros_like(s))  # no valid key: a finite softmax, masked below
    m = s.amax(dim=-1, keepdim=True).detach()
    e = torch.exp(s - m)
    l_exp = e.sum(dim=-1, keepdim=True)
    p = e.to(torch.bfloat16).to(torch.float32) if recipe.p_format == PFormat.BF16 else e
    denom = p.sum(dim=-1, keepdim=True) if recipe.rowsum_gemm else l_exp
    out = torch.matmul(p, vf) / denom
    lse = (torch.log(l_exp) + m).squeeze(-1) if return_lse else None
    if has_key is not None:
        out = torch.where(has_key, out, torch.zeros_like(out))
        if lse is not None:
            lse = torch.where(has_key[..., 0], lse, torch.full_like(lse, float("-inf")))
    stats: Optional[Dict] = None
    if return_stats:
        b, h, s_q = q.shape[:3]
        n_qt = -(-s_q // recipe.tile_m)
        lens = [s_k] * b if kv_lens is None else kv_lens.tolist()
        tiles = h * n_qt * sum(-(-int(n) // recipe.tile_n) for n in lens)
        stats = {"rollbacks": 0, "tiles": tiles, "rollback_tiles": 0, "rollback_rate": 0.0}
    return out.to(q.dtype), lse, stats

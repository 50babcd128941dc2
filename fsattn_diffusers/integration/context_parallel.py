"""fsattn inside diffusers' context parallelism (``ContextParallelConfig``, ``enable_parallelism``).

diffusers 0.42 runs ring and Ulysses attention in ``models/attention_dispatch.py``:
``_templated_context_parallel_attention(q, k, v, ..., forward_op=..., backward_op=..., _parallel_config=...)``
shards and gathers (Ulysses all-to-all over heads; ring all-gather of K/V and an LSE merge of the
partial outputs) and calls ``forward_op`` for the local attention. ``forward_op`` may be any callable of
the signature below, so fsattn plugs in without re-implementing either scheme:

* ring calls it with ``return_lse=True`` once per K/V shard and merges with the natural-log LSE,
  (B, S, H) fp32. fsattn's LSE is the normaliser in the reference's units (NUMERICS.md section 5),
  so the merge reproduces the one-call result within the recipe's own error;
* Ulysses calls it once over the full sequence and the local heads, with ``return_lse=False``.

Inference only: the backward op raises.

Wan (``WanTransformer3DModel._cp_plan``) is supported: ``WanFSAttnProcessor`` uses this module when
``enable_parallelism`` has set its ``_parallel_config``. HunyuanVideo has no ``_cp_plan`` in diffusers
0.42, and ``HunyuanVideoFSAttnProcessor`` falls back to stock attention under context parallelism. What
it needs: (1) a plan passed as ``enable_parallelism(config, cp_plan=...)`` that splits *both* streams,
``hidden_states`` and ``encoder_hidden_states`` (dim 1), at the input of ``transformer_blocks.0`` — after
the token refiner, which must see all text tokens — splits the RoPE output (``rope``, dim 0 of cos and
sin) and gathers at ``proj_out`` (dim 1); each rank then holds ``[image shard ; text shard]``, a shard of a
permutation of the joint sequence, which ring and Ulysses handle as is; (2) no key padding: the model
builds its ``[B, 1, 1, N]`` mask over ``[image ; text]`` of the whole sequence, which no split of the key
axis turns into per-rank masks, so trim the text to its valid tokens first (xDiT does: with batch 1 there
is then no padding), and make the text length divisible by the degree (or ``ulysses_anything`` /
``ring_anything``); (3) the processor's joint path then calls :func:`context_parallel_attention` like
Wan's (``kv_lens`` is None). Image-to-video's ``first_frame_num_tokens`` assumes the first frame's
tokens are on every rank and would need its own handling.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from ..api import attention
from ..recipe import Recipe


def fsattn_forward_op(recipe: Recipe, backend: str = "auto") -> Callable:
    """A diffusers context-parallel ``forward_op`` running ``recipe`` on (B, S, H, D) operands.

    Parameters
    ----------
    recipe : Recipe
        The numerics of every call (chosen once per attention layer call, before sharding).
    backend : str
        Passed to :func:`fsattn_diffusers.attention`.

    Returns
    -------
    callable
        ``op(ctx, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse,
        _save_ctx=True, _parallel_config=None)`` returning the output (B, S, H, D) in the query's
        dtype, and with ``return_lse`` also the natural-log LSE (B, S, H) in fp32.
    """

    def forward_op(ctx, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                   enable_gqa=False, return_lse=False, _save_ctx=True, _parallel_config=None):
        if attn_mask is not None or is_causal or dropout_p or enable_gqa:
            raise ValueError("fsattn context parallelism takes unmasked, non-causal attention without dropout "
                             "or GQA; accepted: attn_mask=None, is_causal=False, dropout_p=0, enable_gqa=False")
        result = attention(query, key, value, recipe, layout="bshd", scale=scale, return_lse=return_lse,
                           backend=backend)
        if not return_lse:
            return result
        out, lse = result
        return out, lse.transpose(1, 2)  # (B, H, S) -> (B, S, H): diffusers merges in BSHD

    return forward_op


def _inference_only_backward(ctx, grad_out, *args, **kwargs):
    raise NotImplementedError("fsattn attention is inference-only (no backward pass)")


def context_parallel_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, recipe: Recipe,
                               parallel_config, *, scale: Optional[float] = None,
                               backend: str = "auto") -> torch.Tensor:
    """fsattn self-attention under diffusers' ring / Ulysses / unified context parallelism.

    Parameters
    ----------
    query, key, value : Tensor (B, S_local, H, D)
        This rank's sequence shard, as a diffusers processor holds it.
    recipe : Recipe
    parallel_config : diffusers ``ParallelConfig``
        The processor's ``_parallel_config`` (set by ``model.enable_parallelism``).
    scale : float, optional
        Softmax scale; default ``D ** -0.5``.
    backend : str
        Passed to :func:`fsattn_diffusers.attention`.

    Returns
    -------
    Tensor (B, S_local, H, D)
        This rank's rows of the attention over the whole sequence, in the query's dtype.
    """
    from diffusers.models.attention_dispatch import _templated_context_parallel_attention

    return _templated_context_parallel_attention(
        query, key, value, None, 0.0, False, scale, False, False,
        forward_op=fsattn_forward_op(recipe, backend), backward_op=_inference_only_backward,
        _parallel_config=parallel_config)


__all__ = ["fsattn_forward_op", "context_parallel_attention"]

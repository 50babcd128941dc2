"""Public entry point: :func:`attention`.

Validates the call, brings the operands to a (B, H, S, D) view without copying, picks a backend and
returns the output in the caller's layout and dtype. Inputs are never modified.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Union

import torch

from . import differentiable
from .backends import AttentionRequest, AttentionResult, run_backend, run_checked
from .formats import MX_BLOCK
from .recipe import Recipe, get_recipe

LAYOUTS = ("bshd", "bhsd")
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# MX blocks hold 32 elements (OCP MX v1.0) and the Walsh-Hadamard transform needs a power of two.


def supported_head_dim(recipe: Recipe, head_dim: int) -> Optional[str]:
    """Return why ``head_dim`` cannot run ``recipe`` (``None`` when it can)."""
    needs_blocks = recipe.qk_format.mx_element is not None
    if needs_blocks and head_dim % MX_BLOCK:
        return f"head dim {head_dim} is not a multiple of {MX_BLOCK} (MX blocks) for recipe {recipe.name!r}"
    if recipe.hadamard and (head_dim & (head_dim - 1)):
        return f"head dim {head_dim} is not a power of two (Hadamard rotation) for recipe {recipe.name!r}"
    return None


def _as_lens(lens, batch: int, length: int, device, name: str = "kv_lens", what: str = "key"
             ) -> Optional[torch.Tensor]:
    """``lens`` (``kv_lens`` or ``q_lens``) as an int64 (B,) tensor on ``device`` with values in [0, ``length``]."""
    if lens is None:
        return None
    if not isinstance(lens, torch.Tensor):
        try:
            lens = torch.tensor(list(lens), dtype=torch.int64)
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be a sequence of {batch} ints or an int tensor of shape ({batch},)"
                             ) from None
    if lens.dtype.is_floating_point or lens.dtype == torch.bool or lens.shape != (batch,):
        raise ValueError(f"{name} must be an int tensor of shape ({batch},), got dtype {lens.dtype} "
                         f"shape {tuple(lens.shape)}; accepted: one valid-{what} count per batch entry")
    lens = lens.to(device=device, dtype=torch.int64)
    if torch.compiler.is_compiling():  # the range check reads the values: not inside a torch.compile graph
        return lens
    lo, hi = int(lens.min()), int(lens.max())
    if lo < 0 or hi > length:
        raise ValueError(f"{name} values must lie in [0, {length}] (the {what} length), got min {lo} max {hi}")
    return lens


def validate(q, k, v, layout: str):
    """Check types and shapes; return ``(batch, heads, s_q, s_k, head_dim)``. One-line ValueErrors."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in DTYPES:
            raise ValueError(f"{name} has dtype {t.dtype}; accepted: float16, bfloat16, float32")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D ({layout.upper()}), got shape {tuple(t.shape)}")
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; accepted: {', '.join(LAYOUTS)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v dtypes differ ({q.dtype}, {k.dtype}, {v.dtype}); accepted: one dtype for all three")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v are on different devices ({q.device}, {k.device}, {v.device})")
    if layout == "bshd":
        (b, s_q, h, d), (bk, s_k, hk, dk), (bv, s_v, hv, dv) = q.shape, k.shape, v.shape
    else:
        (b, h, s_q, d), (bk, hk, s_k, dk), (bv, hv, s_v, dv) = q.shape, k.shape, v.shape
    if (bk, hk, dk) != (b, h, d) or (bv, hv, s_v) != (b, h, s_k) or dv != d:
        raise ValueError(f"shapes do not match for layout {layout!r}: q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}; accepted: equal batch, heads and head dim, k and v of equal length")
    if min(b, h, s_q, s_k, d) == 0:
        raise ValueError(f"empty dimension in q {tuple(q.shape)} / k {tuple(k.shape)}; accepted: all sizes >= 1")
    return b, h, s_q, s_k, d


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    recipe: Union[str, Recipe] = "mxfp8",
    *,
    layout: str = "bshd",
    scale: Optional[float] = None,
    kv_lens: Optional[Union[torch.Tensor, Sequence[int]]] = None,
    q_lens: Optional[Union[torch.Tensor, Sequence[int]]] = None,
    return_lse: bool = False,
    return_stats: bool = False,
    backend: str = "auto",
    strict: bool = False,
):
    """Fused-Softmax attention (non-causal) under ``recipe``.

    Parameters
    ----------
    q : Tensor (B, S_q, H, D) for ``layout="bshd"`` or (B, H, S_q, D) for ``"bhsd"``
    k, v : Tensor (B, S_k, H, D) or (B, H, S_k, D)
        float16, bfloat16 or float32, all of one dtype and device. Any strides.
    recipe : str or Recipe
        A preset of :data:`~fsattn_diffusers.recipe.PRESETS` (``"mxfp8"``, ``"mxfp6"``, ``"mxfp4"``: the paper's
        pipeline with the default additions of NUMERICS.md §7; ``"mxfp8-paper"``, ``"mxfp6-paper"``,
        ``"mxfp4-paper"``: the paper's pipeline alone; ``"bf16-emulated"``: the conventional softmax on BF16
        operands, computed by the emulator, not stock attention (the former name ``"bf16"`` still resolves to it,
        with a deprecation notice); ``"exact"``: FP32 throughout), a preset with changes
        (``"mxfp8+smooth_q=false"``) or a Recipe.
    scale : float, optional
        Softmax scale alpha; default ``D ** -0.5``.
    kv_lens : int tensor (B,) or sequence of ints, optional
        Valid keys per batch entry; keys at positions >= kv_lens[b] are ignored. A row with no valid key
        gives zeros (and LSE = -inf).
    q_lens : int tensor (B,) or sequence of ints, optional
        Valid queries per batch entry, the rest being padding (e.g. the text padding of a joint self-attention,
        where ``q_lens = kv_lens``). Only Q smoothing reads it (``Recipe.smooth_q``): its query mean and per-slice
        switch then count only the queries before ``q_lens[b]``, so padded rows cannot change the other rows'
        numerics. Every row is still computed. Default: all queries.
    return_lse : bool
        Also return the natural-log log-sum-exp of the scaled scores, fp32 (B, H, S_q).
    return_stats : bool
        Also return a dict with ``rollbacks`` (row-level rollback events), ``tiles`` (query tile x key
        tile pairs visited), ``rollback_tiles`` (pairs where any row rolled back), ``rollback_rate``.
    backend : str
        ``"auto"`` (the first backend of :func:`~fsattn_diffusers.backends.auto_order` that takes the operands'
        device and the call: the Triton kernels on a Hopper GPU, AITER on ROCm, else the emulator), or a backend
        name. A kernel backend computes its own numerics variant whatever ``Recipe.numerics`` says
        (``Backend.computes``; the Hopper kernels: NUMERICS.md §6); the emulator computes the variant the recipe
        names.
    strict : bool
        Non-finite inputs (NaN, +-inf in q, or in k/v at keys before ``kv_lens``): with ``False`` (default)
        one warning per process, and the (batch, head) slices that hold them are computed with exact
        float64 attention, so the damage is what exact attention gives (one NaN in q: its row; one +inf
        in k: the rows whose score with that key is +inf) and the other slices are the recipe's values.
        With ``True`` a ``ValueError`` naming the tensors and counts, raised before any work. The check
        costs one host sync per call: a backend that finds the flags in its own reads (the Triton kernels'
        pre-pass, ``Backend.detects_nonfinite``) stages them so that the sync waits for its pre-pass only and
        the call returns while the attention kernel runs; the other backends (and ``strict=True``, before the
        backend) take one extra read of q, k, v and wait for it. It is skipped while ``torch.compile`` traces
        (NUMERICS.md section 8; :func:`fsattn_diffusers.backends.run_checked`).

    Gradients: with grad mode on and an input that requires grad, recipes without quantized operands
    and with the exact exponential (``exact``, ``bf16``) run a differentiable PyTorch path (the
    conventional softmax on the recipe's operand roundings; it builds the (S_q, S_k) score matrix).
    Quantized recipes are inference-only: the forward runs as usual, and ``backward()`` through its
    output raises a one-line ``ValueError`` naming the recipe and what to use for training.

    Returns
    -------
    Tensor, or tuple
        The output in the input layout and dtype; followed by ``lse`` and/or ``stats`` when requested.
    """
    recipe = get_recipe(recipe)
    if not isinstance(layout, str):
        raise ValueError(f"layout must be a string; accepted: {', '.join(LAYOUTS)}")
    layout = layout.lower()
    b, h, s_q, s_k, d = validate(q, k, v, layout)
    why = supported_head_dim(recipe, d)
    if why is not None:
        raise ValueError(f"{why}; accepted: multiples of {MX_BLOCK} that are powers of two (e.g. 64, 128)")
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    scale = float(scale)
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a positive finite float, got {scale}")
    lens = _as_lens(kv_lens, b, s_k, q.device)
    qlens = _as_lens(q_lens, b, s_q, q.device, "q_lens", "query")
    if layout == "bshd":  # views, no copies
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    request = AttentionRequest(q, k, v, recipe, scale, kv_lens=lens, q_lens=qlens, return_lse=return_lse,
                               return_stats=return_stats)
    grad = differentiable.wants_grad(q, k, v)
    exact = grad and differentiable.supports(recipe)
    if exact:  # exact arithmetic on the recipe's operand roundings: non-finite inputs are warned about, not repaired
        def run(r):
            return AttentionResult(*differentiable.attention(r.q, r.k, r.v, r.recipe, scale=r.scale, kv_lens=r.kv_lens,
                                                             return_lse=r.return_lse, return_stats=r.return_stats))
    else:
        def run(r):
            return run_backend(backend, r)
    res = run_checked(run, request, strict=strict, repair=not exact)
    out, lse, stats = res.out, res.lse, res.stats
    if grad and not exact:  # forward as usual; a backward through the result raises the one-line refusal
        out, lse = differentiable.inference_only(out, lse, recipe, q, k, v)
    if layout == "bshd":
        out = out.transpose(1, 2)
    extras = ([lse] if return_lse else []) + ([stats] if return_stats else [])
    return (out, *extras) if extras else out

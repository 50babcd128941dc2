"""FlashAttention-3 (PyPI ``fa3-fwd``) as a baseline backend: BF16, and FP8 E4M3 with per-(batch, head) scales.

This is not a Fused-Softmax kernel: it is the attention a user would otherwise run on Hopper, exposed
through the same backend contract so that the policies ``fa3`` and ``fa3-fp8``
(:mod:`fsattn_diffusers.integration.policy`) run in ``apply``, ``fsattn sweep`` and ``fsattn e2e`` next to
ours. Two recipes select the mode, read from their fields (``qk_format``), not their names:

* :data:`FA3_RECIPE` (``"fa3"``): ``flash_attn_func`` on the BF16 operands (exact softmax).
* :data:`FA3_FP8_RECIPE` (``"fa3-fp8"``): Q, K and V quantized on the device to FP8 E4M3 with one FP32
  scale ``amax / 448`` per (batch, head) (amax over the sequence and the head dim; padded keys excluded),
  passed to FA3 as ``q_descale``/``k_descale``/``v_descale`` of shape (B, H); the output is BF16.

With ``kv_lens`` (HunyuanVideo's text padding) the call goes through ``flash_attn_varlen_func``: every
query row is kept (``cu_seqlens_q = b * S_q``), keys run over the padded layout (``cu_seqlens_k =
b * S_k``) and ``seqused_k = kv_lens`` bounds each batch entry's keys, so no gather or copy is needed.

The recipes describe the numerics for the emulator (used only when a call falls back): ``fa3`` is the
``bf16`` preset under another name; ``fa3-fp8`` is FP8 Q/K/V with exact softmax, whose emulation uses one
scale per tensor rather than per (batch, head).
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from typing import Optional

import torch

from ..formats import E4M3
from ..recipe import BF16_EMULATED, PRESETS, Recipe
from ..smoothing import valid_prefix
from .contract import AttentionRequest, AttentionResult, Speed, SpeedClass
from .registry import Backend, register_backend

#: FP8 E4M3 largest finite value: a per-(batch, head) scale maps amax onto it.
E4M3_MAX = E4M3.max_value
FA3_RECIPE = PRESETS[BF16_EMULATED].replace(name="fa3")
FA3_FP8_RECIPE = Recipe(name="fa3-fp8", qk_format="fp8", p_format="bf16", v_format="fp8_tensor")
#: The recipes this backend runs, by name (for messages and the policies); a recipe runs here when it equals one of
#: them in every field but its name (anything else is refused with a reason).
FA3_RECIPES = {FA3_RECIPE.name: FA3_RECIPE, FA3_FP8_RECIPE.name: FA3_FP8_RECIPE}
_FIELDS = tuple(f.name for f in dataclasses.fields(Recipe) if f.name != "name")
_TAKEN = {tuple(getattr(r, f) for f in _FIELDS) for r in FA3_RECIPES.values()}
#: Python module of the PyPI package ``fa3-fwd`` (FlashAttention-3, forward only).
FA3_MODULE = "fa3_fwd_interface"
INSTALL_HINT = "pip install fa3-fwd einops"
# Head dims FA3 is built for (fa3-fwd 0.0.3 keeps 64, 96, 128, 192 and 256; smaller ones round up).
FA3_MAX_HEAD_DIM = 256


def fa3_module():
    """The imported ``fa3_fwd_interface`` module (raises the import's own exception when absent).

    Once imported it is read from ``sys.modules`` (a dict lookup ``torch.compile`` traces; an import
    statement would break the graph)."""
    module = sys.modules.get(FA3_MODULE)
    return module if module is not None else importlib.import_module(FA3_MODULE)


def fa3_missing() -> Optional[str]:
    """Why FA3 cannot be imported here (``None`` when it can): the package, or the import's error."""
    try:
        fa3_module()
    except Exception as exc:  # ImportError, or OSError from the CUDA extension on a CPU-only build
        return f"{FA3_MODULE} is not importable ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
    return None


def require_fa3(policy: str) -> None:
    """Raise a one-line ValueError when the ``policy`` (``fa3``/``fa3-fp8``) cannot import FA3."""
    why = fa3_missing()
    if why is None:
        return
    if not torch.cuda.is_available() or getattr(torch.version, "hip", None):
        raise ValueError(f"{policy} policy runs FlashAttention-3, which needs an NVIDIA Hopper GPU and the fa3-fwd "
                         f"package; this machine has no CUDA device, so installing fa3-fwd will not help")
    raise ValueError(f"{policy} policy needs the fa3-fwd package ({INSTALL_HINT}); {why}")


def _available(device):
    if device.type != "cuda" or getattr(torch.version, "hip", None):
        return "no CUDA device (FlashAttention-3 runs on NVIDIA GPUs)"
    return fa3_missing()


def _unsupported(request: AttentionRequest) -> Optional[str]:
    q, recipe = request.q, request.recipe
    if tuple(getattr(recipe, f) for f in _FIELDS) not in _TAKEN:
        return f"recipe {recipe.name!r} is not an FA3 baseline; accepted: {', '.join(FA3_RECIPES)}"
    if q.dtype != torch.bfloat16:
        return f"dtype {q.dtype} (the fa3-fwd build runs bfloat16 and FP8 inputs)"
    d = q.shape[-1]
    if d > FA3_MAX_HEAD_DIM or d % 8:
        return f"head dim {d} (FA3 takes multiples of 8 up to {FA3_MAX_HEAD_DIM})"
    return None


def fp8_per_head(x: torch.Tensor, valid: Optional[torch.Tensor] = None):
    """FP8 E4M3 copy of ``x`` with one FP32 scale per (batch, head).

    Parameters
    ----------
    x : Tensor (B, S, H, D), any float dtype; not modified.
    valid : bool Tensor (B, S), optional
        Positions that count for the amax (padded keys excluded).

    Returns
    -------
    (x8, descale)
        ``x8`` float8_e4m3fn (B, S, H, D) contiguous, ``descale`` float32 (B, H) with ``x ~ x8 * descale``.
    """
    a = x.abs()
    if valid is not None:
        a = torch.where(valid[:, :, None, None], a, torch.zeros((), dtype=a.dtype, device=a.device))
    amax = a.amax(dim=(1, 3)).float()
    descale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    x8 = (x.float() / descale[:, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return x8.contiguous(), descale


def _run(request: AttentionRequest) -> AttentionResult:
    """(B, H, S, D) views in (the BSHD tensors of the caller, transposed); the output (B, H, S_q, D) in q's dtype."""
    q, k, v, recipe, scale, kv_lens = request.q, request.k, request.v, request.recipe, request.scale, request.kv_lens
    return_lse, return_stats = request.return_lse, request.return_stats
    fa3 = fa3_module()
    qs, ks, vs = (t.transpose(1, 2) for t in (q, k, v))  # back to (B, S, H, D): FA3's layout
    b, s_q, h, d = qs.shape
    s_k = ks.shape[1]
    extra = {}
    if recipe.qk_format == FA3_FP8_RECIPE.qk_format:  # FP8 E4M3 operands, one scale per (batch, head)
        valid = valid_prefix(kv_lens, s_k, ks.device)
        qs, extra["q_descale"] = fp8_per_head(qs)
        ks, extra["k_descale"] = fp8_per_head(ks, valid)
        vs, extra["v_descale"] = fp8_per_head(vs, valid)
    if kv_lens is None:
        res = fa3.flash_attn_func(qs, ks, vs, softmax_scale=scale, causal=False, return_attn_probs=return_lse,
                                  **extra)
        out, lse = res if return_lse else (res, None)
    else:
        offsets = torch.arange(b + 1, dtype=torch.int32, device=qs.device)
        res = fa3.flash_attn_varlen_func(
            qs.reshape(b * s_q, h, d), ks.reshape(b * s_k, h, d), vs.reshape(b * s_k, h, d),
            offsets * s_q, offsets * s_k, s_q, s_k, seqused_k=kv_lens.to(device=qs.device, dtype=torch.int32),
            softmax_scale=scale, causal=False, return_attn_probs=return_lse, **extra)
        out, lse = res if return_lse else (res, None)
        out = out.reshape(b, s_q, h, d)
        if lse is not None:  # varlen LSE is (H, total_q)
            lse = lse.reshape(h, b, s_q).transpose(0, 1)
    out = out.to(q.dtype).transpose(1, 2)
    if lse is not None:
        lse = lse.float()
    stats = None
    if return_stats:  # FA3 has no frozen maximum and no rollback gate
        stats = {"rollbacks": 0, "tiles": 0, "rollback_tiles": 0, "rollback_rate": 0.0}
    return AttentionResult(out, lse, stats)


# A baseline: by name only, never under "auto". Its recipes carry no Q smoothing, so q_lens changes nothing.
register_backend(Backend("fa3", _run, _available, _unsupported, speed=Speed(SpeedClass.NATIVE), computes="fa3"))

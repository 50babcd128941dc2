"""AITER's ``mha_v4``: the paper's own MI355X kernels, behind a thin adapter.

**Unverified on hardware** — we have no MI355X. Only the mapping from our recipes to AITER's arguments
is tested (against a stand-in module). Facts used (AITER ``aiter/ops/mha_v4.py``, late 2026): BF16 BSHD
contiguous inputs, head dim 128, non-causal, BF16 BSHD output, no LSE; ``AttentionFormat`` names the
operand formats; the MXFP8 recipe (MX Q/K, per-tensor FP8 V) is ``mha_v4_mxfp8`` in early releases and
``mha_v4`` with FP8 formats later.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Callable, Optional, Tuple

import torch

from ..recipe import PRESETS
from .registry import Backend, register_backend

# AITER's mha_v4 kernels take head dim 128 only.
AITER_HEAD_DIM = 128
#: Our preset -> the AttentionFormat names of (Q, K, V) in AITER (paper Table 3).
AITER_FORMATS = {
    "mxfp8": ("FP8_E4M3", "FP8_E4M3", "FP8_E4M3"),
    "mxfp6": ("MXFP6", "MXFP6", "MXFP6"),
    "mxfp4": ("MXFP4", "MXFP4", "MXFP4"),
}


def _module():
    return importlib.import_module("aiter.ops.mha_v4")


def _available(device) -> Optional[str]:
    if device.type != "cuda" or getattr(torch.version, "hip", None) is None:
        return "not ROCm (AITER mha_v4 needs an MI355X)"
    try:
        _module()
    except Exception as exc:  # noqa: BLE001 - any import failure means unusable
        return f"aiter.ops.mha_v4 is not importable ({type(exc).__name__})"
    return None


def preset_of(recipe) -> Optional[str]:
    """The paper preset ``recipe`` equals (AITER runs exactly those), or None."""
    for name in AITER_FORMATS:
        if recipe == PRESETS[name].replace(name=recipe.name):
            return name
    return None


def _unsupported(q, k, v, recipe, *, kv_lens, return_lse) -> Optional[str]:
    if preset_of(recipe) is None:
        return f"AITER runs only the paper's presets {', '.join(AITER_FORMATS)} unchanged"
    if q.shape[-1] != AITER_HEAD_DIM:
        return f"AITER mha_v4 needs head dim {AITER_HEAD_DIM}, got {q.shape[-1]}"
    if kv_lens is not None:
        return "AITER mha_v4 takes no key-padding lengths"
    if return_lse:
        return "AITER mha_v4 returns no LSE"
    return None


def aiter_call(recipe, mod) -> Tuple[Callable, tuple]:
    """The AITER function and positional format arguments for ``recipe``."""
    name = preset_of(recipe)
    if name == "mxfp8" and hasattr(mod, "mha_v4_mxfp8"):
        return mod.mha_v4_mxfp8, ()
    formats = tuple(getattr(mod.AttentionFormat, f) for f in AITER_FORMATS[name])
    return mod.mha_v4, formats


def _run(q, k, v, recipe, *, scale, kv_lens, return_lse, return_stats):
    mod = _module()
    fn, formats = aiter_call(recipe, mod)
    # Our views are (B, H, S, D); AITER wants contiguous BF16 BSHD.
    q_, k_, v_ = (t.transpose(1, 2).to(torch.bfloat16).contiguous() for t in (q, k, v))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # mha_v4_mxfp8 is deprecated in later AITER
        out = fn(q_, k_, v_, *formats, softmax_scale=scale)
    stats = None
    if return_stats:  # the kernels report no rollback counts
        stats = {"rollbacks": None, "tiles": None, "rollback_tiles": None, "rollback_rate": None}
    return out.transpose(1, 2).to(q.dtype), None, stats


register_backend(Backend("aiter", _run, _available, _unsupported))

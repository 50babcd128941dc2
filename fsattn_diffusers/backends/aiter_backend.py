"""AITER's ``mha_v4``: the paper's own MI355X kernels, behind a thin adapter.

**Unverified on hardware** — we have no MI355X. Only the mapping from our recipes to AITER's arguments
is tested (against a stand-in module). Facts used (AITER ``aiter/ops/mha_v4.py``, late 2026): BF16 BSHD
contiguous inputs, head dim 128, non-causal, BF16 BSHD output, no LSE; ``AttentionFormat`` names the
operand formats; the MXFP8 recipe (MX Q/K, per-tensor FP8 V) is ``mha_v4_mxfp8`` in early releases and
``mha_v4`` with FP8 formats later.

AITER runs the paper's pipeline (the ``*-paper`` presets). The default presets add three things, honoured here:
K smoothing is done on the host before the call (``smoothing.subtract_mean``: exact, softmax ignores the per-row
shift, and AITER returns no LSE to correct); the signed rotation by flipping the signs of Q's and K's channels on the
host (``H diag(s) x = H (s * x)``, exact; AITER's own rotation then applies ``H``); the lowering gate
(``rollback_floor_log2``) is a no-op under AITER's semantics, where P carries a scale per row and key tile (the
emulator's ``mi355x`` mode gives bit-identical outputs with and without it: tests/test_rollback_floor.py). Q smoothing
(``smooth_q``) needs a per-key score term that ``mha_v4`` cannot add: a call whose queries select it on any slice
(``smoothing.q_smoothing_heads`` over the valid queries, those before ``q_lens``: a host-side check) is not taken, so
it falls back with a warning; on the other calls the switch leaves Q as it is and the call is AITER's. The default
presets' ``key_order="diagonal"`` (each query tile starts at its own key tile) and the MXFP6-P presets'
``frozen_max_offset_log2`` are not arguments of ``mha_v4``: AITER visits the key tiles in its own order from tile 0
and freezes the reference at that tile's row maximum, as the paper does, and the adapter says so once per process and
field (what the diagonal order changes on local attention: docs/design.md, "The frozen reference").
"""

from __future__ import annotations

import importlib
import warnings
from typing import Callable, Optional, Tuple

import torch

from ..hadamard import rotation_signs
from ..recipe import PAPER_SUFFIX, PRESETS, Q_SMOOTHING_MIN_RATIO, Numerics
from ..smoothing import q_smoothing_heads, subtract_mean, token_mean, valid_prefix
from .contract import AttentionRequest, AttentionResult, Speed, SpeedClass
from .registry import Backend, register_backend, warn_once

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


#: Recipe fields the adapter honours around AITER's kernel (see the module docstring), with the paper's values.
HOST_FIELDS = dict(smooth_k=False, hadamard_signs=False, rollback_floor_log2=None, smooth_q=False,
                   smooth_q_min_ratio=Q_SMOOTHING_MIN_RATIO)
#: Recipe fields AITER's kernel does not take; a call runs with the paper's value (see the module docstring).
KERNEL_FIXED_FIELDS = dict(key_order="natural", frozen_max_offset_log2=0.0)
#: What AITER's kernel does instead, per field of :data:`KERNEL_FIXED_FIELDS` (the warning's words).
_KERNEL_FIXED_BEHAVIOUR = dict(key_order="visits the key tiles from tile 0",
                               frozen_max_offset_log2="freezes the reference at the first key tile's row maximum")


def preset_of(recipe) -> Optional[str]:
    """The format name (a key of :data:`AITER_FORMATS`) whose paper preset ``recipe`` equals once the fields the
    adapter handles (:data:`HOST_FIELDS`) are set to the paper's values, or None: AITER runs only those."""
    for name in AITER_FORMATS:
        if recipe.replace(**HOST_FIELDS, **KERNEL_FIXED_FIELDS, name=recipe.name) == \
                PRESETS[name + PAPER_SUFFIX].replace(name=recipe.name):
            return name
    return None


def host_inputs(q, k, recipe):
    """``(q, k)`` as AITER must see them for ``recipe``: K smoothed and Q/K channel signs flipped where the recipe
    asks (new tensors; the caller's are never modified). (B, H, S, D) views in, the same layout out."""
    if recipe.smooth_k:  # BF16 values, as AITER takes them
        k = subtract_mean(k, token_mean(k)).to(torch.bfloat16)
    if recipe.hadamard and recipe.hadamard_signs:
        signs = rotation_signs(q.shape[-1]).to(q.device)
        q, k = q * signs.to(q.dtype), k * signs.to(k.dtype)
    return q, k


def _unsupported(request: AttentionRequest) -> Optional[str]:
    q, recipe = request.q, request.recipe
    if preset_of(recipe) is None:
        return (f"AITER runs only the presets {', '.join(AITER_FORMATS)} and their {PAPER_SUFFIX} forms "
                f"(fields other than {', '.join([*HOST_FIELDS, *KERNEL_FIXED_FIELDS])} unchanged)")
    if q.shape[-1] != AITER_HEAD_DIM:
        return f"AITER mha_v4 needs head dim {AITER_HEAD_DIM}, got {q.shape[-1]}"
    if request.kv_lens is not None:
        return "AITER mha_v4 takes no key-padding lengths"
    if request.return_lse:
        return "AITER mha_v4 returns no LSE"
    if recipe.smooth_q:
        valid_q = valid_prefix(request.q_lens, q.shape[2], q.device)
        n = int(q_smoothing_heads(q, recipe.smooth_q_min_ratio, valid_q).sum())
        if n:
            return (f"Q smoothing selects {n} of {q.shape[0] * q.shape[1]} (batch, head) slices and AITER mha_v4 "
                    f"cannot add its per-key term")
    return None


def aiter_call(recipe, mod) -> Tuple[Callable, tuple]:
    """The AITER function and positional format arguments for ``recipe``."""
    name = preset_of(recipe)
    if name == "mxfp8" and hasattr(mod, "mha_v4_mxfp8"):
        return mod.mha_v4_mxfp8, ()
    formats = tuple(getattr(mod.AttentionFormat, f) for f in AITER_FORMATS[name])
    return mod.mha_v4, formats


def _run(request: AttentionRequest) -> AttentionResult:
    # q_lens only decides Q smoothing's switch (checked in _unsupported); the rows past it are computed all the same.
    q, k, v, recipe = request.q, request.k, request.v, request.recipe
    mod = _module()
    fn, formats = aiter_call(recipe, mod)
    for field, paper in KERNEL_FIXED_FIELDS.items():
        if getattr(recipe, field) != paper:
            warn_once(f"aiter:{field}", f"fsattn: AITER mha_v4 {_KERNEL_FIXED_BEHAVIOUR[field]}; the recipe's "
                      f"{field}={getattr(recipe, field)!r} is not applied there (warned once per process)")
    q, k = host_inputs(q, k, recipe)
    # Our views are (B, H, S, D); AITER wants contiguous BF16 BSHD.
    q_, k_, v_ = (t.transpose(1, 2).to(torch.bfloat16).contiguous() for t in (q, k, v))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # mha_v4_mxfp8 is deprecated in later AITER
        out = fn(q_, k_, v_, *formats, softmax_scale=request.scale)
    stats = None
    if request.return_stats:  # the kernels report no rollback counts
        stats = {"rollbacks": None, "tiles": None, "rollback_tiles": None, "rollback_rate": None}
    return AttentionResult(out.transpose(1, 2).to(q.dtype), None, stats)


# AITER's MI355X kernels run the MX formats natively (the paper's kernels).
register_backend(Backend("aiter", _run, _available, _unsupported, speed=Speed(SpeedClass.NATIVE),
                         computes=Numerics.MI355X, auto_rank=10))

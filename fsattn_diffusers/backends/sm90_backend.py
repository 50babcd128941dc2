"""The Hopper target: the Triton/Gluon Fused-Softmax kernels of ``kernels/`` for NVIDIA sm_90 (compute capability 9.0
exactly: their wgmma instructions exist on no other architecture), registered as the backend ``"triton"``.

They compute the ``sm90`` numerics variant of every recipe (:mod:`fsattn_diffusers.sm90_numerics`, NUMERICS.md §6).
Their pre-pass reads every element of q, k, v (keys before ``kv_lens``) and flags the non-finite slices itself
(``detects_nonfinite``), and ``kernels.nonfinite_flags`` is their standalone detection pass. Formats with one scale
per 32 keys of P or channels of Q/K (MXFP6, MXFP4) are carried in E4M3 here: no faster than mxfp8 (speed class
``widened``). The library core imports ``kernels`` here and in :mod:`.rope` (Wan's RoPE) only; the measurement
harnesses (``measure/``, ``commands/``) reach the kernels through this registration (``Backend.kernel``).
"""

from __future__ import annotations

from typing import Optional

from ..formats import QKFormat
from ..recipe import Numerics
from .contract import AttentionRequest, AttentionResult, Speed, SpeedClass
from .registry import Backend, CudaCapability, register_backend

#: Devices the kernels take: compute capability 9.0 (sm_90) with triton; compiled for sm_90a (wgmma needs the
#: arch-specific target).
HOPPER = CudaCapability(capabilities=((9, 0),), label="Hopper kernels", modules=("triton",), ptxas_arch="sm_90a")
#: The package of these kernels (``kernels/sm90/``, installed under this package's root).
KERNELS = f"{__package__.rpartition('.')[0]}.kernels.sm90"
#: Q/K or P formats that carry one scale per 32 elements of P's keys or Q/K's channels: the MX blocks Hopper's GEMMs
#: cannot take, so these kernels run them no faster than mxfp8.
MX_BLOCK_FORMATS = ("mxfp6", "mxfp4")
_WIDENED = Speed(SpeedClass.WIDENED, as_fast_as="mxfp8",
                 why=f"{HOPPER.arch_names[0]}: one scale per 32 keys of P, which its GEMMs cannot take")


def speed(recipe) -> Speed:
    """``widened`` (no faster than mxfp8) for a recipe with a format of :data:`MX_BLOCK_FORMATS`, else ``native``."""
    if any(f in MX_BLOCK_FORMATS for f in (recipe.qk_format, recipe.p_format, recipe.v_format)):
        return _WIDENED
    return Speed(SpeedClass.NATIVE)


def refuses(request: AttentionRequest) -> Optional[str]:
    """Why the kernels cannot take ``request`` (the plan's rule on the recipe and head dim), or None."""
    from ..kernels.sm90.plan import unsupported_reason

    return unsupported_reason(request.recipe, request.q.shape[-1])


def run(request: AttentionRequest) -> AttentionResult:
    """The call on the kernels: the INT8 Q/K kernel for INT8 recipes, else the plan's kernel variant."""
    r = request
    args = dict(scale=r.scale, kv_lens=r.kv_lens, return_lse=r.return_lse, return_stats=r.return_stats,
                detect_nonfinite=r.detect_nonfinite, q_lens=r.q_lens)
    if r.recipe.qk_format == QKFormat.INT8:  # the INT8 Q/K kernel (kernels/sm90/fused_attention_gluon_int8.py)
        from ..kernels.sm90.ops_int8 import fused_attention_int8

        out, lse, stats, flags = fused_attention_int8(r.q, r.k, r.v, r.recipe, **args)
    else:
        from ..kernels.sm90.ops import fused_attention  # imports triton: only where the kernel runs
        from ..kernels.sm90.plan import plan_for

        out, lse, stats, flags = fused_attention(r.q, r.k, r.v, plan_for(r.recipe), **args)
    return AttentionResult(out, lse, stats, flags)


def flag_nonfinite(q, k, v, kv_lens):
    """The kernels' exact non-finite pass (``kernels.nonfinite_flags``): (B, H) bool flags, or None for a head dim
    it does not take."""
    from ..kernels.nonfinite_flags import flag_nonfinite as flags, supports

    return flags(q, k, v, kv_lens) if supports(q.shape[-1]) else None


register_backend(Backend("triton", run, HOPPER, refuses, speed=speed, computes=Numerics.SM90, auto_rank=0,
                         detects_nonfinite=True, flag_nonfinite=flag_nonfinite, kernels=KERNELS))

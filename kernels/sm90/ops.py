"""Host side of the Triton kernels: launch the pre-pass and the attention kernel, and register the whole
call as the ``torch.library`` custom op ``fsattn::fused_attention`` (with a fake implementation, so that
``torch.compile`` traces through it)."""

from __future__ import annotations

import os
from typing import NamedTuple, Optional, Tuple

import torch

from fsattn_diffusers.exponent import LOG2E
from fsattn_diffusers.nonfinite import StagedFlags
from fsattn_diffusers.sm90_numerics import KEY_TERM_COLS, QX_MAX_LOG2, QX_MIN_LOG2
from fsattn_diffusers.smoothing import lse_offset

from .key_term import key_term_operands
from .plan import KernelPlan, plan_from_key
from .prepass import INTERPRET, KEY_TILE, padded, prepare_qk, prepare_v
from ..token_mean import token_mean

# Query rows per program and key tile of the attention kernel (the paper uses M = 256, N = 128).
BLOCK_M = 128
BLOCK_N = KEY_TILE
NUM_WARPS = 8
NUM_STAGES = 3
# Kernel variants, named for what they are (FSATTN_KERNEL_VARIANT picks one; the default covers every recipe):
# "gluon_pingpong" (default): kernels/sm90/fused_attention_gluon_pingpong.py, the gated recipes (mxfp8 with fp8_row
#   P; mxfp6 and mxfp4 with MXFP6 P, kernels/sm90/gluon_mxfp6_p.py) in Gluon: two free-running warpgroups per 128-row
#   tile, every GEMM asynchronous, the softmax of key tile j under the PV GEMM of tile j-1; fp8_row P's row sum on the
#   tensor cores.
#   H200, paper shape, kernel-only, mxfp8: ~945 TFLOP/s.
# "triton": kernels/sm90/fused_attention.py, two warpgroups on one 128-row tile in triton.language, mxfp6 P's Stage-B by
#   a scaled E4M3 conversion, P's key columns in the FP8 A-fragment order. It runs every recipe the other does not
#   (no gate, Rowmax-H15) and under the interpreter. H200, paper shape: mxfp8 ~795, mxfp6/mxfp4 ~632 TFLOP/s.
# Both give the same values up to the row sum's summation order (tests/test_kernel_gpu.py).
GLUON_PINGPONG = "gluon_pingpong"
TRITON = "triton"
VARIANTS = (GLUON_PINGPONG, TRITON)
#: The environment variable that picks the variant, read at each call (:func:`effective_variant`).
VARIANT_ENV = "FSATTN_KERNEL_VARIANT"
#: A process-wide choice that takes precedence over ``VARIANT_ENV`` (``fsattn bench --variant`` sets it); None: the
#: environment variable's value, else ``GLUON_PINGPONG``.
VARIANT: Optional[str] = None
PP_STAGES = 4


def effective_variant(variant: Optional[str], plan: KernelPlan) -> str:
    """The variant that runs ``plan``.

    Parameters
    ----------
    variant : str or None
        The variant asked for; None: :data:`VARIANT`, else the ``FSATTN_KERNEL_VARIANT`` environment variable as it
        is at this call, else "gluon_pingpong".
    plan : KernelPlan
        The recipe's kernel plan.

    Returns
    -------
    str
        "gluon_pingpong" where it applies (the gated recipes with Schraudolph's exponential: mxfp8, mxfp6, mxfp4 with
        fp8_row or MXFP6 P, on a GPU), else "triton".

    Raises
    ------
    ValueError
        One line naming the unknown variant, where it came from and the accepted values.
    """
    source = "variant"
    if not variant:
        variant, source = VARIANT, "kernels.sm90.ops.VARIANT"
    if not variant:
        variant, source = os.environ.get(VARIANT_ENV) or GLUON_PINGPONG, VARIANT_ENV
    if variant not in VARIANTS:
        raise ValueError(f"{source}={variant!r} is not a kernel variant; accepted: {', '.join(VARIANTS)}")
    if variant == GLUON_PINGPONG and (not plan.gate or plan.h15 or INTERPRET):
        return TRITON
    return variant


class KernelOperands(NamedTuple):
    """What the pre-pass gives the attention kernel (layouts in :mod:`kernels.sm90.prepass`).

    Q smoothing's per-key score term (sm90_numerics difference 9), or None each: ``bias`` (B, H, SKP) float32, the
    term in doublings as the triton kernel adds it on the query tiles that keep it; ``kx`` (B * H * SKP, 32) E4M3,
    its terms, the gluon_pingpong kernel's chained-wgmma operand; ``kg`` (B * H) int32, the shift G; ``q_sel``
    (B * H) int32, Q smoothing's per-slice switch (``Recipe.smooth_q_min_ratio``): the slices with 0 have no term,
    their Kx rows are not written and the gluon_pingpong kernel skips the chained wgmma there (None: every slice
    has it). ``k_mean`` (B, H, 1, D): K smoothing's mean (the LSE adds ``scale * q . k_mean`` back), or None.
    """

    q8: torch.Tensor
    qe: torch.Tensor
    k8: torch.Tensor
    ke: torch.Tensor
    v8t: torch.Tensor
    vs: torch.Tensor
    bias: Optional[torch.Tensor] = None
    k_mean: Optional[torch.Tensor] = None
    kx: Optional[torch.Tensor] = None
    kg: Optional[torch.Tensor] = None
    q_sel: Optional[torch.Tensor] = None


def prepass(q, k, v, plan: KernelPlan, scale: float, kv_lens: Optional[torch.Tensor], variant: str = None,
            flags: Optional[torch.Tensor] = None, q_lens: Optional[torch.Tensor] = None) -> KernelOperands:
    """All operands for the attention kernel (see kernels.sm90.prepass), smoothing included. ``flags`` (B * H,) int32,
    optional: the slices whose q, k or v (keys before ``kv_lens``) hold a NaN or an inf are set to 1, as
    :func:`kernels.nonfinite_flags.flag_nonfinite` flags them, by the pre-pass's own reads. ``q_lens`` (B,) int32,
    optional: Q smoothing's mean and switch count only the queries before it (``smoothing.smooth_inputs``)."""
    variant = effective_variant(variant, plan)
    nan_pad = variant == GLUON_PINGPONG
    k_mean = token_mean(k, kv_lens) if plan.smooth_k else None
    q_mean = q_sel = None
    if plan.smooth_q and plan.smooth_q_ratio2 > 0.0:  # the per-slice switch: q_mean 0 where it is off
        q_mean, q_sel = token_mean(q, q_lens, ratio2=plan.smooth_q_ratio2)
    elif plan.smooth_q:
        q_mean = token_mean(q, q_lens)
    # K first: Q smoothing's key term sets a floor under Q's tile exponents (sm90_numerics difference 9)
    k8, ke, bias = prepare_qk(k, plan, 1.0, tile_ref=True, kv_lens=kv_lens, nan_pad=nan_pad, mean=k_mean,
                              q_mean=q_mean, bias_mult=scale * LOG2E, flags=flags)
    bias_eff = kx = kg = q_floor = None
    if bias is not None:  # the pre-pass wrote 0 for padded keys
        bias_eff, kx, kg, q_floor = key_term_operands(bias, ke, variant == GLUON_PINGPONG, INTERPRET, q_sel)
    q8, qe, _ = prepare_qk(q, plan, scale * LOG2E, tile_ref=True, mean=q_mean, floor=q_floor, flags=flags,
                           q_sel=q_sel)
    v8t, vs = prepare_v(v, plan, kv_lens, perm=True, flags=flags)
    return KernelOperands(q8, qe, k8, ke, v8t, vs, bias_eff, k_mean, kx, kg, q_sel)


def attention_from_operands(ops, out: torch.Tensor, plan: KernelPlan, s_q: int, s_k: int,
                            kv_lens: Optional[torch.Tensor], lse: Optional[torch.Tensor],
                            stats: torch.Tensor, block_m: int = BLOCK_M, num_warps: int = NUM_WARPS,
                            num_stages: Optional[int] = None, variant: Optional[str] = None) -> None:
    """Launch the attention kernel on pre-pass outputs, writing ``out`` (B, H, S_q, D view, any strides).

    ``stats`` is a (2,) int32 tensor that receives (rows rolled back, query x key tile pairs rolled back), or None
    to skip the counting. With K smoothing ``lse`` receives the log-sum-exp of the
    smoothed scores: add ``smoothing.lse_offset(q, ops.k_mean, scale)`` for the true one (``fused_attention`` does).
    """
    variant = effective_variant(variant, plan)
    if num_stages is None:
        num_stages = PP_STAGES if variant == GLUON_PINGPONG else NUM_STAGES
    q8, qe, k8, ke, v8t, vs, bias = ops[:7]
    b, h, sqp, d = q8.shape
    skp = k8.shape[2]
    grid = (sqp // block_m, b * h)
    if variant == GLUON_PINGPONG:
        return _launch_gluon_pingpong(ops, out, plan, s_q, s_k, kv_lens, lse, stats, block_m, num_stages)
    from .fused_attention import fsattn_fwd_kernel

    if plan.o_promotion != 1:
        raise ValueError(f"triton kernel with o_promotion_tiles={plan.o_promotion or None}: it promotes O every key "
                         "tile; accepted: 1, or variant 'gluon_pingpong' (a GPU) for other intervals")
    if plan.diagonal and 128 % block_m:
        raise ValueError(f"triton kernel with key_order='diagonal': block_m {block_m}; accepted: a divisor of 128 "
                         "(the order is set per 128-row query tile)")
    if stats is None:
        stats = torch.zeros((2,), dtype=torch.int32, device=q8.device)
    fsattn_fwd_kernel[grid](
        q8, qe, k8, ke, v8t, vs, out, lse if lse is not None else stats, stats,
        kv_lens if kv_lens is not None else stats, *out.stride(), h, s_q, s_k, sqp, skp,
        D=d, BM=block_m, BN=BLOCK_N, HAS_KVL=kv_lens is not None, WRITE_LSE=lse is not None,
        P_MX=plan.p_mxfp6, GATE=plan.gate, CAP=float(plan.gate_cap), SIGMA=float(plan.p_sigma),
        NUM_STAGES=num_stages, RNE_CVT=INTERPRET, H15=plan.h15, H15_EXP=127 + plan.p_sigma,
        BIAS=bias if bias is not None else vs, KG=ops.kg if bias is not None else qe, HAS_BIAS=bias is not None,
        LOWER=plan.lowers, FLOOR=float(plan.gate_floor), DIAGONAL=plan.diagonal, M_OFFSET=plan.seed_offset,
        num_warps=num_warps)


def tma_desc(t, block, dtype: str = "float8e4nv"):
    """Host TMA descriptor of ``t`` (elements of Gluon type ``dtype``) with the default NVMMA shared layout for
    ``block``."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    layout = gl.NVMMASharedLayout.get_default_for(block, getattr(gl, dtype))
    return TensorDescriptor(t, list(t.shape), list(t.stride()), block, layout)


def _fp8_desc(t, block):
    """Host TMA descriptor of an FP8 tensor (:func:`tma_desc`)."""
    return tma_desc(t, block)


def rollback_tile_words(b: int, h: int, sqp: int, skp: int, stats: Optional[torch.Tensor], device):
    """``(stats, nkw, tile_bits)`` for a Gluon launch: one bit per (128-row tile, key tile) that rolled back (the two
    warpgroups of a tile may both fire), ``nkw`` int32 words per query tile (0 and no words when ``stats`` is None,
    which then becomes a scratch (2,) tensor). Add the bits to ``stats[1]`` with :func:`count_rollback_tiles`."""
    if stats is None:
        return torch.zeros((2,), dtype=torch.int32, device=device), 0, None
    nkw = -(-(skp // BLOCK_N) // 32)
    return stats, nkw, torch.zeros((b * h * (sqp // 128) * nkw,), dtype=torch.int32, device=device)


def count_rollback_tiles(stats: torch.Tensor, tile_bits: Optional[torch.Tensor]) -> None:
    """``stats[1] +=`` the rolled-back (query tile, key tile) pairs in :func:`rollback_tile_words`' bits."""
    if tile_bits is not None:
        stats[1] += _popcount(tile_bits).to(torch.int32)


def _launch_gluon_pingpong(ops, out, plan, s_q, s_k, kv_lens, lse, stats, block_m, num_stages):
    """kernels/sm90/fused_attention_gluon_pingpong.py: 128-row tiles, one 4-warp partition per 64 rows (8 warps)."""
    if block_m != 128:
        raise ValueError(f"gluon_pingpong kernel: block_m {block_m}; accepted: 128 (two 64-row warpgroups)")
    from .fused_attention_gluon_pingpong import ONES_N, WG_ROWS, fsattn_fwd_gluon_pingpong_kernel

    q8, qe, k8, ke, v8t, vs, bias = ops[:7]
    has_term = bias is not None
    term_sel = has_term and ops.q_sel is not None
    if has_term and ops.kx is None:
        raise ValueError("gluon_pingpong kernel with Q smoothing: the operands lack the key term's E4M3 terms (kx); "
                         "accepted: operands from prepass(..., variant='gluon_pingpong')")
    b, h, sqp, d = q8.shape
    skp = k8.shape[2]
    stats, nkw, tile_bits = rollback_tile_words(b, h, sqp, skp, stats, q8.device)
    ones_desc = _fp8_desc(_ones_tile(q8.device), [ONES_N.value, BLOCK_N])
    if has_term:  # the chained wgmma's operands: Qx from the table of powers of two, Kx per key
        qx_desc = _fp8_desc(_qx_table(q8.device, WG_ROWS.value), [WG_ROWS.value, KEY_TERM_COLS])
        kx_desc = _fp8_desc(ops.kx, [BLOCK_N, KEY_TERM_COLS])
    else:  # unused (never loaded)
        qx_desc = kx_desc = ones_desc
    # Q smoothing's per-slice switch: two launches, the slices without the term first, then those with it; in each,
    # the programs of the other slices return at once
    q_desc, k_desc = _fp8_desc(q8.view(b * h * sqp, d), [WG_ROWS.value, d]), _fp8_desc(k8.view(b * h * skp, d),
                                                                                       [BLOCK_N, d])
    v_desc = _fp8_desc(v8t.view(b * h * d, skp), [d, BLOCK_N])
    for key_term in ((False, True) if term_sel else (has_term,)):
        fsattn_fwd_gluon_pingpong_kernel[(sqp // block_m, b * h)](
            q_desc, k_desc, v_desc, ones_desc, qx_desc, kx_desc,
            qe, ke, vs, ops.kg if has_term else qe, ops.q_sel if term_sel else qe, out,
            lse if lse is not None else stats, stats, tile_bits if nkw else stats, nkw,
            kv_lens if kv_lens is not None else stats, *out.stride(), h, s_q, s_k, sqp, skp,
            D=d, BN=BLOCK_N, HAS_KVL=kv_lens is not None, WRITE_LSE=lse is not None, CAP=float(plan.gate_cap),
            FLOOR=plan.lowering_floor, SIGMA=float(plan.p_sigma),
            STAGES=num_stages, REGS=PP_WORKER_REGS, KEY_TERM=key_term, TERM_SEL=term_sel, P_MX=plan.p_mxfp6,
            DIAGONAL=plan.diagonal, M_OFFSET=plan.seed_offset, O_PROMOTE=plan.o_promotion, num_warps=4)
    count_rollback_tiles(stats, tile_bits)


_ONES = {}
_QX = {}


def _qx_table(device, rows: int) -> torch.Tensor:
    """The key term's A operands (sm90_numerics difference 9), one ``rows``-row tile per power of two: tile ``i``
    holds ``2^(QX_MIN_LOG2 + i)`` in every column for i <= QX_MAX_LOG2 - QX_MIN_LOG2, the tile after them zeros (a
    query tile that drops the term). ((QX_MAX_LOG2 - QX_MIN_LOG2 + 2) * rows, KEY_TERM_COLS) E4M3, one per device."""
    key = (str(device), rows)
    if key not in _QX:
        vals = [2.0 ** e for e in range(QX_MIN_LOG2, QX_MAX_LOG2 + 1)] + [0.0]
        col = torch.tensor(vals, dtype=torch.float32, device=device).repeat_interleave(rows)
        _QX[key] = col[:, None].expand(-1, KEY_TERM_COLS).contiguous().to(torch.float8_e4m3fn)
    return _QX[key]


def _ones_tile(device, dtype: torch.dtype = torch.float8_e4m3fn) -> torch.Tensor:
    """The (8, 128) ones operand of a Gluon kernel's tensor-core row sum (E4M3 for gluon_pingpong, BF16 for the INT8
    kernel), one per device and dtype."""
    key = (str(device), dtype)
    if key not in _ONES:
        _ONES[key] = torch.ones((8, BLOCK_N), device=device).to(dtype)
    return _ONES[key]


def _popcount(words: torch.Tensor) -> torch.Tensor:
    """Set bits in an int32 tensor (a byte lookup table; torch has no popcount)."""
    lut = torch.tensor([bin(i).count("1") for i in range(256)], dtype=torch.int64, device=words.device)
    return lut[words.view(torch.uint8).long()].sum()


# Registers per thread of the gluon_pingpong kernel's worker partition (setmaxnreg), as many as the default one's: the
# two fill the 65536. At 240 ptxas waited for the worker's PV GEMM right after S, before its softmax; at 256 whole
# calls are 7% / 12% faster at the paper / Wan2.2 shapes (H100), outputs bit for bit the same (docs/design.md).
PP_WORKER_REGS = 256


def _out_like(q: torch.Tensor, out_bshd: bool) -> torch.Tensor:
    b, h, s, d = q.shape
    if out_bshd:
        return torch.empty((b, s, h, d), dtype=q.dtype, device=q.device)
    return torch.empty((b, h, s, d), dtype=q.dtype, device=q.device)


def _lse_shape(q: torch.Tensor, return_lse: bool):
    return (q.shape[0], q.shape[1], q.shape[2]) if return_lse else (0,)


def _fused_attention(q, k, v, kv_lens, scale, plan_key, return_lse, out_bshd, want_stats, on_flags=None,
                     q_lens=None):
    """:func:`fused_attention_op`'s work. With ``on_flags`` (eager calls only) the pre-pass also writes the non-finite
    flags, (B * H,) int32, and ``on_flags(flags)`` runs between it and the attention kernel's launch."""
    plan = plan_from_key(plan_key)
    out = _out_like(q, out_bshd)
    out_view = out.transpose(1, 2) if out_bshd else out
    lse = torch.empty(_lse_shape(q, return_lse), dtype=torch.float32, device=q.device)
    stats = torch.zeros((2,), dtype=torch.int32, device=q.device)
    flags = (torch.zeros((q.shape[0] * q.shape[1],), dtype=torch.int32, device=q.device) if on_flags is not None
             else None)
    ops = prepass(q, k, v, plan, scale, kv_lens, flags=flags, q_lens=q_lens)
    if on_flags is not None:
        on_flags(flags)
    attention_from_operands(ops, out_view, plan, q.shape[2], k.shape[2], kv_lens,
                            lse if return_lse else None, stats if want_stats else None)
    if return_lse and ops.k_mean is not None:  # the log-sum-exp of the unsmoothed scores
        lse += lse_offset(q, ops.k_mean, scale)
    return out, lse, stats


@torch.library.custom_op("fsattn::fused_attention", mutates_args=())
def fused_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_lens: Optional[torch.Tensor],
                       scale: float, plan_key: str, return_lse: bool, out_bshd: bool, want_stats: bool,
                       q_lens: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fused-Softmax attention on (B, H, S, D) views.

    Returns
    -------
    out : (B, S_q, H, D) if ``out_bshd`` else (B, H, S_q, D), contiguous, q's dtype.
    lse : (B, H, S_q) float32 natural-log LSE, or an empty (0,) tensor.
    stats : (2,) int32: rows that rolled back, (query tile, key tile) pairs with a rollback (zeros
        unless ``want_stats``).
    """
    return _fused_attention(q, k, v, kv_lens, scale, plan_key, return_lse, out_bshd, want_stats, q_lens=q_lens)


@fused_attention_op.register_fake
def _(q, k, v, kv_lens, scale, plan_key, return_lse, out_bshd, want_stats, q_lens=None):
    return (_out_like(q, out_bshd), torch.empty(_lse_shape(q, return_lse), dtype=torch.float32, device=q.device),
            torch.empty((2,), dtype=torch.int32, device=q.device))


def visited_tiles(b: int, h: int, s_q: int, s_k: int, kv_lens: Optional[torch.Tensor],
                  block_m: int = BLOCK_M) -> int:
    """(query tile, key tile) pairs the kernel visits (host side; syncs when kv_lens is given)."""
    n_qt = -(-s_q // block_m)
    if kv_lens is None:
        return b * h * n_qt * (-(-s_k // BLOCK_N))
    return h * n_qt * sum(-(-int(n) // BLOCK_N) for n in kv_lens.tolist())


def fused_attention(q, k, v, plan: KernelPlan, *, scale: float, kv_lens=None, return_lse=False,
                    return_stats=False, detect_nonfinite=False, q_lens=None):
    """Backend entry: (B, H, S, D) views in, ``(out (B, H, S_q, D) view, lse or None, stats or None, flags)``.

    ``flags``: with ``detect_nonfinite`` a :class:`fsattn_diffusers.nonfinite.StagedFlags` holding what
    :func:`fsattn_diffusers.nonfinite.detect` gives, found by the pre-pass's own reads and staged to the host before
    the attention kernel is launched (an eager call, outside the custom op); else None.
    """
    out_bshd = q.stride(1) < q.stride(2)  # the caller's q is BSHD: give the output the same layout
    if kv_lens is not None:
        kv_lens = kv_lens.to(device=q.device, dtype=torch.int32).contiguous()
    if q_lens is not None:
        q_lens = q_lens.to(device=q.device, dtype=torch.int32).contiguous()
    args = (q, k, v, kv_lens, float(scale), plan.key(), bool(return_lse), out_bshd, bool(return_stats))
    return run_fused(lambda on_flags: _fused_attention(*args, on_flags=on_flags, q_lens=q_lens),
                     lambda: fused_attention_op(*args, q_lens), q, k, kv_lens, out_bshd, return_lse, return_stats,
                     detect_nonfinite)


def run_fused(eager, op, q, k, kv_lens, out_bshd: bool, return_lse: bool, return_stats: bool, detect_nonfinite: bool):
    """A backend entry's call of its work: ``eager(on_flags)`` when the pre-pass's non-finite flags are wanted
    (staged to the host before the attention kernel's launch), else the custom op ``op()``; both return ``(out, lse,
    stats (2,) int32)``. Returns ``(out (B, H, S_q, D) view, lse or None, stats dict or None, StagedFlags or None)``."""
    staged = None
    if detect_nonfinite:
        def stage(flags):
            nonlocal staged
            staged = StagedFlags(flags.view(q.shape[0], q.shape[1]) > 0)
        out, lse, st = eager(stage)
    else:
        out, lse, st = op()
    out = out.transpose(1, 2) if out_bshd else out
    stats = None
    if return_stats:
        rows, tiles_rb = (int(x) for x in st.tolist())
        tiles = visited_tiles(q.shape[0], q.shape[1], q.shape[2], k.shape[2], kv_lens)
        stats = {"rollbacks": rows, "tiles": tiles, "rollback_tiles": tiles_rb,
                 "rollback_rate": tiles_rb / max(1, tiles)}
    return out, (lse if return_lse else None), stats, staged


__all__ = ["fused_attention", "fused_attention_op", "prepass", "attention_from_operands", "padded"]

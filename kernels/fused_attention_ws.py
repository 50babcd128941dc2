"""Warp-specialized variant of :mod:`kernels.fused_attention` (same numerics, same operands).

EXPERIMENTAL, not used by default: it compiles to Triton's Hopper producer/consumer partitions, matches
the reference under the CPU interpreter, but hung on the H200 (Triton 3.6.0, 2026-11-29); see ops.VARIANT.

Triton's Hopper warp specialization (``tl.range(..., warp_specialize=True)`` with TMA tensor
descriptors and ``num_warps=4``) splits the BM=128 query tile into two 64-row consumer warpgroups fed by a
TMA producer warp, so one warpgroup's softmax overlaps the other's GEMMs (the FA3 schedule; the paper's
ping-pong, Section 4). The partitioning takes no branch inside the loop (Triton 3.6 then silently drops
the specialization), so every key tile runs through one branch-free body: tile 0 is selected per row,
the tail is masked by NaN keys (see the loop), and the rollback is applied per row unconditionally:
``O, l *= 2^-delta`` with ``delta = 0`` except on rows the gate fires (the same values as the branchy
kernel, for one FMUL pass over O per tile).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .common import pow2
from .fused_attention import _stage_ab


@triton.jit
def fsattn_fwd_ws_kernel(qd, kd, vd, QE, KE, VS, OUT, LSE, FLAGS, ROWS, KVL,
                         sob, soh, sos, sod, H, SQ, SK, SQP, SKP, NKT,
                         D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, HAS_KVL: tl.constexpr,
                         WRITE_LSE: tl.constexpr, P_MX: tl.constexpr, GATE: tl.constexpr, CAP: tl.constexpr,
                         SIGMA: tl.constexpr, STATS: tl.constexpr, NUM_STAGES: tl.constexpr,
                         RNE_CVT: tl.constexpr, WS: tl.constexpr, MASK_WHERE: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    n_keys = SK
    if HAS_KVL:
        n_keys = tl.load(KVL + b).to(tl.int32)
    rows = pid_m * BM + tl.arange(0, BM)
    dcol = tl.arange(0, D)
    kcol = tl.arange(0, BN)
    q = qd.load([bh * SQP + pid_m * BM, 0])
    qe = tl.load(QE + bh * (SQP // 128) + (pid_m * BM) // 128)  # Q's exponent per 128-row tile
    KE_row = KE + bh * NKT
    row_ok = rows < SQ
    n_tiles = tl.cdiv(n_keys, BN)

    o = tl.zeros((BM, D), tl.float32)
    l = tl.zeros((BM,), tl.float32)
    m = tl.zeros((BM,), tl.float32)
    fired = tl.zeros((BM,), tl.int32)
    for t in tl.range(0, n_tiles, num_stages=NUM_STAGES, warp_specialize=WS):
        k = kd.load([bh * SKP + t * BN, 0])
        acc = tl.dot(q, k.T)
        e_t = qe + tl.load(KE_row + t)
        if MASK_WHERE:  # CPU interpreter: explicit mask (its max propagates NaN)
            acc = tl.where((t * BN + kcol < n_keys)[None, :], acc, float("-inf"))
        # On the GPU, keys past S_k / kv_lens are NaN rows of K8 (pre-pass): their scores are NaN, which
        # the non-propagating max (FMNMX) of the gate and of Stage-A's clamp drop, so P = 0 there and
        # the loop needs no branch or select (warp specialization allows neither).
        x_max = tl.max(acc, axis=1) * pow2(e_t)
        if GATE:  # lines 8-13, per row: delta = 0 except where the gate fires
            fire = (t > 0) & (x_max > m + CAP)
            delta = tl.where(fire, tl.math.ceil(x_max - m), 0.0)
            down = pow2(-delta.to(tl.int32))
            o = o * down[:, None]
            l = l * down
            fired += fire.to(tl.int32)
            if STATS:
                # (query tile, key tile) pairs with a rollback: every fired row writes the same flag.
                flag = FLAGS + (bh * tl.num_programs(0) + pid_m).to(tl.int64) * NKT + t
                tl.store(flag + rows * 0, fire.to(tl.int32), mask=fire & row_ok)
            m = m + delta
        # Tile 0 freezes the reference (line 2) on the 1/128 grid.
        m = tl.where(t == 0, tl.math.ceil(x_max * 128.0) * (1.0 / 128.0), m)
        c = (12582912.0 + 16249.0 + 128.0 * SIGMA) - 128.0 * m
        p8, psum = _stage_ab(acc, pow2(e_t + 7), c, P_MX, not GATE, BM, BN, RNE_CVT)
        l += psum
        vt = vd.load([bh * D, t * BN])
        o = tl.dot(p8, vt.T, o)
    vs = tl.load(VS + bh * D + dcol)
    inv = tl.where(l > 0, 1.0 / l, 0.0)
    out = o * inv[:, None] * vs[None, :]
    optr = OUT + b.to(tl.int64) * sob + h.to(tl.int64) * soh + rows[:, None].to(tl.int64) * sos + dcol[None, :] * sod
    tl.store(optr, out.to(OUT.dtype.element_ty), mask=row_ok[:, None])
    if WRITE_LSE:
        lse = tl.where(n_keys > 0, (tl.log2(l) - SIGMA + m) * 0.6931471805599453, float("-inf"))
        tl.store(LSE + bh.to(tl.int64) * SQ + rows, lse, mask=row_ok)
    if STATS:
        tl.store(ROWS + bh.to(tl.int64) * SQP + rows, fired)

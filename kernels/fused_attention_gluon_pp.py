"""Fused-Softmax attention forward in Gluon for Hopper with two free-running warpgroups: each owns 64 query rows of
the program's 128-row tile and overlaps its softmax with its own PV GEMM and with the other warpgroup's work.

(The module keeps its historical name: it began as FlashAttention-3's ping-pong, where "turn" mbarriers made the two
warpgroups take turns on the tensor cores. Nsight Compute on the H200 showed that order made the two softmaxes
alternate rather than overlap - one warp per scheduler issuing at a time, 43% issue-slot use, the waiting warpgroup
~400 cycles per tile at its turn - and dropping the turn made the kernel 5% faster; benchmarks/NOTES.md.)

Numerics, operands and the per-tile steps are those of :mod:`kernels.fused_attention_gluon` (mxfp8: P per-row FP8,
gate on the raw score maxima, Stage-A by bit construction, keys past ``kv_lens`` as E4M3 NaN). What changes:

* ``gl.warp_specialize`` runs the same consumer twice, on rows ``[0, 64)`` and ``[64, 128)`` of the program's
  128-row query tile, as two 4-warp partitions. Each has its own gate, so the gate's reduction and the rollback
  branch involve one warpgroup (a 128-thread barrier), not the whole CTA.
* Per key tile a warpgroup issues ``S_j = Q K_j^T`` and ``O += P_{j-1} V_{j-1}`` back to back; Stage-B of ``P_j``
  is done at the end of iteration ``j`` and carried as int32 words of four E4M3 bytes (:func:`_stage_b_words`), so
  the issue window holds only the GEMMs.
* K/V stages are released through an ``empty`` mbarrier per slot (one arrival per warpgroup after its PV GEMM on
  that slot has landed); warpgroup 1 then refills the slot by TMA.

Rollback statistics: ``STATS[0]`` counts rows (as the other variants); the (128-row tile, key tile) pairs with a
rollback are bits of ``FLAGS`` (``NKW`` int32 words per (batch x head, query tile); ``NKW = 0`` records none), which
the host counts, since the two warpgroups of a tile roll back independently.
"""

from __future__ import annotations

import os

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from .fused_attention_gluon import (D_BITS, MAGIC, _load_kv, _perm_a_fragment, _pow2, _stage_a, _stage_b_words,
                                    _words_to_fp8)

# Rows of the query tile per warpgroup (wgmma's M) and warpgroups per program.
WG_ROWS = gl.constexpr(64)
# Columns of the ones operand of the tensor-core row sum (wgmma's smallest N).
ONES_N = gl.constexpr(8)
# EXPERIMENT (fifth session): 0 = Stage-A row sum of the BF16 proxy (current numerics); 1 = row sum of the E4M3 P on
# the tensor cores (P8 @ ones); 2 = 1 with an FP16 proxy (Schraudolph on FP16's bit layout, cvt f16x2 -> e4m3x2).
PP_MODE = gl.constexpr(int(os.environ.get("FSATTN_PP_MODE", "0")))
# 1024 * (15 - 7/128): Schraudolph's bias on FP16's 1/1024 mantissa grid with the kernel's eps' = 7/128 (Section 4.2).
D_BITS_F16 = gl.constexpr(15304.0)


@gluon.jit
def _stage_a_f16(s, s1024, c):
    """Stage-A with an FP16 proxy: fp32 whose low 16 bits are the FP16 pattern of P * 2^sigma (upper bits MAGIC's)."""
    return gl.maximum(s * s1024 + c[:, None], MAGIC)


@gluon.jit
def _stage_b_words_f16(f, p_layout: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr):
    """Stage-B from :func:`_stage_a_f16`: two PRMT and two f16x2 -> e4m3x2 conversions per word of four E4M3 bytes,
    in the order of :func:`kernels.fused_attention_gluon._stage_b_words`."""
    f = gl.convert_layout(_perm_a_fragment(f, BM, BN), p_layout)
    lo, hi = gl.split(gl.reshape(f, [BM, BN // 4, 2, 2]))
    e0, e2 = gl.split(lo)
    e1, e3 = gl.split(hi)
    return gl.inline_asm_elementwise(
        "{ .reg .b32 a, b; .reg .b16 lo, hi; prmt.b32 a, $1, $2, 0x5410; prmt.b32 b, $3, $4, 0x5410; "
        "cvt.rn.satfinite.e4m3x2.f16x2 lo, a; cvt.rn.satfinite.e4m3x2.f16x2 hi, b; mov.b32 $0, {lo, hi}; }",
        "=r,f,f,f,f", [e0, e1, e2, e3], dtype=gl.int32, is_pure=True, pack=1)


@gluon.jit
def _consumer(WG: gl.constexpr, q_smem, qbar, k_smem, v_smem, kbar, vbar, empty, ones_smem, onesbar, k_desc, v_desc,
              QE, KE, VS, OUT, LSE, STATS, FLAGS, NKW, pid_m, bh, b, h, n_keys, sob, soh, sos, sod, SQ, SQP, SKP,
              WRITE_LSE, CAP, SIGMA):
    """One warpgroup: rows ``pid_m * 128 + WG * 64 + [0, 64)`` against every key tile of (batch, head) ``bh``.

    Partition arguments cannot be constexprs (they arrive as tensors): the tile sizes come from the shared-memory
    shapes, and ``WRITE_LSE``, ``CAP``, ``SIGMA`` are runtime scalars.
    """
    STAGES: gl.constexpr = k_smem.shape[0]
    BN: gl.constexpr = k_smem.shape[1]
    D: gl.constexpr = k_smem.shape[2]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 32])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 32])
    l_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, ONES_N, 32])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=4)
    srow: gl.constexpr = gl.SliceLayout(1, s_layout)
    orow: gl.constexpr = gl.SliceLayout(1, o_layout)
    ocol: gl.constexpr = gl.SliceLayout(0, o_layout)
    lrow: gl.constexpr = gl.SliceLayout(1, l_layout)
    BM: gl.constexpr = WG_ROWS
    TC_SUM: gl.constexpr = PP_MODE > 0
    F16: gl.constexpr = PP_MODE == 2
    # Stage-A's grid: 128 steps per doubling (BF16 proxy) or 1024 (FP16 proxy).
    GRID_LOG2: gl.constexpr = 10 if F16 else 7
    GRID: gl.constexpr = 1024.0 if F16 else 128.0

    n_tiles = (n_keys + BN - 1) // BN
    qs = q_smem.index(WG)
    ones = ones_smem.permute((1, 0))
    qe = gl.load(QE + bh * (SQP // 128) + pid_m)  # Q's exponent per 128-row tile (both warpgroups share it)
    KE_row = KE + bh * (SKP // BN)
    krow0 = bh * SKP
    vrow0 = bh * D
    row0 = pid_m * 128 + WG * BM
    rows = row0 + gl.arange(0, BM, layout=srow)
    row_ok = rows < SQ
    zero_s = gl.zeros([BM, BN], gl.float32, s_layout)

    o = gl.zeros([BM, D], gl.float32, o_layout)
    l = gl.zeros([BM], gl.float32, srow)
    lacc = gl.zeros([BM, ONES_N], gl.float32, l_layout)
    m = gl.full([BM], float("-inf"), gl.float32, srow)
    nrows = pid_m * 0
    ntiles = pid_m * 0
    if n_keys > 0:
        mbarrier.wait(qbar.index(WG), 0)
        mbarrier.wait(kbar.index(0), 0)
        if TC_SUM:
            mbarrier.wait(onesbar.index(0), 0)
        s = warpgroup_mma(qs, k_smem.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(0, deps=(s,))
        e0 = qe + gl.load(KE_row)
        m = gl.ceil(gl.max(s, axis=1) * _pow2(e0 + 7)) * (1.0 / 128.0)  # the frozen reference (Algorithm 1)
        if F16:
            c = (MAGIC + D_BITS_F16 + GRID * SIGMA) - GRID * m
            pw = _stage_b_words_f16(_stage_a_f16(s, _pow2(e0 + GRID_LOG2), c), p_layout, BM, BN)
        else:
            c = (MAGIC + D_BITS + GRID * SIGMA) - GRID * m
            p, l = _stage_a(s, _pow2(e0 + GRID_LOG2), c)
            pw = _stage_b_words(p, p_layout, BM, BN)
        for j in range(1, n_tiles):
            slot = j % STAGES
            prev = (j - 1) % STAGES
            pa = _words_to_fp8(pw, p_layout, BM, BN)  # Stage-B of tile j-1 was done at the end of iteration j-1
            mbarrier.wait(kbar.index(slot), (j // STAGES) & 1)
            mbarrier.wait(vbar.index(prev), ((j - 1) // STAGES) & 1)
            s = warpgroup_mma(qs, k_smem.index(slot).permute((1, 0)), zero_s, use_acc=False, is_async=True)
            if TC_SUM:  # l += P8_{j-1} @ ones, issued before the PV GEMM so that waiting for S_j waits for it too
                lacc = warpgroup_mma(pa, ones, lacc, is_async=True)
            o = warpgroup_mma(pa, v_smem.index(prev).permute((1, 0)), o, is_async=True)
            s = warpgroup_mma_wait(1, deps=(s,))
            e_t = qe + gl.load(KE_row + j)
            amax = gl.max(s, axis=1)
            fire = amax > (m + CAP) * _pow2(-e_t)  # gate on the raw block maxima (Algorithm 1 line 8)
            anyfire = gl.max(fire.to(gl.int32), axis=0) > 0  # this warpgroup only
            if F16:
                p = _stage_a_f16(s, _pow2(e_t + GRID_LOG2), c)
                o, p, lacc = warpgroup_mma_wait(0, deps=(o, p, lacc))
            elif TC_SUM:
                p, psum = _stage_a(s, _pow2(e_t + GRID_LOG2), c)
                o, p, lacc = warpgroup_mma_wait(0, deps=(o, p, lacc))
            else:
                p, psum = _stage_a(s, _pow2(e_t + GRID_LOG2), c)
                o, p, psum = warpgroup_mma_wait(0, deps=(o, p, psum))
            mbarrier.arrive(empty.index(prev))  # this warpgroup is done with K/V of tile j-1
            if WG == 1:  # refill the slot once both warpgroups have released it
                mbarrier.wait(empty.index(prev), ((j - 1) // STAGES) & 1)
                _load_kv(k_desc, v_desc, k_smem, v_smem, kbar, vbar, prev, j - 1 + STAGES, krow0, vrow0,
                         j - 1 + STAGES < n_tiles, BN)
            if anyfire:  # rare rollback: new reference for the fired rows, O and l rescaled, Stage-A redone
                delta = gl.where(fire, gl.ceil(amax * _pow2(e_t) - m), 0.0)
                m = m + delta
                c = c - GRID * delta
                down = gl.exp2(-delta)
                if TC_SUM:
                    lacc = lacc * gl.convert_layout(down, lrow)[:, None]
                else:
                    l = l * down
                o = o * gl.convert_layout(down, orow)[:, None]
                nrows += gl.sum((fire & row_ok).to(gl.int32), axis=0)
                ntiles += 1
                if NKW > 0:
                    gl.atomic_or(FLAGS + (bh * (SQP // 128) + pid_m) * NKW + j // 32, 1 << (j % 32))
                if F16:
                    p = _stage_a_f16(s, _pow2(e_t + GRID_LOG2), c)
                else:
                    p, psum = _stage_a(s, _pow2(e_t + GRID_LOG2), c)
            # Stage-B now, so that the GEMM issue window holds no conversion
            if F16:
                pw = _stage_b_words_f16(p, p_layout, BM, BN)
            else:
                if not TC_SUM:
                    l = l + psum
                pw = _stage_b_words(p, p_layout, BM, BN)
        last = (n_tiles - 1) % STAGES
        pa = _words_to_fp8(pw, p_layout, BM, BN)
        mbarrier.wait(vbar.index(last), ((n_tiles - 1) // STAGES) & 1)
        if TC_SUM:
            lacc = warpgroup_mma(pa, ones, lacc, is_async=True)
        o = warpgroup_mma(pa, v_smem.index(last).permute((1, 0)), o, is_async=True)
        if TC_SUM:
            o, lacc = warpgroup_mma_wait(0, deps=(o, lacc))
            l = gl.convert_layout(gl.max(lacc, axis=1), srow)  # every column holds the row sum
        else:
            o = warpgroup_mma_wait(0, deps=(o,))

    dcol = gl.arange(0, D, layout=ocol)
    orows = row0 + gl.arange(0, BM, layout=orow)
    vs = gl.load(VS + bh * D + dcol)
    inv = gl.convert_layout(gl.where(l > 0, 1.0 / l, 0.0), orow)
    out = o * inv[:, None] * vs[None, :]
    optr = (OUT + b.to(gl.int64) * sob + h.to(gl.int64) * soh + orows[:, None].to(gl.int64) * sos
            + dcol[None, :] * sod)
    gl.store(optr, out.to(OUT.dtype.element_ty), mask=(orows < SQ)[:, None])
    lse = (gl.log2(l) - SIGMA + m) * 0.6931471805599453  # stored only when asked (a runtime flag here)
    gl.store(LSE + bh.to(gl.int64) * SQ + rows, lse, mask=row_ok & (WRITE_LSE != 0))
    if ntiles > 0:
        gl.atomic_add(STATS, nrows)


@gluon.jit
def _consumer0(q_smem, qbar, k_smem, v_smem, kbar, vbar, empty, ones_smem, onesbar, k_desc, v_desc, QE, KE, VS, OUT, LSE, STATS,
               FLAGS, NKW, pid_m, bh, b, h, n_keys, sob, soh, sos, sod, SQ, SQP, SKP, WRITE_LSE, CAP, SIGMA):
    _consumer(0, q_smem, qbar, k_smem, v_smem, kbar, vbar, empty, ones_smem, onesbar, k_desc, v_desc, QE, KE, VS, OUT, LSE, STATS,
              FLAGS, NKW, pid_m, bh, b, h, n_keys, sob, soh, sos, sod, SQ, SQP, SKP, WRITE_LSE, CAP, SIGMA)


@gluon.jit
def _consumer1(q_smem, qbar, k_smem, v_smem, kbar, vbar, empty, ones_smem, onesbar, k_desc, v_desc, QE, KE, VS, OUT, LSE, STATS,
               FLAGS, NKW, pid_m, bh, b, h, n_keys, sob, soh, sos, sod, SQ, SQP, SKP, WRITE_LSE, CAP, SIGMA):
    _consumer(1, q_smem, qbar, k_smem, v_smem, kbar, vbar, empty, ones_smem, onesbar, k_desc, v_desc, QE, KE, VS, OUT, LSE, STATS,
              FLAGS, NKW, pid_m, bh, b, h, n_keys, sob, soh, sos, sod, SQ, SQP, SKP, WRITE_LSE, CAP, SIGMA)


@gluon.jit
def fsattn_fwd_gluon_pp_kernel(q_desc, k_desc, v_desc, ones_desc, QE, KE, VS, OUT, LSE, STATS, FLAGS, NKW, KVL,
                               sob, soh, sos, sod, H, SQ, SK, SQP, SKP,
                               D: gl.constexpr, BN: gl.constexpr, HAS_KVL: gl.constexpr, WRITE_LSE: gl.constexpr,
                               CAP: gl.constexpr, SIGMA: gl.constexpr, STAGES: gl.constexpr, REGS: gl.constexpr):
    """One (128-row query tile, batch x head) per program, launched with 4 warps (+4 in the worker partition).

    q_desc : TMA descriptor of Q8 viewed as (B*H*SQP, D), block (64, D).
    k_desc : of K8 (B*H*SKP, D), block (BN, D), NaN rows past the valid keys.
    v_desc : of V8T (B*H*D, SKP), block (D, BN), keys permuted into the FP8 A-fragment order.
    """
    pid_m = gl.program_id(0)
    bh = gl.program_id(1)
    b = bh // H
    h = bh % H
    n_keys = SK
    if HAS_KVL:
        n_keys = gl.load(KVL + b).to(gl.int32)
    n_tiles = (n_keys + BN - 1) // BN

    q_smem = gl.allocate_shared_memory(gl.float8e4nv, [2, WG_ROWS, D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BN, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, D, BN], v_desc.layout)
    qbar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    kbar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    vbar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ones_smem = gl.allocate_shared_memory(gl.float8e4nv, [ONES_N, BN], ones_desc.layout)
    onesbar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    mbarrier.init(onesbar.index(0), count=1)
    for i in gl.static_range(2):
        mbarrier.init(qbar.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(kbar.index(i), count=1)
        mbarrier.init(vbar.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)
    fence_async_shared()

    for i in gl.static_range(2):
        mbarrier.expect(qbar.index(i), q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [bh * SQP + pid_m * 128 + i * WG_ROWS, 0], qbar.index(i),
                                        q_smem.index(i))
    if PP_MODE > 0:  # the ones tile of the tensor-core row sum (TMA: a ones tile stored from registers summed wrong)
        mbarrier.expect(onesbar.index(0), ones_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(ones_desc, [0, 0], onesbar.index(0), ones_smem)
    for i in gl.static_range(STAGES):
        _load_kv(k_desc, v_desc, k_smem, v_smem, kbar, vbar, i, i, bh * SKP, bh * D, i < n_tiles, BN)

    args = (q_smem, qbar, k_smem, v_smem, kbar, vbar, empty, ones_smem, onesbar, k_desc, v_desc, QE, KE, VS, OUT, LSE, STATS,
            FLAGS, NKW, pid_m, bh, b, h, n_keys, sob, soh, sos, sod, SQ, SQP, SKP, WRITE_LSE, CAP, SIGMA)
    gl.warp_specialize([(_consumer0, args), (_consumer1, args)], [4], [REGS])

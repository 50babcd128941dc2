"""Fused-Softmax attention forward in Gluon for Hopper (sm_90): the mxfp8 recipe with GEMM/softmax overlap.

Same numerics and operands as :mod:`kernels.fused_attention` with ``FAST`` (P per-row FP8, gate on the raw
score maxima, Stage-A by bit construction); what changes is the schedule, which Triton 3.6 does not let us
express in ``triton.language``: every wgmma here is asynchronous and waited for explicitly, so that the
softmax of key tile j runs while the PV GEMM of tile j-1 is on the tensor cores (FlashAttention-3's
intra-warpgroup pipelining):

    issue S_j = Q K_j^T            (async)
    Stage-B of tile j-1 (E4M3 P as the register A operand)  <- overlaps the score GEMM
    issue O  += P_{j-1} V_{j-1}    (async)
    wait until only the PV GEMM is in flight
    gate on S_j; Stage-A of S_j with the current reference   <- overlaps the PV GEMM
    wait for the PV GEMM; rare rollback (new reference, O and l rescaled, Stage-A redone);
    l += rowsum; refill the freed K/V stage by TMA

K/V tiles arrive by TMA into a ring of ``STAGES`` shared-memory slots. Keys past ``kv_lens`` (or S_k) are
E4M3 NaN in K8 (pre-pass ``nan_pad``): their scores are NaN, which the max-based gate, the frozen maximum
and Stage-A's clamp drop (``maximum`` returns the non-NaN operand), so no tile needs a mask.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

# 1.5 * 2^23 and 128 * (127 - eps'): the Stage-A constants of kernels.fused_attention (Section 4.2).
MAGIC = gl.constexpr(12582912.0)
D_BITS = gl.constexpr(16249.0)


@gluon.jit
def _pow2(e):
    """2^e for an int32 exponent in the normal range (bit construction)."""
    return ((e + 127) << 23).to(gl.float32, bitcast=True)


@gluon.jit
def _stage_a(s, s128, c):
    """Stage-A: the BF16 proxy of P * 2^sigma by bit construction (as fp32), and its row sum."""
    f = gl.maximum(s * s128 + c[:, None], MAGIC)
    p = (f.to(gl.int32, bitcast=True) << 16).to(gl.float32, bitcast=True)
    return p, gl.sum(p, axis=1)


@gluon.jit
def _stage_b(p, p_layout: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, PERM: gl.constexpr):
    """Stage-B: E4M3 per-row P as the PV GEMM's register A operand. With PERM, P's key columns are taken in
    the FP8 A-fragment order (as kernels.fused_attention._perm_p; V8T stored to match by the pre-pass)."""
    if PERM:  # on the fp32 values: the conversion below is then a register renaming within each thread
        p = _perm_a_fragment(p, BM, BN)
    return gl.convert_layout(p, p_layout).to(gl.float8e4nv)


@gluon.jit
def _perm_a_fragment(p, BM: gl.constexpr, BN: gl.constexpr):
    """P's key columns in the FP8 A-fragment order (kernels.fused_attention._perm_p; V8T is stored to match)."""
    return gl.reshape(gl.permute(gl.reshape(p, [BM, BN // 16, 2, 2, 2, 2]), [0, 1, 3, 4, 2, 5]), [BM, BN])


@gluon.jit
def _stage_b_words(p, p_layout: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr):
    """Stage-B (permuted, as :func:`_stage_b`) packed as int32 words of four E4M3 bytes, shape (BM, BN // 4).

    A loop-carried FP8 tensor is kept as one byte per register and repacked before the GEMM (~100 PRMT/LOP3 per
    tile); words are carried as they are. Byte ``i`` of a word is P's element ``4 w + i`` in ``p_layout`` order."""
    p = gl.convert_layout(_perm_a_fragment(p, BM, BN), p_layout)
    lo, hi = gl.split(gl.reshape(p, [BM, BN // 4, 2, 2]))  # elements (0, 2) and (1, 3) of each group of four
    e0, e2 = gl.split(lo)
    e1, e3 = gl.split(hi)
    return gl.inline_asm_elementwise(
        "{ .reg .b16 lo, hi; cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1; cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3; "
        "mov.b32 $0, {lo, hi}; }", "=r,f,f,f,f", [e0, e1, e2, e3], dtype=gl.int32, is_pure=True, pack=1)


@gluon.jit
def _words_to_fp8(w, p_layout: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr):
    """The inverse of :func:`_stage_b_words`' packing: the (BM, BN) E4M3 A operand in ``p_layout`` (no instructions:
    each word is reused as the register holding its four bytes)."""
    w2 = gl.join(w, w)
    w4 = gl.reshape(gl.join(w2, w2), [BM, BN])
    w4 = gl.convert_layout(w4, p_layout)
    return gl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r,r,r,r", [w4], dtype=gl.float8e4nv, is_pure=True,
                                     pack=4)


@gluon.jit
def _load_kv(k_desc, v_desc, k_smem, v_smem, kbar, vbar, slot, tile, krow0, vrow0, pred,
             BN: gl.constexpr):
    mbarrier.expect(kbar.index(slot), k_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(k_desc, [krow0 + tile * BN, 0], kbar.index(slot), k_smem.index(slot), pred=pred)
    mbarrier.expect(vbar.index(slot), v_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(v_desc, [vrow0, tile * BN], vbar.index(slot), v_smem.index(slot), pred=pred)


@gluon.jit
def fsattn_fwd_gluon_kernel(q_desc, k_desc, v_desc, QE, KE, VS, OUT, LSE, STATS, KVL,
                            sob, soh, sos, sod, H, SQ, SK, SQP, SKP,
                            D: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, HAS_KVL: gl.constexpr,
                            WRITE_LSE: gl.constexpr, CAP: gl.constexpr, SIGMA: gl.constexpr,
                            STAGES: gl.constexpr, PERM: gl.constexpr, num_warps: gl.constexpr):
    """One (query tile, batch x head) per program; operands as kernels.fused_attention (V8T permuted iff PERM).

    q_desc : TMA descriptor of Q8 viewed as (B*H*SQP, D), block (BM, D).
    k_desc : of K8 (B*H*SKP, D), block (BN, D), NaN rows past the valid keys.
    v_desc : of V8T (B*H*D, SKP), block (D, BN).
    """
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BN, 32])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, D, 32])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=4)
    srow: gl.constexpr = gl.SliceLayout(1, s_layout)
    orow: gl.constexpr = gl.SliceLayout(1, o_layout)
    ocol: gl.constexpr = gl.SliceLayout(0, o_layout)

    pid_m = gl.program_id(0)
    bh = gl.program_id(1)
    b = bh // H
    h = bh % H
    n_keys = SK
    if HAS_KVL:
        n_keys = gl.load(KVL + b).to(gl.int32)
    n_tiles = (n_keys + BN - 1) // BN

    q_smem = gl.allocate_shared_memory(gl.float8e4nv, [BM, D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BN, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, D, BN], v_desc.layout)
    qbar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    kbar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    vbar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(qbar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(kbar.index(i), count=1)
        mbarrier.init(vbar.index(i), count=1)

    krow0 = bh * SKP
    vrow0 = bh * D
    mbarrier.expect(qbar, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [bh * SQP + pid_m * BM, 0], qbar, q_smem)
    for i in gl.static_range(STAGES):
        _load_kv(k_desc, v_desc, k_smem, v_smem, kbar, vbar, i, i, krow0, vrow0, i < n_tiles, BN)

    qe = gl.load(QE + bh * (SQP // 128) + (pid_m * BM) // 128)  # Q's exponent per 128-row tile
    KE_row = KE + bh * (SKP // BN)
    rows = pid_m * BM + gl.arange(0, BM, layout=srow)
    row_ok = rows < SQ
    zero_s = gl.zeros([BM, BN], gl.float32, s_layout)

    o = gl.zeros([BM, D], gl.float32, o_layout)
    l = gl.zeros([BM], gl.float32, srow)
    m = gl.full([BM], float("-inf"), gl.float32, srow)
    nrows = pid_m * 0
    ntiles = pid_m * 0
    if n_keys > 0:
        # Tile 0: the frozen reference (Algorithm 1 line 2), then Stage-A/B.
        mbarrier.wait(qbar, 0)
        mbarrier.wait(kbar.index(0), 0)
        s = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(0, deps=(s,))
        e0 = qe + gl.load(KE_row)
        m = gl.ceil(gl.max(s, axis=1) * _pow2(e0 + 7)) * (1.0 / 128.0)
        c = (MAGIC + D_BITS + 128.0 * SIGMA) - 128.0 * m
        p, l = _stage_a(s, _pow2(e0 + 7), c)
        for j in range(1, n_tiles):
            slot = j % STAGES
            prev = (j - 1) % STAGES
            mbarrier.wait(kbar.index(slot), (j // STAGES) & 1)
            s = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), zero_s, use_acc=False, is_async=True)
            pa = _stage_b(p, p_layout, BM, BN, PERM)  # Stage-B of tile j-1 under the score GEMM of tile j
            mbarrier.wait(vbar.index(prev), ((j - 1) // STAGES) & 1)
            o = warpgroup_mma(pa, v_smem.index(prev).permute((1, 0)), o, is_async=True)
            s = warpgroup_mma_wait(1, deps=(s,))  # S_j has landed; the PV GEMM may still run
            e_t = qe + gl.load(KE_row + j)
            amax = gl.max(s, axis=1)
            fire = amax > (m + CAP) * _pow2(-e_t)  # gate on the raw block maxima (Algorithm 1 line 8)
            anyfire = gl.max(fire.to(gl.int32), axis=0) > 0
            # Stage-A with the current reference; p and psum pass through the wait so that this work is
            # scheduled under the PV GEMM (ptxas would otherwise hoist the wait above it).
            p, psum = _stage_a(s, _pow2(e_t + 7), c)
            o, p, psum = warpgroup_mma_wait(0, deps=(o, p, psum))
            if anyfire:  # rare rollback (lines 8-13), after the PV GEMM has landed: new reference, redo Stage-A
                delta = gl.where(fire, gl.ceil(amax * _pow2(e_t) - m), 0.0)
                m = m + delta
                c = c - 128.0 * delta
                down = gl.exp2(-delta)
                l = l * down
                o = o * gl.convert_layout(down, orow)[:, None]
                nrows += gl.sum((fire & row_ok).to(gl.int32), axis=0)
                ntiles += 1
                p, psum = _stage_a(s, _pow2(e_t + 7), c)
            l = l + psum
            _load_kv(k_desc, v_desc, k_smem, v_smem, kbar, vbar, prev, j - 1 + STAGES, krow0, vrow0,
                     j - 1 + STAGES < n_tiles, BN)
        last = (n_tiles - 1) % STAGES
        pa = _stage_b(p, p_layout, BM, BN, PERM)
        mbarrier.wait(vbar.index(last), ((n_tiles - 1) // STAGES) & 1)
        o = warpgroup_mma(pa, v_smem.index(last).permute((1, 0)), o, is_async=True)
        o = warpgroup_mma_wait(0, deps=(o,))
    mbarrier.invalidate(qbar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(kbar.index(i))
        mbarrier.invalidate(vbar.index(i))

    dcol = gl.arange(0, D, layout=ocol)
    orows = pid_m * BM + gl.arange(0, BM, layout=orow)
    vs = gl.load(VS + bh * D + dcol)
    inv = gl.convert_layout(gl.where(l > 0, 1.0 / l, 0.0), orow)
    out = o * inv[:, None] * vs[None, :]
    optr = (OUT + b.to(gl.int64) * sob + h.to(gl.int64) * soh + orows[:, None].to(gl.int64) * sos
            + dcol[None, :] * sod)
    gl.store(optr, out.to(OUT.dtype.element_ty), mask=(orows < SQ)[:, None])
    if WRITE_LSE:
        lse = (gl.log2(l) - SIGMA + m) * 0.6931471805599453
        gl.store(LSE + bh.to(gl.int64) * SQ + rows, lse, mask=row_ok)
    if ntiles > 0:
        gl.atomic_add(STATS, nrows)
        gl.atomic_add(STATS + 1, ntiles)

"""Fused-Softmax attention forward in Gluon for Hopper (sm_90), the mxfp8 recipe (P per-row FP8): two free-running
warpgroups, each owning 64 query rows of the program's 128-row tile, every wgmma asynchronous and waited for
explicitly, so that the softmax of key tile j runs while the tensor cores work on the PV GEMM of tile j-1.

Per key tile j a warpgroup (tiles visited in ``Recipe.key_order``: from tile 0, or ``DIAGONAL`` from tile
``j0 = floor(pid_m * n_tiles / n_query_tiles)`` on, wrapping; :func:`fsattn_diffusers.numerics.key_tile_order`):

    issue S_j = Q K_j^T; issue l_j = P8_{j-1} @ ones; issue O += P8_{j-1} V_{j-1}        (async)
    wait for S_j and l_j; l += l_j (fp32, registers)
    gate on the raw block maxima of S_j (Algorithm 1 line 8; a per-warp vote, no barrier), or lower the reference
    Stage-A of S_j: one FMA and a clamp give fp32 words whose low 16 bits are the FP16 proxy of P * 2^sigma
    wait for the PV GEMM; release the K/V slot (warpgroup 1 refills it by TMA)
    rare rollback: new reference for the fired rows, O and l rescaled, Stage-A redone
    Stage-B: PRMT + cvt f16x2 -> e4m3x2, P8_j carried to iteration j+1 as int32 words of four E4M3 bytes

Numerics (sm90_numerics differences 5 and 7): the FP16-layout proxy and ``l`` summed over the E4M3 P on the tensor
cores, one key tile per wgmma (accumulating ``l`` across all key tiles in the wgmma accumulator lost up to 40% of it
at 32768 keys on the H200: FP8 wgmma accumulation is not fp32-exact), added in fp32. Keys past ``kv_lens`` are E4M3
NaN in K8 (pre-pass ``nan_pad``): their scores are NaN, which the gate, the frozen maximum and Stage-A's clamp drop
(``maximum`` returns the non-NaN operand), so no tile needs a mask.

Design choices (H200; docs/design.md, "Kernel structure"): no "turn" barrier between the two warpgroups (with one,
the two softmaxes alternated instead of overlapping, 5% slower); the FP16-layout proxy and the row sum on the tensor
cores (~526 -> ~418 instructions per steady-state tile); the gate's vote per warp (``vote.sync``) instead of a
warpgroup-wide reduction (two BAR.SYNC per tile, ~5%); one mbarrier for the K and V of a tile.

Rollback statistics: ``STATS[0]`` counts rows; the (128-row tile, key tile) pairs with a rollback are bits of ``FLAGS``
(``NKW`` int32 words per (batch x head, query tile); ``NKW = 0`` records none), which the host counts, since the two
warpgroups of a tile roll back independently.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from fsattn_diffusers import sm90_numerics
from fsattn_diffusers.exponent import LN2 as _LN2

from ..common import RNE_MAGIC
from .constants import KEY_TERM_COLS, QX_MAX_LOG2, QX_MIN_LOG2
from .gluon_key_loop import (_key_tile, _lowering_trigger, _record_rollback, _rollback_reference, _runs_this_launch,
                             _warp_any, _warp_vote_declare)
from .gluon_mxfp6_p import D_BITS, block_max, stage_a_mxfp6, stage_b_mxfp6

# Rows of the query tile per warpgroup (wgmma's M).
WG_ROWS = gl.constexpr(64)
# Columns of the ones operand of the tensor-core row sum (wgmma's smallest N).
ONES_N = gl.constexpr(8)
# f = MAGIC + pattern keeps the pattern (< 2^22) in the low mantissa bits, rounded half-even (common.RNE_MAGIC).
MAGIC = RNE_MAGIC
# 1024 * (15 - eps') with eps' = 7/128: Schraudolph's bias on FP16's 1/1024 grid (paper eps = 0.05798, Section 4.2;
# sm90_numerics.D_BITS_F16).
D_BITS_F16 = gl.constexpr(float(sm90_numerics.D_BITS_F16))
LN2 = gl.constexpr(_LN2)
# Stage-A grid: 2^10 steps per doubling (FP16's mantissa).
GRID_LOG2 = gl.constexpr(10)


@gluon.jit
def _pow2(e):
    """2^e for an int32 exponent in the normal range (bit construction)."""
    return ((e + 127) << 23).to(gl.float32, bitcast=True)


@gluon.jit
def _stage_a(s, s1024, c):
    """Stage-A: fp32 words whose low 16 bits are the FP16 pattern of P * 2^sigma (upper bits MAGIC's)."""
    return gl.maximum(s * s1024 + c[:, None], MAGIC)


@gluon.jit
def _perm_a_fragment(p, BM: gl.constexpr, BN: gl.constexpr):
    """P's key columns in the FP8 A-fragment order (kernels.sm90.fused_attention._perm_p; V8T is stored to match)."""
    return gl.reshape(gl.permute(gl.reshape(p, [BM, BN // 16, 2, 2, 2, 2]), [0, 1, 3, 4, 2, 5]), [BM, BN])


@gluon.jit
def a_fragment_quads(f, p_layout: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr):
    """``(e0, e1, e2, e3)``, each (BM, BN // 4): the elements ``4 w + i`` of the (BM, BN) tile ``f`` with its key
    columns permuted as :func:`_perm_a_fragment`, in ``p_layout`` order: the four bytes of word ``w`` of the E4M3 PV
    operand."""
    f = gl.convert_layout(_perm_a_fragment(f, BM, BN), p_layout)
    lo, hi = gl.split(gl.reshape(f, [BM, BN // 4, 2, 2]))  # elements (0, 2) and (1, 3) of each group of four
    e0, e2 = gl.split(lo)
    e1, e3 = gl.split(hi)
    return e0, e1, e2, e3


@gluon.jit
def _stage_b_words(f, p_layout: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr):
    """Stage-B: the E4M3 PV operand (:func:`a_fragment_quads`) as int32 words of four E4M3 bytes, shape
    (BM, BN // 4): per word two PRMT (two FP16 patterns into one f16x2 register) and two
    ``cvt.rn.satfinite.e4m3x2.f16x2``. Byte ``i`` of a word is P's element ``4 w + i`` in ``p_layout`` order.
    A loop-carried FP8 tensor would be kept as one byte per register and repacked before the GEMM."""
    e0, e1, e2, e3 = a_fragment_quads(f, p_layout, BM, BN)
    return gl.inline_asm_elementwise(
        "{ .reg .b32 a, b; .reg .b16 lo, hi; prmt.b32 a, $1, $2, 0x5410; prmt.b32 b, $3, $4, 0x5410; "
        "cvt.rn.satfinite.e4m3x2.f16x2 lo, a; cvt.rn.satfinite.e4m3x2.f16x2 hi, b; mov.b32 $0, {lo, hi}; }",
        "=r,f,f,f,f", [e0, e1, e2, e3], dtype=gl.int32, is_pure=True, pack=1)


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
def _load_kv(k_desc, v_desc, kx_desc, k_smem, v_smem, kx_smem, kvbar, slot, tile, krow0, vrow0, pred,
             BN: gl.constexpr, KEY_TERM: gl.constexpr):
    """K and V (``KEY_TERM``: and the key term's Kx) of key tile ``tile`` into ``slot``, all on the slot's one mbarrier
    (one expect, one wait per tile; separate K and V barriers cost an expect, a BAR.SYNC and a wait more per tile)."""
    if KEY_TERM:
        nbytes: gl.constexpr = k_desc.block_type.nbytes + v_desc.block_type.nbytes + kx_desc.block_type.nbytes
    else:
        nbytes: gl.constexpr = k_desc.block_type.nbytes + v_desc.block_type.nbytes
    mbarrier.expect(kvbar.index(slot), nbytes, pred=pred)
    tma.async_copy_global_to_shared(k_desc, [krow0 + tile * BN, 0], kvbar.index(slot), k_smem.index(slot), pred=pred)
    tma.async_copy_global_to_shared(v_desc, [vrow0, tile * BN], kvbar.index(slot), v_smem.index(slot), pred=pred)
    if KEY_TERM:
        tma.async_copy_global_to_shared(kx_desc, [krow0 + tile * BN, 0], kvbar.index(slot), kx_smem.index(slot),
                                        pred=pred)


@gluon.jit
def _issue_scores(qs, k_tile, qx_tile, kx_tile, zero_s, KEY_TERM: gl.constexpr):
    """Issue ``S = Q K^T`` (async). With ``KEY_TERM`` Q smoothing's key term comes first and the score GEMM is chained
    on it, ``S = Qx Kx^T + Q K^T``: the term's 28 equal lead products and its refinements are summed into a zero
    accumulator, at their own magnitude. FP8 wgmma accumulation keeps about 13 mantissa bits below the largest
    exponent of what it adds, so chained the other way (the term onto the scores) every lead product was cut alike at
    the scores' magnitude, and a term small beside the scores lost a large share of itself (H200 fuzz: 2.0-2.6% from
    the sm90 reference, where the triton kernel, which adds the term in fp32, was 0.4-0.8% on the same inputs)."""
    if KEY_TERM:
        s = warpgroup_mma(qx_tile, kx_tile.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        return warpgroup_mma(qs, k_tile.permute((1, 0)), s, is_async=True)
    else:
        return warpgroup_mma(qs, k_tile.permute((1, 0)), zero_s, use_acc=False, is_async=True)


@gluon.jit
def _stage_a_any(s, bmax, e, c, P_MX: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr):
    """Stage-A of tile scores ``s`` (raw GEMM units ``2^-e``): fp8_row P on the FP16 grid (``e128`` unused), MXFP6 P
    on the BF16 grid with one constant per 32-key block (kernels.sm90.gluon_mxfp6_p)."""
    if P_MX:
        return stage_a_mxfp6(s, bmax, _pow2(e + 7), c, BM, BN)
    else:
        return _stage_a(s, _pow2(e + GRID_LOG2), c), c.to(gl.int32)


@gluon.jit
def _stage_b_any(p, e128, p_layout: gl.constexpr, P_MX: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr):
    """Stage-B: ``(words, psum)``, the E4M3 PV operand as int32 words and (MXFP6 P) the row sum of the MXFP6 values;
    fp8_row P's row sum is taken on the tensor cores (``psum`` 0)."""
    if P_MX:
        return stage_b_mxfp6(p, e128, p_layout, BM, BN, _perm_a_fragment)
    else:
        return _stage_b_words(p, p_layout, BM, BN), e128.to(gl.float32) * 0.0


@gluon.jit
def _tile_peaks(s, P_MX: gl.constexpr, srow: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr):
    """``(row maxima (BM,) in srow, block maxima)`` of raw scores ``s``; the block maxima (MXFP6 P's scales) only
    with ``P_MX`` (else the row maxima again)."""
    if P_MX:
        bmax = block_max(s, BM, BN)
        return gl.convert_layout(gl.max(bmax, axis=1), srow), bmax
    else:
        xm = gl.max(s, axis=1)
        return xm, xm


@gluon.jit
def _issue_pv(pa, v_tile, o, ot, zero_o, visit, O_PROMOTE: gl.constexpr):
    """Issue the PV GEMM of key visit ``visit`` (async): ``(o, ot)`` with the pending accumulator in one of them.

    ``O_PROMOTE`` key tiles per fp32 promotion of O (``Recipe.o_promotion_tiles``; NUMERICS.md section 6): 1 sums each
    tile's product in a zero accumulator, added to O in fp32 after the wait; ``n`` > 1 chains the products of ``n``
    consecutive visits in one accumulator (``ot``, zeroed at every ``n``-th visit) before adding it; 0 chains every
    tile onto O itself. The FP8 wgmma keeps about 13 bits below the largest exponent it adds, so a chain onto a
    growing sum cuts each later product at the sum's magnitude (numerics_accumulation)."""
    if O_PROMOTE == 0:
        o = warpgroup_mma(pa, v_tile.permute((1, 0)), o, is_async=True)
    elif O_PROMOTE == 1:
        ot = warpgroup_mma(pa, v_tile.permute((1, 0)), zero_o, use_acc=False, is_async=True)
    else:
        ot = warpgroup_mma(pa, v_tile.permute((1, 0)), ot, use_acc=visit % O_PROMOTE != 0, is_async=True)
    return o, ot


@gluon.jit
def _wait_pv(o, ot, p, visit, O_PROMOTE: gl.constexpr, LAST: gl.constexpr = False):
    """Wait for every pending wgmma (``p`` rides along as a dependency) and promote: O += the chunk's sum after the
    last visit of a chunk of ``O_PROMOTE`` (:func:`_issue_pv`), and after the last visit (``LAST``). Returns
    ``(o, ot, p)``."""
    if O_PROMOTE == 0:
        o, p = warpgroup_mma_wait(0, deps=(o, p))
    else:
        ot, p = warpgroup_mma_wait(0, deps=(ot, p))
        if O_PROMOTE == 1 or LAST:
            o = o + ot
        elif (visit + 1) % O_PROMOTE == 0:
            o = o + ot
    return o, ot, p


@gluon.jit
def _consumer(WG: gl.constexpr, KEY_TERM: gl.constexpr, P_MX: gl.constexpr, DIAGONAL: gl.constexpr,
              O_PROMOTE: gl.constexpr, q_smem, qbar,
              k_smem, v_smem, kvbar,
              empty, ones_smem, onesbar, qx_smem, kx_smem, k_desc, v_desc, kx_desc, QE, KE, VS, OUT, LSE, STATS,
              FLAGS, NKW, pid_m, bh, b, h, n_keys, j0, sob, soh, sos, sod, SQ, SQP, SKP, WRITE_LSE, CAP, FLOOR,
              SIGMA, M_OFFSET):
    """One warpgroup: rows ``pid_m * 128 + WG * 64 + [0, 64)`` against every key tile of (batch, head) ``bh``, from
    key tile ``j0`` on (wrapping around; the loop counter ``j`` counts visits, :func:`_key_tile` gives the tile).
    ``KEY_TERM``: Q smoothing's per-key term enters the score GEMM as a K = 32 wgmma the score GEMM is chained on,
    ``S_j = Qx Kx_j^T + Q K_j^T`` (:func:`_issue_scores`; sm90_numerics difference 9; ``qx_smem`` the query tile's
    power of two, ``kx_smem`` the key tiles' E4M3 terms), before the maximum, the gate and Stage-A. ``P_MX``: MXFP6 P
    (kernels.sm90.gluon_mxfp6_p; the row sum in registers), else fp8_row P (the row sum on the tensor cores).

    Both partitions run this function; ``WG``, ``KEY_TERM``, ``P_MX`` and ``DIAGONAL`` reach it as ``gl.constexpr``
    arguments. The tile sizes come from the shared-memory shapes, and ``WRITE_LSE``, ``CAP``, ``FLOOR``, ``SIGMA``,
    ``M_OFFSET`` arrive as runtime scalars (the partition call materializes the kernel's constexprs). ``FLOOR``
    (doublings, ``inf``: never) lowers the reference when a key tile's peak lies that far below it
    (``Recipe.rollback_floor_log2``); ``M_OFFSET`` (doublings) raises the frozen reference
    (``Recipe.frozen_max_offset_log2``).
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
    scol: gl.constexpr = gl.SliceLayout(0, s_layout)
    orow: gl.constexpr = gl.SliceLayout(1, o_layout)
    ocol: gl.constexpr = gl.SliceLayout(0, o_layout)
    lrow: gl.constexpr = gl.SliceLayout(1, l_layout)
    BM: gl.constexpr = WG_ROWS
    # Stage-A's grid (steps per doubling) and Schraudolph's bias on it: FP16's for fp8_row P, BF16's for MXFP6 P.
    GRID: gl.constexpr = 128.0 if P_MX else 1024.0
    BIAS_BITS: gl.constexpr = D_BITS if P_MX else D_BITS_F16

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
    zero_o = gl.zeros([BM, D], gl.float32, o_layout)
    ot = zero_o  # the FP8 wgmma's accumulator of the current chunk of O_PROMOTE key tiles
    l = gl.zeros([BM], gl.float32, srow)  # MXFP6 P: the row sum; fp8_row P: set from lsum after the loop
    lt = gl.zeros([BM, ONES_N], gl.float32, l_layout)  # one key tile's P8 @ ones (every column the row sum)
    lsum = gl.zeros([BM, ONES_N], gl.float32, l_layout)  # their fp32 sum
    m = gl.full([BM], float("-inf"), gl.float32, srow)
    nfired = gl.zeros([BM], gl.int32, srow)  # rollbacks per row (summed after the loop)
    _warp_vote_declare(WG)
    if n_keys > 0:
        mbarrier.wait(qbar.index(WG), 0)
        mbarrier.wait(kvbar.index(0), 0)
        if not P_MX:
            mbarrier.wait(onesbar.index(0), 0)
        if KEY_TERM:
            mbarrier.wait(onesbar.index(1), 0)  # the Qx tile
        s = _issue_scores(qs, k_smem.index(0), qx_smem, kx_smem.index(0), zero_s, KEY_TERM)
        s = warpgroup_mma_wait(0, deps=(s,))
        e0 = qe + gl.load(KE_row + j0)
        xm, bmax = _tile_peaks(s, P_MX, srow, BM, BN)
        m = gl.ceil(xm * _pow2(e0 + 7)) * (1.0 / 128.0) + M_OFFSET  # the frozen reference (Algorithm 1)
        m_high = m  # the row's highest reference (bounds a lowering)
        lo = _lowering_trigger(m, m_high, FLOOR)
        low_before = m != m  # all False: the first tile set the reference
        c = (MAGIC + BIAS_BITS + GRID * SIGMA) - GRID * m  # exact: m is on the 1/128 grid
        p, e128 = _stage_a_any(s, bmax, e0, c, P_MX, BM, BN)
        pw, psum = _stage_b_any(p, e128, p_layout, P_MX, BM, BN)
        if P_MX:
            l = l + gl.convert_layout(psum, srow)
        for j in range(1, n_tiles):
            slot = j % STAGES
            prev = (j - 1) % STAGES
            pa = _words_to_fp8(pw, p_layout, BM, BN)  # Stage-B of tile j-1 was done at the end of iteration j-1
            mbarrier.wait(kvbar.index(slot), (j // STAGES) & 1)  # K_j and V_j (V_{j-1} was waited for with K_{j-1})
            s = _issue_scores(qs, k_smem.index(slot), qx_smem, kx_smem.index(slot), zero_s, KEY_TERM)
            if not P_MX:
                lt = warpgroup_mma(pa, ones, lt, use_acc=False, is_async=True)  # before the PV GEMM: waited with S_j
            # P V of tile j-1 (_issue_pv: into the chunk accumulator, added to O in fp32 every O_PROMOTE tiles)
            o, ot = _issue_pv(pa, v_smem.index(prev), o, ot, zero_o, j - 1, O_PROMOTE)
            if P_MX:
                s = warpgroup_mma_wait(1, deps=(s,))
            else:
                s, lt = warpgroup_mma_wait(1, deps=(s, lt))
                lsum = lsum + lt
            t = _key_tile(j, j0, n_tiles, DIAGONAL)
            e_t = qe + gl.load(KE_row + t)
            xm, bmax = _tile_peaks(s, P_MX, srow, BM, BN)
            xmax = xm * _pow2(e_t)  # the tile's row peaks in doublings (exact scaling)
            low = xmax < lo
            fire = (xmax > m + CAP) | (low & low_before)  # gate (Algorithm 1 line 8), or a second low tile in a row
            low_before = low
            anyfire = _warp_any(fire, WG)  # this warp only
            p, e128 = _stage_a_any(s, bmax, e_t, c, P_MX, BM, BN)
            if O_PROMOTE > 1:  # Stage-B before the wait: P's 16 words instead of its 64 beside the pending chunk
                pw, psum = _stage_b_any(p, e128, p_layout, P_MX, BM, BN)
                o, ot, pw = _wait_pv(o, ot, pw, j - 1, O_PROMOTE)
            else:
                o, ot, p = _wait_pv(o, ot, p, j - 1, O_PROMOTE)
            mbarrier.arrive(empty.index(prev))  # this warpgroup is done with K/V of tile j-1
            if WG == 1:  # refill the slot once both warpgroups have released it
                mbarrier.wait(empty.index(prev), ((j - 1) // STAGES) & 1)
                _load_kv(k_desc, v_desc, kx_desc, k_smem, v_smem, kx_smem, kvbar, prev,
                         _key_tile(j - 1 + STAGES, j0, n_tiles, DIAGONAL), krow0, vrow0, j - 1 + STAGES < n_tiles,
                         BN, KEY_TERM)
            if anyfire:  # rare rollback (per warp; nothing in here may synchronize threads): new reference for the
                # fired rows (up, or down by a lowering), O and l rescaled, Stage-A redone
                m, m_high, lo, c, down = _rollback_reference(fire, xmax, m, m_high, c, FLOOR, GRID)
                if P_MX:
                    l = l * down
                else:
                    lsum = lsum * gl.convert_layout(down, lrow, assert_trivial=True)[:, None]
                o = o * gl.convert_layout(down, orow, assert_trivial=True)[:, None]
                if O_PROMOTE > 1:  # the chunk's partial sum (stale right after a promotion, then overwritten)
                    ot = ot * gl.convert_layout(down, orow, assert_trivial=True)[:, None]
                nfired = _record_rollback(nfired, fire, row_ok, FLAGS, NKW, bh, SQP, pid_m, t, rows)
                p, e128 = _stage_a_any(s, bmax, e_t, c, P_MX, BM, BN)
                if O_PROMOTE > 1:
                    pw, psum = _stage_b_any(p, e128, p_layout, P_MX, BM, BN)
            if O_PROMOTE <= 1:  # here, the GEMM issue window holds no conversion
                pw, psum = _stage_b_any(p, e128, p_layout, P_MX, BM, BN)
            if P_MX:
                l = l + gl.convert_layout(psum, srow)
        last = (n_tiles - 1) % STAGES  # the slot of the last visit
        pa = _words_to_fp8(pw, p_layout, BM, BN)
        if not P_MX:
            lt = warpgroup_mma(pa, ones, lt, use_acc=False, is_async=True)
        o, ot = _issue_pv(pa, v_smem.index(last), o, ot, zero_o, n_tiles - 1, O_PROMOTE)
        if P_MX:
            o, ot, l = _wait_pv(o, ot, l, n_tiles - 1, O_PROMOTE, True)
        else:
            o, ot, lt = _wait_pv(o, ot, lt, n_tiles - 1, O_PROMOTE, True)
            l = gl.convert_layout(gl.max(lsum + lt, axis=1), srow)  # every column holds the row sum

    dcol = gl.arange(0, D, layout=ocol)
    orows = row0 + gl.arange(0, BM, layout=orow)
    vs = gl.load(VS + bh * D + dcol)
    inv = gl.convert_layout(gl.where(l > 0, 1.0 / l, 0.0), orow)
    out = o * inv[:, None] * vs[None, :]
    optr = (OUT + b.to(gl.int64) * sob + h.to(gl.int64) * soh + orows[:, None].to(gl.int64) * sos
            + dcol[None, :] * sod)
    gl.store(optr, out.to(OUT.dtype.element_ty), mask=(orows < SQ)[:, None])
    lse = (gl.log2(l) - SIGMA + m) * LN2  # stored only when asked (a runtime flag here)
    gl.store(LSE + bh.to(gl.int64) * SQ + rows, lse, mask=row_ok & (WRITE_LSE != 0))
    nrows = gl.sum(nfired, axis=0)
    if nrows > 0:
        gl.atomic_add(STATS, nrows)


@gluon.jit
def fsattn_fwd_gluon_pingpong_kernel(q_desc, k_desc, v_desc, ones_desc, qx_desc, kx_desc, QE, KE, VS, KG, TSEL, OUT,
                                     LSE, STATS, FLAGS, NKW, KVL, sob, soh, sos, sod, H, SQ, SK, SQP, SKP,
                                     D: gl.constexpr, BN: gl.constexpr, HAS_KVL: gl.constexpr,
                                     WRITE_LSE: gl.constexpr, CAP: gl.constexpr, FLOOR: gl.constexpr,
                                     SIGMA: gl.constexpr,
                                     STAGES: gl.constexpr, REGS: gl.constexpr, KEY_TERM: gl.constexpr = False,
                                     TERM_SEL: gl.constexpr = False, P_MX: gl.constexpr = False,
                                     DIAGONAL: gl.constexpr = False, M_OFFSET: gl.constexpr = 0.0,
                                     O_PROMOTE: gl.constexpr = 1):
    """One (128-row query tile, batch x head) per program, launched with 4 warps (+4 in the worker partition).

    q_desc : TMA descriptor of Q8 viewed as (B*H*SQP, D), block (64, D).
    k_desc : of K8 (B*H*SKP, D), block (BN, D), NaN rows past the valid keys.
    v_desc : of V8T (B*H*D, SKP), block (D, BN), keys permuted into the FP8 A-fragment order.
    ones_desc : of an (8, BN) E4M3 tensor of ones, block (8, BN): the row sum's B operand.
    qx_desc : (``KEY_TERM``) of the key term's table of A tiles (kernels.sm90.ops._qx_table), block (64, 32); KG (B*H)
        int32 the shift G: the tile ``2^(-QE - G)`` is loaded, or the zero tile below 2^QX_MIN_LOG2.
    kx_desc : (``KEY_TERM``) of Kx (B*H*SKP, 32) E4M3, block (BN, 32): the key term's B operand.
    Without ``KEY_TERM`` both may be any descriptor (ones_desc); they are not read.
    TSEL : (``TERM_SEL``) (B*H) int32, Q smoothing's per-slice switch (kernels.token_mean): launched with ``KEY_TERM``
        False, then True, a slice works only in the launch of its setting (the term is 0 where TSEL is 0).
    DIAGONAL : ``Recipe.key_order == "diagonal"``: query tile ``pid_m`` visits the key tiles from
        ``floor(pid_m * n_tiles / (SQP / 128))`` on (``n_tiles`` those holding valid keys), else from tile 0.
    M_OFFSET : doublings added to the frozen reference (``Recipe.frozen_max_offset_log2``, a multiple of 1/128).
    O_PROMOTE : key tiles per fp32 promotion of O (``Recipe.o_promotion_tiles``; 0: never), :func:`_issue_pv`.
    """
    pid_m = gl.program_id(0)
    bh = gl.program_id(1)
    b = bh // H
    h = bh % H
    n_keys = SK
    if HAS_KVL:
        n_keys = gl.load(KVL + b).to(gl.int32)
    n_tiles = (n_keys + BN - 1) // BN
    j0 = n_tiles * 0
    if DIAGONAL:
        j0 = (pid_m * n_tiles) // (SQP // 128)

    if _runs_this_launch(TSEL, bh, KEY_TERM, TERM_SEL):
        q_smem = gl.allocate_shared_memory(gl.float8e4nv, [2, WG_ROWS, D], q_desc.layout)
        k_smem = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BN, D], k_desc.layout)
        v_smem = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, D, BN], v_desc.layout)
        qbar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        kvbar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        ones_smem = gl.allocate_shared_memory(gl.float8e4nv, [ONES_N, BN], ones_desc.layout)
        if KEY_TERM:
            qx_smem = gl.allocate_shared_memory(gl.float8e4nv, [WG_ROWS, KEY_TERM_COLS], qx_desc.layout)
            kx_smem = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BN, KEY_TERM_COLS], kx_desc.layout)
        else:  # not allocated (never read)
            qx_smem = ones_smem
            kx_smem = k_smem
        onesbar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())  # the ones tile, the Qx tile
        mbarrier.init(onesbar.index(0), count=1)
        mbarrier.init(onesbar.index(1), count=1)
        for i in gl.static_range(2):
            mbarrier.init(qbar.index(i), count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(kvbar.index(i), count=1)
            mbarrier.init(empty.index(i), count=2)
        fence_async_shared()

        for i in gl.static_range(2):
            mbarrier.expect(qbar.index(i), q_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(q_desc, [bh * SQP + pid_m * 128 + i * WG_ROWS, 0], qbar.index(i),
                                            q_smem.index(i))
        # the ones tile of the tensor-core row sum (fp8_row P), by TMA (a ones tile stored to shared memory from
        # registers gave row sums at half their value on the H200). Not with MXFP6 P: its partitions never read the
        # tile, so the allocator gave its bytes to the partitions' captured arguments, and the late TMA write replaced
        # the captured key count (kv_lens) with E4M3 ones: the partitions then waited for key tiles that were never
        # loaded (a hang on the H200).
        if not P_MX:
            mbarrier.expect(onesbar.index(0), ones_desc.block_type.nbytes, pred=n_tiles > 0)
            tma.async_copy_global_to_shared(ones_desc, [0, 0], onesbar.index(0), ones_smem, pred=n_tiles > 0)
        if KEY_TERM:  # the query tile's Qx = 2^(-QE - G) (sm90_numerics difference 9), or the zero tile
            v = -gl.load(QE + bh * (SQP // 128) + pid_m) - gl.load(KG + bh)
            qx_tile = gl.where(v < QX_MIN_LOG2, QX_MAX_LOG2 - QX_MIN_LOG2 + 1,
                               gl.minimum(v, QX_MAX_LOG2) - QX_MIN_LOG2)
            mbarrier.expect(onesbar.index(1), qx_desc.block_type.nbytes, pred=n_tiles > 0)
            tma.async_copy_global_to_shared(qx_desc, [qx_tile * WG_ROWS, 0], onesbar.index(1), qx_smem,
                                            pred=n_tiles > 0)
        for i in gl.static_range(STAGES):
            _load_kv(k_desc, v_desc, kx_desc, k_smem, v_smem, kx_smem, kvbar, i, _key_tile(i, j0, n_tiles, DIAGONAL),
                     bh * SKP, bh * D, i < n_tiles, BN, KEY_TERM)

        args = (q_smem, qbar, k_smem, v_smem, kvbar, empty, ones_smem, onesbar, qx_smem, kx_smem, k_desc, v_desc,
                kx_desc, QE, KE, VS, OUT, LSE, STATS, FLAGS, NKW, pid_m, bh, b, h, n_keys, j0, sob, soh, sos, sod, SQ,
                SQP, SKP, WRITE_LSE, CAP, FLOOR, SIGMA, M_OFFSET)
        # one partition per 64-row warpgroup, both running _consumer (WG, KEY_TERM, P_MX, DIAGONAL as constexprs)
        gl.warp_specialize([(_consumer, (gl.constexpr(0), KEY_TERM, P_MX, DIAGONAL, O_PROMOTE) + args),
                            (_consumer, (gl.constexpr(1), KEY_TERM, P_MX, DIAGONAL, O_PROMOTE) + args)], [4], [REGS])

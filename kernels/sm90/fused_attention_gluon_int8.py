"""Fused-Softmax attention forward in Gluon for Hopper (sm_90), the INT8 Q/K tiers: INT8 scores exact in int32, and
either Stage-A's BF16 proxy itself as the PV operand with V in BF16 (preset ``int8-bf16``) or (``PV_FP8``, preset
``int8-fp8``) P and V in FP8 E4M3.

The structure is :mod:`kernels.sm90.fused_attention_gluon_pingpong`'s (two free-running 64-row warpgroups, every wgmma
asynchronous, the softmax of key tile j beside the PV GEMM of tile j-1, one mbarrier per K/V slot, the per-warp gate
vote, the rare rollback); its helpers are imported from there, Stage-A and P's words from
:mod:`kernels.sm90.gluon_int8_stage_a`. What differs, per key tile j:

    issue S_j = Q8 K8_j^T (s8 x s8 -> s32); issue l += P16_{j-1} @ ones; issue O += P16_{j-1} V16_{j-1}   (async)
    wait for S_j and l; scores as fp32, biased (one integer add: Xb = 1.5 2^23 + S_j), a_j = QS_row * KS_j
    gate on rowmax(S_j) a_j (per row), Stage-A (``EXP2``, below) gives ``P = 2^(S_j a_j - m)``
    wait for the PV GEMM; rare rollback; P16_j = two BF16 values per register, carried to iteration j+1

``PV_FP8`` (sm90_numerics differences 13, 14): Stage-A is ``ex2.approx.f32(fma(Xb, a_j, -k))`` with
``k = fma(a_j, 1.5 2^23, m - SIGMA)`` (:func:`~kernels.sm90.gluon_int8_stage_a._fma_rows`), i.e. ``P 2^SIGMA`` with
``SIGMA = 4`` under the gate's cap of 4 doublings, two ``cvt.rn.satfinite.e4m3x2.f32`` per word of four E4M3 bytes (key
columns in the FP8 A-fragment order, V8T stored to match); each tile's ``P8 @ ones`` and ``P8 V8`` go into zero
accumulators and are added to ``l`` and O in fp32 after their wait (the FP8 wgmma's accumulation is not fp32: chained
across key tiles it loses the small later products). V8 carries one scale per channel (``VS``), applied to O's columns
after ``1 / l``.

Stage-A with BF16 P (``EXP2``; sm90_numerics differences 10, 11, 14), one FMA per element on the biased scores, the
bias taken off by the tile's row constant ``k`` (one FMA per row and tile, one rounding). It is written ``x a - k``:
the compiler forms the steady tiles' Stage-A as one FFMA each but shares the product ``Xb a`` with the rollback
re-run and rounds it first there (FMUL + FADD; 256 of the 640 clamps of the plain build), a BF16 pattern one step off
where the two roundings differ. Written as explicit FMAs (``_fma_rows``, as with FP8 P, whose E4M3 rounding of a
row's dominant weight is sensitive to it) the same instructions ran 10-11% slower with outputs bit for bit the same
(docs/design.md, "The INT8 tiers' speed"):

- ``EXP2_SCHRAUDOLPH``: ``z = max(fma(Xb, 128 a_j, -k), MAGIC)`` with ``k = fma(128 a_j, 1.5 2^23, -c)``, whose low
  16 bits are the BF16 proxy pattern (grid 1/128 of a doubling, Schraudolph's bias ``D_BITS`` in ``c``); one PRMT packs
  two patterns.
- ``EXP2_HW``: ``ex2.approx.f32(fma(Xb, a_j, -k))`` with ``k = fma(a_j, 1.5 2^23, m - SIGMA)``, and
  ``cvt.rn.bf16x2.f32`` for two values (BF16 P).

Numerics: the int32 scores are exact (|S| < 127^2 D < 2^22); added to the bits of ``1.5 * 2^23`` they are exact fp32
values ``Xb``, and Stage-A's FMA takes the exact product ``Xb a`` (``k``'s rounding moves ``m`` per row and tile by
less than half its ulp: difference 14). Slices with Q smoothing's key term (difference 12; the tile's terms come by
TMA with its K/V slot) take the first tile's peaks from ``fma(S, a, b_j)``; with ``EXP2_HW`` Stage-A's argument is
``fma(Xb, a_j, -k) + b_j`` and a rolled-back row's P is scaled by ``2^-step``, with Schraudolph Stage-A runs on
``fma(S, a, b_j)``. BF16 products accumulate in fp32 on the tensor cores, so with BF16 P O and ``l`` are
chained in the wgmma accumulators across key tiles. Keys past ``kv_lens`` (K8 rows zero) are masked in the last key
tile only, which the natural key order peels off the loop. The reference is
:func:`fsattn_diffusers.backends.reference_attention` ("triton") with the recipe (``int8-bf16``, ``int8-fp8``).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from .fused_attention_gluon_pingpong import LN2, MAGIC, ONES_N, WG_ROWS
from .gluon_key_loop import (_key_tile, _lowering_trigger, _record_rollback, _rollback_reference, _runs_this_launch,
                             _warp_any, _warp_vote_declare)
from .gluon_int8_stage_a import (GRID, _mask_tail, _p_words, _row_peaks, _scores, _stage_a_again, _tile_stage_a,
                                 _with_key_term, _words_to_p)
from .gluon_mxfp6_p import D_BITS

@gluon.jit
def _issue_pv(pa, ones, v_tile, o, lacc, zero_o, zero_l, PV_FP8: gl.constexpr):
    """Issue the row sum and the PV GEMM of one key tile (async), the row sum first. BF16 P: chained onto ``lacc``
    and ``o`` in the accumulators, returns ``(o, lacc)``; FP8 P: into zero accumulators, returns the tile's
    ``(P8 V8, P8 @ ones)``, which the caller adds to O and ``l`` in fp32 after the wait."""
    if PV_FP8:
        lt = warpgroup_mma(pa, ones, zero_l, use_acc=False, is_async=True)
        ot = warpgroup_mma(pa, v_tile.permute((1, 0)), zero_o, use_acc=False, is_async=True)
        return ot, lt
    else:
        lacc = warpgroup_mma(pa, ones, lacc, is_async=True)
        o = warpgroup_mma(pa, v_tile, o, is_async=True)
        return o, lacc


@gluon.jit
def _load_kv(k_desc, v_desc, b_desc, k_smem, v_smem, b_smem, kvbar, slot, tile, bh, SKP, pred, BN: gl.constexpr,
             PV_FP8: gl.constexpr, HAS_BIAS: gl.constexpr):
    """K8 and V (V16 rows, or ``PV_FP8`` V8T columns) of key tile ``tile`` into ``slot``, and with ``HAS_BIAS`` the
    tile's key terms, on the slot's one mbarrier."""
    D: gl.constexpr = k_smem.shape[2]
    if HAS_BIAS:
        mbarrier.expect(kvbar.index(slot),
                        k_desc.block_type.nbytes + v_desc.block_type.nbytes + b_desc.block_type.nbytes, pred=pred)
        tma.async_copy_global_to_shared(b_desc, [bh * SKP + tile * BN], kvbar.index(slot), b_smem.index(slot),
                                        pred=pred)
    else:
        mbarrier.expect(kvbar.index(slot), k_desc.block_type.nbytes + v_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(k_desc, [bh * SKP + tile * BN, 0], kvbar.index(slot), k_smem.index(slot),
                                    pred=pred)
    if PV_FP8:
        tma.async_copy_global_to_shared(v_desc, [bh * D, tile * BN], kvbar.index(slot), v_smem.index(slot),
                                        pred=pred)
    else:
        tma.async_copy_global_to_shared(v_desc, [bh * SKP + tile * BN, 0], kvbar.index(slot), v_smem.index(slot),
                                        pred=pred)


@gluon.jit
def _key_step(j, o, lacc, m, m_high, lo, low_before, c, nfired, pw, WG: gl.constexpr, MASK: gl.constexpr,
              DIAGONAL: gl.constexpr, EXP2: gl.constexpr, HAS_BIAS: gl.constexpr, PV_FP8: gl.constexpr,
              SIGMA: gl.constexpr, qs, ones, k_smem, v_smem, b_smem, kvbar, empty, k_desc, v_desc, b_desc, KS_row, qsc,
              zero_s,
              zero_o, zero_l, rows, row_ok, FLAGS, NKW, pid_m, bh, n_keys, n_tiles, j0, SQP, SKP, CAP, FLOOR,
              p_layout: gl.constexpr, scol: gl.constexpr, orow: gl.constexpr, lrow: gl.constexpr):
    """Visit ``j`` of the key loop (:func:`_consumer`): issue S_j, l and O of tile j-1, gate, Stage-A, refill, rare
    rollback, P_j's words. ``MASK``: the visit's tile may hold keys past ``n_keys`` (checked at run time). Returns the
    loop-carried state ``(o, lacc, m, m_high, lo, low_before, c, nfired, pw)``."""
    STAGES: gl.constexpr = k_smem.shape[0]
    BN: gl.constexpr = k_smem.shape[1]
    BM: gl.constexpr = WG_ROWS
    slot = j % STAGES
    prev = (j - 1) % STAGES
    pa = _words_to_p(pw, p_layout, BM, BN, PV_FP8)
    mbarrier.wait(kvbar.index(slot), (j // STAGES) & 1)
    s = warpgroup_mma(qs, k_smem.index(slot).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    ov, lv = _issue_pv(pa, ones, v_smem.index(prev), o, lacc, zero_o, zero_l, PV_FP8)
    s, lv = warpgroup_mma_wait(1, deps=(s, lv))  # the row sum was issued before the PV GEMM
    if PV_FP8:
        lacc = lacc + lv
    else:
        lacc = lv
    t = _key_tile(j, j0, n_tiles, DIAGONAL)
    a = qsc * gl.load(KS_row + t)
    x = _scores(s)
    if MASK:
        x = _mask_tail(x, t, n_keys, BN, scol)
    # xmax: the row peaks in doublings (with Q smoothing's key term where HAS_BIAS)
    xmax, p, keep = _tile_stage_a(x, a, c, m, b_smem.index(slot), EXP2, HAS_BIAS, SIGMA, PV_FP8, scol)
    low = xmax < lo
    fire = (xmax > m + CAP) | (low & low_before)
    low_before = low
    anyfire = _warp_any(fire, WG)
    ov, p = warpgroup_mma_wait(0, deps=(ov, p))
    if PV_FP8:
        o = o + ov
    else:
        o = ov
    mbarrier.arrive(empty.index(prev))
    if WG == 1:
        mbarrier.wait(empty.index(prev), ((j - 1) // STAGES) & 1)
        _load_kv(k_desc, v_desc, b_desc, k_smem, v_smem, b_smem, kvbar, prev,
                 _key_tile(j - 1 + STAGES, j0, n_tiles, DIAGONAL), bh, SKP, j - 1 + STAGES < n_tiles, BN, PV_FP8,
                 HAS_BIAS)
    if anyfire:  # rare rollback (per warp): new reference for the fired rows, O and l rescaled, Stage-A redone
        m_gate = m
        m, m_high, lo, c, down = _rollback_reference(fire, xmax, m, m_high, c, FLOOR, GRID)
        lacc = lacc * gl.convert_layout(down, lrow, assert_trivial=True)[:, None]
        o = o * gl.convert_layout(down, orow, assert_trivial=True)[:, None]
        nfired = _record_rollback(nfired, fire, row_ok, FLAGS, NKW, bh, SQP, pid_m, t, rows)
        p = _stage_a_again(keep, p, a, c, m, m - m_gate, EXP2, HAS_BIAS, SIGMA, PV_FP8)
    return o, lacc, m, m_high, lo, low_before, c, nfired, _p_words(p, p_layout, BM, BN, EXP2, PV_FP8)


@gluon.jit
def _consumer(WG: gl.constexpr, DIAGONAL: gl.constexpr, EXP2: gl.constexpr, HAS_BIAS: gl.constexpr,
              PV_FP8: gl.constexpr, SIGMA: gl.constexpr, q_smem, qbar, k_smem, v_smem, b_smem, kvbar, empty,
              ones_smem, onesbar, k_desc, v_desc, b_desc, QS, KS, VS, OUT, LSE, STATS, FLAGS, NKW, pid_m, bh, b, h,
              n_keys, j0,
              sob, soh, sos, sod, SQ, SQP, SKP, WRITE_LSE, CAP, FLOOR, M_OFFSET):
    """One warpgroup: rows ``pid_m * 128 + WG * 64 + [0, 64)`` against every key tile of (batch, head) ``bh``
    (``kernels.sm90.fused_attention_gluon_pingpong._consumer``'s loop with INT8 scores, BF16 or ``PV_FP8`` P/V)."""
    STAGES: gl.constexpr = k_smem.shape[0]
    BN: gl.constexpr = k_smem.shape[1]
    D: gl.constexpr = k_smem.shape[2]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 32])
    if PV_FP8:  # the PV GEMM's K per instruction and the A operand's elements per 32-bit register
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, D, 32])
        l_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, ONES_N, 32])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=4)
    else:
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, D, 16])
        l_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, ONES_N, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    srow: gl.constexpr = gl.SliceLayout(1, s_layout)
    scol: gl.constexpr = gl.SliceLayout(0, s_layout)
    orow: gl.constexpr = gl.SliceLayout(1, o_layout)
    ocol: gl.constexpr = gl.SliceLayout(0, o_layout)
    lrow: gl.constexpr = gl.SliceLayout(1, l_layout)
    BM: gl.constexpr = WG_ROWS

    n_tiles = (n_keys + BN - 1) // BN
    qs = q_smem.index(WG)
    ones = ones_smem.permute((1, 0))
    KS_row = KS + bh * (SKP // BN)
    row0 = pid_m * 128 + WG * BM
    rows = row0 + gl.arange(0, BM, layout=srow)
    row_ok = rows < SQ
    qsc = gl.load(QS + bh * SQP + rows)  # Q's scale per row (alpha log2 e folded in)
    zero_s = gl.zeros([BM, BN], gl.int32, s_layout)
    zero_o = gl.zeros([BM, D], gl.float32, o_layout)  # PV_FP8: the zero accumulators of one tile's products
    zero_l = gl.zeros([BM, ONES_N], gl.float32, l_layout)

    o = gl.zeros([BM, D], gl.float32, o_layout)
    lacc = gl.zeros([BM, ONES_N], gl.float32, l_layout)  # P @ ones: every column the row sum
    m = gl.full([BM], float("-inf"), gl.float32, srow)
    nfired = gl.zeros([BM], gl.int32, srow)
    _warp_vote_declare(WG)
    if n_keys > 0:
        mbarrier.wait(qbar.index(WG), 0)
        mbarrier.wait(kvbar.index(0), 0)
        mbarrier.wait(onesbar.index(0), 0)
        s = warpgroup_mma(qs, k_smem.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(0, deps=(s,))
        a = qsc * gl.load(KS_row + j0)
        x = _mask_tail(_scores(s), j0, n_keys, BN, scol)
        if HAS_BIAS:  # the first tile's peaks from the scores in doublings, fma(S, a, b_j)
            peaks = _row_peaks(_with_key_term(x, a, b_smem.index(0), scol), a, True)
        else:
            peaks = _row_peaks(x, a, False)
        m = gl.ceil(peaks * 128.0) * (1.0 / 128.0) + M_OFFSET  # the frozen reference (Algorithm 1)
        m_high = m
        lo = _lowering_trigger(m, m_high, FLOOR)
        low_before = m != m
        c = (MAGIC + D_BITS) - GRID * m  # exact: m is on the 1/128 grid
        p = _tile_stage_a(x, a, c, m, b_smem.index(0), EXP2, HAS_BIAS, SIGMA, PV_FP8, scol)[1]
        pw = _p_words(p, p_layout, BM, BN, EXP2, PV_FP8)
        # the loop runs the full key tiles; in the natural order a partial last tile is peeled off and masked after
        # it, so the loop carries no mask (with DIAGONAL the partial tile comes mid-way: every visit checks)
        n_loop = n_tiles
        if not DIAGONAL:
            if n_keys % BN != 0:
                n_loop = n_tiles - 1
        for j in range(1, n_loop):
            o, lacc, m, m_high, lo, low_before, c, nfired, pw = _key_step(
                j, o, lacc, m, m_high, lo, low_before, c, nfired, pw, WG, DIAGONAL, DIAGONAL, EXP2, HAS_BIAS, PV_FP8,
                SIGMA, qs, ones, k_smem, v_smem, b_smem, kvbar, empty, k_desc, v_desc, b_desc, KS_row, qsc, zero_s,
                zero_o, zero_l, rows, row_ok, FLAGS, NKW, pid_m, bh, n_keys, n_tiles, j0, SQP, SKP, CAP, FLOOR,
                p_layout, scol, orow, lrow)
        if n_tiles > 1 and n_loop < n_tiles:  # the partial last tile, masked
            o, lacc, m, m_high, lo, low_before, c, nfired, pw = _key_step(
                n_tiles - 1, o, lacc, m, m_high, lo, low_before, c, nfired, pw, WG, True, DIAGONAL, EXP2, HAS_BIAS,
                PV_FP8, SIGMA, qs, ones, k_smem, v_smem, b_smem, kvbar, empty, k_desc, v_desc, b_desc, KS_row, qsc,
                zero_s, zero_o, zero_l, rows, row_ok, FLAGS, NKW, pid_m, bh, n_keys, n_tiles, j0, SQP, SKP, CAP, FLOOR,
                p_layout, scol, orow, lrow)
        last = (n_tiles - 1) % STAGES
        ov, lv = _issue_pv(_words_to_p(pw, p_layout, BM, BN, PV_FP8), ones, v_smem.index(last), o, lacc, zero_o,
                           zero_l, PV_FP8)
        ov, lv = warpgroup_mma_wait(0, deps=(ov, lv))
        if PV_FP8:
            o = o + ov
            lacc = lacc + lv
        else:
            o = ov
            lacc = lv

    l = gl.convert_layout(gl.max(lacc, axis=1), srow)
    dcol = gl.arange(0, D, layout=ocol)
    orows = row0 + gl.arange(0, BM, layout=orow)
    inv = gl.convert_layout(gl.where(l > 0, 1.0 / l, 0.0), orow)
    out = o * inv[:, None]
    if PV_FP8:  # V8's scale per channel
        out = out * gl.load(VS + bh * D + dcol)[None, :]
    optr = (OUT + b.to(gl.int64) * sob + h.to(gl.int64) * soh + orows[:, None].to(gl.int64) * sos
            + dcol[None, :] * sod)
    gl.store(optr, out.to(OUT.dtype.element_ty), mask=(orows < SQ)[:, None])
    lse = (gl.log2(l) - SIGMA + m) * LN2
    gl.store(LSE + bh.to(gl.int64) * SQ + rows, lse, mask=row_ok & (WRITE_LSE != 0))
    nrows = gl.sum(nfired, axis=0)
    if nrows > 0:
        gl.atomic_add(STATS, nrows)


@gluon.jit(do_not_specialize=["SK"])  # S_k = 1 as a constant breaks the peeled loop's lowering
def fsattn_fwd_gluon_int8_kernel(q_desc, k_desc, v_desc, ones_desc, b_desc, QS, KS, VS, TSEL, OUT, LSE, STATS, FLAGS,
                                 NKW, KVL, sob, soh, sos, sod, H, SQ, SK, SQP, SKP, D: gl.constexpr, BN: gl.constexpr,
                                 HAS_KVL: gl.constexpr, WRITE_LSE: gl.constexpr, CAP: gl.constexpr,
                                 FLOOR: gl.constexpr, STAGES: gl.constexpr, REGS: gl.constexpr,
                                 DIAGONAL: gl.constexpr = False, M_OFFSET: gl.constexpr = 0.0,
                                 EXP2: gl.constexpr = 0, HAS_BIAS: gl.constexpr = False,
                                 TERM_SEL: gl.constexpr = False, PV_FP8: gl.constexpr = False,
                                 SIGMA: gl.constexpr = 0.0):
    """One (128-row query tile, batch x head) per program, launched with 4 warps (+4 in the worker partition).

    q_desc : TMA descriptor of Q8 (B*H*SQP, D) int8, block (64, D); QS (B*H*SQP) fp32 its per-row scales.
    k_desc : of K8 (B*H*SKP, D) int8, block (BN, D); KS (B*H*SKP/BN) fp32 its per-tile scales.
    v_desc : of V16 (B*H*SKP, D) bf16, block (BN, D), zero rows past the valid keys; ``PV_FP8``: of V8T (B*H*D, SKP)
        E4M3, block (D, BN), keys permuted into the FP8 A-fragment order, and VS (B*H*D) fp32 its channel scales.
    ones_desc : of an (8, BN) tensor of ones in P's type (BF16, E4M3): the row sum's B operand.
    PV_FP8, SIGMA : FP8 P and V (module docstring); P is carried as ``P 2^SIGMA`` (0 for BF16 P).
    DIAGONAL, M_OFFSET, CAP, FLOOR : as
        :func:`kernels.sm90.fused_attention_gluon_pingpong.fsattn_fwd_gluon_pingpong_kernel`.
    EXP2 : Stage-A's exponential (``EXP2_SCHRAUDOLPH``, ``EXP2_HW``; module docstring).
    b_desc, HAS_BIAS : of Q smoothing's per-key term (B*H*SKP) fp32 in doublings, block (BN), brought with each K/V
        slot and added before the gate and Stage-A (:func:`~kernels.sm90.gluon_int8_stage_a._tile_stage_a`,
        sm90_numerics difference 12); without ``HAS_BIAS`` any fp32 descriptor of that block (not read).
    TSEL, TERM_SEL : (``TERM_SEL``) (B*H) int32, Q smoothing's per-slice switch. The host launches the kernel twice,
        ``HAS_BIAS`` False then True; a program whose slice has ``TSEL != 0`` unequal to ``HAS_BIAS`` returns before
        any work, so a slice the switch leaves out runs the loop without the key term.
    """
    pid_m = gl.program_id(0)
    bh = gl.program_id(1)
    b = bh // H
    h = bh % H
    n_keys = SK
    if HAS_KVL:
        n_keys = gl.minimum(gl.load(KVL + b).to(gl.int32), SK)
    n_tiles = (n_keys + BN - 1) // BN
    j0 = n_tiles * 0
    if DIAGONAL:
        j0 = (pid_m * n_tiles) // (SQP // 128)

    if _runs_this_launch(TSEL, bh, HAS_BIAS, TERM_SEL):
        q_smem = gl.allocate_shared_memory(gl.int8, [2, WG_ROWS, D], q_desc.layout)
        k_smem = gl.allocate_shared_memory(gl.int8, [STAGES, BN, D], k_desc.layout)
        if PV_FP8:
            v_smem = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, D, BN], v_desc.layout)
            ones_smem = gl.allocate_shared_memory(gl.float8e4nv, [ONES_N, BN], ones_desc.layout)
        else:
            v_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BN, D], v_desc.layout)
            ones_smem = gl.allocate_shared_memory(gl.bfloat16, [ONES_N, BN], ones_desc.layout)
        if HAS_BIAS:
            b_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BN], b_desc.layout)
        else:
            b_smem = k_smem  # not read
        qbar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        kvbar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        onesbar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
        mbarrier.init(onesbar.index(0), count=1)
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
        mbarrier.expect(onesbar.index(0), ones_desc.block_type.nbytes, pred=n_tiles > 0)
        tma.async_copy_global_to_shared(ones_desc, [0, 0], onesbar.index(0), ones_smem, pred=n_tiles > 0)
        for i in gl.static_range(STAGES):
            _load_kv(k_desc, v_desc, b_desc, k_smem, v_smem, b_smem, kvbar, i, _key_tile(i, j0, n_tiles, DIAGONAL),
                     bh, SKP, i < n_tiles, BN, PV_FP8, HAS_BIAS)

        args = (q_smem, qbar, k_smem, v_smem, b_smem, kvbar, empty, ones_smem, onesbar, k_desc, v_desc, b_desc, QS, KS,
                VS, OUT, LSE, STATS, FLAGS, NKW, pid_m, bh, b, h, n_keys, j0, sob, soh, sos, sod, SQ, SQP, SKP,
                WRITE_LSE, CAP, FLOOR, M_OFFSET)
        gl.warp_specialize([(_consumer, (gl.constexpr(0), DIAGONAL, EXP2, HAS_BIAS, PV_FP8, SIGMA) + args),
                            (_consumer, (gl.constexpr(1), DIAGONAL, EXP2, HAS_BIAS, PV_FP8, SIGMA) + args)], [4],
                           [REGS])

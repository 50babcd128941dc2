"""Pieces of the key loop shared by the Gluon kernels for Hopper (:mod:`kernels.sm90.fused_attention_gluon_pingpong`,
:mod:`kernels.sm90.fused_attention_gluon_int8`): the order in which a query tile visits the key tiles, Q smoothing's
per-slice switch, and the frozen reference's rollback gate (Algorithm 1 lines 8-13, with the lowering of
``Recipe.rollback_floor_log2``): the per-warp vote that decides whether a warp takes the rare path, the new
reference, and the record of which (query tile, key tile) pairs rolled back.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .constants import FLOOR_LIMIT


@gluon.jit
def _lowering_trigger(m, m_high, FLOOR):
    """The peak (doublings) below which a key tile lowers the reference: ``m - FLOOR``, or -inf once that would leave
    ``m_high - FLOOR_LIMIT`` (emulator.lowering_gate; ``FLOOR = inf`` never lowers)."""
    return gl.where(m - FLOOR > m_high - FLOOR_LIMIT, m - FLOOR, float("-inf"))


@gluon.jit
def _rollback_reference(fire, xmax, m, m_high, c, FLOOR, GRID: gl.constexpr):
    """The rollback of the fired rows (Algorithm 1, and a lowering): ``(m, m_high, lo, c, down)`` with the new
    reference on the integer-doubling steps ``delta`` (0 on the other rows), never more than FLOOR_LIMIT below
    ``m_high``; Stage-A's constant ``c`` on its grid of ``GRID`` steps per doubling, and ``down = 2^-delta``, the
    factor O and l are rescaled by."""
    delta = gl.where(fire, gl.maximum(gl.ceil(xmax - m), m_high - FLOOR_LIMIT - m), 0.0)
    m = m + delta
    m_high = gl.maximum(m_high, m)
    return m, m_high, _lowering_trigger(m, m_high, FLOOR), c - GRID * delta, gl.exp2(-delta)


@gluon.jit
def _record_rollback(nfired, fire, row_ok, FLAGS, NKW, bh, SQP, pid_m, t, rows):
    """Count the fired rows in ``nfired`` (returned) and set key tile ``t``'s bit of this query tile's rollback words
    (FLAGS, NKW words per query tile; none when NKW is 0)."""
    nfired += (fire & row_ok).to(gl.int32)
    gl.atomic_or(FLAGS + (bh * (SQP // 128) + pid_m) * NKW + t // 32 + rows * 0,
                 (1 << (t % 32)) + rows * 0, mask=fire & (NKW > 0))
    return nfired


def _vote_asm(reg: str):
    """PTX of the per-warp gate vote through predicate register ``reg``: (declare it, vote into it, read it)."""
    return (gl.constexpr(f".reg .pred {reg}; mov.b32 $0, $1;"),
            gl.constexpr("{ .reg .pred a, b; setp.ne.b32 a, $2, 0; setp.ne.b32 b, $3, 0; or.pred a, a, b; "
                         f"vote.sync.any.pred {reg}, a, -1; }} mov.b32 $0, 0; mov.b32 $1, 0;"),
            gl.constexpr(f"selp.b32 $0, $1, 0, {reg};"))


# One predicate register per warpgroup partition: both partitions are lowered into one PTX function.
VOTE_DECLARE_0, VOTE_0, VOTE_READ_0 = _vote_asm("%fsa_vote0")
VOTE_DECLARE_1, VOTE_1, VOTE_READ_1 = _vote_asm("%fsa_vote1")


@gluon.jit
def _warp_vote_declare(WG: gl.constexpr):
    """Declare the PTX predicate register that carries :func:`_warp_any`'s vote. Emitted once, before the key loop."""
    if WG == 0:
        gl.inline_asm_elementwise(VOTE_DECLARE_0, "=r,r", [gl.program_id(0)], dtype=gl.int32, is_pure=False, pack=1)
    else:
        gl.inline_asm_elementwise(VOTE_DECLARE_1, "=r,r", [gl.program_id(0)], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _warp_any(fire, WG: gl.constexpr):
    """Whether any row of this warp fired, as a scalar that is uniform per warp (not per warpgroup).

    Each thread ORs its two rows' flags and ``vote.sync.any`` writes the warp's answer into the predicate register
    declared by :func:`_warp_vote_declare`; a second asm block, whose only argument is a scalar, reads it back, so
    Gluon types the result as a scalar. Both blocks have side effects, so they stay in order. A warpgroup-wide
    ``gl.max`` here cost two BAR.SYNC per key tile and ~8% of the kernel on the H200; the rollback body is
    thread-local, so warps of one warpgroup may take it independently.
    """
    f = fire.to(gl.int32)
    one = f.shape[0] // f.shape[0]
    if WG == 0:
        gl.inline_asm_elementwise(VOTE_0, "=r,=r,r,r", [f], dtype=gl.int32, is_pure=False, pack=2)  # 2 rows/thread
        v = gl.inline_asm_elementwise(VOTE_READ_0, "=r,r", [one], dtype=gl.int32, is_pure=False, pack=1)
    else:
        gl.inline_asm_elementwise(VOTE_1, "=r,=r,r,r", [f], dtype=gl.int32, is_pure=False, pack=2)
        v = gl.inline_asm_elementwise(VOTE_READ_1, "=r,r", [one], dtype=gl.int32, is_pure=False, pack=1)
    return v != 0


@gluon.jit
def _key_tile(j, j0, n_tiles, DIAGONAL: gl.constexpr):
    """The key tile of visit ``j`` (0 <= j < 2 n_tiles): ``j`` itself, or with ``DIAGONAL`` the visits start at tile
    ``j0`` and wrap around."""
    t = j
    if DIAGONAL:
        t = j0 + j
        t = gl.where(t >= n_tiles, t - n_tiles, t)
    return t


@gluon.jit
def _runs_this_launch(TSEL, bh, SETTING: gl.constexpr, TERM_SEL: gl.constexpr):
    """Whether slice ``bh`` works in this launch: always, or (``TERM_SEL``) if its switch TSEL equals ``SETTING``."""
    run = True
    if TERM_SEL:
        run = (gl.load(TSEL + bh) != 0) == SETTING
    return run

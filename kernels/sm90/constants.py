"""Constants of the Hopper kernels shared by the Triton and Gluon attention kernels and their pre-passes: the
rollback floor's limit, MXFP6 P's Stage-B anchors and Q smoothing's key-term range (values from
:mod:`fsattn_diffusers.sm90_numerics` and :mod:`fsattn_diffusers.recipe`)."""

from __future__ import annotations

import triton.language as tl

from fsattn_diffusers import sm90_numerics
from fsattn_diffusers.recipe import ROLLBACK_FLOOR_LIMIT_LOG2

from ..common import E2M3_MAX_SCALED  # noqa: F401 - re-exported for the attention kernels

# How far below the row's highest reference a lowering may take it (both kernels; recipe.ROLLBACK_FLOOR_LIMIT_LOG2).
FLOOR_LIMIT = tl.constexpr(float(ROLLBACK_FLOOR_LIMIT_LOG2))
# MXFP6 P's Stage-B (both kernels; sm90_numerics.mxfp6_p_scaled_e4m3): E2M3's largest value 7.5 with the block scale
# mapped onto E4M3's smallest normal 2^-6 (common.E2M3_MAX_SCALED, the pre-pass's clamp too); 128 * 7, the smallest
# exponent field taken for a block (E = 7); and 2^23 + 128 * 123, so that (2^23 + 128 E) - MXFP6_ANCHOR_OFFSET =
# 128 (E - 123) exactly.
MXFP6_E128_MIN = tl.constexpr(896)
MXFP6_ANCHOR_OFFSET = tl.constexpr(8388608.0 + 15744.0)
# Q smoothing's key term through a chained wgmma (both kernels; sm90_numerics difference 9): its K (columns of Qx/Kx)
# and the range of Qx = 2^(-QE - G) that E4M3 holds exactly; below it the query tile drops the term.
KEY_TERM_COLS = tl.constexpr(sm90_numerics.KEY_TERM_COLS)
QX_MIN_LOG2 = tl.constexpr(sm90_numerics.QX_MIN_LOG2)
QX_MAX_LOG2 = tl.constexpr(sm90_numerics.QX_MAX_LOG2)

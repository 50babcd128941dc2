"""Recipe -> kernel operand plan: the one place that maps a :class:`Recipe` to what the kernels compute.

Hopper (sm_90) has FP8 E4M3 tensor cores but no MX instructions. Every MX element (E4M3, E2M3, E2M1)
is carried in an E4M3 value scaled by ``2^(s_b - R + t0)``: ``s_b`` is the block's E8M0 exponent, ``R``
a reference exponent shared by a whole GEMM row/column group (a query row, a key tile, a V channel), and
``t0`` the headroom the element format leaves below E4M3's maximum 448. The GEMM result is then the MX
product times ``2^(R_q + R_k - 2 t0)``, a power of two per row and key tile that rides in the single FMA
of Stage-A. When the block exponents of one group are more than the exact window apart, the E4M3 value
is the nearest-even rounding of the shifted element: the sm90 deviation that
:mod:`fsattn_diffusers.sm90_numerics` reproduces.

A backend with native MX (Triton ``tl.dot_scaled`` on Blackwell/CDNA4) would take ``elem``/``rule``
from this plan directly and drop the carry; nothing here has been run on such hardware.
"""

from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass
from typing import Optional

from fsattn_diffusers import sm90_numerics
from fsattn_diffusers.formats import DEFAULT_SCALE_RULE, E2M1, E2M3, E4M3, SCALE_RULES
from fsattn_diffusers.numerics import INT8_EXPONENTIALS, INT8_PV_FORMATS
from fsattn_diffusers.recipe import FROZEN_MAX_OFFSET_GRID
from fsattn_diffusers.smoothing import q_smoothing_ratio2

# Element format codes shared by the Triton kernels.
FMT_E4M3, FMT_E2M3, FMT_E2M1 = 0, 1, 2
_FORMAT = {FMT_E4M3: E4M3, FMT_E2M3: E2M3, FMT_E2M1: E2M1}
_MX_FMT = {"mxfp8": FMT_E4M3, "mxfp6": FMT_E2M3, "mxfp4": FMT_E2M1}
# Scale rule codes shared by the Triton kernels (the names: formats.SCALE_RULES).
RULE_ROUND_UP_175, RULE_FLOOR, RULE_CEIL = 0, 1, 2
_RULES = {"round_up_175": RULE_ROUND_UP_175, "floor": RULE_FLOOR, "ceil": RULE_CEIL}
assert set(_RULES) == set(SCALE_RULES)
# (mantissa bits, smallest normal exponent, largest finite value, emax) of each element format (OCP MX v1.0).
ELEM = {code: (f.mbits, f.emin, f.max_value, f.emax) for code, f in _FORMAT.items()}
# Headroom t0 (doublings) an element format leaves under E4M3's 448: 7.5 * 2^5 = 240, 6 * 2^6 = 384.
CARRY_T0 = {code: sm90_numerics.CARRY_T0[name] for name, code in _MX_FMT.items()}

# sm90 Stage-B (see sm90_numerics): P carries a per-row power-of-two scale frozen with the reference m.
# The gate keeps every P <= 2^P_HEADROOM_LOG2, so P * 2^SIGMA never passes E4M3's 448.
P_HEADROOM_LOG2 = sm90_numerics.P_HEADROOM_LOG2
# fp8_row P: P * 2^4 <= 2^8 = 256 < 448 (E4M3 max), Section 4.2's per-row FP8 P with a frozen scale.
P_SIGMA_FP8 = sm90_numerics.P_SIGMA["fp8_row"]
# mxfp6 P: the E2M3 block maximum is below 8 * 2^(H-2); times 2^3 it stays under 448 (E2M3 carry t0=5).
P_SIGMA_MXFP6 = sm90_numerics.P_SIGMA["mxfp6"]

SUPPORTED_HEAD_DIMS = (64, 128)
# The (P, V) formats of the INT8 kernel: those of the Hopper INT8 numerics but E4M3 V under one scale per tensor,
# which no preset uses.
INT8_KERNEL_PV_FORMATS = tuple(pv for pv in INT8_PV_FORMATS if pv[1] != "fp8_tensor")


@dataclass(frozen=True)
class KernelPlan:
    """Constants the Triton kernels take for one recipe."""

    qk_fmt: int
    qk_rule: int
    v_mx: bool  # False: per-tensor FP8 (fp8_tensor)
    v_fmt: int
    v_rule: int
    p_mxfp6: bool  # False: per-row FP8 P
    p_rule: int
    p_sigma: int
    hadamard: bool
    gate: bool
    gate_cap: int  # doublings above the frozen reference that fire the gate
    hadamard_signs: bool = False  # rotate by H diag(s) (hadamard.rotation_signs)
    smooth_k: bool = False  # the pre-pass subtracts K's token mean (smoothing.token_mean)
    smooth_q: bool = False  # the pre-pass subtracts Q's token mean; the kernel adds the key term q_mean . k_j
    h15: bool = False  # Rowmax-H15 exponential (sm90_numerics difference 8) instead of Schraudolph's
    gate_floor: int = 0  # doublings below the reference that lower it (Recipe.rollback_floor_log2); 0: never
    diagonal: bool = False  # Recipe.key_order == "diagonal" (numerics.key_tile_order); False: from key tile 0
    # Q smoothing's per-slice switch (Recipe.smooth_q_min_ratio): the float32 bits of the squared ratio; 0: every slice
    smooth_q_ratio2_bits: int = 0
    # the frozen reference raised by this many 1/128 doublings (Recipe.frozen_max_offset_log2 * 128)
    seed_offset_128: int = 0
    # key tiles per fp32 promotion of O (Recipe.o_promotion_tiles; 0: never, O chained in the wgmma accumulator)
    o_promotion: int = 1

    def key(self) -> str:
        """Compact string form (the custom op's argument); :func:`plan_from_key` inverts it."""
        return ",".join(str(int(getattr(self, f.name))) for f in dataclasses.fields(self))

    @property
    def lowers(self) -> bool:
        """Whether the gate also lowers the reference (``gate_floor`` > 0)."""
        return self.gate_floor > 0

    @property
    def lowering_floor(self) -> float:
        """``gate_floor`` as the gluon_pingpong kernel takes it: a runtime threshold in doublings, ``inf`` when the
        plan never lowers."""
        return float(self.gate_floor) if self.lowers else float("inf")

    @property
    def smooth_q_ratio2(self) -> float:
        """:func:`fsattn_diffusers.smoothing.q_smoothing_ratio2` of ``Recipe.smooth_q_min_ratio``, the threshold of
        :func:`kernels.token_mean.token_mean` (0: every slice is smoothed)."""
        return struct.unpack("<f", struct.pack("<I", self.smooth_q_ratio2_bits))[0]

    @property
    def seed_offset(self) -> float:
        """``Recipe.frozen_max_offset_log2``: doublings added to the frozen reference (a multiple of 1/128)."""
        return self.seed_offset_128 / FROZEN_MAX_OFFSET_GRID

    @property
    def qk_t0(self) -> int:
        return CARRY_T0[self.qk_fmt]

    @property
    def v_t0(self) -> int:
        return CARRY_T0[self.v_fmt] if self.v_mx else 0


def _rule(explicit: Optional[str], fmt_name: str) -> int:
    return _RULES[explicit or DEFAULT_SCALE_RULE[fmt_name]]


def unsupported_reason(recipe, head_dim: int) -> Optional[str]:
    """One line saying why the Triton kernel cannot run ``recipe`` at ``head_dim`` (None when it can)."""
    if head_dim not in SUPPORTED_HEAD_DIMS:
        return f"head dim {head_dim} (the Triton kernel takes 64 or 128)"
    if recipe.qk_format == "int8":
        return _int8_unsupported(recipe)
    if recipe.qk_format not in _MX_FMT:
        return f"qk_format {recipe.qk_format!r} (the Triton kernel takes mxfp8, mxfp6, mxfp4)"
    if recipe.v_format not in ("fp8_tensor", "mxfp6", "mxfp4"):
        return f"v_format {recipe.v_format!r} (the Triton kernel takes fp8_tensor, mxfp6, mxfp4)"
    if recipe.p_format not in ("fp8_row", "mxfp6"):
        return f"p_format {recipe.p_format!r} (the Triton kernel takes fp8_row, mxfp6)"
    if recipe.exponential == "rowmax_h15":
        if recipe.p_format != "fp8_row" or not recipe.rollback:
            return ("Rowmax-H15 with p_format {!r}, rollback {} (the Triton kernel runs it with fp8_row P and the "
                    "rollback gate)".format(recipe.p_format, recipe.rollback))
    elif recipe.exponential != "schraudolph" or recipe.proxy != "u16":
        return (f"exponential {recipe.exponential}/{recipe.proxy} (the Triton kernel takes Schraudolph U16 or "
                f"Rowmax-H15)")
    if not recipe.frozen_max:
        return "a running maximum (the Triton kernel freezes the maximum, Section 4.1)"
    if recipe.p_scale_rule not in (None, "floor") and recipe.p_format == "mxfp6":
        return f"p_scale_rule {recipe.p_scale_rule!r} for mxfp6 P (the Triton kernel uses floor)"
    if recipe.tile_n != 128:
        return f"tile_n {recipe.tile_n} (the Triton kernel's key tile is 128)"
    if recipe.o_promotion_tiles != 1 and (not recipe.rollback or recipe.exponential == "rowmax_h15"):
        return (f"o_promotion_tiles {recipe.o_promotion_tiles} without the gate or with Rowmax-H15 (these run the "
                f"triton kernel, which promotes O every key tile; the gluon_pingpong kernel takes any interval)")
    return None


def _int8_unsupported(recipe) -> Optional[str]:
    """Why the INT8 Q/K kernel (kernels/sm90/fused_attention_gluon_int8.py) cannot run ``recipe`` (None when it can)."""
    if (recipe.p_format, recipe.v_format) not in INT8_KERNEL_PV_FORMATS:
        return (f"int8 Q/K with p_format {recipe.p_format!r}, v_format {recipe.v_format!r} (the INT8 kernel takes "
                f"P/V {', '.join(f'{p}/{v}' for p, v in INT8_KERNEL_PV_FORMATS)})")
    if recipe.p_format == "fp8_row" and (recipe.exponential != "exact" or recipe.o_promotion_tiles != 1):
        return (f"int8 Q/K with FP8 P under exponential {recipe.exponential}, o_promotion_tiles "
                f"{recipe.o_promotion_tiles} (the INT8 kernel's FP8 P takes the exact exponential and promotes O "
                f"every key tile)")
    if recipe.key_order != "natural":
        return f"int8 Q/K with key_order {recipe.key_order!r} (the INT8 kernel visits the key tiles in natural order)"
    if recipe.exponential not in INT8_EXPONENTIALS or recipe.proxy != "u16" or not recipe.frozen_max:
        return (f"int8 Q/K with exponential {recipe.exponential}/{recipe.proxy}, frozen_max {recipe.frozen_max} (the "
                f"INT8 kernel takes {', '.join(INT8_EXPONENTIALS)} with the U16 proxy and the frozen maximum)")
    if not recipe.hadamard:
        return "int8 Q/K without the rotation (the INT8 kernel always rotates)"
    if recipe.tile_n != 128:
        return f"tile_n {recipe.tile_n} (the kernel's key tile is 128)"
    return None


def plan_for(recipe) -> KernelPlan:
    """The :class:`KernelPlan` of a supported recipe (check :func:`unsupported_reason` first)."""
    v_mx = recipe.v_format != "fp8_tensor"
    p_mx = recipe.p_format == "mxfp6"
    return KernelPlan(
        qk_fmt=_MX_FMT[recipe.qk_format],
        qk_rule=_rule(recipe.qk_scale_rule, recipe.qk_format),
        v_mx=v_mx,
        v_fmt=_MX_FMT[recipe.v_format] if v_mx else FMT_E4M3,
        v_rule=_rule(recipe.v_scale_rule, recipe.v_format) if v_mx else RULE_ROUND_UP_175,
        p_mxfp6=p_mx,
        p_rule=RULE_FLOOR,
        p_sigma=P_SIGMA_MXFP6 if p_mx else P_SIGMA_FP8,
        hadamard=recipe.hadamard,
        gate=recipe.rollback,
        gate_cap=min(recipe.rollback_cap_log2, P_HEADROOM_LOG2),
        hadamard_signs=recipe.hadamard_signs,
        smooth_k=recipe.smooth_k,
        smooth_q=recipe.smooth_q,
        h15=recipe.exponential == "rowmax_h15",
        gate_floor=(recipe.rollback_floor_log2 or 0) if recipe.rollback else 0,
        diagonal=recipe.key_order == "diagonal",
        smooth_q_ratio2_bits=(struct.unpack("<I", struct.pack("<f", q_smoothing_ratio2(recipe.smooth_q_min_ratio)))[0]
                              if recipe.smooth_q else 0),
        seed_offset_128=int(recipe.frozen_max_offset_log2 * FROZEN_MAX_OFFSET_GRID),
        o_promotion=recipe.o_promotion_tiles or 0,
    )


def plan_from_key(key: str) -> KernelPlan:
    """Inverse of :meth:`KernelPlan.key`."""
    fields = dataclasses.fields(KernelPlan)
    values = [int(x) for x in key.split(",")]
    if len(values) != len(fields):
        raise ValueError(f"bad kernel plan key {key!r}")
    return KernelPlan(**{f.name: (bool(x) if f.type in ("bool", bool) else x) for f, x in zip(fields, values)})

"""The numerics of one attention call, as a frozen dataclass.

A :class:`Recipe` is the single description of what an attention call computes. The emulator, the
Triton kernel, the AITER adapter and the diffusers processors all take one. The presets ``mxfp8``,
``mxfp6`` and ``mxfp4`` are the three kernels of the paper (Table 3, Section 4) with the default additions, the
``-paper`` presets their pipeline alone; ``bf16-emulated`` is exact softmax on BF16 operands (the paper's BF16
reference); ``int8-bf16`` the accurate tier; ``exact`` keeps every operand in FP32. The fields that name a mode
hold str-valued enums (:class:`~fsattn_diffusers.modes.Mode`): the formats and scale rules of
:mod:`fsattn_diffusers.formats`, :class:`Exponential`, :class:`Proxy`, :class:`Numerics` and :class:`KeyOrder`.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Optional

from .formats import SCALE_RULES, PFormat, QKFormat, ScaleRule, VFormat  # noqa: F401 (SCALE_RULES: re-exported)
from .modes import Mode
from .notices import warn_once

# The paper gates the frozen maximum at 2^32 (Section 4.1: "All three kernels ... gate at 2^32").
ROLLBACK_CAP_LOG2 = 32
# A lowering (``Recipe.rollback_floor_log2``) never takes the reference more than this many doublings below the
# highest reference of the row: contributions that far down are below fp32's resolution of the row's mass, and the
# accumulator, scaled up by at most 2^64, cannot overflow (P * V8 summed over 2^20 keys stays below 2^37).
ROLLBACK_FLOOR_LIMIT_LOG2 = 64
# Query-tile rows and key-tile columns of the paper's kernels (Section 3: M = 256, N = 128).
TILE_M = 256
TILE_N = 128


class Exponential(Mode):
    """How Stage-A computes the weights ``2^(x - m)`` (``Recipe.exponential``; NUMERICS.md §3)."""

    EXACT = "exact"
    SCHRAUDOLPH = "schraudolph"
    ROWMAX_H15 = "rowmax_h15"


class Proxy(Mode):
    """Width of Schraudolph's bit pattern (``Recipe.proxy``)."""

    U32 = "u32"
    U16 = "u16"
    U8 = "u8"


class Numerics(Mode):
    """What the tiled loop computes (``Recipe.numerics``): ``MI355X`` the paper's kernels, ``SM90`` what the Hopper
    kernels compute (``fsattn_diffusers.sm90_numerics``; NUMERICS.md §6)."""

    MI355X = "mi355x"
    SM90 = "sm90"


class KeyOrder(Mode):
    """The order in which a query tile visits the key tiles (``Recipe.key_order``; ``numerics.key_tile_order``)."""

    NATURAL = "natural"
    DIAGONAL = "diagonal"


#: The accepted strings of each mode (``choices=`` of the CLI, error messages).
QK_FORMATS = QKFormat.values()
P_FORMATS = PFormat.values()
V_FORMATS = VFormat.values()
EXPONENTIALS = Exponential.values()
PROXIES = Proxy.values()
NUMERICS = Numerics.values()
#: Orders in which a query tile visits the key tiles (``Recipe.key_order``; ``numerics.key_tile_order``).
KEY_ORDERS = KeyOrder.values()
#: The Recipe fields that hold a mode, and its enum: a string given for one is normalized to the member.
MODE_FIELDS = dict(qk_format=QKFormat, p_format=PFormat, v_format=VFormat, exponential=Exponential, proxy=Proxy,
                   qk_scale_rule=ScaleRule, v_scale_rule=ScaleRule, p_scale_rule=ScaleRule, numerics=Numerics,
                   key_order=KeyOrder)
#: ``Recipe.frozen_max_offset_log2`` is a multiple of 1 / this: the grid of the Hopper kernel's frozen reference
#: (``sm90_numerics`` difference 2), which keeps Stage-A's constant ``128 m`` an integer.
FROZEN_MAX_OFFSET_GRID = 128
#: The default presets' ``frozen_max_offset_log2`` for MXFP6 P (mxfp6, mxfp4): 3/32 doubling, chosen by a sweep over
#: 0..1/2 (docs/design.md, "The frozen reference").
MXFP6_P_FROZEN_MAX_OFFSET_LOG2 = 3 / 32
#: Q smoothing's per-slice switch (``Recipe.smooth_q_min_ratio``'s default): a (batch, head) slice is smoothed when its
#: query mean's norm exceeds its queries' rms distance from that mean. Queries without a shared component give about
#: ``1 / sqrt(S_q)``; at 1 only slices whose queries share a large offset take the key term. The statistic's values on
#: the structured families and what the switch costs and gains: docs/design.md, "Q smoothing's per-slice switch".
Q_SMOOTHING_MIN_RATIO = 1.0


@dataclass(frozen=True)
class Recipe:
    """Numerics of the Fused-Softmax pipeline (paper Algorithm 1 and Table 3).

    Parameters
    ----------
    name : str
        A label for reports; presets use the paper's names.
    qk_format, p_format, v_format : QKFormat, PFormat, VFormat or their strings
        Operand formats of Q/K, of the probabilities P and of V (:class:`~fsattn_diffusers.formats.PFormat` is the
        one description of P's formats and of how each layer takes them). ``mxfp8``/``mxfp6``/``mxfp4`` are OCP
        MX formats (E4M3 / E2M3 / E2M1 elements with an E8M0 scale per 32 elements, along the head dim
        for Q/K, along the key axis for V and P). ``fp8_row`` is P in FP8 E4M3 with a power-of-two scale
        per row and key tile; ``fp8_tensor`` is V in FP8 E4M3 with one FP32 scale per tensor; ``fp8``
        is Q/K in FP8 E4M3 with one FP32 scale per tensor. ``int8`` is Q/K in symmetric INT8 (codes -127..127)
        after the rotation and Q's pre-scale, one FP32 scale ``amax / 127`` per query and per key tile of ``tile_n``
        keys (``formats.fake_quantize_int8_rows``): INT8 products sum exactly in int32, and both scales fold into a
        per-row factor per key tile. ``bf16``/``fp32`` round to those types.
    exponential : Exponential or str
        ``exact`` (exp2 in FP32), ``schraudolph`` (paper Section 4.2-4.3, affine bit construction) or
        ``rowmax_h15`` (Rowmax-H15 of "How Much Softmax Do You Need in LLMs?": two levels per octave,
        {1, 1.5}·2^n, anchored at the row max).
    proxy : Proxy or str
        Width of the Schraudolph pattern (Stage-A): ``u32`` read as FP32, ``u16`` read as BF16 (the
        paper's choice), ``u8`` read as FP8 E4M3 (single stage).
    frozen_max : bool
        Freeze the row maximum from key tile 0 (Section 4.1) instead of the running maximum.
    rollback : bool
        Enable the rollback gate of the frozen maximum (disable only for ablation).
    rollback_cap_log2 : int
        Gate threshold: a score more than 2^cap above the frozen reference triggers a rollback.
    rollback_floor_log2 : int or None
        Lower the frozen reference when the peaks of two key tiles in a row lie more than ``floor`` doublings below
        it (to the second tile's peak; the row's accumulators scaled up by the same exact power of two, as a
        rollback scales them down); None never lowers (the paper). With P in FP8 under a per-row scale that moves
        only with the reference, a reference held up by one early outlier key (an attention sink) pushes every later
        tile's P into E4M3's subnormals; the lowering brings it back. The reference stays within
        :data:`ROLLBACK_FLOOR_LIMIT_LOG2` of the row's highest one.
    key_order : KeyOrder or str
        The order in which a query tile visits the key tiles, so which tile freezes its reference.
        ``natural`` (the paper): key tile 0 first. ``diagonal``: query tile ``i`` of ``n_q`` starts at key tile
        ``floor(i * n_k / n_q)`` of the ``n_k`` tiles holding valid keys and wraps around
        (:func:`fsattn_diffusers.numerics.key_tile_order`); in self-attention that is the tile of the query's own
        positions. Where attention is local (video tokens with RoPE) the frozen reference then comes from the row's
        peak instead of a distant tile: fewer rollbacks, and the row's largest weights near 1, where FP8 P rounds
        them least (measurements: docs/design.md, "The frozen reference"). Exact arithmetic gives the
        same result in either order. Under MXFP6 P's floor scale rule weights just below 1 saturate at 0.9375, so the
        MXFP6-P presets pair it with ``frozen_max_offset_log2``.
    frozen_max_offset_log2 : float
        Raise the frozen reference by this many doublings above the first tile's row maximum (the ``sm90`` grid
        value ``ceil(128 max) / 128``), so the row's largest weight in that tile is ``2^-offset`` instead of about 1.
        A multiple of 1/128 in [0, 1) (:data:`FROZEN_MAX_OFFSET_GRID`): the Hopper kernel's reference stays on its
        1/128 grid. Exact arithmetic is unchanged (P carries a constant factor that the row sum divides out); what
        moves is where the weights fall on P's grid. Under MXFP6 P's floor scale rule a block peaking just below 1
        gets the scale 2^-3 and its peak saturates at E2M3's 7.5 (0.9375). The MXFP6-P presets take
        :data:`MXFP6_P_FROZEN_MAX_OFFSET_LOG2` with the diagonal order, chosen by measurement (the gain is not
        monotonic in the offset; docs/design.md, "The frozen reference").
    rowsum_gemm : bool
        Accumulate the row sum from the quantized P that enters the PV GEMM (Section 4.4) instead of
        from the unquantized probabilities.
    hadamard : bool
        Rotate Q and K by the normalized Walsh-Hadamard transform over the head dimension.
    hadamard_signs : bool
        Rotate by ``H diag(s)`` instead of ``H``, with ``s`` the fixed +-1 vector of
        :func:`fsattn_diffusers.hadamard.rotation_signs` (one per head dim, the same for Q and K, so ``Q K^T`` is
        unchanged); no effect without ``hadamard``. A plain Hadamard rotation maps a vector shared by all tokens (``c * ones``) onto one coordinate;
        the signs spread it over all of them.
    smooth_k : bool
        Subtract K's mean over the valid keys (per batch, head and channel, rounded to BF16) before quantizing K.
        Exact in real arithmetic (each row's scores move by the constant ``q_i . k_mean``); the LSE adds that
        constant back, so it stays the log-sum-exp of the unsmoothed scores.
    smooth_q : bool
        Subtract Q's mean over the queries (per batch, head and channel) before quantizing Q, and add the per-key
        term ``q_mean . k_j`` (float32, from the BF16 inputs) to the scores before the exponential. Exact in real
        arithmetic. The ``sm90`` numerics carry the term as the Hopper kernel's chained wgmma does (E4M3 terms,
        ``sm90_numerics`` difference 9); its kernel cost on the slices that take it: docs/design.md, "K and Q
        smoothing".
    smooth_q_min_ratio : float
        With ``smooth_q``, smooth only the (batch, head) slices whose query mean stands out of the queries' spread:
        ``|q_mean| > ratio * rms_t |q_t - q_mean|`` (:func:`fsattn_diffusers.smoothing.q_smoothing_heads`, float64
        statistics of the BF16 values over all queries). The other slices keep Q as it is and skip the key term
        (their ``q_mean`` is taken as 0). ``0`` smooths every slice. Queries without a shared component give
        about ``1 / sqrt(S_q)``; the default is :data:`Q_SMOOTHING_MIN_RATIO`. The default presets turn Q smoothing on
        (:data:`ROBUST`, switched per slice); the ``-paper`` presets leave it off. On a slice it smooths, a query's
        output depends on the other queries of the slice (their mean, the switch), and a sequence split across GPUs
        is smoothed per shard (each shard's mean and switch). Padded query rows are left out of the statistics
        when the call gives ``q_lens`` (``attention(..., q_lens=...)``).
    tile_m, tile_n : int
        Query rows per tile and keys per tile (frozen max, gate and P's per-row scale work per tile). The ``sm90``
        numerics, which the Hopper kernels compute, fix both at 128 (``tile_m`` is honoured by the ``mi355x`` numerics
        only; a ``tile_n`` other than 128 the Triton backend refuses): NUMERICS.md §6.
    qk_scale_rule, v_scale_rule, p_scale_rule : ScaleRule, str or None
        MX shared-exponent rule. ``floor`` is OCP's floor(log2 amax) - emax_elem; ``ceil`` is
        ceil(log2(amax / elem_max)) (torchao RCEIL); ``round_up_175`` is AITER's MXFP8 rule (amax
        exponent rounded up when its mantissa is >= 1.75, minus 8). ``None`` takes the paper kernels'
        rule for the format: MXFP8 ``round_up_175``, MXFP6 ``floor``, MXFP4 ``ceil``.
    numerics : Numerics or str
        ``mi355x`` (the paper's kernels) or ``sm90`` (what our Hopper kernel computes; see
        :mod:`fsattn_diffusers.emulator`).
    o_promotion_tiles : int or None
        FP8 PV on Hopper (the ``sm90`` numerics with FP8 P): every how many key tiles the FP8 wgmma's accumulator is
        added to O in fp32 and restarted from zero. ``1`` (the default): every tile, the reference sums O in fp32;
        ``n``: the accumulator chains ``n`` tiles (``4 n`` wgmmas of 32 keys) in the tensor cores' reduced-precision
        accumulation, :func:`fsattn_diffusers.numerics_accumulation.fp8_chained_mma`; ``None`` (or 0): never, the
        whole row in the tensor cores. Other numerics sum O in fp32 whatever it says (NUMERICS.md §6).

    A string given for a mode field (:data:`MODE_FIELDS`) is stored as the enum member it names, which compares,
    hashes and serializes as that string: ``Recipe(qk_format="mxfp8").qk_format is QKFormat.MXFP8`` and
    ``== "mxfp8"``.
    """

    name: str = "custom"
    qk_format: QKFormat = QKFormat.BF16
    p_format: PFormat = PFormat.BF16
    v_format: VFormat = VFormat.BF16
    exponential: Exponential = Exponential.EXACT
    proxy: Proxy = Proxy.U16
    frozen_max: bool = False
    rollback: bool = True
    rollback_cap_log2: int = ROLLBACK_CAP_LOG2
    rollback_floor_log2: Optional[int] = None
    key_order: KeyOrder = KeyOrder.NATURAL
    frozen_max_offset_log2: float = 0.0
    rowsum_gemm: bool = False
    hadamard: bool = False
    hadamard_signs: bool = False
    smooth_k: bool = False
    smooth_q: bool = False
    smooth_q_min_ratio: float = Q_SMOOTHING_MIN_RATIO
    tile_m: int = TILE_M
    tile_n: int = TILE_N
    qk_scale_rule: Optional[ScaleRule] = None
    v_scale_rule: Optional[ScaleRule] = None
    p_scale_rule: Optional[ScaleRule] = None
    numerics: Numerics = Numerics.MI355X
    o_promotion_tiles: Optional[int] = 1

    def __post_init__(self) -> None:
        for field, mode in MODE_FIELDS.items():
            value = getattr(self, field)
            if value is not None or not field.endswith("_scale_rule"):
                object.__setattr__(self, field, mode.parse(value, f"Recipe.{field}"))
        if not (1 <= self.rollback_cap_log2 <= 126):
            raise ValueError(f"Recipe.rollback_cap_log2={self.rollback_cap_log2} is out of range; accepted: 1..126")
        if self.rollback_floor_log2 is not None and not (1 <= self.rollback_floor_log2 <= ROLLBACK_FLOOR_LIMIT_LOG2):
            raise ValueError(f"Recipe.rollback_floor_log2={self.rollback_floor_log2} is out of range; accepted: "
                             f"None or 1..{ROLLBACK_FLOOR_LIMIT_LOG2}")
        offset = self.frozen_max_offset_log2
        if not (0.0 <= offset < 1.0 and float(offset * FROZEN_MAX_OFFSET_GRID).is_integer()):
            raise ValueError(f"Recipe.frozen_max_offset_log2={offset!r} is not supported; accepted: a multiple of "
                             f"1/{FROZEN_MAX_OFFSET_GRID} in [0, 1)")
        if not (self.smooth_q_min_ratio >= 0.0 and self.smooth_q_min_ratio < float("inf")):
            raise ValueError(f"Recipe.smooth_q_min_ratio={self.smooth_q_min_ratio!r} is out of range; accepted: a "
                             f"finite number >= 0 (0: every slice)")
        if self.o_promotion_tiles == 0:
            object.__setattr__(self, "o_promotion_tiles", None)  # 0: never, stored as None
        if self.o_promotion_tiles is not None and not (isinstance(self.o_promotion_tiles, int)
                                                       and self.o_promotion_tiles >= 1):
            raise ValueError(f"Recipe.o_promotion_tiles={self.o_promotion_tiles!r} is not supported; accepted: a "
                             f"positive int (key tiles per fp32 promotion), or None / 0 (never)")
        for field in ("tile_m", "tile_n"):
            value = getattr(self, field)
            if value < 32 or value % 32:
                raise ValueError(f"Recipe.{field}={value} is not supported; accepted: a multiple of 32, at least 32")

    def replace(self, **changes) -> "Recipe":
        """Return a copy with ``changes`` applied.

        Without ``name`` in ``changes``, a copy whose numerics differ gets a derived name, the old one
        followed by the changed fields: ``PRESETS["mxfp8"].replace(proxy="u32").name == "mxfp8+proxy=u32"``
        (records and reports name what was computed; :func:`get_recipe` parses such a name back into the same
        Recipe). An explicit ``name`` is kept as given; a copy with no field actually changed keeps the name.

        Raises
        ------
        ValueError
            One line naming the unknown field(s) and listing the accepted ones.
        """
        fields = [f.name for f in dataclasses.fields(self)]
        unknown = sorted(set(changes) - set(fields))
        if unknown:
            raise ValueError(f"Recipe.replace: unknown field(s) {', '.join(unknown)}; accepted: {', '.join(fields)}")
        if "name" not in changes:
            changed = [f for f in fields if f in changes and changes[f] != getattr(self, f)]
            if changed:
                changes["name"] = self.name + "".join(f"+{f}={changes[f]}" for f in changed)
        return dataclasses.replace(self, **changes)

    @property
    def is_quantized(self) -> bool:
        """True when any operand is narrower than BF16."""
        wide = (QKFormat.FP32, QKFormat.BF16)
        return any(fmt not in wide for fmt in (self.qk_format, self.p_format, self.v_format))


_FUSED = dict(exponential="schraudolph", proxy="u16", frozen_max=True, rowsum_gemm=True, hadamard=True)
#: What the default presets add to the paper's pipeline for inputs whose tokens share an offset (NUMERICS.md §7): the
#: signed rotation, K smoothing, and Q smoothing on the slices whose queries share a large offset (the switch
#: above; the other slices run the plain key loop bit for bit, paying only the Q statistics; its measured cost:
#: docs/design.md, "Q smoothing's per-slice switch").
ROBUST = dict(hadamard_signs=True, smooth_k=True, smooth_q=True)
#: What the default presets add per P format: FP8 P under one per-row scale (fp8_row) lowers its reference when a
#: key tile peaks 10 doublings below it, where that peak times the Hopper kernel's 2^4 reaches E4M3's smallest normal
#: 2^-6 (NUMERICS.md §7, attention sinks), and visits the key tiles diagonal first (the reference from the row's own
#: neighbourhood where attention is local). Block-scaled P (mxfp6) re-scales every 32 keys and needs no lowering; it
#: takes the diagonal order with the reference raised by 3/32 doubling, which keeps the row's largest weights out of
#: the floor scale rule's saturation at 0.9375 (measurements: docs/design.md, "The frozen reference").
ROBUST_P = {"fp8_row": dict(rollback_floor_log2=10, key_order="diagonal"),
            "mxfp6": dict(key_order="diagonal", frozen_max_offset_log2=MXFP6_P_FROZEN_MAX_OFFSET_LOG2)}
#: The suffix of the paper-faithful presets.
PAPER_SUFFIX = "-paper"
_OPERANDS = {
    "mxfp8": dict(qk_format="mxfp8", p_format="fp8_row", v_format="fp8_tensor"),
    "mxfp6": dict(qk_format="mxfp6", p_format="mxfp6", v_format="mxfp6"),
    "mxfp4": dict(qk_format="mxfp4", p_format="mxfp6", v_format="mxfp4"),
}

#: Named presets. ``mxfp8``/``mxfp6``/``mxfp4`` are paper Table 3 with the complete pipeline (Table 4's bold row)
#: plus :data:`ROBUST`; ``mxfp8-paper``/``mxfp6-paper``/``mxfp4-paper`` are the paper's pipeline alone (what
#: ``fsattn accuracy --table 4`` reproduces); ``bf16-emulated`` is the conventional softmax on BF16 operands, computed
#: by the emulator (``"bf16"`` names stock attention, as a policy of ``fsattn_diffusers.integration``); ``exact``
#: keeps FP32 throughout.
BF16_EMULATED = "bf16-emulated"
#: The accurate tier's preset (INT8 Q/K, BF16 P and V).
INT8_BF16 = "int8-bf16"
#: The Hopper speed tier's preset (INT8 Q/K, FP8 E4M3 P and V).
INT8_FP8 = "int8-fp8"
PRESETS = {
    "exact": Recipe(name="exact", qk_format="fp32", p_format="fp32", v_format="fp32"),
    BF16_EMULATED: Recipe(name=BF16_EMULATED, qk_format="bf16", p_format="bf16", v_format="bf16"),
    **{name: Recipe(name=name, **ops, **_FUSED, **ROBUST, **ROBUST_P[ops["p_format"]])
       for name, ops in _OPERANDS.items()},
    **{name + PAPER_SUFFIX: Recipe(name=name + PAPER_SUFFIX, **ops, **_FUSED) for name, ops in _OPERANDS.items()},
    # The accurate tier: INT8 Q/K, Stage-A's BF16 proxy itself as P (no Stage-B), BF16 V; the signed rotation and K
    # smoothing; `int8-bf16+smooth_q=true` adds Q smoothing with its per-slice switch (NUMERICS.md §1, §7).
    INT8_BF16: Recipe(name=INT8_BF16, qk_format="int8", p_format="bf16", v_format="bf16", **_FUSED,
                      **{k: v for k, v in ROBUST.items() if k != "smooth_q"}),
    # The Hopper speed tier: the accurate tier's INT8 pre-pass with Q smoothing's per-slice switch (ROBUST),
    # P = E4M3(2^(X - m) 2^4) under the frozen reference (sm90_numerics difference 13; the exact exponential:
    # Schraudolph's proxy missed SageAttention 2's error on gaussian, NUMERICS.md §1), V in E4M3 with one scale per
    # channel, and fp8_row P's lowering; the key tiles in natural order, the only order the INT8 kernel visits.
    INT8_FP8: Recipe(name=INT8_FP8, qk_format="int8", p_format="fp8_row", v_format="fp8_channel",
                     **{**_FUSED, "exponential": "exact"}, **ROBUST,
                     **{**ROBUST_P["fp8_row"], "key_order": "natural"}),
}


#: Each field's type, read from the class (``Optional[X]`` for the fields that accept None).
_FIELD_TYPES = typing.get_type_hints(Recipe)


def _field_value(name: str, text: str):
    """The value of field ``name`` written as ``text`` in a recipe name: ``true``/``false``, a number, ``none`` (where
    the field accepts None), or a mode's string (checked by :class:`Recipe`)."""
    kind = _FIELD_TYPES[name]
    args = typing.get_args(kind)
    optional = type(None) in args
    if optional:
        kind = next(a for a in args if a is not type(None))
    low = text.strip().lower()
    if optional and low == "none":
        return None
    if kind is bool:
        if low not in ("true", "false", "1", "0"):
            raise ValueError(f"Recipe.{name}={text!r} is not a bool; accepted: true, false")
        return low in ("true", "1")
    if kind in (int, float):
        try:
            return kind(low)
        except ValueError:
            what = "an integer" if kind is int else "a number"
            raise ValueError(f"Recipe.{name}={text!r} is not {what}") from None
    return low


#: Former preset names, accepted with a one-time deprecation notice: old name -> the preset's name now.
RENAMED_PRESETS = {"bf16": BF16_EMULATED}


def parse_recipe_name(text: str) -> Recipe:
    """A preset with changes, written ``"mxfp8+smooth_q"`` or ``"mxfp8+proxy=u32+rollback_cap_log2=24"`` (a bare
    field name means ``=true``). Unknown presets or fields raise a one-line ValueError; a former name
    (:data:`RENAMED_PRESETS`) gives its preset with a one-time deprecation notice."""
    base, *changes = [part.strip() for part in text.strip().lower().split("+")]
    if base in RENAMED_PRESETS:
        new = RENAMED_PRESETS[base]
        warn_once(f"renamed preset {base}", f"recipe {base!r} is deprecated: the preset is now {new!r} (the "
                  f"conventional softmax on BF16 operands, computed by the emulator; \"{base}\" as a policy is stock "
                  f"attention)")
        base, text = new, "+".join([new, *changes])
    if base not in PRESETS:
        raise ValueError(f"unknown recipe {text!r}; accepted: {', '.join(PRESETS)}, a Recipe, or a preset with "
                         f"changes such as 'mxfp8+smooth_q'")
    fields = {f.name: f for f in dataclasses.fields(Recipe) if f.name != "name"}
    kwargs = {}
    for change in changes:
        key, _, value = change.partition("=")
        if key not in fields:
            raise ValueError(f"unknown Recipe field {key!r} in {text!r}; accepted: {', '.join(fields)}")
        kwargs[key] = _field_value(key, value or "true")
    return PRESETS[base].replace(name=text.strip(), **kwargs) if kwargs else PRESETS[base]


def get_recipe(recipe) -> Recipe:
    """Resolve a preset name (optionally with changes, see :func:`parse_recipe_name`) or pass a Recipe through.

    Raises
    ------
    ValueError
        For an unknown name or a value that is neither a name nor a Recipe.
    """
    if isinstance(recipe, Recipe):
        return recipe
    if isinstance(recipe, str):
        return parse_recipe_name(recipe)
    raise ValueError(f"recipe must be a preset name or a Recipe, got {type(recipe).__name__}; "
                     f"accepted: {', '.join(PRESETS)} or a Recipe")

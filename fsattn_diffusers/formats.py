"""Narrow floating-point element formats and OCP MX (microscaling) block quantization.

Pure PyTorch, CPU and CUDA. Values are carried in float32 tensors whose values lie on the target grid
("fake quantization"); :func:`quantize_mx` / :func:`dequantize_mx` also give the stored form (element
codes, E8M0 scale bytes, FP4 packed two per byte).

Element rounding is round-to-nearest-even with saturation to the largest finite element (OCP MX v1.0,
Section 6.3); NaN stays NaN. Shared-exponent rules (see :data:`SCALE_RULES`):

* ``floor``  — OCP: ``floor(log2 amax) - emax_elem`` (the largest elements may saturate).
* ``ceil``   — ``ceil(log2(amax / elem_max))``, with ``amax / elem_max`` rounded to fp32 first
  (torchao RCEIL; AITER's MXFP4 quantizer). Never saturates.
* ``round_up_175`` — AITER's MXFP8 quantizer: the exponent of amax, plus one when amax's mantissa is
  >= 1.75, minus 8. E4M3 only (448 = 1.75 * 2^8); never saturates.

Ends of the fp32 range (all as AITER's mha_v4 quantizers compute them, pinned by tests/test_formats_edges.py):

* ``round_up_175`` with amax >= 1.75 * 2^127 (and amax = inf): rounding the exponent up leaves the finite
  range, and the scale saturates at s = 127 (E8M0 byte 254) instead of 128 - 8 = 120. The block maximum
  stays exact (amax / 2^127 < 2 in E4M3); elements below 2^118 lose the 7 binades between.
* ``ceil`` with amax / elem_max <= 2^-127 (an fp32 subnormal): the bit construction gives s = -126 where
  exact ceil(log2) and torchao's RCEIL clamp to -127; elements are then at most half of elem_max (one bit
  of precision less, never a saturation). amax = 0 gives -127.
* An infinite element: the scale is the largest the rule gives (127; ``floor``: 128 - emax), the element
  saturates to the element maximum and dequantizes to +-inf (fp32 overflow), and every finite element
  of its block below 2^117 is flushed to 0. (AITER's MXFP4 would store the E8M0 NaN byte here.)
* A NaN element makes its block's scale the E8M0 NaN byte and the whole block NaN (torchao, OCP); AITER's
  ``fmaxf`` block maximum skips NaN instead. Attention repairs non-finite inputs before these matter
  (:mod:`fsattn_diffusers.nonfinite`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from .modes import Mode

# OCP MX v1.0: 32 elements share one scale.
MX_BLOCK = 32
# E8M0 encodes 2^(byte - 127); byte 255 is NaN. We clamp exponents to [-127, 127].
E8M0_BIAS = 127
E8M0_NAN = 255


class ScaleRule(Mode):
    """How an MX block's E8M0 scale follows from its largest magnitude (``Recipe.*_scale_rule``; module docstring)."""

    FLOOR = "floor"
    CEIL = "ceil"
    ROUND_UP_175 = "round_up_175"


SCALE_RULES = ScaleRule.values()
# AITER mha_v4_quant.cu, MXFP8: adding 2^21 to fp32 bits carries into the exponent iff mantissa >= 1.75.
_ROUND_UP_175_ADD = 0x00200000
_F32_EXP_MASK = 0x7F800000
_F32_MANT_ONES = 0x007FFFFF


@dataclass(frozen=True)
class ElemFormat:
    """A sign-magnitude minifloat without infinities (OCP MX element types, FP8 E4M3)."""

    name: str
    ebits: int
    mbits: int
    bias: int
    max_value: float  # largest finite magnitude

    @property
    def emax(self) -> int:
        """Exponent of the largest normal binade (OCP's emax_elem)."""
        return math.floor(math.log2(self.max_value))

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal binade."""
        return 1 - self.bias

    @property
    def bits(self) -> int:
        return 1 + self.ebits + self.mbits


E4M3 = ElemFormat("e4m3", 4, 3, 7, 448.0)  # FP8; 0x7F / 0xFF are NaN
E2M3 = ElemFormat("e2m3", 2, 3, 1, 7.5)  # FP6
E3M2 = ElemFormat("e3m2", 3, 2, 3, 28.0)  # FP6 (alternative)
E2M1 = ElemFormat("e2m1", 2, 1, 1, 6.0)  # FP4
ELEM_FORMATS = {f.name: f for f in (E4M3, E2M3, E3M2, E2M1)}
#: Element format of each MX format name used by recipes.
MX_ELEMENT = {"mxfp8": E4M3, "mxfp6": E2M3, "mxfp4": E2M1}
#: The paper kernels' shared-exponent rule per MX format (AITER mha_v4 quantizers).
DEFAULT_SCALE_RULE = {"mxfp8": ScaleRule.ROUND_UP_175, "mxfp6": ScaleRule.FLOOR, "mxfp4": ScaleRule.CEIL}


class _OperandFormat(Mode):
    """Shared by the operand formats: the MX element, if the format is an MX one."""

    @property
    def mx_element(self) -> Optional[ElemFormat]:
        """The element format of an MX format (32 elements per E8M0 scale), else None."""
        return MX_ELEMENT.get(self.value)


class QKFormat(_OperandFormat):
    """The format of Q and K, the score GEMM's operands (``Recipe.qk_format``; NUMERICS.md §1).

    ``FP32``/``BF16`` round to those types. ``FP8``: E4M3 with one FP32 scale per tensor. ``MXFP8``/``MXFP6``/
    ``MXFP4``: OCP MX, E4M3 / E2M3 / E2M1 elements with an E8M0 scale per 32 channels of the head dim. ``INT8``:
    symmetric codes -127..127 with one FP32 scale ``amax / 127`` per query and per key tile
    (:func:`fake_quantize_int8_rows`).
    """

    FP32 = "fp32"
    BF16 = "bf16"
    FP8 = "fp8"
    MXFP8 = "mxfp8"
    MXFP6 = "mxfp6"
    MXFP4 = "mxfp4"
    INT8 = "int8"


class VFormat(_OperandFormat):
    """The format of V, the PV GEMM's B operand (``Recipe.v_format``; NUMERICS.md §1).

    ``FP32``/``BF16`` round to those types. ``FP8_TENSOR``: E4M3 with one FP32 scale per tensor. ``FP8_CHANNEL``:
    E4M3 with one FP32 scale ``amax / 448`` per (batch, head, channel) over the valid keys
    (:func:`fake_quantize_fp8_channel`; SageAttention 2's V). ``MXFP8``/``MXFP6``/``MXFP4``: OCP MX with an E8M0
    scale per 32 keys of a channel.
    """

    FP32 = "fp32"
    BF16 = "bf16"
    FP8_TENSOR = "fp8_tensor"
    FP8_CHANNEL = "fp8_channel"
    MXFP8 = "mxfp8"
    MXFP6 = "mxfp6"
    MXFP4 = "mxfp4"


class PFormat(_OperandFormat):
    """The format of P, the probabilities that are the PV GEMM's A operand (``Recipe.p_format``).

    The one description of the P formats; every layer takes P's format from here:

    * ``FP32``/``BF16``: Stage-A's weights rounded to those types (no scale; ``BF16`` with the U16 proxy is the
      proxy itself).
    * ``FP8_ROW``: E4M3 elements under one power-of-two scale per row and key tile (``Recipe.tile_n`` keys), rule
      ``round_up_175`` unless ``Recipe.p_scale_rule`` says otherwise.
    * ``MXFP6``/``MXFP4``: E2M3 / E2M1 elements under one E8M0 scale per 32 keys, rules ``floor`` / ``ceil`` by
      default (the paper kernels' MX rules, :data:`DEFAULT_SCALE_RULE`).

    The layers: :func:`fsattn_diffusers.operands.stage_b` quantizes by :attr:`element`, :meth:`keys_per_scale` and
    :attr:`default_scale_rule` (the ``mi355x`` numerics); on Hopper the scale is a fixed power of two per row
    (the Hopper numerics' ``P_SIGMA``, by format: ``FP8_ROW`` and ``MXFP6`` only) and their ``stage_b``
    carries MXFP6 P in E4M3; the Hopper kernels' plan (``plan`` of their kernel package) turns the format into their
    MXFP6-P switch.
    """

    FP32 = "fp32"
    BF16 = "bf16"
    FP8_ROW = "fp8_row"
    MXFP6 = "mxfp6"
    MXFP4 = "mxfp4"

    @property
    def element(self) -> Optional[ElemFormat]:
        """The element format of a scaled P format (E4M3, E2M3, E2M1); None for ``FP32``/``BF16``."""
        return E4M3 if self is PFormat.FP8_ROW else self.mx_element

    @property
    def default_scale_rule(self) -> Optional[ScaleRule]:
        """The shared-exponent rule when ``Recipe.p_scale_rule`` is None; None for ``FP32``/``BF16``."""
        if self is PFormat.FP8_ROW:
            return ScaleRule.ROUND_UP_175
        return DEFAULT_SCALE_RULE.get(self.value)

    def keys_per_scale(self, tile_n: int) -> Optional[int]:
        """Keys that share one scale: ``tile_n`` (``FP8_ROW``, a row's key tile), :data:`MX_BLOCK` (MX formats),
        None (unscaled)."""
        if self is PFormat.FP8_ROW:
            return tile_n
        return MX_BLOCK if self.mx_element is not None else None


def round_to_bf16(x: torch.Tensor) -> torch.Tensor:
    """Round to BF16 (nearest-even) and return float32."""
    return x.to(torch.bfloat16).to(torch.float32)


def round_to_elem(x: torch.Tensor, fmt: ElemFormat) -> torch.Tensor:
    """Round float32 ``x`` to ``fmt``'s grid: nearest-even, saturating, subnormals kept, NaN kept.

    Parameters
    ----------
    x : Tensor, float32, any shape
    fmt : ElemFormat

    Returns
    -------
    Tensor, float32, same shape, every finite value representable in ``fmt``.
    """
    x = x.to(torch.float32)
    ax = x.abs()
    _, exp = torch.frexp(ax)  # ax = mant * 2^exp, mant in [0.5, 1): floor(log2 ax) = exp - 1
    e = torch.clamp(exp - 1, min=fmt.emin)
    quantum_exp = (e - fmt.mbits).to(torch.int32)
    y = torch.ldexp(torch.round(torch.ldexp(ax, -quantum_exp)), quantum_exp)
    y = torch.clamp(y, max=fmt.max_value)  # saturate (inf too); NaN passes through clamp
    return torch.copysign(y, x)


def encode_elem(values: torch.Tensor, fmt: ElemFormat) -> torch.Tensor:
    """Bit codes (uint8, low ``fmt.bits`` bits) of values already on ``fmt``'s grid."""
    v = values.to(torch.float32)
    sign = torch.signbit(v).to(torch.int32)
    av = v.abs()
    _, exp = torch.frexp(av)
    e = torch.clamp(exp - 1, min=fmt.emin)
    normal = av >= 2.0 ** fmt.emin
    field = torch.where(normal, e + fmt.bias, torch.zeros_like(e))
    mant = torch.ldexp(av, -(e - fmt.mbits).to(torch.int32)).to(torch.int32)
    mant = torch.where(normal, mant - (1 << fmt.mbits), mant)
    code = (sign << (fmt.ebits + fmt.mbits)) | (field << fmt.mbits) | mant
    if fmt is E4M3:
        code = torch.where(torch.isnan(v), (sign << 7) | 0x7F, code)
    return code.to(torch.uint8)


def decode_elem(codes: torch.Tensor, fmt: ElemFormat) -> torch.Tensor:
    """Float32 values of ``fmt`` bit codes (uint8)."""
    c = codes.to(torch.int32)
    sign = (c >> (fmt.ebits + fmt.mbits)) & 1
    field = (c >> fmt.mbits) & ((1 << fmt.ebits) - 1)
    mant = c & ((1 << fmt.mbits) - 1)
    normal = field > 0
    e = torch.where(normal, field - fmt.bias, torch.full_like(field, fmt.emin))
    sig = torch.where(normal, mant + (1 << fmt.mbits), mant).to(torch.float32)
    val = torch.ldexp(sig, (e - fmt.mbits).to(torch.int32))
    if fmt is E4M3:
        val = torch.where((c & 0x7F) == 0x7F, torch.full_like(val, float("nan")), val)
    return torch.where(sign.bool(), -val, val)


def shared_exponent(amax: torch.Tensor, fmt: ElemFormat, rule: str) -> torch.Tensor:
    """Unbiased E8M0 exponent (int32, clamped to [-127, 127]) for blocks with absolute maximum ``amax``.

    NaN blocks get exponent 128 (stored as the E8M0 NaN byte 255 by :func:`quantize_mx`). At the ends of
    the range (module docstring): ``round_up_175`` gives 127 for amax >= 1.75 * 2^127 or inf; ``ceil``
    gives -126 for 0 < amax / elem_max <= 2^-127 (exact ceil: -127) and 127 for inf.
    """
    amax = amax.to(torch.float32)
    if rule == ScaleRule.FLOOR:
        biased = (amax.view(torch.int32) >> 23) & 0xFF
        s = biased - E8M0_BIAS - fmt.emax
    elif rule == ScaleRule.CEIL:
        # fl(amax / elem_max) as the rule defines it: PyTorch's CUDA division by a Python scalar multiplies by the
        # reciprocal, another rounding of the quotient (no ceil exponent found to differ on 4M values and the
        # neighbours of elem_max * 2^k; the per-tensor FP8 scale did differ, fake_quantize_fp8_tensor)
        descale = (amax / torch.full_like(amax, fmt.max_value)).view(torch.int32)
        s = (((descale + _F32_MANT_ONES) & _F32_EXP_MASK) >> 23) - E8M0_BIAS
    elif rule == ScaleRule.ROUND_UP_175:
        if fmt is not E4M3:
            raise ValueError(f"scale rule 'round_up_175' is defined for E4M3 only, got {fmt.name}; "
                             f"accepted: floor, ceil")
        biased = ((amax.view(torch.int32) + _ROUND_UP_175_ADD) & _F32_EXP_MASK) >> 23
        s = torch.where(biased == 255, torch.full_like(biased, 254), torch.clamp(biased - fmt.emax, min=0)) - E8M0_BIAS
    else:
        raise ValueError(f"unknown scale rule {rule!r}; accepted: {', '.join(SCALE_RULES)}")
    s = torch.clamp(s, -E8M0_BIAS, E8M0_BIAS)
    return torch.where(torch.isnan(amax), torch.full_like(s, E8M0_NAN - E8M0_BIAS), s)


def _blocks(x: torch.Tensor, axis: int, block: int) -> Tuple[torch.Tensor, int]:
    """Move ``axis`` last, zero-pad it to a multiple of ``block`` and split it: (..., nblocks, block)."""
    x = x.movedim(axis, -1).to(torch.float32)
    n = x.shape[-1]
    pad = (-n) % block
    if pad:
        x = torch.nn.functional.pad(x, (0, pad))
    return x.reshape(*x.shape[:-1], -1, block), n


def _unblocks(xb: torch.Tensor, n: int, axis: int) -> torch.Tensor:
    x = xb.reshape(*xb.shape[:-2], -1)[..., :n]
    return x.movedim(-1, axis)


def _mx_elements(x: torch.Tensor, fmt: ElemFormat, rule: str, axis: int, block: int):
    xb, n = _blocks(x, axis, block)
    s = shared_exponent(xb.abs().amax(dim=-1, keepdim=True), fmt, rule)
    nan_block = s == E8M0_NAN - E8M0_BIAS
    elems = round_to_elem(torch.ldexp(xb, -torch.where(nan_block, 0, s)), fmt)
    elems = torch.where(nan_block, torch.full_like(elems, float("nan")), elems)
    return elems, s, n


def fake_quantize_mx(x: torch.Tensor, fmt: ElemFormat, *, axis: int = -1, rule: str = "floor",
                     block: int = MX_BLOCK) -> torch.Tensor:
    """MX-quantize and dequantize in one go.

    Parameters
    ----------
    x : Tensor, any float dtype, any shape; blocks of ``block`` consecutive elements along ``axis``
        (the last block zero-padded when the axis length is not a multiple of ``block``).

    Returns
    -------
    Tensor, float32, same shape: ``element * 2^shared_exponent``, bit-identical to
    ``dequantize_mx(quantize_mx(x, ...))``.
    """
    elems, s, n = _mx_elements(x, fmt, rule, axis, block)
    return _unblocks(torch.ldexp(elems, s), n, axis)


@dataclass
class MXTensor:
    """Stored MX form. ``codes``: uint8 element codes (FP4: two per byte, element 2i in the low
    nibble), blocked as (..., nblocks, block or block/2) with ``axis`` moved last; ``scales``: uint8
    E8M0 bytes (..., nblocks, 1)."""

    codes: torch.Tensor
    scales: torch.Tensor
    fmt: ElemFormat
    axis: int
    length: int


def quantize_mx(x: torch.Tensor, fmt: ElemFormat, *, axis: int = -1, rule: str = "floor",
                block: int = MX_BLOCK) -> MXTensor:
    """Quantize to the stored MX form (see :class:`MXTensor`)."""
    elems, s, n = _mx_elements(x, fmt, rule, axis, block)
    codes = encode_elem(elems, fmt)
    if fmt.bits == 4:
        codes = pack_fp4(codes)
    scales = (s + E8M0_BIAS).to(torch.uint8)
    return MXTensor(codes, scales, fmt, axis, n)


def dequantize_mx(t: MXTensor) -> torch.Tensor:
    """Float32 values of a stored MX tensor, in the original shape."""
    codes = unpack_fp4(t.codes) if t.fmt.bits == 4 else t.codes
    vals = decode_elem(codes, t.fmt)
    scale = t.scales.to(torch.int32)
    vals = torch.where(scale == E8M0_NAN, torch.full_like(vals, float("nan")), torch.ldexp(vals, scale - E8M0_BIAS))
    return _unblocks(vals, t.length, t.axis)


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """Pack 4-bit codes two per byte along the last axis (even index in the low nibble)."""
    c = codes.to(torch.uint8)
    return (c[..., 0::2] & 0xF) | ((c[..., 1::2] & 0xF) << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_fp4`."""
    lo, hi = packed & 0xF, packed >> 4
    return torch.stack((lo, hi), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def fake_quantize_fp8_tensor(x: torch.Tensor) -> torch.Tensor:
    """FP8 E4M3 with one float32 scale ``amax / 448`` for the whole tensor (paper Table 3, mxfp8 V).

    Returns float32 dequantized values. An all-zero tensor stays zero.
    """
    x = x.to(torch.float32)
    amax = x.abs().amax()
    # a tensor divisor: PyTorch's CUDA division by a Python scalar multiplies by its reciprocal (one ulp off at times)
    scale = torch.where(amax > 0, amax / torch.full_like(amax, E4M3.max_value), torch.ones_like(amax))
    return round_to_elem(x / scale, E4M3) * scale


def fake_quantize_fp8_channel(x: torch.Tensor) -> torch.Tensor:
    """FP8 E4M3 with one float32 scale ``amax / 448`` per channel (the last axis) over the tokens (axis -2):
    ``E4M3(x / scale) * scale`` for ``x`` (..., S, D), float32 values of that shape. A channel of zeros stays zero."""
    x = x.to(torch.float32)
    amax = x.abs().amax(dim=-2, keepdim=True)
    scale = torch.where(amax > 0, amax / torch.full_like(amax, E4M3.max_value), torch.ones_like(amax))
    return round_to_elem(x / scale, E4M3) * scale


def fake_quantize_pow2_rows(x: torch.Tensor, fmt: ElemFormat, rule: str, *, group: int) -> torch.Tensor:
    """Quantize to ``fmt`` with one power-of-two scale per row and group of ``group`` columns.

    This is per-row FP8 P (paper Table 3: "a power-of-two scale per row and key tile") when ``group`` is
    the key-tile width. ``x``: float32 (..., rows, cols); groups run along the last axis.
    """
    return fake_quantize_mx(x, fmt, axis=-1, rule=rule, block=group)


#: Largest INT8 code of the symmetric INT8 format (codes -127..127; -128 is not used, so negation is exact).
INT8_MAX = 127


def int8_rows(x: torch.Tensor, rows_per_scale: int = 1) -> Tuple[torch.Tensor, torch.Tensor]:
    """Symmetric INT8 codes and scales, one float32 scale ``amax / 127`` per group of ``rows_per_scale`` rows.

    Parameters
    ----------
    x : Tensor (..., S, D), float
        Rows are tokens, columns the head dimension; a group is ``rows_per_scale`` tokens (the last one may be
        shorter).
    rows_per_scale : int
        1 gives one scale per token; the key tile's width gives one per key tile.

    Returns
    -------
    codes : Tensor (..., S, D) float32, ``rne(x / scale)`` in [-127, 127].
    scales : Tensor (..., S, 1) float32, each row's group scale (1 for a group of zeros; NaN if it holds a NaN).
    """
    if rows_per_scale < 1:
        raise ValueError(f"rows_per_scale={rows_per_scale!r}; accepted: a positive int")
    y = x.to(torch.float32)
    s, d = y.shape[-2], y.shape[-1]
    pad = (-s) % rows_per_scale
    yp = torch.nn.functional.pad(y, (0, 0, 0, pad))
    groups = yp.reshape(*yp.shape[:-2], -1, rows_per_scale * d)
    amax = groups.abs().amax(dim=-1, keepdim=True)
    # IEEE divisions on every device: PyTorch's CUDA division by a Python scalar multiplies by its reciprocal instead
    # (one ulp off in ~5% of the scales), so the divisor is a tensor. NaN amax: a NaN scale.
    scale = torch.where(amax == 0, torch.ones_like(amax), amax / torch.full_like(amax, INT8_MAX))
    codes = torch.clamp(torch.round(groups / scale), -INT8_MAX, INT8_MAX).reshape(yp.shape)[..., :s, :]
    scales = scale.repeat_interleave(rows_per_scale, dim=-2)[..., :s, :]
    return codes, scales


def fake_quantize_int8_rows(x: torch.Tensor, rows_per_scale: int = 1) -> torch.Tensor:
    """:func:`int8_rows`' values ``code * scale`` (..., S, D) float32. A group of zeros stays zero; a NaN makes its
    group NaN."""
    codes, scales = int8_rows(x, rows_per_scale)
    return codes * scales


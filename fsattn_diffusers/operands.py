"""The pre-pass and Stage-B: operands of the two GEMMs in each recipe's formats (paper Table 3).

Everything returns float32 tensors whose values are exactly the quantized operands (dequantized), so the
emulator's GEMMs are plain float32 matrix products of the values the hardware multiplies.
"""

from __future__ import annotations

import math
from typing import Tuple

import torch

from .formats import (DEFAULT_SCALE_RULE, MX_ELEMENT, PFormat, QKFormat, ScaleRule, VFormat, fake_quantize_fp8_channel,
                      fake_quantize_fp8_tensor, fake_quantize_int8_rows, fake_quantize_mx, round_to_bf16)
from .exponent import LOG2E  # noqa: F401 (operands.LOG2E: where Q is pre-scaled)
from .hadamard import fwht_unnormalized, rotation_signs
from .recipe import Recipe


def scale_rule(recipe: Recipe, operand: str, fmt_name: str) -> ScaleRule:
    """The shared-exponent rule of ``operand`` (``qk``, ``v`` or ``p``) for MX format ``fmt_name``."""
    explicit = getattr(recipe, f"{operand}_scale_rule")
    if explicit is not None:
        return explicit
    return DEFAULT_SCALE_RULE[fmt_name]


def rotate(y: torch.Tensor, recipe: Recipe) -> torch.Tensor:
    """``y @ diag(s) H`` unnormalized (float32, (..., D)): the Walsh-Hadamard butterflies, after the fixed signs
    ``s`` when ``recipe.hadamard_signs`` (each product by +-1 is exact)."""
    if recipe.hadamard_signs:
        y = y * rotation_signs(y.shape[-1]).to(y.device)
    return fwht_unnormalized(y)


def prequantize_qk(x: torch.Tensor, recipe: Recipe, multiplier: float) -> torch.Tensor:
    """The BF16 value a quantized Q/K format rounds before quantizing: rotate, scale, round (float32).

    AITER mha_v4_quant.cu: MXFP8 rounds the rotation to BF16 and then the scaled value again; the
    MXFP6/MXFP4 (and per-tensor FP8) paths round ``rotate * rsqrt(d) * multiplier`` once.
    """
    y = round_to_bf16(x.to(torch.float32))
    if recipe.hadamard:
        rsqrt_d = 1.0 / math.sqrt(x.shape[-1])
        y = rotate(y, recipe)
        if recipe.qk_format == QKFormat.MXFP8:
            return round_to_bf16(round_to_bf16(y * rsqrt_d) * multiplier)
        return round_to_bf16(y * rsqrt_d * multiplier)
    return round_to_bf16(y * multiplier)


def prepare_qk(x: torch.Tensor, recipe: Recipe, multiplier: float, rows_per_scale: int = 1
               ) -> Tuple[torch.Tensor, float]:
    """Pre-pass of Q (``multiplier = alpha * log2 e``) or K (``multiplier = 1``).

    Parameters
    ----------
    x : Tensor (B, H, S, D), any float dtype and strides.
    rows_per_scale : int
        ``int8`` only: tokens per INT8 scale (1 for Q; ``recipe.tile_n`` for K, one scale per key tile).

    Returns
    -------
    operand : Tensor (B, H, S, D) float32, the values the score GEMM multiplies.
    post_multiplier : float
        Factor applied to the FP32 scores afterwards. Quantized formats fold the multiplier into the
        operand before quantization (paper Algorithm 1: ``(alpha log2 e) Q_i`` is quantized), so 1.0;
        ``fp32``/``bf16`` keep the operand as given and scale the scores, as a BF16 kernel does.
    """
    fmt = recipe.qk_format
    if fmt in (QKFormat.FP32, QKFormat.BF16):
        y = x.to(torch.float32)
        if fmt == QKFormat.BF16:
            y = round_to_bf16(y)
        if recipe.hadamard:
            y = rotate(y, recipe) * (1.0 / math.sqrt(x.shape[-1]))
        return y, multiplier
    y = prequantize_qk(x, recipe, multiplier)
    if fmt == QKFormat.INT8:
        return fake_quantize_int8_rows(y, rows_per_scale), 1.0
    if fmt == QKFormat.FP8:
        return fake_quantize_fp8_tensor(y), 1.0
    elem = MX_ELEMENT[fmt]
    return fake_quantize_mx(y, elem, axis=-1, rule=scale_rule(recipe, "qk", fmt)), 1.0


def prepare_v(v: torch.Tensor, recipe: Recipe, valid: torch.Tensor = None) -> torch.Tensor:
    """V operand (B, H, S_k, D) float32. MX blocks run along the key axis (32 keys per channel).

    ``valid`` (B, 1, S_k, 1) bool, optional: padded keys are zeroed before quantization so they
    cannot move a block's or the tensor's scale.
    """
    y = v.to(torch.float32)
    if valid is not None:
        y = torch.where(valid, y, torch.zeros_like(y))
    fmt = recipe.v_format
    if fmt == VFormat.FP32:
        return y
    y = round_to_bf16(y)
    if fmt == VFormat.BF16:
        return y
    if fmt == VFormat.FP8_TENSOR:
        return fake_quantize_fp8_tensor(y)
    if fmt == VFormat.FP8_CHANNEL:
        return fake_quantize_fp8_channel(y)
    return fake_quantize_mx(y, MX_ELEMENT[fmt], axis=-2, rule=scale_rule(recipe, "v", fmt))


def stage_b(p: torch.Tensor, recipe: Recipe) -> torch.Tensor:
    """Stage-B: the Stage-A probabilities in ``recipe.p_format`` (:class:`~fsattn_diffusers.formats.PFormat`).

    Parameters
    ----------
    p : Tensor (..., rows, keys of one key tile) float32
        Stage-A's weights.
    recipe : Recipe

    Returns
    -------
    Tensor, the shape of ``p``, float32: the values the PV GEMM multiplies. ``fp8_row`` takes one power-of-two
    scale per row over the whole key tile, ``mxfp6``/``mxfp4`` an E8M0 scale per 32 keys; the scales come from the
    block maxima of P (the same maxima the gate reads, paper Section 4.2).
    """
    fmt = recipe.p_format
    if fmt == PFormat.FP32:
        return p
    if fmt == PFormat.BF16:
        return round_to_bf16(p)
    rule = recipe.p_scale_rule or fmt.default_scale_rule
    return fake_quantize_mx(p, fmt.element, axis=-1, rule=rule, block=fmt.keys_per_scale(recipe.tile_n))

"""``Recipe.tile_m`` is honoured or fixed, never silently ignored: the ``sm90`` numerics (what the Hopper kernels compute,
recorded as ``computed_numerics = "sm90"``) fix 128-row query tiles; ``tile_n`` other than 128 the Triton backend
refuses with one line (NUMERICS.md §6)."""

import torch

from fsattn_diffusers.backends import computed_numerics
from fsattn_diffusers.emulator import emulate_attention
from fsattn_diffusers.kernels.sm90.plan import unsupported_reason
from fsattn_diffusers.numerics import numerics_for
from fsattn_diffusers.recipe import PRESETS

BASE = PRESETS["mxfp8"]


def test_triton_takes_any_tile_m_and_records_the_sm90_numerics_with_128_row_tiles():
    wide = BASE.replace(tile_m=512)
    assert unsupported_reason(wide, 128) is None
    assert computed_numerics("triton", wide) == "sm90"
    assert numerics_for(wide.replace(numerics="sm90")).tile_m == 128
    assert numerics_for(wide).tile_m == 512  # the mi355x numerics honour it


def test_triton_refuses_another_tile_n_with_one_line():
    why = unsupported_reason(BASE.replace(tile_n=64), 128)
    assert why == "tile_n 64 (the Triton kernel's key tile is 128)"


def test_sm90_values_do_not_depend_on_tile_m():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 512, 64, generator=g).bfloat16() for _ in range(3))
    outs = [emulate_attention(q, k, v, BASE.replace(numerics="sm90", tile_m=m), scale=0.125)[0] for m in (128, 256)]
    assert torch.equal(outs[0], outs[1])

"""``Recipe.frozen_max_offset_log2``: the frozen reference raised by a multiple of 1/128 doubling above the first
tile's row maximum, and the MXFP6-P presets that take it with the diagonal key order.

Errors are relative Frobenius errors against float64 softmax attention (``testing.exact_attention``) on the same
rounded inputs; every test prints its numbers before asserting. The kernels' agreement with the sm90 emulator under
the default presets (which carry the offset) is in tests/test_kernel_gpu.py.
"""

import pytest
import torch

from fsattn_diffusers.emulator import emulate_attention
from fsattn_diffusers.measure.structured_inputs import FAMILIES
from fsattn_diffusers.numerics import MI355XNumerics, SM90Numerics
from fsattn_diffusers.recipe import (FROZEN_MAX_OFFSET_GRID, MXFP6_P_FROZEN_MAX_OFFSET_LOG2, PAPER_SUFFIX, PRESETS,
                                     Recipe, get_recipe)
from fsattn_diffusers.testing import exact_attention, relative_error
from tolerances import (FP32_ACCUMULATED, FP32_LSE_NATS, FP32_ROUNDOFF, FROZEN_OFFSET_GAUSSIAN_COST,
                        FROZEN_OFFSET_LOCALITY_GAIN)

SCALE = 128 ** -0.5
OFFSET = MXFP6_P_FROZEN_MAX_OFFSET_LOG2


def test_presets_raise_the_reference_for_mxfp6_p_only():
    assert OFFSET == 3 / 32 and (OFFSET * FROZEN_MAX_OFFSET_GRID).is_integer()
    for name in ("mxfp6", "mxfp4"):
        print(name, PRESETS[name].key_order, PRESETS[name].frozen_max_offset_log2)
        assert PRESETS[name].key_order == "diagonal" and PRESETS[name].frozen_max_offset_log2 == OFFSET
    for name in ("mxfp8", "bf16-emulated", "exact", *(n + PAPER_SUFFIX for n in ("mxfp8", "mxfp6", "mxfp4"))):
        assert PRESETS[name].frozen_max_offset_log2 == 0.0, name


@pytest.mark.parametrize("bad", [-1 / 128, 1.0, 0.1, 1 / 256, float("nan"), float("inf")])
def test_offset_off_the_grid_is_one_clear_error(bad):
    with pytest.raises(ValueError, match="frozen_max_offset_log2") as err:
        Recipe(frozen_max_offset_log2=bad)
    print(err.value)
    assert "\n" not in str(err.value) and "accepted: a multiple of 1/128 in [0, 1)" in str(err.value)


def test_offset_parses_from_a_recipe_name():
    r = get_recipe("mxfp6+frozen_max_offset_log2=0.125")
    assert r.frozen_max_offset_log2 == 0.125 and r.key_order == "diagonal"
    assert PRESETS["mxfp6"].replace(frozen_max_offset_log2=0.0).name == "mxfp6+frozen_max_offset_log2=0.0"


def test_the_seed_is_raised_by_the_offset_exactly():
    """sm90: ``ceil(128 max) / 128 + offset`` (on the kernel's grid, exact in fp32); mi355x: ``max + offset``."""
    t = torch.tensor([-3.3, 0.0, 0.001, 7.99, 100.5, float("-inf")])
    for o in (0.0, 1 / 128, OFFSET, 127 / 128):
        r = PRESETS["mxfp6"].replace(frozen_max_offset_log2=o)
        sm90 = SM90Numerics(r.replace(numerics="sm90")).seed(t)
        want = torch.ceil(t * 128) / 128 + o
        print(o, sm90.tolist())
        assert torch.equal(sm90, want) and torch.equal(sm90 * 128, torch.round(sm90 * 128))  # -inf stays -inf
        assert torch.equal(MI355XNumerics(r).seed(t), t + o)


@pytest.mark.parametrize("o", [1 / 128, OFFSET, 0.5])
def test_exact_arithmetic_is_unchanged(o):
    """With an exact exponential and FP32 operands the offset is a constant factor on P that the row sum divides out:
    outputs to float tolerance and the LSE (still the log-sum-exp of the scores)."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, s, 64, generator=g) * 2 for s in (300, 700, 700))
    base = PRESETS["exact"].replace(frozen_max=True)
    a, la, _ = emulate_attention(q, k, v, base, scale=SCALE, return_lse=True)
    b, lb, _ = emulate_attention(q, k, v, base.replace(frozen_max_offset_log2=o), scale=SCALE, return_lse=True)
    ex, ex_lse = exact_attention(q, k, v, SCALE)
    print(f"o={o}: out diff {relative_error(b, a):.2e}, lse max diff {float((lb - la).abs().max()):.2e}, "
          f"vs exact lse {float((lb - ex_lse).abs().max()):.2e}")
    assert relative_error(b, a) < FP32_ROUNDOFF and float((lb - la).abs().max()) < FP32_ACCUMULATED
    assert float((lb - ex_lse).abs().max()) < FP32_LSE_NATS


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_mxfp6_presets_gain_on_locality(dtype):
    """The reason for the presets' setting: on RoPE-like local attention the diagonal order with the raised reference
    beats MXFP6 P's paper order and plain seed (sm90 emulator), and Gaussian inputs do not get worse by more than
    0.1 pp."""
    errs = {}
    for family in ("locality", "gaussian"):
        q, k, v = FAMILIES[family](1, 1, 2048, 128, dtype, "cpu", 0)
        ex, _ = exact_attention(q, k, v, SCALE)
        for name in ("mxfp6", "mxfp6+key_order=natural+frozen_max_offset_log2=0"):
            out, _, _ = emulate_attention(q, k, v, get_recipe(name).replace(numerics="sm90"), scale=SCALE)
            errs[family, name] = relative_error(out, ex)
    print({f"{f} {n}": f"{e:.4%}" for (f, n), e in errs.items()})
    new, old = "mxfp6", "mxfp6+key_order=natural+frozen_max_offset_log2=0"
    assert errs["locality", new] < errs["locality", old] - FROZEN_OFFSET_LOCALITY_GAIN
    assert errs["gaussian", new] < errs["gaussian", old] + FROZEN_OFFSET_GAUSSIAN_COST

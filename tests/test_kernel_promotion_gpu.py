"""O's fp32 promotion (``Recipe.o_promotion_tiles``) in the gluon_pingpong kernel over 256 key tiles (S_k = 32768).

Hopper's FP8 wgmma keeps about 13 bits below the largest exponent it adds (numerics_accumulation): chained over every
key tile onto O it cut each later tile's products at O's magnitude, which left the kernel ~10% off on sharp rows at
S = 32768. Each interval runs against its own sm90 reference (which models the chain where the interval is not 1)
under the kernel rule (:func:`fsattn_diffusers.testing.within_kernel_rule`), on the structured families where the
chain's loss is largest, and every promoted interval keeps what the fp32 sum bought: its error is the every-tile
reference's under the same rule (the chain without promotion is 16x that on ``clustered``).
Skipped without an sm_90 GPU (the Triton interpreter runs the triton kernel, which promotes every tile only).
"""

import pytest
import torch

from kernel_device import CPU_INTERPRET, DEV, poison_allocator, rel, skip_module_without_sm90  # noqa: E402

skip_module_without_sm90()
pytest.importorskip("triton")

from kernel_device import sm90_reference_attention  # noqa: E402
from fsattn_diffusers.kernels.sm90.ops import fused_attention  # noqa: E402
from fsattn_diffusers.kernels.sm90.plan import plan_for  # noqa: E402
from fsattn_diffusers.measure.structured_inputs import FAMILIES  # noqa: E402
from fsattn_diffusers.recipe import get_recipe  # noqa: E402
from fsattn_diffusers.testing import KERNEL_REF_MAX, exact_attention, within_kernel_rule  # noqa: E402

pytestmark = pytest.mark.gpu
S_Q, S_K, D = 256, 32768, 128


@pytest.fixture(scope="module")
def inputs():
    if CPU_INTERPRET:
        pytest.skip("256 key tiles through the gluon_pingpong kernel: a GPU only")
    out = {}
    for family in ("clustered", "sharp"):
        q, k, v = FAMILIES[family](1, 2, S_K, D, torch.bfloat16, DEV, 0)
        out[family] = (q[:, :, :S_Q].contiguous(), k, v)
    return out


def _run(q, k, v, recipe_name):
    recipe = get_recipe(recipe_name)
    poison_allocator()
    out = fused_attention(q, k, v, plan_for(recipe), scale=D ** -0.5)[0]
    ref = sm90_reference_attention(q, k, v, recipe, scale=D ** -0.5)[0]
    return out, ref


@pytest.mark.parametrize("family", ["clustered", "sharp"])
def test_each_promotion_interval_is_its_reference_at_32768_keys(inputs, family):
    q, k, v = inputs[family]
    ex = exact_attention(q, k, v, D ** -0.5, None)[0]
    errs, every_tile_ref = {}, None
    for interval in (1, 2, 0):
        name = "mxfp8" if interval == 1 else f"mxfp8+o_promotion_tiles={interval}"
        out, ref = _run(q, k, v, name)
        e_k, e_r, kr = rel(out, ex), rel(ref, ex), rel(out, ref)
        errs[interval] = e_k
        every_tile_ref = e_r if interval == 1 else every_tile_ref
        print(f"{family} o_promotion_tiles={interval or 'never'}: err kernel {e_k:.5f} ref {e_r:.5f} "
              f"kernel-vs-ref {kr:.2e}")
        assert torch.isfinite(out).all(), "unwritten (NaN-poisoned) or non-finite output"
        assert within_kernel_rule(e_k, e_r) and kr < KERNEL_REF_MAX
    print(f"{family}: against the every-tile reference's error {every_tile_ref:.5f}: interval 2 "
          f"{errs[2] / every_tile_ref - 1:+.4f}, never {errs[0] / every_tile_ref - 1:+.4f}")
    assert within_kernel_rule(errs[1], every_tile_ref) and within_kernel_rule(errs[2], every_tile_ref)

"""Two CPU processes (gloo, file init, no network): fsattn under ring and Ulysses equals one process.

One spawn runs, for every recipe, diffusers' ring and Ulysses templates with fsattn's forward op and
torch's ``_templated_ring_attention`` (the ring of xDiT's USP) with the xDiT kernel contract; see
:mod:`fsattn_diffusers.measure.parallel_check`. Tolerance rule, errors measured against exact float64
attention: ``|err_sharded - err_single| <= 0.15 * err_single + 1e-5`` (the floor covers fp32 rounding of
the merge for the ``exact`` recipe). Sharding changes numerics legitimately: each K/V shard has its own
frozen maximum and per-tensor FP8 V scale (ring), and under Ulysses the per-tensor V scale covers the
local heads only; the MX blocks are unchanged. The INT8 tiers (``int8-bf16``, and with the exact exponential)
merge their LSE under the ring like the MX recipes: each K/V shard has its own key mean (K smoothing) and INT8 K
scales, so the ring's error differs slightly from one process's; Ulysses keeps every head's whole sequence on one
rank and is bit-identical. The Hopper hybrid (``hybrid-int8-mxfp8``, int8-bf16 at the first step) runs whole in the
tiny Wan transformer under ring and Ulysses.
"""

import pytest
import torch

from fsattn_diffusers.measure import parallel_check as check

RECIPES = ["exact", "bf16-emulated", "mxfp8", "mxfp6", "mxfp4", "int8-bf16", "int8-bf16+exponential=exact"]
#: Tiny Wan transformer with fsattn processors under diffusers' context parallelism.
WAN_POLICIES = ["exact", "mxfp8", "hybrid-int8-mxfp8"]
WORLD = 2


@pytest.fixture(scope="module")
def sharded():
    return check.run_sharded(RECIPES, world=WORLD, wan_policies=WAN_POLICIES)


@pytest.mark.parametrize("recipe", RECIPES)
def test_ring_and_ulysses_over_two_processes_equal_one_process(sharded, recipe):
    q, k, v = check.make_inputs()
    rows = check.compare(recipe, sharded[recipe], q, k, v)
    for r in rows:
        print(f"{recipe:6} {r['mode']:10} err one process {r['e_single']:.3e}  sharded {r['e_sharded']:.3e}  "
              f"max|diff| {r['max_abs_diff']:.2e}")
    assert sorted(r["mode"] for r in rows) == sorted(check.MODES)
    assert all(r["ok"] for r in rows), rows


@pytest.mark.parametrize("policy", WAN_POLICIES)
def test_wan_transformer_under_context_parallelism_equals_one_process(sharded, policy):
    """The Wan processor honours ``_parallel_config``: ring and Ulysses through diffusers' templates."""
    rows = check.compare_wan(policy, sharded[f"wan:{policy}"], backend="emulator")
    for r in rows:
        print(f"wan {policy:6} {r['mode']:8} err vs stock one process {r['e_single']:.3e}  "
              f"sharded {r['e_sharded']:.3e}")
    assert sorted(r["mode"] for r in rows) == ["ring", "ulysses"]
    assert all(r["ok"] for r in rows), rows


def test_numerics_that_sharding_does_not_touch_are_bit_identical(sharded):
    """Ulysses keeps every query row's keys on one rank: without per-tensor scales it is exact."""
    q, k, v = check.make_inputs()
    for recipe in ("exact", "bf16-emulated", "mxfp6", "mxfp4", "int8-bf16", "int8-bf16+exponential=exact"):
        single = check.attention(q, k, v, recipe)
        assert torch.equal(sharded[recipe]["ulysses"], single), recipe


def test_forward_op_gives_bshd_lse_only_when_the_template_asks():
    """diffusers' ring asks for the LSE (B, S, H); Ulysses does not; masks, causal and GQA are refused."""
    from fsattn_diffusers.parallel import fsattn_forward_op
    from fsattn_diffusers.recipe import PRESETS

    q, k, v = check.make_inputs((1, 96, 2, 64))
    op = fsattn_forward_op(PRESETS["mxfp8"], backend="emulator")
    out = op(None, q, k, v, None, 0.0, False, None, False, False)
    want, want_lse = check.attention(q, k, v, "mxfp8", return_lse=True, backend="emulator")
    assert torch.equal(out, want)
    out, lse = op(None, q, k, v, None, 0.0, False, None, False, True)
    assert torch.equal(out, want) and lse.shape == (1, 96, 2) and torch.equal(lse, want_lse.transpose(1, 2))
    with pytest.raises(ValueError, match="attn_mask=None"):
        op(None, q, k, v, torch.ones(1, 1, 96, 96, dtype=torch.bool), 0.0, False, None, False, False)

"""The lowering gate (``Recipe.rollback_floor_log2``): a frozen reference held up by an attention sink comes down.

Errors are relative Frobenius errors against float64 softmax attention (``testing.exact_attention``) on the same
rounded inputs; every test prints its numbers before asserting.
"""

import math

import pytest
import torch
from tile_patterns import patterned_tiles

import fsattn_diffusers as fa
from fsattn_diffusers import emulator
from fsattn_diffusers.measure.structured_inputs import FAMILIES
from fsattn_diffusers.recipe import PRESETS, ROBUST_P, ROLLBACK_FLOOR_LIMIT_LOG2, Recipe, get_recipe
from fsattn_diffusers.testing import exact_attention, relative_error
from tolerances import (FAR_SINK_ERR_MAX, FAR_SINK_LSE, FP32_ACCUMULATED, ROLLBACK_GAIN_MAX, ROLLBACK_MERGED_RATIO,
                        ROLLBACK_OFF_ERR_MIN, ROLLBACK_ON_ERR_MAX, ROLLBACK_SLACK_PP)

SCALE = 128 ** -0.5


def _sm90(name):
    return get_recipe(name).replace(numerics="sm90")


def _run(recipe, q, k, v, kv_lens=None):
    return emulator.emulate_attention(q, k, v, recipe, scale=SCALE, kv_lens=kv_lens, return_lse=True,
                                      return_stats=True)


def test_mxfp8_preset_lowers_and_the_paper_preset_does_not():
    assert PRESETS["mxfp8"].rollback_floor_log2 == ROBUST_P["fp8_row"]["rollback_floor_log2"] == 10
    for name in ("mxfp8-paper", "mxfp6", "mxfp4", "mxfp6-paper", "mxfp4-paper"):
        assert PRESETS[name].rollback_floor_log2 is None, name
    off = get_recipe("mxfp8+rollback_floor_log2=none")
    assert off.rollback_floor_log2 is None and off.smooth_k and off.hadamard_signs


@pytest.mark.parametrize("bad", [0, -3, ROLLBACK_FLOOR_LIMIT_LOG2 + 1])
def test_out_of_range_floor_is_one_clear_error(bad):
    with pytest.raises(ValueError, match="rollback_floor_log2") as err:
        Recipe(rollback_floor_log2=bad)
    print(err.value)
    assert "\n" not in str(err.value) and "accepted" in str(err.value)


@pytest.mark.parametrize("numerics", ["sm90", "mi355x"])
def test_a_sink_in_the_first_tile_no_longer_flushes_the_other_keys(numerics):
    """The sink's key is in key tile 0, so the frozen reference is its score, ~ln(S) + 4 nats above the rest; with
    fp8_row P under the sm90 kernel's per-row scale every later P falls to E4M3's subnormals (5.7% error). Lowering
    the reference at the first tile whose peak is 10 doublings down brings the error to that of mxfp6 P."""
    q, k, v = FAMILIES["attention_sink"](1, 2, 8192, 128, torch.bfloat16, "cpu", 0)
    q = q[:, :, :512]
    ex, ex_lse = exact_attention(q, k, v, SCALE)
    base = PRESETS["mxfp8"].replace(numerics=numerics, key_order="natural")  # key tile 0, the sink's, first
    on, lse_on, st_on = _run(base, q, k, v)
    off, lse_off, st_off = _run(base.replace(rollback_floor_log2=None), q, k, v)
    e_on, e_off = relative_error(on, ex), relative_error(off, ex)
    # The LSE must stay the log of the row sum the output is normalized by (a lowering rescales both): merging the
    # two key halves by their LSEs, as ring attention does, gives the one-call result up to the recipe's error.
    h = k.shape[2] // 2
    o1, l1, _ = _run(base, q, k[:, :, :h], v[:, :, :h])
    o2, l2, _ = _run(base, q, k[:, :, h:], v[:, :, h:])
    w = torch.softmax(torch.stack([l1, l2]), dim=0)[..., None]
    merged = w[0] * o1.float() + w[1] * o2.float()
    e_merged = relative_error(merged, ex)
    print(f"{numerics}: error with lowering {e_on:.4f} (rollbacks {st_on['rollbacks']}), without {e_off:.4f} "
          f"(rollbacks {st_off['rollbacks']}); key halves merged by LSE {e_merged:.4f}")
    assert st_on["rollbacks"] > st_off["rollbacks"]
    assert e_merged < ROLLBACK_MERGED_RATIO * e_on + ROLLBACK_SLACK_PP
    if numerics == "sm90":
        assert e_off > ROLLBACK_OFF_ERR_MIN and e_on < ROLLBACK_GAIN_MAX * e_off and e_on < ROLLBACK_ON_ERR_MAX
    else:  # a P scale per row and key tile: nothing to recover, nothing lost
        assert e_on <= e_off + ROLLBACK_SLACK_PP


def test_gaussian_inputs_are_unchanged_by_the_lowering():
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, s, 128, generator=g).to(torch.bfloat16) for s in (384, 4096, 4096))
    ex, _ = exact_attention(q, k, v, SCALE)
    on, _, st_on = _run(_sm90("mxfp8"), q, k, v)
    off, _, st_off = _run(_sm90("mxfp8+rollback_floor_log2=none"), q, k, v)
    diff = relative_error(on, off)
    print(f"gaussian: error {relative_error(on, ex):.4f} vs {relative_error(off, ex):.4f}, outputs differ by "
          f"{diff:.2e}; rollbacks {st_on['rollbacks']} vs {st_off['rollbacks']}")
    assert st_on["rollbacks"] == st_off["rollbacks"] and diff == 0.0


def test_the_reference_never_falls_more_than_the_limit_below_its_highest():
    """Key 0 scores ~1000 doublings above every other key: lowering stops 64 doublings under it, so the accumulators
    (scaled up by at most 2^64) stay finite, and the output is the sink's value row, as exact attention gives."""
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 1, s, 128, generator=g) for s in (128, 1024, 1024))
    u = torch.nn.functional.normalize(torch.randn(128, generator=g), dim=0)
    q = q + 40.0 * u
    k[:, :, 0] = 500.0 * u  # score ~ 40 * 500 / sqrt(128) ~ 1768 nats above the rest
    q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))
    ex, _ = exact_attention(q, k, v, SCALE)
    out, lse, st = _run(_sm90("mxfp8"), q, k, v)
    off, lse_off, _ = _run(_sm90("mxfp8+rollback_floor_log2=none"), q, k, v)
    err, lse_diff = relative_error(out, ex), float((lse - lse_off).abs().max())
    print(f"far sink: error {err:.4f}, LSE max |with - without lowering| {lse_diff:.2e}, rollbacks {st['rollbacks']}, "
          f"finite {bool(torch.isfinite(out).all())}")
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    assert st["rollbacks"] == 128  # one lowering per row, to the limit; none after it
    # the sink holds all the mass: the LSE (its quantized score) is the same with and without the lowering
    assert err < FAR_SINK_ERR_MAX and lse_diff < FAR_SINK_LSE


def test_padded_keys_never_lower_the_reference():
    """Tiles past kv_lens have no valid key (peak -inf): they neither lower the reference nor count."""
    q, k, v = FAMILIES["attention_sink"](2, 1, 1024, 128, torch.bfloat16, "cpu", 1)
    k2, v2 = k.clone(), v.clone()
    k2[1, :, 300:], v2[1, :, 300:] = -1e4, 7.0  # garbage past kv_lens
    lens = torch.tensor([1024, 300])
    a, la, sa = _run(_sm90("mxfp8"), q, k, v, lens)
    b, lb, sb = _run(_sm90("mxfp8"), q, k2, v2, lens)
    print(f"rollbacks {sa['rollbacks']} / {sb['rollbacks']}, tiles {sa['tiles']} / {sb['tiles']}")
    assert torch.equal(a, b) and torch.equal(la, lb) and sa == sb


def test_public_call_with_the_default_recipe_recovers_the_sink():
    q, k, v = FAMILIES["attention_sink"](1, 1, 4096, 128, torch.bfloat16, "cpu", 3)
    q = q[:, :, :256]
    ex, _ = exact_attention(q, k, v, SCALE)
    out = fa.attention(q, k, v, "mxfp8", layout="bhsd", backend="emulator")
    paper = fa.attention(q, k, v, "mxfp8+rollback_floor_log2=none", layout="bhsd", backend="emulator")
    print(f"public call, mi355x emulator: {relative_error(out, ex):.4f} vs {relative_error(paper, ex):.4f}")
    assert math.isfinite(relative_error(out, ex))
    assert relative_error(out, ex) <= relative_error(paper, ex) + ROLLBACK_SLACK_PP


@pytest.mark.parametrize("pattern, moves", [("HLHLHLHL", 0), ("HLLHHHHH", 2), ("HLLLLLLL", 1)])
def test_the_reference_comes_down_at_the_second_low_tile_in_a_row(pattern, moves):
    """Key tiles of 128 keys whose scores sit ~8 doublings above (H) or ~10 below (L) zero: one low tile between high
    ones never lowers the reference (it would only bounce back up); two in a row lower it once per row (and the H
    after them raises it again: two moves)."""
    q, k, v = patterned_tiles(pattern)
    out, _, st = _run(_sm90("mxfp8"), q, k, v)
    ex, _ = exact_attention(q, k, v, SCALE)
    print(f"{pattern}: rollbacks {st['rollbacks']} for 64 rows, error {relative_error(out, ex):.4f}")
    assert st["rollbacks"] == 64 * moves


@pytest.mark.parametrize("family", ["attention_sink", "sharp"])
def test_the_lowering_changes_no_output_under_the_mi355x_semantics(family):
    """With a P scale per row and key tile (the paper's kernels), moving the reference by whole doublings only moves
    Schraudolph's exponent field and P's scale: outputs bit-identical, LSE equal to float rounding. This is why the
    AITER adapter may run the mxfp8 preset on the paper's kernel, which has no lowering gate."""
    q, k, v = FAMILIES[family](1, 2, 4096, 128, torch.bfloat16, "cpu", 0)
    q = q[:, :, :512]
    on, lse_on, st_on = _run(PRESETS["mxfp8"], q, k, v)
    off, lse_off, _ = _run(PRESETS["mxfp8"].replace(rollback_floor_log2=None), q, k, v)
    lse_diff = float((lse_on - lse_off).abs().max())
    print(f"{family}: {st_on['rollbacks']} rollbacks with the lowering; outputs equal {torch.equal(on, off)}, "
          f"LSE max |diff| {lse_diff:.1e}")
    assert torch.equal(on, off) and lse_diff < FP32_ACCUMULATED

"""``Recipe.key_order``: the order in which a query tile visits the key tiles, so which tile freezes its reference.
The emulator (both numerics modes) against the rule of :func:`fsattn_diffusers.numerics.key_tile_order`; the kernels
follow the same rule (tests/test_kernel_gpu.py)."""

import pytest
import torch

import fsattn_diffusers as fa
from fsattn_diffusers.emulator import emulate_attention
from fsattn_diffusers.measure.structured_inputs import FAMILIES
from fsattn_diffusers.numerics import first_key_tile, key_tile_order
from fsattn_diffusers.recipe import PAPER_SUFFIX, PRESETS, get_recipe
from fsattn_diffusers.testing import exact_attention, relative_error
from tolerances import DIAGONAL_ORDER_GAIN_MIN, KEY_ORDER_CHANGE_MAX

SCALE = 128 ** -0.5


def test_key_tile_order_table():
    """Exact table: self-attention starts each query tile at its own key tile; S_q != S_k at floor(i n_k / n_q)."""
    assert key_tile_order("natural", 2, 4, 4) == [0, 1, 2, 3]
    assert key_tile_order("diagonal", 0, 4, 4) == [0, 1, 2, 3]
    assert key_tile_order("diagonal", 2, 4, 4) == [2, 3, 0, 1]
    assert key_tile_order("diagonal", 3, 4, 4) == [3, 0, 1, 2]
    assert [first_key_tile(i, 3, 8) for i in range(3)] == [0, 2, 5]  # 384 queries, 1024 keys
    assert [first_key_tile(i, 8, 3) for i in range(8)] == [0, 0, 0, 1, 1, 1, 2, 2]  # cross-attention to 3 tiles
    assert key_tile_order("diagonal", 5, 8, 1) == [0]
    assert key_tile_order("diagonal", 1, 2, 0) == []


def test_unknown_key_order_is_one_clear_error():
    for call in (lambda: key_tile_order("reversed", 0, 1, 1), lambda: PRESETS["mxfp8"].replace(key_order="reversed"),
                 lambda: get_recipe("mxfp8+key_order=reversed")):
        with pytest.raises(ValueError) as err:
            call()
        print(err.value)
        assert "\n" not in str(err.value) and "accepted: natural, diagonal" in str(err.value)


def test_default_presets_take_the_diagonal_order_and_the_paper_presets_do_not():
    """MXFP6 P (mxfp6, mxfp4) with its reference raised (tests/test_frozen_max_offset.py)."""
    assert PRESETS["mxfp8"].key_order == PRESETS["mxfp6"].key_order == PRESETS["mxfp4"].key_order == "diagonal"
    for name in ("mxfp8", "mxfp6", "mxfp4"):
        assert PRESETS[name + PAPER_SUFFIX].key_order == "natural"


@pytest.mark.parametrize("numerics", ["sm90", "mi355x"])
def test_one_query_tile_starts_at_key_tile_zero_in_both_orders(numerics):
    """At most one query tile (S_q <= the numerics' tile rows): both orders visit 0, 1, ...: the same bits."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, s, 128, generator=g).bfloat16() for s in (100, 700, 700))
    base = get_recipe("mxfp8").replace(numerics=numerics)
    a = emulate_attention(q, k, v, base, scale=SCALE, return_lse=True)
    b = emulate_attention(q, k, v, base.replace(key_order="natural"), scale=SCALE, return_lse=True)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize("numerics", ["sm90", "mi355x"])
def test_diagonal_order_is_the_natural_order_on_rotated_keys(numerics):
    """Query tile i in the diagonal order computes what the natural order computes with the keys rotated by i key
    tiles (whole tiles, so the tiles' exponents and K's mean are the same): bit for bit, output and LSE."""
    g = torch.Generator().manual_seed(2)
    tile = 128
    q, k, v = (torch.randn(1, 2, s, 128, generator=g).bfloat16() for s in (512, 512, 512))
    rec = get_recipe("mxfp8").replace(numerics=numerics, tile_m=tile)
    out, lse, _ = emulate_attention(q, k, v, rec, scale=SCALE, return_lse=True)
    for i in range(4):
        rows = slice(i * tile, i * tile + tile)
        kk, vv = (torch.roll(t, -i * tile, dims=2) for t in (k, v))
        o1, l1, _ = emulate_attention(q[:, :, rows], kk, vv, rec.replace(key_order="natural"), scale=SCALE,
                                      return_lse=True)
        print(f"{numerics} query tile {i}: max |diff| {float((out[:, :, rows] - o1).abs().max()):.3e}")
        assert torch.equal(out[:, :, rows], o1) and torch.equal(lse[:, :, rows], l1)


def test_garbage_past_kv_lens_does_not_move_the_diagonal():
    """The start tile counts the tiles that hold valid keys, not the padded length: the keys padded by 300 garbage
    rows, by 300 zero rows, or not padded at all give the same bits under the same ``kv_lens``."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 2, s, 64, generator=g).bfloat16() for s in (384, 600, 600))
    lens = torch.tensor([600, 333])
    rec = get_recipe("mxfp8").replace(numerics="sm90")
    outs = []
    for pad in (1e4 * torch.randn(2, 2, 300, 64, generator=g), torch.zeros(2, 2, 300, 64), None):
        kk = k if pad is None else torch.cat([k, pad.bfloat16()], dim=2)
        vv = v if pad is None else torch.cat([v, pad.bfloat16()], dim=2)
        outs.append(emulate_attention(q, kk, vv, rec, scale=64 ** -0.5, kv_lens=lens, return_lse=True))
    for o, lse, _ in outs[1:]:
        assert torch.equal(o, outs[0][0]) and torch.equal(lse, outs[0][1])


def test_locality_gains_from_the_diagonal_order():
    """A RoPE-like position component (``locality``): the natural order freezes the reference on key tile 0, far
    from most queries, and rolls back as the scores rise toward each query's own tile; the diagonal order freezes it
    there. Fewer rollbacks and a smaller error in the sm90 mode (the kernel's numerics)."""
    q, k, v = FAMILIES["locality"](1, 2, 2048, 128, torch.bfloat16, "cpu", 0)
    ex, _ = exact_attention(q, k, v, SCALE)
    res = {}
    for order in ("natural", "diagonal"):
        out, _, st = emulate_attention(q, k, v, get_recipe("mxfp8").replace(numerics="sm90", key_order=order),
                                       scale=SCALE, return_stats=True)
        res[order] = (relative_error(out, ex), st["rollbacks"])
    print("locality, sm90:", {o: f"err {e:.4%}, rollbacks {r}" for o, (e, r) in res.items()})
    assert res["diagonal"][0] < res["natural"][0] - DIAGONAL_ORDER_GAIN_MIN
    assert res["diagonal"][1] < res["natural"][1] / 4


def test_public_call_on_the_emulator_takes_the_order():
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 384, 2, 64, generator=g) for _ in range(3))
    a = fa.attention(q, k, v, "mxfp8", backend="emulator")
    b = fa.attention(q, k, v, "mxfp8+key_order=natural", backend="emulator")
    c = fa.attention(q, k, v, "mxfp8+key_order=diagonal", backend="emulator")
    diff = float((a - b).abs().max())
    print(f"diagonal vs natural: max |diff| {diff:.3e}")
    assert torch.equal(a, c) and 0.0 < diff < KEY_ORDER_CHANGE_MAX

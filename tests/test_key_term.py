"""Q smoothing's key term as the Hopper kernel's chained wgmma carries it (sm90_numerics difference 9), on the CPU:
the E4M3 terms, the shift G, the floor under Q's tile exponents, the tiles that drop the term, and the sm90
reference with it against exact attention."""

import pytest
import torch

from fsattn_diffusers import sm90_numerics as sm90
from fsattn_diffusers.emulator import emulate_attention
from fsattn_diffusers.formats import E4M3, round_to_elem
from fsattn_diffusers.measure.structured_inputs import FAMILIES
from fsattn_diffusers.recipe import get_recipe
from fsattn_diffusers.testing import exact_attention, relative_error
from kernel_device import sm90_reference_attention
from tile_patterns import query_tile_far_above
from tolerances import KEY_TERM_ERR_FLOOR, KEY_TERM_ERR_RATIO, KEY_TERM_SMALL_SLICE_ERR

SMOOTH_Q = "mxfp8+smooth_q+smooth_q_min_ratio=0"


def _bias_and_ke(seed=0, scales=(1e-3, 5.0, 300.0), s_k=300):
    g = torch.Generator().manual_seed(seed)
    bias = torch.randn(2, len(scales), s_k, generator=g) * torch.tensor(scales).view(1, -1, 1)
    ke = torch.randint(-9, -4, (2, len(scales), -(-s_k // 128)), generator=g, dtype=torch.int32)
    return bias, ke


def test_the_terms_are_e4m3_values_that_sum_to_the_term():
    bias, ke = _bias_and_ke()
    t = sm90.key_term(bias, ke)
    kx = torch.cat([t.lead[..., None].expand(*t.lead.shape, sm90.KEY_TERM_LEAD), t.refine], dim=-1)
    assert kx.shape[-1] == sm90.KEY_TERM_COLS
    assert torch.equal(kx, round_to_elem(kx, E4M3)) and float(kx.abs().max()) <= sm90.E4M3_MAX
    ke_k = ke.repeat_interleave(128, dim=-1)[..., :bias.shape[-1]]
    x = torch.ldexp(bias, t.g[..., None] - ke_k)
    amax = x.abs().amax(dim=-1)
    cap = sm90.KEY_TERM_LEAD * sm90.E4M3_MAX
    # G is the largest shift that keeps every key's term within the terms' capacity
    assert bool((amax <= cap).all()) and bool((2 * amax > cap).all())
    rel = ((t.bias_eff - bias).abs().amax(dim=-1) / bias.abs().amax(dim=-1))
    print(f"G {t.g.tolist()}, relative error of the carried term {rel.max():.2e}")
    assert float(rel.max()) < 2 ** -19
    assert torch.equal(t.q_floor, -t.g - sm90.QX_MAX_LOG2)


def test_a_zero_term_and_invalid_keys_give_zero_terms():
    bias, ke = _bias_and_ke(scales=(0.0, 3.0))
    valid = torch.arange(300)[None, :] < torch.tensor([300, 77])[:, None]
    bias[1, :, 77:] = 1e6  # garbage past kv_lens must not move G
    t = sm90.key_term(bias, ke, valid)
    t_clean = sm90.key_term(torch.where(valid[:, None], bias, 0.0), ke)
    assert torch.equal(t.g, t_clean.g) and torch.equal(t.bias_eff, t_clean.bias_eff)
    assert float(t.bias_eff[:, 0].abs().max()) == 0.0 and int(t.g[0, 0]) == sm90.KEY_TERM_G_MAX
    assert float(t.bias_eff[1, :, 77:].abs().max()) == 0.0


def test_the_floor_raises_small_q_tile_exponents_and_gives_all_zero_tiles_its_value():
    g = torch.Generator().manual_seed(1)
    y = torch.randn(1, 2, 384, 64, generator=g)
    y[:, :, :128] *= 2.0 ** -12  # a small tile
    y[:, 1, 256:] = 0.0  # an all-zero tile
    plain, e_plain = sm90.carry_mx(y, "mxfp8", "round_up_175", 128, return_exps=True)
    floor = torch.tensor([[-100, -8]], dtype=torch.int32)
    out, e = sm90.carry_mx(y, "mxfp8", "round_up_175", 128, floor=floor, return_exps=True)
    print("tile exponents without / with the floor", e_plain.tolist(), e.tolist())
    assert torch.equal(out[:, 0], plain[:, 0]) and torch.equal(e[:, 0], e_plain[:, 0])  # floor far below: unchanged
    assert int(e_plain[0, 1, 2]) == 0 and int(e[0, 1, 2]) == -8  # all-zero tile
    assert int(e_plain[0, 1, 0]) < -8 and int(e[0, 1, 0]) == -8
    assert torch.equal(out[:, 1, 128:256], plain[:, 1, 128:256])  # tiles above the floor unchanged
    # the raised tile: the same values on a coarser grid (E4M3 with 4 more doublings of subnormals)
    small = plain[:, 1, :128]
    assert float(relative_error(out[:, 1, :128], small)) < KEY_TERM_SMALL_SLICE_ERR
    with pytest.raises(ValueError, match="floor needs tile"):
        sm90.carry_mx(y, "mxfp8", "round_up_175", None, floor=floor)


def _smooth_q_errors(q, k, v, kv=None):
    scale = q.shape[-1] ** -0.5
    ex, _ = exact_attention(q, k, v, scale, kv)
    ref, lse, _ = sm90_reference_attention(q, k, v, get_recipe(SMOOTH_Q), scale=scale, kv_lens=kv)
    emu, _, _ = emulate_attention(q, k, v, get_recipe(SMOOTH_Q), scale=scale, kv_lens=kv)
    return relative_error(ref, ex), relative_error(emu, ex), ref, lse


@pytest.mark.parametrize("family", ["offset_uniform_q", "offset_direction_q", "gaussian", "attention_sink"])
def test_the_sm90_reference_with_the_key_term_is_as_accurate_as_the_exact_term(family):
    """The mi355x emulator adds the term exactly (float32); the sm90 reference carries it in E4M3 terms."""
    q, k, v = FAMILIES[family](1, 2, 1024, 128, torch.bfloat16, "cpu", 0)
    e_ref, e_emu, ref, _ = _smooth_q_errors(q, k, v)
    print(f"{family}: err sm90 reference {e_ref:.4f}, mi355x emulator (exact term) {e_emu:.4f}")
    assert torch.isfinite(ref).all() and e_ref < KEY_TERM_ERR_RATIO * e_emu + KEY_TERM_ERR_FLOOR


def test_near_identical_queries_hit_the_floor_and_stay_accurate():
    """Queries equal up to 1e-4: the term is ~2^21 times the GEMM's unit, so Q's tile exponent is floored; identical
    queries (an all-zero smoothed Q) keep the term through the floor's exponent."""
    g = torch.Generator().manual_seed(2)
    base = torch.randn(1, 2, 1, 128, generator=g) * 2.0
    k = torch.randn(1, 2, 384, 128, generator=g).bfloat16()
    v = torch.randn(1, 2, 384, 128, generator=g).bfloat16()
    for jitter in (1e-2, 0.0):
        q = (base + jitter * torch.randn(1, 2, 256, 128, generator=g)).bfloat16()
        e_ref, e_emu, _, lse = _smooth_q_errors(q, k, v)
        print(f"jitter {jitter}: err sm90 reference {e_ref:.4f}, exact-term emulator {e_emu:.4f}")
        assert torch.isfinite(lse).all() and e_ref < KEY_TERM_ERR_RATIO * e_emu + KEY_TERM_ERR_FLOOR


def test_a_query_tile_far_above_the_term_drops_it():
    """A query tile 2^16 larger than the others, in pairs of opposite rows (so it leaves Q's mean alone):
    2^(-QE - G) falls below E4M3 there and that tile drops the term (its scores are ~2^14 times the term), the other
    keeps it; the output stays as accurate as with the exact term."""
    q, k, v = query_tile_far_above()
    recipe = get_recipe(SMOOTH_Q).replace(numerics="sm90")
    from fsattn_diffusers.numerics import numerics_for
    from fsattn_diffusers.smoothing import smooth_inputs

    qs, ks, bias, _ = smooth_inputs(q, k, recipe, 128 ** -0.5)
    *_, kept = numerics_for(recipe).operands(qs, ks, v, 128 ** -0.5, None, bias)
    print("tiles keeping the term", kept[0, 0, ::128].tolist())
    assert kept[0, 0, :128].all() and not kept[0, 0, 128:].any()
    e_ref, e_emu, _, _ = _smooth_q_errors(q, k, v)
    print(f"err sm90 reference {e_ref:.4f}, exact-term emulator {e_emu:.4f}")
    assert e_ref < KEY_TERM_ERR_RATIO * e_emu + KEY_TERM_ERR_FLOOR

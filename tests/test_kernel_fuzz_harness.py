"""The kernel fuzz harness (fsattn_diffusers.measure.kernel_fuzz) on the CPU: its cases, and that its checks catch
what they are for (the sm90 reference stands in for the kernel; broken stand-ins must fail)."""

import dataclasses

import pytest
import torch

from fsattn_diffusers.measure.kernel_fuzz import (LSE_REF_MAX, MAX_WORK, S_MAX, Case, case_line, generate_cases,
                                                  kernel_reference, make_inputs, reference_bounds, run_case,
                                                  summary_lines)
from fsattn_diffusers.recipe import get_recipe
from fsattn_diffusers.smoothing import q_smoothing_heads
from kernel_device import sm90_reference_attention

RECIPES = ("mxfp8", "mxfp6", "mxfp4")
VARIANTS = ("gluon_pingpong", "triton", "api")


def good_kernel(q, k, v, recipe, kv, variant, scale, out, lse):
    o, l = kernel_reference(q, k, v, recipe, scale, kv)
    out.copy_(o)
    lse.copy_(l)


def test_generated_cases_cover_the_space():
    cases = generate_cases(300, RECIPES, VARIANTS, seed=0)
    assert cases == generate_cases(300, RECIPES, VARIANTS, seed=0), "seeded"
    assert all(c.work <= MAX_WORK and 1 <= c.b <= 4 and 1 <= c.h <= 48 for c in cases)
    assert all(1 <= c.s_q <= S_MAX and 1 <= c.s_k <= S_MAX for c in cases)
    lengths = [c.s_q for c in cases] + [c.s_k for c in cases]
    print(f"S range {min(lengths)}..{max(lengths)}, multiples of 128: {sum(n % 128 == 0 for n in lengths)} of "
          f"{len(lengths)}, max work {max(c.work for c in cases)}")
    assert min(lengths) == 1 and max(lengths) >= 10_000
    assert sum(n % 128 == 0 for n in lengths) < len(lengths) // 4
    assert {(c.recipe, c.variant) for c in cases} == {(r, v) for r in RECIPES for v in VARIANTS}
    assert {c.dtype for c in cases} == {"fp16", "bf16", "fp32"} and {c.d for c in cases} == {64, 128}
    assert {c.layout for c in cases} == {"bshd", "bhsd"} and {c.strided for c in cases} == {True, False}
    lens = [n for c in cases if c.kv_lens for n in c.kv_lens]
    assert 0 in lens and any(c.kv_lens is None for c in cases) and any(c.pad_garbage for c in cases)
    assert any(c.kv_lens and c.s_k in c.kv_lens for c in cases)


def tiny_cases(n=5):
    return generate_cases(n, RECIPES, ("triton",), seed=1, max_work=1 << 15)


def test_harness_passes_the_reference_against_itself():
    results = [run_case(c, good_kernel, "cpu") for c in tiny_cases()]
    for r in results:
        print(case_line(r))
    print("\n".join(summary_lines(results)))
    assert all(not r["failures"] for r in results)
    assert all(r["kernel_vs_ref"] == 0.0 and r["lse_diff"] == 0.0 for r in results)


def test_harness_catches_broken_kernels():
    case = next(c for c in tiny_cases(20) if c.s_q > 1 and c.kv_lens is None)

    def unwritten_row(q, k, v, recipe, kv, variant, scale, out, lse):
        o, l = kernel_reference(q, k, v, recipe, scale, kv)
        out[:, :, 1:].copy_(o[:, :, 1:])
        lse.copy_(l)

    def noisy(q, k, v, recipe, kv, variant, scale, out, lse):
        good_kernel(q, k, v, recipe, kv, variant, scale, out, lse)
        out.mul_(2.0)

    def writes_input(q, k, v, recipe, kv, variant, scale, out, lse):
        good_kernel(q, k, v, recipe, kv, variant, scale, out, lse)
        k[0, 0, 0, 0] = 7.0

    calls = []

    def nondeterministic(q, k, v, recipe, kv, variant, scale, out, lse):
        good_kernel(q, k, v, recipe, kv, variant, scale, out, lse)
        calls.append(1)
        if len(calls) == 2:
            out[0, 0, 0, 0] = out[0, 0, 0, 0] * 1.01 + 1e-3

    def lse_finite_everywhere(q, k, v, recipe, kv, variant, scale, out, lse):
        good_kernel(q, k, v, recipe, kv, variant, scale, out, lse)
        lse.nan_to_num_(neginf=0.0)

    expect = {unwritten_row: "NaN", noisy: "tolerance rule", writes_input: "inputs modified",
              nondeterministic: "not deterministic"}
    for fn, word in expect.items():
        r = run_case(case, fn, "cpu")
        print(fn.__name__, "->", r["failures"])
        assert any(word in f for f in r["failures"]), fn.__name__
    empty = next(c for c in tiny_cases(40) if c.kv_lens and 0 in c.kv_lens)
    r = run_case(empty, lse_finite_everywhere, "cpu")
    print("lse_finite_everywhere ->", r["failures"])
    assert any("LSE finite" in f for f in r["failures"])


def _reference_under_score_noise(monkeypatch, recipe_name, rel_noise, seed=0):
    """sm90 reference of a five-key input with the score GEMM's results perturbed by ``rel_noise`` relative
    (the size of a different summation order in the FP8 tensor cores): ``(out, lse)``."""
    g = torch.Generator().manual_seed(seed)
    q = 2.0 * torch.randn((1, 16, 2048, 64), generator=g)
    k, v = (torch.randn((1, 16, 5, 64), generator=g) for _ in range(2))
    real = torch.matmul
    if rel_noise:
        noise = torch.Generator().manual_seed(seed + 1)

        def noisy(a, b):
            x = real(a, b)
            return x * (1 + rel_noise * (2 * torch.rand(x.shape, generator=noise) - 1))

        monkeypatch.setattr(torch, "matmul", noisy)
    try:
        out, lse, _ = sm90_reference_attention(q, k, v, get_recipe(recipe_name), scale=0.125)
    finally:
        monkeypatch.setattr(torch, "matmul", real)
    return out, lse


@pytest.mark.parametrize("recipe_name", ["mxfp8", "mxfp8+exponential=rowmax_h15"])
def test_lse_bounds_cover_a_different_summation_order(monkeypatch, recipe_name):
    # Why Rowmax-H15 has its own bounds: its weights are a step function of the score, so scores 2e-4 apart move its
    # LSE past Schraudolph's bound (one E4M3 step of P), never past one H15 step (1.5x).
    rel_max, lse_max = reference_bounds(recipe_name)
    o0, l0 = _reference_under_score_noise(monkeypatch, recipe_name, 0.0)
    o1, l1 = _reference_under_score_noise(monkeypatch, recipe_name, 2e-4)
    lse_moved = float((l1 - l0).abs().max())
    out_moved = float((o1.double() - o0.double()).norm() / o0.double().norm())
    print(f"{recipe_name}: LSE moved {lse_moved:.3f} (bound {lse_max:.3f}), out moved {out_moved:.2e} (bound {rel_max})")
    assert lse_moved < lse_max and out_moved < rel_max
    if recipe_name.endswith("rowmax_h15"):
        assert lse_moved > LSE_REF_MAX, "H15's LSE should move past the E4M3 bound here (else it needs no own bound)"


@pytest.mark.parametrize("layout,strided", [("bhsd", False), ("bshd", True)])
def test_switch_recipes_get_heads_on_both_sides_of_the_switch(layout, strided):
    """Fuzz inputs for Q smoothing's per-slice switch: the even heads carry SWITCH_Q_OFFSET and take the key term, the
    odd ones (normal queries) do not, so both kernel launches run; other recipes' Q is left as drawn."""
    case = Case(0, 7, "mxfp8", "triton", 2, 4, 512, 64, 64, "bf16", layout, strided, None, False)  # the preset switches
    (q, k, v), _ = make_inputs(case, "cpu")
    (q0, k0, v0), _ = make_inputs(dataclasses.replace(case, recipe="mxfp8+smooth_q=false"), "cpu")
    sel = q_smoothing_heads(q, get_recipe(case.recipe).smooth_q_min_ratio)
    print(f"{layout}{' strided' if strided else ''}: smoothed slices {sel.int().tolist()}")
    assert sel.tolist() == [[True, False, True, False]] * 2
    assert not q_smoothing_heads(q0, get_recipe(case.recipe).smooth_q_min_ratio).any()  # drawn without the offset
    assert torch.equal(k, k0) and torch.equal(v, v0) and torch.equal(q[:, 1::2], q0[:, 1::2])


def test_the_tile_cap_shrinks_sizes_and_keeps_the_pairs():
    """FSATTN_FUZZ_MAX_TILES (CI's interpreter): every case within the cap, the same (recipe, variant) per index."""
    from fsattn_diffusers.measure.kernel_fuzz import tile_count

    pairs = (["mxfp8", "mxfp6"], ["triton", "api"])
    free = generate_cases(40, *pairs, seed=3, max_work=16384)
    capped = generate_cases(40, *pairs, seed=3, max_work=16384, max_tiles=4)
    counts = [tile_count(c.b, c.h, c.s_q, c.s_k) for c in capped]
    print("tile counts without / with the cap:", max(tile_count(c.b, c.h, c.s_q, c.s_k) for c in free), max(counts))
    assert max(counts) <= 4 and max(tile_count(c.b, c.h, c.s_q, c.s_k) for c in free) > 4
    assert [(c.recipe, c.variant) for c in capped] == [(c.recipe, c.variant) for c in free]
    assert tile_count(1, 1, 1, 1) == 1 and tile_count(2, 3, 129, 256) == 2 * 3 * 2 * 2

"""The kernel fuzz harness (fsattn_diffusers.measure.kernel_fuzz) on the CPU: its cases, and that its checks catch
what they are for (the sm90 reference stands in for the kernel; broken stand-ins must fail)."""


from fsattn_diffusers.emulator import sm90_reference_attention
from fsattn_diffusers.measure.kernel_fuzz import MAX_WORK, S_MAX, case_line, generate_cases, run_case, summary_lines
from fsattn_diffusers.recipe import PRESETS

RECIPES = ("mxfp8", "mxfp6", "mxfp4")
VARIANTS = ("gluon_pingpong", "triton", "api")


def reference(q, k, v, recipe, scale, kv):
    out, lse, _ = sm90_reference_attention(q, k, v, PRESETS[recipe], scale=scale, kv_lens=kv)
    return out, lse


def good_kernel(q, k, v, recipe, kv, variant, scale, out, lse):
    o, l = reference(q, k, v, recipe, scale, kv)
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
    results = [run_case(c, good_kernel, reference, "cpu") for c in tiny_cases()]
    for r in results:
        print(case_line(r))
    print("\n".join(summary_lines(results)))
    assert all(not r["failures"] for r in results)
    assert all(r["kernel_vs_ref"] == 0.0 and r["lse_diff"] == 0.0 for r in results)


def test_harness_catches_broken_kernels():
    case = next(c for c in tiny_cases(20) if c.s_q > 1 and c.kv_lens is None)

    def unwritten_row(q, k, v, recipe, kv, variant, scale, out, lse):
        o, l = reference(q, k, v, recipe, scale, kv)
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
        r = run_case(case, fn, reference, "cpu")
        print(fn.__name__, "->", r["failures"])
        assert any(word in f for f in r["failures"]), fn.__name__
    empty = next(c for c in tiny_cases(40) if c.kv_lens and 0 in c.kv_lens)
    r = run_case(empty, lse_finite_everywhere, reference, "cpu")
    print("lse_finite_everywhere ->", r["failures"])
    assert any("LSE finite" in f for f in r["failures"])

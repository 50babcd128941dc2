"""The Triton kernel on a CUDA GPU (sm_90+): against exact attention, the sm90 reference and the emulator.

Tolerance rule (stated once in :mod:`fsattn_diffusers.testing`, with its derivation): with
``err(x) = ||x - exact||_F / ||exact||_F`` against float64 softmax attention on the same inputs,

    |err(kernel) - err(sm90 reference)| <= 5e-4 + 0.02 * err(sm90 reference),

where the sm90 reference (:func:`fsattn_diffusers.backends.reference_attention` of the ``triton`` backend) computes in
PyTorch what the kernel computes; and the kernel stays within KERNEL_REF_MAX (2e-2) relative of that reference
(the score GEMM's FP8 tensor-core accumulation is not modeled). Every test prints its numbers before
asserting. Skipped without CUDA; ``FSATTN_KERNEL_TEST_CPU=1`` with ``TRITON_INTERPRET=1`` runs the same
checks on the CPU through Triton's interpreter (slow; for developing the tests).
"""

import math

import pytest
import torch

from kernel_device import (CPU_INTERPRET, DEV, a_fragment_position, kernel_on_operands, make, poison_allocator, rel,  # noqa: E402
                           skip_module_without_sm90)

skip_module_without_sm90()
triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

import fsattn_diffusers as fa  # noqa: E402
from fsattn_diffusers import sm90_numerics  # noqa: E402
from kernel_device import sm90_reference_attention  # noqa: E402
from fsattn_diffusers.emulator import emulate_attention  # noqa: E402
from fsattn_diffusers.recipe import PRESETS, get_recipe  # noqa: E402
from fsattn_diffusers.smoothing import smooth_inputs  # noqa: E402
from fsattn_diffusers.testing import (KERNEL_ERR_ATOL, KERNEL_ERR_REL, KERNEL_REF_MAX, errors_agree,  # noqa: E402
                                      exact_attention, within_kernel_rule)

from fsattn_diffusers.kernels.sm90.fused_attention import _stage_ab_h15  # noqa: E402
from fsattn_diffusers.kernels.sm90.ops import attention_from_operands, fused_attention, prepass  # noqa: E402
from fsattn_diffusers.kernels.sm90.plan import plan_for  # noqa: E402
from fsattn_diffusers.measure.structured_inputs import FAMILIES  # noqa: E402
from tolerances import (FP32_ACCUMULATED, FP32_ROUNDOFF, GLUON_VS_TRITON_LSE, GLUON_VS_TRITON_OUT,  # noqa: E402
                        KERNEL_LSE_VS_EXACT, KERNEL_LSE_VS_REFERENCE, UNIFORM_ROWS_LSE_VS_EXACT)

pytestmark = pytest.mark.gpu
RECIPES = ("mxfp8", "mxfp6", "mxfp4")
#: The kernel's exponentials: Schraudolph's (the presets) and Rowmax-H15 (sm90_numerics difference 8).
H15 = "mxfp8+exponential=rowmax_h15"
EXP_RECIPES = RECIPES + (H15,)
# (B, H, S_q, S_k, D, layout, kv_lens): awkward lengths, S_q != S_k, batch > 1, both head dims, a batch
# entry with no valid key.
CASES = [
    (2, 3, 300, 200, 64, "bshd", None),
    (1, 2, 257, 1000, 128, "bhsd", [777]),
    (3, 2, 130, 129, 128, "bshd", [129, 0, 77]),
]


def exact(q, k, v, scale, kv_lens):
    return exact_attention(q, k, v, scale, kv_lens)  # rows with no valid key: 0, LSE -inf


def run_case(recipe_name, b, h, s_q, s_k, d, layout, lens, spiky=False, seed=0):
    recipe = get_recipe(recipe_name)
    q, k, v = make(b, h, s_q, s_k, d, layout, seed=seed, spiky=spiky)
    kv = None if lens is None else torch.tensor(lens, device=DEV)
    scale = 1.0 / math.sqrt(d)
    poison_allocator()
    out, lse, st, _ = fused_attention(q, k, v, plan_for(recipe), scale=scale, kv_lens=kv, return_lse=True,
                                      return_stats=True)
    ref_o, ref_lse, ref_st = sm90_reference_attention(q, k, v, recipe, scale=scale, kv_lens=kv)
    ex_o, ex_lse = exact(q, k, v, scale, kv)
    emu_o, _, _ = emulate_attention(q, k, v, recipe, scale=scale, kv_lens=kv)
    e_k, e_r, e_m = rel(out, ex_o), rel(ref_o, ex_o), rel(emu_o, ex_o)
    finite = torch.isfinite(ex_lse)
    lse_diff = float((lse - ref_lse)[finite].abs().max()) if finite.any() else 0.0
    print(f"{recipe_name} {(b, h, s_q, s_k, d)} {layout} kv_lens={lens} spiky={spiky}: err kernel {e_k:.5f} "
          f"sm90-ref {e_r:.5f} mi355x-emulator {e_m:.5f} | kernel-vs-ref {rel(out, ref_o):.2e} "
          f"sm90-vs-mi355x {rel(ref_o, emu_o):.2e} | lse maxdiff {lse_diff:.2e} | stats {st} ref {ref_st}")
    return out, lse, st, ref_o, ref_lse, ref_st, ex_o, ex_lse, (e_k, e_r)


@pytest.mark.parametrize("variant", ["gluon_pingpong", "triton"])
@pytest.mark.parametrize("recipe", RECIPES)
def test_many_key_tiles_on_inputs_with_a_small_recipe_error(recipe, variant):
    """``clustered`` inputs (sharp, patch-like rows; the recipe's error ~1%) over 64 key tiles: the kernel's error is
    its reference's (testing.within_kernel_rule). O accumulated across key tiles on the FP8 tensor cores (each tile's
    products cut at O's magnitude) broke this rule on the H200 by ~3 pp on inputs of this kind (3.7% against 0.8%)."""
    if CPU_INTERPRET:
        pytest.skip("64 key tiles take too long in Triton's interpreter (whose dot accumulates in fp32 anyway)")
    q, k, v = FAMILIES["clustered"](1, 2, 8192, 128, torch.bfloat16, DEV, 0)
    out, _, _ = _kernel(q, k, v, recipe, None, variant)
    ref_o, _, _ = sm90_reference_attention(q, k, v, get_recipe(recipe), scale=128 ** -0.5)
    ex_o, _ = exact(q, k, v, 128 ** -0.5, None)
    e_k, e_r = rel(out, ex_o), rel(ref_o, ex_o)
    print(f"clustered {recipe} {variant}: err kernel {e_k:.5f} ref {e_r:.5f}, kernel-vs-ref {rel(out, ref_o):.2e}")
    assert not torch.isnan(out).any()
    assert within_kernel_rule(e_k, e_r) and rel(out, ref_o) < KERNEL_REF_MAX


@pytest.mark.parametrize("recipe", EXP_RECIPES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[:5])) + f"-{c[5]}-kv{c[6]}")
def test_kernel_matches_reference_and_rule(recipe, case):
    out, lse, st, ref_o, ref_lse, ref_st, ex_o, ex_lse, (e_k, e_r) = run_case(recipe, *case)
    assert out.shape == ex_o.shape and out.dtype == torch.bfloat16
    assert not torch.isnan(out).any(), "unwritten (NaN-poisoned) or NaN output"
    assert torch.isfinite(out).all()
    assert within_kernel_rule(e_k, e_r), f"tolerance rule: |{e_k} - {e_r}| > {KERNEL_ERR_ATOL} + {KERNEL_ERR_REL} * {e_r}"
    assert rel(out, ref_o) < KERNEL_REF_MAX
    finite = torch.isfinite(ex_lse)
    assert torch.equal(torch.isfinite(lse), finite), "LSE must be -inf exactly on rows with no valid key"
    assert (lse - ref_lse)[finite].abs().max() < KERNEL_LSE_VS_REFERENCE
    # Against exact: Schraudolph's bias in l (~0.04) plus the score error of the Q/K formats.
    assert (lse - ex_lse.float())[finite].abs().max() < KERNEL_LSE_VS_EXACT[recipe]
    if case[6] is not None and 0 in case[6]:
        bi = case[6].index(0)
        assert torch.all(out[bi] == 0), "a batch entry without valid keys gives zeros"
    assert st["tiles"] == ref_st["tiles"]
    assert abs(st["rollbacks"] - ref_st["rollbacks"]) <= max(2, ref_st["rollbacks"] // 50)


# One key and no kv_lens: the key count is then only the argument S_k == 1, which Triton would compile as a constant
# (the fuzz found NaN and run-to-run varying outputs there). Outputs finite, within the rule, the same on a second call.
# (In Triton's interpreter the first two cases take 3 heads, not 14, and 2, not 7: the property is the key count, and
# the interpreter's time grows with the programs.)
SINGLE_KEY = [(2, 3 if CPU_INTERPRET else 14, 9, 1, 128, "bshd", None),
              (2, 2 if CPU_INTERPRET else 7, 35, 1, 64, "bhsd", None),
              (1, 5, 300, 1, 128, "bhsd", None)]


@pytest.mark.parametrize("recipe", EXP_RECIPES)
@pytest.mark.parametrize("case", SINGLE_KEY, ids=lambda c: "x".join(map(str, c[:5])) + f"-{c[5]}")
def test_a_single_key_without_kv_lens(recipe, case):
    out, lse, _, ref_o, _, _, _, _, (e_k, e_r) = run_case(recipe, *case)
    out2, lse2 = run_case(recipe, *case)[:2]
    assert torch.isfinite(out).all() and torch.isfinite(lse).all(), "NaN or unwritten output with one key"
    assert within_kernel_rule(e_k, e_r) and rel(out, ref_o) < KERNEL_REF_MAX
    assert torch.equal(out, out2) and torch.equal(lse, lse2), "two calls differ"


@pytest.mark.parametrize("recipe", EXP_RECIPES)
def test_spiky_inputs_roll_back_and_stay_finite(recipe):
    out, lse, st, ref_o, ref_lse, ref_st, ex_o, ex_lse, (e_k, e_r) = run_case(
        recipe, 1, 2, 256, 1024, 128, "bhsd", None, spiky=True, seed=3)
    assert st["rollbacks"] > 0 and ref_st["rollbacks"] > 0, "the spikes must fire the gate"
    # Scores within FP8 accumulation noise of the threshold may fire on one side only: allow 2%.
    assert abs(st["rollbacks"] - ref_st["rollbacks"]) <= max(2, ref_st["rollbacks"] // 50)
    assert abs(st["rollback_tiles"] - ref_st["rollback_tiles"]) <= max(2, ref_st["rollback_tiles"] // 50)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    assert within_kernel_rule(e_k, e_r)
    assert rel(out, ref_o) < KERNEL_REF_MAX


@pytest.mark.parametrize("recipe", RECIPES)
def test_identical_keys_smooth_to_an_all_zero_tile(recipe):
    """Every key the same vector (one valid key, or a constant sequence): K smoothing leaves an all-zero K tile, whose
    MX exponent is the smallest one; the kernel must still see scores of 0 (uniform attention), not 0 * 2^-inf."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 2, 300, 128, generator=g).to(torch.bfloat16).to(DEV)
    k = torch.randn(2, 2, 1, 128, generator=g).expand(2, 2, 200, 128).contiguous().to(torch.bfloat16).to(DEV)
    v = torch.randn(2, 2, 200, 128, generator=g).to(torch.bfloat16).to(DEV)
    kv = torch.tensor([1, 200], device=DEV)
    scale = 128 ** -0.5
    poison_allocator()
    out, lse, _, _ = fused_attention(q, k, v, plan_for(PRESETS[recipe]), scale=scale, kv_lens=kv, return_lse=True)
    ref_o, ref_lse, _ = sm90_reference_attention(q, k, v, PRESETS[recipe], scale=scale, kv_lens=kv)
    ex_o, ex_lse = exact(q, k, v, scale, kv)
    print(f"{recipe}: err kernel {rel(out, ex_o):.5f} ref {rel(ref_o, ex_o):.5f}, "
          f"lse maxdiff {float((lse - ex_lse.float()).abs().max()):.2e}")
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    assert rel(out, ref_o) < KERNEL_REF_MAX and float((lse - ex_lse.float()).abs().max()) < UNIFORM_ROWS_LSE_VS_EXACT


def test_unwritten_output_buffer_is_fully_written():
    recipe = PRESETS["mxfp8"]
    plan = plan_for(recipe)
    q, k, v = make(2, 3, 300, 200, 64, "bhsd", seed=5)
    ops = prepass(q, k, v, plan, 0.125, None)
    out = torch.full_like(q, float("nan"))
    attention_from_operands(ops, out, plan, 300, 200, None, None, None)
    print("NaN left in the output:", int(torch.isnan(out).sum()))
    assert not torch.isnan(out).any()


@pytest.mark.skipif(CPU_INTERPRET, reason="the public API picks the triton backend on CUDA only")
def test_public_api_and_layouts_agree():
    q, k, v = make(2, 3, 300, 200, 64, "bshd", seed=6)
    a = fa.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), "mxfp8", layout="bshd",
                     backend="triton")
    b = fa.attention(q.contiguous(), k.contiguous(), v.contiguous(), "mxfp8", layout="bhsd", backend="triton")
    diff = float((a.transpose(1, 2).float() - b.float()).abs().max())
    print("bshd vs bhsd max diff", diff, "strides", a.stride(), b.stride())
    assert a.shape == (2, 300, 3, 64) and a.is_contiguous(), "BSHD in, BSHD memory out (no copy)"
    assert diff == 0.0


@pytest.mark.skipif(CPU_INTERPRET, reason="torch.compile of the custom op needs the GPU")
def test_custom_op_under_torch_compile():
    q, k, v = make(1, 2, 256, 256, 128, "bhsd", seed=7)
    plan = plan_for(PRESETS["mxfp8"])

    def f(q, k, v):
        out, lse, _ = torch.ops.fsattn.fused_attention(q, k, v, None, 0.0883883476, plan.key(), True, False, False)
        return out.float().sum() + lse.sum()
    eager = f(q, k, v)
    compiled = torch.compile(f, fullgraph=True)(q, k, v)
    print("eager", float(eager), "compiled", float(compiled))
    assert torch.allclose(eager, compiled)


@pytest.mark.skipif(CPU_INTERPRET, reason="memory accounting needs the GPU")
def test_peak_extra_memory_below_qkv_bf16():
    q, k, v = make(1, 8, 4096, 4096, 128, "bhsd", seed=8)
    torch.cuda.synchronize()
    fa.attention(q, k, v, "mxfp8", layout="bhsd", backend="triton")  # compile outside the measurement
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fa.attention(q, k, v, "mxfp8", layout="bhsd", backend="triton")
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    qkv = 3 * q.numel() * 2
    print(f"peak extra {extra / 2**20:.1f} MiB (output included) vs Q+K+V bf16 {qkv / 2**20:.1f} MiB")
    del out
    assert extra <= qkv


@pytest.mark.parametrize("recipe", RECIPES)
def test_kernel_lse_merges_key_halves(recipe):
    """The kernel's LSE is the normaliser in the units of what it computes: merging two key shards by LSE
    (what ring attention does) equals one call within the recipe's own error. Rule (as on the CPU
    emulator): |err_merged - err_one_call| <= 0.15 err_one_call + 1e-5, errors vs float64 softmax."""
    q, k, v = make(1, 2, 256, 1024, 128, "bhsd", seed=11)
    if not CPU_INTERPRET:  # on the GPU this must run the kernel, not a fallback
        from fsattn_diffusers.backends import availability

        assert availability(q.device)["triton"] is None
    full = fa.attention(q, k, v, recipe, layout="bhsd", backend="triton")
    o1, l1 = fa.attention(q, k[:, :, :448], v[:, :, :448], recipe, layout="bhsd", backend="triton", return_lse=True)
    o2, l2 = fa.attention(q, k[:, :, 448:], v[:, :, 448:], recipe, layout="bhsd", backend="triton", return_lse=True)
    w = torch.softmax(torch.stack([l1, l2]), dim=0)[..., None]
    merged = w[0] * o1.float() + w[1] * o2.float()
    ref = exact_attention(q, k, v, 128 ** -0.5)[0]
    e_full, e_merged = rel(full, ref), rel(merged, ref)
    print(f"{recipe}: one call {e_full:.5f}, merged key halves {e_merged:.5f}")
    assert errors_agree(e_merged, e_full)


def _kernel(q, k, v, recipe_name, kv, variant):
    """(out, lse, stats) of kernel_device.kernel_on_operands."""
    return kernel_on_operands(q, k, v, recipe_name, kv, variant)[:3]


@pytest.mark.parametrize("variant", ["triton", "gluon_pingpong"])
@pytest.mark.parametrize("recipe", RECIPES)
def test_padded_keys_do_not_change_the_output(recipe, variant):
    """Keys past kv_lens (values x1e4 in K and V) change nothing: the pre-pass zeroes them before K's
    per-tile reference exponent is taken (otherwise they would coarsen the valid keys of their tile)."""
    q, k, v = make(2, 2, 130, 300, 128, "bhsd", seed=13)
    kv = torch.tensor([200, 77], device=DEV)
    k2, v2 = k.clone(), v.clone()
    for bi, n in enumerate(kv.tolist()):
        k2[bi, :, n:] *= 1e4
        v2[bi, :, n:] *= 1e4
    o1, l1, _ = _kernel(q, k, v, recipe, kv, variant)
    o2, l2, _ = _kernel(q, k2, v2, recipe, kv, variant)
    diff = float((o1.float() - o2.float()).abs().max())
    print(f"{recipe} {variant}: max |out(padded x1e4) - out| = {diff}, lse {float((l1 - l2).abs().max())}")
    assert torch.equal(o1, o2) and torch.equal(l1, l2)


@pytest.mark.parametrize("recipe", ["mxfp8", "mxfp6"])
def test_permuted_v_is_a_key_permutation(recipe):
    """The attention kernels' V operand (PERM_V) holds the same bytes as the plain one, keys of every aligned group
    of 16 at position c0 + 2 c3 + 4 c1 + 8 c2 (bits of the key index c mod 16)."""
    from fsattn_diffusers.kernels.sm90.prepass import prepare_v

    g = torch.Generator().manual_seed(3)
    v = torch.randn(2, 3, 300, 128, generator=g).to(torch.bfloat16).to(DEV)
    plan = plan_for(PRESETS[recipe])
    plain, vs_plain = prepare_v(v, plan, kv_lens=torch.tensor([300, 211], dtype=torch.int32, device=DEV))
    perm, vs_perm = prepare_v(v, plan, kv_lens=torch.tensor([300, 211], dtype=torch.int32, device=DEV), perm=True)
    pos = a_fragment_position(torch.arange(plain.shape[-1], device=DEV))
    expect = torch.empty_like(plain.view(torch.uint8))
    expect[..., pos] = plain.view(torch.uint8)
    mismatches = int((expect != perm.view(torch.uint8)).sum())
    print(f"{recipe}: permuted-V byte mismatches {mismatches} of {perm.numel()}")
    assert mismatches == 0
    assert torch.equal(vs_plain, vs_perm)


# The last two: one key tile under kv_lens with more than one program, where the MXFP6-P build once hung (the
# partitions' captured key count shared bytes with the unused ones tile, which a late TMA write overwrote).
GLUON_CASES = CASES + [(1, 2, 256, 1024, 128, "bhsd", None, True), (1, 3, 1000, 2000, 64, "bhsd", None, False),
                       (1, 2, 256, 77, 128, "bhsd", [77], False), (1, 2, 256, 256, 128, "bhsd", [97], False)]


@pytest.mark.parametrize("variant", ["gluon_pingpong"])
# mxfp8+key_order=natural: fp8_row P from key tile 0; mxfp6+key_order=natural: MXFP6 P with the raised reference
# (frozen_max_offset_log2) from key tile 0 (the default presets pair it with the diagonal order)
@pytest.mark.parametrize("recipe", RECIPES + ("mxfp8+key_order=natural", "mxfp6+key_order=natural"))
@pytest.mark.parametrize("case", [c if len(c) == 8 else (*c, False) for c in GLUON_CASES],
                         ids=lambda c: "x".join(map(str, c[:5])) + f"-{c[5]}-kv{c[6]}-spiky{c[7]}")
def test_gluon_variant_matches_triton_and_reference(case, recipe, variant):
    """FSATTN_KERNEL_VARIANT=gluon_pingpong (asynchronous GEMMs, softmax under the PV GEMM, TMA loads, NaN-padded keys
    as the mask, two free-running warpgroups; fp8_row P's row sum on the tensor cores, MXFP6 P's in registers): the
    same values as the triton variant up to the row sum's summation order, the tolerance rule against the reference,
    no unwritten element, -inf LSE exactly where no key is valid, the same rollbacks."""
    if CPU_INTERPRET:
        pytest.skip("Gluon kernels do not run in Triton's interpreter")
    b, h, s_q, s_k, d, layout, lens, spiky = case
    q, k, v = make(b, h, s_q, s_k, d, layout, seed=21, spiky=spiky)
    kv = None if lens is None else torch.tensor(lens, device=DEV)
    poison_allocator()
    of, lf, sf = _kernel(q, k, v, recipe, kv, "triton")
    og, lg, sg = _kernel(q, k, v, recipe, kv, variant)
    scale = 1.0 / math.sqrt(d)
    ref_o, ref_lse, ref_st = sm90_reference_attention(q, k, v, get_recipe(recipe), scale=scale, kv_lens=kv)
    ex_o, ex_lse = exact(q, k, v, scale, kv)
    e_g, e_r = rel(og, ex_o), rel(ref_o, ex_o)
    finite = torch.isfinite(ex_lse)
    lse_diff = float((lg - lf)[finite].abs().max()) if finite.any() else 0.0
    print(f"{variant} {recipe} {case}: gluon-vs-triton {rel(og, of):.2e} gluon-vs-ref {rel(og, ref_o):.2e} err gluon {e_g:.5f} "
          f"ref {e_r:.5f} | lse gluon-triton {lse_diff:.2e} | stats triton {sf.tolist()} gluon {sg.tolist()} "
          f"ref {ref_st}")
    assert not torch.isnan(og).any(), "unwritten (NaN-poisoned) or NaN output"
    assert torch.equal(torch.isfinite(lg), finite), "LSE must be -inf exactly on rows with no valid key"
    # l: the kernel sums each key tile's E4M3 P on the tensor cores (P8 @ ones), the triton variant in fp32; FP8 wgmma
    # accumulation keeps ~13-14 mantissa bits, so small P next to a large one (spiky rows) are partly dropped: LSE
    # differences of 1e-4 to 1.9e-3 measured on the H200, far below the recipe's own error.
    assert rel(og, of) < GLUON_VS_TRITON_OUT and lse_diff < GLUON_VS_TRITON_LSE
    assert within_kernel_rule(e_g, e_r) and rel(og, ref_o) < KERNEL_REF_MAX
    assert abs(int(sg[0]) - int(sf[0])) <= max(2, int(sf[0]) // 50) and int(sg[1]) == int(sf[1])
    if lens is not None and 0 in lens:
        assert torch.all(og[lens.index(0)] == 0)


def test_gluon_variant_covers_the_gated_recipes_and_falls_back_otherwise():
    """The gated Schraudolph recipes (mxfp8, mxfp6, mxfp4: fp8_row and MXFP6 P) run the gluon variant on a GPU; no gate
    and Rowmax-H15 run the triton kernel when the gluon variant is asked for; an unknown variant name is one clear
    error."""
    from fsattn_diffusers.kernels.sm90.ops import effective_variant

    want = "triton" if CPU_INTERPRET else "gluon_pingpong"
    for name in RECIPES:
        assert effective_variant("gluon_pingpong", plan_for(PRESETS[name])) == want
    for name in ("mxfp6+rollback=False", H15):
        assert effective_variant("gluon_pingpong", plan_for(get_recipe(name))) == "triton"
    with pytest.raises(ValueError, match="accepted: gluon_pingpong, triton"):
        effective_variant("gluonpp", plan_for(PRESETS["mxfp8"]))


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("shape", [(2, 3, 300, 200, 64, "bshd", [200, 77]), (1, 2, 257, 1000, 128, "bhsd", None)])
def test_prepass_operands_equal_the_sm90_reference(recipe, shape):
    """Pre-pass outputs (Q8 * 2^QE per 128-row tile, K8 * 2^KE per key tile, V8T^T * VS) equal
    sm90_numerics.operands bit for bit: on a GPU the E4M3 and BF16 roundings are the hardware casts, in the
    interpreter bit arithmetic; both must give the reference's values."""
    b, h, s_q, s_k, d, layout, lens = shape
    q, k, v = make(b, h, s_q, s_k, d, layout, seed=21)
    kv = None if lens is None else torch.tensor(lens, device=DEV)
    plan = plan_for(PRESETS[recipe])
    scale = 1.0 / math.sqrt(d)
    q8, qe, k8, ke, v8t, vs, bias = prepass(q, k, v, plan, scale, kv, variant="triton")[:7]
    valid = None if kv is None else torch.arange(s_k, device=DEV)[None, :] < kv[:, None]
    q_in, k_in, ref_bias, _ = smooth_inputs(q, k, PRESETS[recipe], scale, valid)  # the robust presets smooth Q, K
    qc, kc, vc = sm90_numerics.operands(q_in, k_in, v, PRESETS[recipe], scale, valid)
    if ref_bias is not None:  # Q smoothing's per-key term: fp32 sums in the kernel's order vs torch's
        got_b = bias[:, :, :s_k] if valid is None else torch.where(valid[:, None, :], bias[:, :, :s_k], 0.0)
        want_b = ref_bias if valid is None else torch.where(valid[:, None, :], ref_bias, 0.0)
        bdiff = float((got_b - want_b).abs().max())
        print(f"{recipe} {shape[:5]} bias: max |diff| {bdiff:.3e} of max |bias| {float(want_b.abs().max()):.3e}")
        assert bdiff <= FP32_ACCUMULATED * float(want_b.abs().max()) + FP32_ROUNDOFF
    qv = (q8.float() * torch.exp2(qe.float()).repeat_interleave(128, dim=2)[..., None])[:, :, :s_q]
    kv_ = (k8.float() * torch.exp2(ke.float()).repeat_interleave(128, dim=2)[..., None])[:, :, :s_k]
    v8t = v8t[..., a_fragment_position(torch.arange(v8t.shape[-1], device=DEV))]  # back to key order
    vv = (v8t.float() * vs[..., None]).transpose(-1, -2)[:, :, :s_k]
    if valid is not None:  # keys past kv_lens: whatever the reference carries there is never read
        kv_, kc = (torch.where(valid[:, None, :, None], t, torch.zeros_like(t)) for t in (kv_, kc))
        vv, vc = (torch.where(valid[:, None, :, None], t, torch.zeros_like(t)) for t in (vv, vc))
    for name, got, want in (("Q", qv, qc), ("K", kv_, kc), ("V", vv, vc)):
        bad = int((got != want.float()).sum())
        print(f"{recipe} {shape[:5]} {name}: {bad} of {got.numel()} differ, max |diff| "
              f"{float((got - want.float()).abs().max()):.3e}")
        assert bad == 0


@pytest.mark.parametrize("shape", [(2, 77, 3, 128), (1, 300, 2, 64)])
def test_fused_rope_equals_the_torch_rope(shape):
    """kernels/rope.py against the processors' torch RoPE (diffusers' arithmetic): bit-identical, for a strided
    (B, S, H, D) view as the Wan processor passes it, with Wan's (1, S, 1, D) float32 angles."""
    from fsattn_diffusers.integration.processors import _rope_interleaved
    from fsattn_diffusers.kernels.rope import rope_interleaved

    b, s, h, d = shape
    g = torch.Generator(device="cpu").manual_seed(31)
    x = (torch.randn((b, s, h * d), generator=g) * 3).to(torch.bfloat16).to(DEV).unflatten(2, (h, d))
    ang = torch.rand((1, s, 1, d // 2), generator=g) * 100.0
    cos = torch.cos(ang).repeat_interleave(2, dim=-1).to(DEV)
    sin = torch.sin(ang).repeat_interleave(2, dim=-1).to(DEV)
    want = _rope_interleaved(x, cos, sin)
    x_before = x.clone()
    got = rope_interleaved(x, cos, sin)
    bad = int((got.view(torch.int16) != want.contiguous().view(torch.int16)).sum())
    print(f"rope {shape}: {bad} of {got.numel()} differ, max |diff| {float((got.float() - want.float()).abs().max()):.3e}")
    assert got.shape == want.shape and got.is_contiguous()
    assert torch.equal(x, x_before), "the input must not be modified"
    assert bad == 0


@triton.jit
def _h15_probe(X, P, S, C, H15_EXP: tl.constexpr, RNE: tl.constexpr):
    """Rowmax-H15 Stage-A/B of the triton kernel on a (16, 128) tile of 2X (scale 1) with c = -2m per row."""
    r = tl.arange(0, 16)[:, None]
    k = tl.arange(0, 128)[None, :]
    acc = tl.load(X + r * 128 + k)
    c = tl.load(C + tl.arange(0, 16))
    p8, psum = _stage_ab_h15(acc, 1.0, c, H15_EXP, RNE)
    tl.store(P + r * 128 + k, p8.to(tl.float32))
    tl.store(S + tl.arange(0, 16), psum)


def test_h15_stage_ab_is_the_e4m3_of_the_reference_weight_for_every_n():
    """The kernel's Rowmax-H15 Stage-A/B (E4M3 rounding done on n) against sm90_numerics' weight then E4M3, for every
    n from the clamp to the gate's top (2 (X - m) = -250 .. 6 in 1/8 steps, 8, -300, -inf; NaN on a GPU)."""
    sigma = 4  # fp8_row P (kernels.sm90.plan.P_SIGMA_FP8)
    x = (torch.arange(16 * 128, dtype=torch.float32) * 0.125 - 250.0).reshape(16, 128)  # 2X - 2m = -250 .. 5.875
    x[0, 0], x[0, 2], x[15, 127] = float("-inf"), -300.0, 8.0  # the clamp; the gate's top
    if not CPU_INTERPRET:  # a GPU's max drops NaN (masked keys of gluon_pingpong); the interpreter's numpy keeps it
        x[0, 1] = float("nan")
    m = torch.full((16,), 0.0)
    # the kernel forms 2X - 2m with s2 = 1: pass 2X as acc and c = -2m
    p = torch.empty(16, 128, device=DEV)
    ps = torch.empty(16, device=DEV)
    _h15_probe[(1,)](x.to(DEV), p, ps, (-2.0 * m).to(DEV), H15_EXP=127 + sigma, RNE=CPU_INTERPRET)
    want = sm90_numerics.e4m3(sm90_numerics.stage_a_h15(x / 2.0, m, sigma))
    diff = (p.cpu() != want).nonzero().tolist()
    bad = len(diff)
    print("differing (row, key):", diff[:8])
    print(f"Rowmax-H15 Stage-B: {bad} of {want.numel()} differ; row sums max |diff| "
          f"{float((ps.cpu() - want.sum(-1)).abs().max()):.2e}")
    assert bad == 0 and torch.allclose(ps.cpu(), want.sum(-1), rtol=FP32_ROUNDOFF, atol=0)

"""Kernel fuzz on a CUDA GPU (sm_90+): seeded random cases, every kernel recipe and variant, against the sm90
reference on the same GPU (harness, checks and tolerance rule: fsattn_diffusers.measure.kernel_fuzz).

Cases: ``FSATTN_FUZZ_CASES`` (default 300), seed ``FSATTN_FUZZ_SEED`` (default 0), work cap
``FSATTN_FUZZ_MAX_WORK`` (default kernel_fuzz.MAX_WORK), tile cap ``FSATTN_FUZZ_MAX_TILES`` (default none:
kernel_fuzz.tile_count, the interpreter's cost). One line per case and the worst case per recipe
go to stdout and, when set, to the file ``FSATTN_FUZZ_LOG``.
``FSATTN_FUZZ_SLICE=a:b`` runs cases a..b-1 of the same seeded list (on the H200 a case takes ~1-7 s, cold compiles
included: `scripts/gpu_suite_h200.sh fuzz` runs slices in several processes side by side on the one GPU).
``FSATTN_FUZZ_PARTS=p`` (default 1) splits those cases into ``p`` consecutive parts, one test item each
(``test_kernel_fuzz[part<j>of<p>]``), which pytest-xdist spreads over its workers (CI's interpreter stage); with
``FSATTN_FUZZ_LOG`` set, part j writes ``<log>.part<j>``.
Variants: kernels.sm90.ops.VARIANTS (``gluon_pingpong`` runs ``triton`` where it does not apply), plus ``api``: the
public custom-op path (``kernels.sm90.ops.fused_attention``, the default variant) with the allocator poisoned.
``FSATTN_KERNEL_TEST_CPU=1 TRITON_INTERPRET=1`` runs it on the CPU through Triton's interpreter (slow: use a
few cases and small caps, e.g. ``FSATTN_FUZZ_CASES=9 FSATTN_FUZZ_MAX_WORK=16384 FSATTN_FUZZ_MAX_TILES=8``).
"""

import os
import pathlib
import time

import pytest
import torch

from kernel_device import CPU_INTERPRET, DEV, skip_module_without_sm90  # noqa: E402

skip_module_without_sm90()
triton = pytest.importorskip("triton")

from fsattn_diffusers.measure.kernel_fuzz import MAX_WORK, case_line, generate_cases, run_case, summary_lines  # noqa: E402
from fsattn_diffusers.recipe import PRESETS, get_recipe  # noqa: E402
from fsattn_diffusers.smoothing import lse_offset  # noqa: E402

from fsattn_diffusers.kernels.sm90.ops import (VARIANTS, attention_from_operands, effective_variant,  # noqa: E402
                                          fused_attention, prepass)
from fsattn_diffusers.kernels.sm90.plan import plan_for, unsupported_reason  # noqa: E402

pytestmark = pytest.mark.gpu
#: Every preset the kernels run (the default ones switch Q smoothing per slice, so their inputs give Q's even heads a
#: shared offset, kernel_fuzz.SWITCH_Q_OFFSET, and both of the kernel's launches run), Rowmax-H15 (the kernels' second
#: exponential) and Q smoothing on every slice (its key term, a wgmma the score GEMM is chained on in gluon_pingpong:
#: with fp8_row P and the lowering gate, and with MXFP6 P).
#: The INT8 Q/K preset runs its own kernel (kernels/sm90/fused_attention_gluon_int8.py, every variant; Gluon has no
#: interpreter, so not on the CPU), also with the hardware exponential and with Q smoothing.
RECIPES = tuple(n for n, r in PRESETS.items() if unsupported_reason(r, 128) is None and unsupported_reason(r, 64) is None
                and (r.qk_format != "int8" or not CPU_INTERPRET)
                ) + ("mxfp8+exponential=rowmax_h15", "mxfp8+smooth_q+smooth_q_min_ratio=0",
                     "mxfp6+smooth_q+smooth_q_min_ratio=0") + (
    () if CPU_INTERPRET else ("int8-bf16+exponential=exact", "int8-bf16+smooth_q=true"))
INT8_KERNEL = "gluon_int8"
FUZZ_VARIANTS = VARIANTS + ("api",)


def _runs(recipe: str, variant: str) -> str:
    """The kernel a case's variant runs."""
    r = get_recipe(recipe)
    if r.qk_format == "int8":
        return INT8_KERNEL
    return effective_variant(None if variant == "api" else variant, plan_for(r))


def kernel(q, k, v, recipe, kv, variant, scale, out, lse):
    if get_recipe(recipe).qk_format == "int8":  # one kernel: the public entry for "api", its launch for the rest
        from fsattn_diffusers.kernels.sm90.ops_int8 import fused_attention_int8

        if variant == "api":
            torch.full((64 << 20,), float("nan"), device=DEV)  # freed at once: torch.empty hands back NaN
        o, l, _, _ = fused_attention_int8(q, k, v, get_recipe(recipe), scale=scale, kv_lens=kv, return_lse=True)
        out.copy_(o)
        lse.copy_(l)
        return
    plan = plan_for(get_recipe(recipe))
    if variant == "api":
        if DEV == "cuda":
            torch.full((64 << 20,), float("nan"), device=DEV)  # freed at once: torch.empty hands back NaN
        o, l, _, _ = fused_attention(q, k, v, plan, scale=scale, kv_lens=kv, return_lse=True)
        out.copy_(o)
        lse.copy_(l)
        return
    ops = prepass(q, k, v, plan, scale, kv, variant=variant)
    stats = torch.zeros((2,), dtype=torch.int32, device=DEV)
    attention_from_operands(ops, out, plan, q.shape[2], k.shape[2], kv, lse, stats, variant=variant)
    if ops.k_mean is not None:  # K smoothing: the LSE of the unsmoothed scores, as fused_attention_op returns it
        lse += lse_offset(q, ops.k_mean, scale)


PARTS = int(os.environ.get("FSATTN_FUZZ_PARTS", "1"))


def _log_path(part: int) -> pathlib.Path:
    log = os.environ.get("FSATTN_FUZZ_LOG", os.devnull)
    return pathlib.Path(log if PARTS == 1 or log == os.devnull else f"{log}.part{part}")


@pytest.mark.parametrize("part", range(PARTS), ids=[f"part{j}of{PARTS}" for j in range(PARTS)])
def test_kernel_fuzz(part):
    n = int(os.environ.get("FSATTN_FUZZ_CASES", "300"))
    seed = int(os.environ.get("FSATTN_FUZZ_SEED", "0"))
    cap = int(os.environ.get("FSATTN_FUZZ_MAX_WORK", str(MAX_WORK)))
    log_path = _log_path(part)
    tiles = int(os.environ.get("FSATTN_FUZZ_MAX_TILES", "0")) or None
    cases = generate_cases(n, RECIPES, FUZZ_VARIANTS, seed=seed, max_work=cap, max_tiles=tiles)
    first, _, last = os.environ.get("FSATTN_FUZZ_SLICE", f"0:{n}").partition(":")
    cases = cases[int(first):int(last or n)]
    cases = cases[len(cases) * part // PARTS:len(cases) * (part + 1) // PARTS]
    if not cases and PARTS > 1:
        pytest.skip(f"part {part} of {PARTS} has no case (more parts than cases)")
    device = "CPU (Triton interpreter)" if CPU_INTERPRET else torch.cuda.get_device_name()
    header = (f"kernel fuzz: cases {cases[0].index if cases else 0}-{cases[-1].index if cases else -1} of {n}, seed {seed}, work cap {cap}, tile cap {tiles}, recipes {RECIPES}, variants {FUZZ_VARIANTS}, "
              f"{device}, torch {torch.__version__}, triton {triton.__version__}, "
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(header)
    t0 = time.perf_counter()
    results = []
    if str(log_path) != os.devnull:
        log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        log.write(header + "\n")
        for case in cases:
            r = run_case(case, kernel, DEV)
            line = case_line(r) + f" (runs {_runs(case.recipe, case.variant)})"
            results.append(r)
            print(line, flush=True)
            log.write(line + "\n")
            log.flush()
        tail = summary_lines(results) + [f"{sum(bool(r['failures']) for r in results)} of {len(results)} cases failed, "
                                         f"{time.perf_counter() - t0:.1f} s"]
        log.write("\n".join(tail) + "\n")
    print("\n".join(tail))
    failed = [r["label"] + ": " + "; ".join(r["failures"]) for r in results if r["failures"]]
    assert not failed, f"{len(failed)} failed cases, first: {failed[:3]}"

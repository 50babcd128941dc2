"""Re-run kernel fuzz cases once per kernel path, to place a failure: the same seeded case (inputs, kv_lens, layout)
through ``gluon_pingpong``, ``triton`` and the public call, each against the Hopper reference and exact attention.

    python3 scripts/kernel_fuzz_triage.py [--seed 0] [--cases 300] [--max-work N] [--recipes A,B] LOG_OR_INDEX ...

``LOG_OR_INDEX``: a fuzz log (``scripts/gpu_suite_h200.sh fuzz`` writes ``kernel_fuzz_h200.txt``), whose ``FAIL`` lines
give the case indices, or case indices. The case list is ``tests/test_kernel_fuzz_gpu.py``'s (same recipes, variants,
seed and work cap), so the numbers are the fuzz's. ``--recipes`` runs each case's inputs under these recipes too (is
a failure the recipe's or the kernel path's?). Needs a Hopper GPU; prints one line per (case, recipe, path).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys

TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests")


def _indices(items):
    out = []
    for item in items:
        if item.isdigit():
            out.append(int(item))
            continue
        with open(item) as fh:
            out += [int(m.group(1)) for m in re.finditer(r"^#(\d+) .*FAIL", fh.read(), re.M)]
    return sorted(set(out))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("items", nargs="+", help="fuzz logs (their FAIL lines) or case indices")
    ap.add_argument("--seed", type=int, default=int(os.environ.get("FSATTN_FUZZ_SEED", "0")))
    ap.add_argument("--cases", type=int, default=int(os.environ.get("FSATTN_FUZZ_CASES", "300")))
    ap.add_argument("--max-work", type=int, default=int(os.environ.get("FSATTN_FUZZ_MAX_WORK", "0")) or None)
    ap.add_argument("--max-tiles", type=int, default=int(os.environ.get("FSATTN_FUZZ_MAX_TILES", "0")) or None)
    ap.add_argument("--recipes", default="", help="comma list of recipes to run each case's inputs under as well")
    a = ap.parse_args(argv)
    sys.path.insert(0, TESTS)
    import test_kernel_fuzz_gpu as fuzz  # the test's recipes, variants and kernel

    from fsattn_diffusers.measure.kernel_fuzz import MAX_WORK, case_line, generate_cases, run_case

    wanted = _indices(a.items)
    if not wanted:
        print("kernel_fuzz_triage: no failed case in the given logs; nothing to re-run")
        return 0
    cases = generate_cases(a.cases, fuzz.RECIPES, fuzz.FUZZ_VARIANTS, seed=a.seed,
                           max_work=a.max_work or MAX_WORK, max_tiles=a.max_tiles)
    bad = [i for i in wanted if not 0 <= i < len(cases)]
    if bad:
        print(f"kernel_fuzz_triage: case indices {bad} are outside the list of {len(cases)}; "
              f"accepted: 0..{len(cases) - 1}", file=sys.stderr)
        return 2
    extra = [r for r in a.recipes.split(",") if r]
    for i in wanted:
        for recipe, variant in [(cases[i].recipe, v) for v in ("gluon_pingpong", "triton", "api")] + \
                [(r, v) for r in extra for v in ("gluon_pingpong", "triton")]:
            case = dataclasses.replace(cases[i], recipe=recipe, variant=variant)
            runs = fuzz._runs(case.recipe, variant)
            print(case_line(run_case(case, fuzz.kernel, fuzz.DEV)) + f" (runs {runs})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Builds of the gluon_pingpong kernel side by side in one process: the working tree's against one or more other copies
of kernels/fused_attention_gluon_pingpong.py (``--baseline``, repeatable; for example ``git show
<commit>:kernels/fused_attention_gluon_pingpong.py``, or a variant under test).

For each (shape, recipe, input family) and each baseline: one pre-pass, then both kernels on the same operands,
compared bit for bit (output, LSE, rollback counts) and each against float64 attention on sampled query rows
(relative error), then kernel-only ``do_bench`` medians interleaved A B, B A, ... (``--rounds``), so that clock and
power drift hits both alike. Run on the H200 from the repository root:

    source scripts/device_env.sh
    git show <commit>:kernels/fused_attention_gluon_pingpong.py > /tmp/baseline.py   # on a machine with the history
    python3 scripts/kernel_ab_h200.py --baseline /tmp/baseline.py --json ab.json --md ab.md
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import sys
import time

import torch

import fsattn_diffusers.kernels.fused_attention_gluon_pingpong as current_module
from fsattn_diffusers.kernels.ops import attention_from_operands, prepass
from fsattn_diffusers.kernels.plan import plan_for
from fsattn_diffusers.measure.kernel_bench import (SAMPLE_ROWS, SHAPES, accuracy, environment, exact_rows,
                                                   interleaved_samples, make_inputs, paired_median, timed)
from fsattn_diffusers.quality.analysis import sample_rows
from fsattn_diffusers.recipe import get_recipe

MODULE = current_module.__name__


def load_baseline(path: str, index: int = 0):
    """The kernel module at ``path``, imported inside ``fsattn_diffusers.kernels`` (its relative imports resolve)."""
    spec = importlib.util.spec_from_file_location(f"{MODULE}_baseline{index}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@contextlib.contextmanager
def kernel_module(mod):
    """Launches inside the block use ``mod``'s kernel (ops imports the module at each launch)."""
    saved = sys.modules[MODULE]
    sys.modules[MODULE] = mod
    try:
        yield
    finally:
        sys.modules[MODULE] = saved


def run_once(mod, ops, plan, shape, lse_too: bool, stages=None):
    b, h, s, d = shape
    out = torch.full((b, h, s, d), float("nan"), device="cuda", dtype=torch.bfloat16)  # poisoned
    lse = torch.full((b, h, s), float("nan"), device="cuda") if lse_too else None
    stats = torch.zeros((2,), dtype=torch.int32, device="cuda")
    with kernel_module(mod):
        attention_from_operands(ops, out, plan, s, s, None, lse, stats, num_stages=stages)
    torch.cuda.synchronize()
    return out, lse, stats


def compare(baseline, shape, recipe_name, inputs, rounds, warmup, rep, log, baseline_stages=None):
    b, h, s, d = shape
    recipe = get_recipe(recipe_name)
    plan = plan_for(recipe)
    q, k, v = make_inputs(b, h, s, s, d, inputs)
    ops = prepass(q, k, v, plan, d ** -0.5, None)
    mods = {"baseline": baseline, "current": current_module}
    stages = {"baseline": baseline_stages, "current": None}
    res = {name: run_once(mod, ops, plan, shape, True, stages[name]) for name, mod in mods.items()}
    (oa, la, sa), (ob, lb, sb) = res["baseline"], res["current"]
    same_out = bool(torch.equal(oa.view(torch.int16), ob.view(torch.int16)))
    same_lse = bool(torch.equal(la.view(torch.int32), lb.view(torch.int32)))
    same_stats = bool(torch.equal(sa, sb))
    finite = bool(torch.isfinite(ob).all())
    rows = sample_rows(s, SAMPLE_ROWS, 0).cuda()
    ref = exact_rows(q, k, v, rows, d ** -0.5)
    err = {"baseline": accuracy(oa[:, :, rows], ref)[0], "current": accuracy(ob[:, :, rows], ref)[0]}
    del res, oa, ob, la, lb, ref
    out = torch.empty((b, h, s, d), device="cuda", dtype=torch.bfloat16)
    def timer(name):
        def run():
            with kernel_module(mods[name]):
                return timed(lambda: attention_from_operands(ops, out, plan, s, s, None, None, None,
                                                             num_stages=stages[name]), warmup, rep)
        return run
    samples = interleaved_samples({name: {"ms": timer(name)} for name in mods}, rounds)
    times = {name: parts["ms"] for name, parts in samples.items()}
    med = {name: paired_median(t) for name, t in times.items()}
    row = {"baseline": baseline.__file__, "baseline_stages": baseline_stages, "shape": list(shape),
           "recipe": recipe_name, "inputs": inputs, "rounds_ms": times,
           "baseline_ms": med["baseline"], "current_ms": med["current"],
           "current_over_baseline": med["current"] / med["baseline"],
           "bit_identical_out": same_out, "bit_identical_lse": same_lse, "same_rollback_counts": same_stats,
           "rollbacks": sa.tolist(), "out_finite": finite,
           "baseline_rel_err": err["baseline"], "current_rel_err": err["current"]}
    log(f"{baseline.__file__}: {str(shape):<22} {recipe_name:<8} {inputs:<10} baseline {med['baseline']:8.3f} ms  "
        f"current {med['current']:8.3f} ms  ratio {row['current_over_baseline']:.4f}  identical out/lse/stats "
        f"{same_out}/{same_lse}/{same_stats}  rel. err {err['baseline']:.4f} / {err['current']:.4f}  "
        f"rounds {[round(x, 3) for x in times['baseline']]} / "
        f"{[round(x, 3) for x in times['current']]}")
    del ops, out
    torch.cuda.empty_cache()
    return row


def markdown(env, args, rows) -> str:
    lines = ["# gluon_pingpong kernel: working tree against a baseline copy, one process", "",
             f"- device: {env.get('device')}; torch {env.get('torch')}, triton {env.get('triton')}; "
             f"date {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}",
             f"- command: `python3 scripts/kernel_ab_h200.py {' '.join(sys.argv[1:])}`",
             f"- kernel-only times (pre-pass done once, same operands): `do_bench` medians (warmup {args.warmup} ms, "
             f"rep {args.rep} ms), {args.rounds} rounds interleaved baseline/current, current/baseline, ...; the "
             "median over the round pairs of the pair's mean (`kernel_bench.paired_median`)",
             "- identical: output (bf16 bits), LSE (fp32 bits) and rollback counts of the two kernels on the same "
             "operands",
             f"- rel. err: relative Frobenius error against float64 softmax attention on {SAMPLE_ROWS} sampled query "
             "rows per head (`kernel_bench.exact_rows`)",
             f"- K/V stages of the baseline's launches: {args.baseline_stages or 'the default (as the current)'}",
             "", "| baseline | shape (B,H,S,D) | recipe | inputs | baseline ms | current ms | current / baseline | "
             "identical out / LSE / rollbacks | rel. err baseline / current |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {os.path.basename(r['baseline'])} | {','.join(map(str, r['shape']))} | {r['recipe']} | "
                     f"{r['inputs']} | {r['baseline_ms']:.3f} | {r['current_ms']:.3f} | "
                     f"{r['current_over_baseline']:.4f} | {r['bit_identical_out']} / {r['bit_identical_lse']} / "
                     f"{r['same_rollback_counts']} | {r['baseline_rel_err']:.4f} / {r['current_rel_err']:.4f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", required=True, action="append",
                    help="a copy of kernels/fused_attention_gluon_pingpong.py (repeat for several)")
    ap.add_argument("--shapes", default="paper,wan22", help=f"comma list of {', '.join(SHAPES)}")
    ap.add_argument("--recipes", default="mxfp8")
    ap.add_argument("--baseline-stages", type=int, default=None,
                    help="K/V pipeline stages of the baseline's launches (default: the library's, as the current's)")
    ap.add_argument("--inputs", default="gaussian", help="comma list: gaussian or structured families")
    ap.add_argument("--rounds", type=int, default=4, help="1 or an even number")
    ap.add_argument("--warmup", type=float, default=50.0)
    ap.add_argument("--rep", type=float, default=300.0)
    ap.add_argument("--json")
    ap.add_argument("--md")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("kernel_ab_h200.py: needs a CUDA GPU (sm_90); none is visible", file=sys.stderr)
        return 2
    baselines = [load_baseline(path, i) for i, path in enumerate(args.baseline)]
    env = environment()
    env["command"] = "python3 scripts/kernel_ab_h200.py " + " ".join(sys.argv[1:])
    rows = []
    for shape_name in args.shapes.split(","):
        b, h, s, d = SHAPES[shape_name]
        for recipe in args.recipes.split(","):
            for inputs in args.inputs.split(","):
                for baseline in baselines:
                    rows.append(compare(baseline, (b, h, s, d), recipe, inputs, args.rounds, args.warmup, args.rep,
                                        print, args.baseline_stages))
    md = markdown(env, args, rows)
    print(md)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": env, "argv": sys.argv[1:], "rows": rows}, f, indent=1)
    if args.md:
        with open(args.md, "w") as f:
            f.write(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())

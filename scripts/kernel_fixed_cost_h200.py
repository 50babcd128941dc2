"""Per-program fixed cost of the gluon_pingpong kernel: kernel-only time at a fixed query length and head count for
several key lengths, fitted as ``T = waves * (a + b * key_tiles)``.

``a`` is what one program (a 128-row query tile) spends outside its steady key loop: launch, barrier set-up, the Q and
first K/V loads, the epilogue (O normalization and store). ``a / (a + b * key_tiles)`` bounds what a persistent kernel
that overlaps one tile's epilogue with the next tile's prologue could save. Run on the H200 from the repository root:

    source scripts/device_env.sh
    python3 scripts/kernel_fixed_cost_h200.py --json fixed_cost.json
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch

from fsattn_diffusers.kernels.ops import attention_from_operands, prepass
from fsattn_diffusers.kernels.plan import plan_for
from fsattn_diffusers.measure.kernel_bench import environment, make_inputs, timed
from fsattn_diffusers.recipe import get_recipe


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--heads", type=int, default=24)
    ap.add_argument("--s-q", type=int, default=32768)
    ap.add_argument("--s-k", default="2048,4096,8192,16384,32768", help="comma list of key lengths (multiples of 128)")
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--recipe", default="mxfp8")
    ap.add_argument("--warmup", type=float, default=50.0)
    ap.add_argument("--rep", type=float, default=300.0)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    plan = plan_for(get_recipe(args.recipe))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    programs = args.heads * math.ceil(args.s_q / 128)
    waves = programs / sms
    rows = []
    for s_k in (int(x) for x in args.s_k.split(",")):
        q, k, v = make_inputs(1, args.heads, args.s_q, s_k, args.d, "gaussian")
        ops = prepass(q, k, v, plan, args.d ** -0.5, None)
        out = torch.empty_like(q)
        ms = timed(lambda: attention_from_operands(ops, out, plan, args.s_q, s_k, None, None, None), args.warmup,
                   args.rep)
        rows.append({"s_k": s_k, "key_tiles": s_k // 128, "kernel_ms": ms, "us_per_program": ms * 1e3 / waves})
        print(f"S_k {s_k:6d}  key tiles {s_k // 128:4d}  kernel {ms:8.3f} ms  per program {ms * 1e3 / waves:8.2f} us")
        del q, k, v, ops, out
        torch.cuda.empty_cache()
    x = torch.tensor([float(r["key_tiles"]) for r in rows], dtype=torch.float64)
    y = torch.tensor([r["us_per_program"] for r in rows], dtype=torch.float64)
    b_fit = float(((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum())
    a_fit = float(y.mean() - b_fit * x.mean())
    resid = (y - (a_fit + b_fit * x)).abs().max().item()
    longest = rows[-1]["key_tiles"]
    share = a_fit / (a_fit + b_fit * longest)
    print(f"fit: per program a = {a_fit:.2f} us + b = {b_fit:.4f} us per key tile (max residual {resid:.2f} us); "
          f"programs {programs}, SMs {sms}, waves {waves:.2f}; fixed share at {longest} key tiles {share:.2%}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": environment(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       "args": vars(args), "rows": rows, "a_us": a_fit, "b_us_per_tile": b_fit,
                       "max_residual_us": resid, "fixed_share_at_longest": share}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""GPU timeline of one public ``attention()`` call: each kernel's duration and the idle gaps between them, from
``torch.profiler`` (CUPTI timestamps), median over several profiled calls after a warm-up.

Shows where the call's time goes outside the attention kernel (K's token mean, the Q/K and V pre-pass kernels, the
non-finite flags' copy to the host). ``--pipelined N`` profiles N calls queued back to back instead, each after an L2
flush as ``triton.testing.do_bench`` times them, and reports per call the GPU time from its first kernel to the next
call's and how much of it the GPU sat idle (waiting for the host). Run on the H200 from the repository root:

    source scripts/device_env.sh
    python3 scripts/call_timeline_h200.py --shapes paper,wan22 --json timeline.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from fsattn_diffusers import attention
from fsattn_diffusers.measure.kernel_bench import SHAPES, environment, make_inputs


def one_timeline(q, k, v, recipe):
    """(name, start_us, duration_us) of every GPU activity of one call, in start order."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        attention(q, k, v, recipe, layout="bhsd")
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    events.sort(key=lambda e: e.time_range.start)
    return [(e.name, e.time_range.start, e.time_range.end - e.time_range.start) for e in events]


def pipelined(q, k, v, recipe, calls):
    """Per call of ``calls`` queued back to back (an L2 flush before each): (span_us, idle_us, kernels): the GPU time
    from the call's first activity to the next flush's, and the gaps between activities within it."""
    flush = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device="cuda")
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls + 1):
            flush.zero_()
            attention(q, k, v, recipe, layout="bhsd")
        torch.cuda.synchronize()
    events = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                    key=lambda e: e.time_range.start)
    starts = [i for i, e in enumerate(events) if e.name.startswith("void at::native::vectorized_elementwise_kernel")
              and "FillFunctor<signed char>" in e.name]  # the flushes
    out = []
    for a, b in zip(starts, starts[1:]):
        span = events[b].time_range.start - events[a + 1].time_range.start
        busy = sum(e.time_range.end - e.time_range.start for e in events[a + 1:b])
        out.append((span, span - busy, b - a - 1))
    return out


def summarize(timelines):
    """Per position in the call: the kernel's name, median duration, median gap before it; and the span."""
    n = min(len(t) for t in timelines)
    rows = []
    for i in range(n):
        durs = [t[i][2] for t in timelines]
        gaps = [t[i][1] - (t[i - 1][1] + t[i - 1][2]) for t in timelines] if i else [0.0]
        rows.append({"name": timelines[0][i][0][:90], "duration_us": statistics.median(durs),
                     "gap_before_us": statistics.median(gaps)})
    spans = [t[n - 1][1] + t[n - 1][2] - t[0][1] for t in timelines]
    return rows, statistics.median(spans)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="paper,wan22", help=f"comma list of {', '.join(SHAPES)}")
    ap.add_argument("--recipe", default="mxfp8")
    ap.add_argument("--calls", type=int, default=5, help="profiled calls (after 3 unprofiled ones)")
    ap.add_argument("--pipelined", type=int, default=0, help="also profile this many calls queued back to back")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    result = {"environment": environment(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "args": vars(args), "shapes": {}}
    for name in args.shapes.split(","):
        b, h, s, d = SHAPES[name]
        q, k, v = make_inputs(b, h, s, s, d, "gaussian")
        for _ in range(3):
            attention(q, k, v, args.recipe, layout="bhsd")
        rows, span = summarize([one_timeline(q, k, v, args.recipe) for _ in range(args.calls)])
        print(f"== {name} {(b, h, s, d)} {args.recipe}: first kernel start to last kernel end {span / 1e3:.3f} ms")
        for r in rows:
            print(f"  {r['duration_us'] / 1e3:9.4f} ms  (gap before {r['gap_before_us']:7.1f} us)  {r['name']}")
        outside = span - max(r["duration_us"] for r in rows)
        print(f"  outside the longest kernel: {outside / 1e3:.4f} ms ({outside / span:.2%} of the span)")
        result["shapes"][name] = {"shape": [b, h, s, d], "span_us": span, "kernels": rows}
        if args.pipelined:
            per_call = pipelined(q, k, v, args.recipe, args.pipelined)
            for i, (span_c, idle, n) in enumerate(per_call):
                print(f"  queued, position {i}: {span_c / 1e3:.4f} ms from its first activity to the next flush, "
                      f"GPU idle {idle / 1e3:.4f} ms, {n} activities")
            result["shapes"][name]["pipelined"] = [{"span_us": a, "idle_us": i, "activities": n}
                                                   for a, i, n in per_call]
        del q, k, v
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

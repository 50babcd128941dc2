"""Time ratios of recipe pairs within one ``fsattn bench`` JSON: each default preset against its paper preset
(``mxfp8`` / ``mxfp8-paper``, ...) or the pairs given, per shape, for the whole call, the pre-pass and the kernel alone.

Both recipes of a pair come from the same process and rounds. With per-round values (``rounds_ms``, ``--rounds`` > 1)
each time is :func:`fsattn_diffusers.measure.kernel_bench.paired_median` of the rounds; an odd count (JSON written
before ``--rounds`` took even counts only) drops its last round, so the estimate still pairs forward and reverse
rounds. Prints a markdown table:

    python -m fsattn_diffusers.measure.bench_pairs benchmarks/results/bench_h100.json [--pairs mxfp8:mxfp8-paper,...]
"""

from __future__ import annotations

import argparse
import json
import sys

from ..recipe import PAPER_SUFFIX
from .kernel_bench import paired_median

PARTS = ("ms", "prepass_ms", "kernel_ms")


def part_time(row: dict, part: str) -> float:
    """One method's time for ``part``: the paired median of its rounds, else the row's single value."""
    rounds = row.get("rounds_ms", {}).get(part)
    if not rounds or len(rounds) == 1:
        return float(row[part])
    return paired_median(rounds[:len(rounds) // 2 * 2])


def pair_rows(results: list, pairs: list) -> list:
    """(shape, a, b, {part: (ms a, ms b, a / b)}) for every pair present at a shape, in the JSON's order."""
    by_key = {(tuple(r["shape"]), r["method"]): r for r in results}
    shapes = list(dict.fromkeys(tuple(r["shape"]) for r in results))
    out = []
    for shape in shapes:
        for a, b in pairs:
            ra, rb = by_key.get((shape, a)), by_key.get((shape, b))
            if ra is None or rb is None:
                continue
            times = {}
            for part in PARTS:
                if part in ra and part in rb:
                    ta, tb = part_time(ra, part), part_time(rb, part)
                    times[part] = (ta, tb, ta / tb)
            out.append((shape, a, b, times))
    return out


def markdown(rows: list) -> str:
    lines = ["| shape (B,H,Sq,Sk,D) | recipe / against | whole call ms | ratio | pre-pass ms | ratio | kernel ms "
             "| ratio |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for shape, a, b, times in rows:
        cells = []
        for part in PARTS:
            if part in times:
                ta, tb, ratio = times[part]
                cells += [f"{ta:.3f} / {tb:.3f}", f"{ratio:.3f}x"]
            else:
                cells += ["-", "-"]
        lines.append(f"| {','.join(map(str, shape))} | {a} / {b} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", help="an `fsattn bench --json` file")
    ap.add_argument("--pairs", default=None,
                    help="comma list of recipe:against (default: every recipe X with X" + PAPER_SUFFIX + " beside it)")
    args = ap.parse_args(argv)
    with open(args.json) as f:
        results = json.load(f)["results"]
    if args.pairs:
        pairs = [tuple(p.split(":", 1)) for p in args.pairs.split(",")]
        if any(len(p) != 2 for p in pairs):
            print(f"bench_pairs: bad --pairs {args.pairs!r}; accepted: a:b[,c:d ...]", file=sys.stderr)
            return 2
    else:
        methods = list(dict.fromkeys(r["method"] for r in results))
        pairs = [(m, m + PAPER_SUFFIX) for m in methods if m + PAPER_SUFFIX in methods]
    print(markdown(pair_rows(results, pairs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

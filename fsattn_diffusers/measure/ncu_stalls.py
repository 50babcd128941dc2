"""Where the warps of one kernel launch wait, from Nsight Compute's per-instruction SASS page.

Reads the CSV that `ncu --import REP --page source --csv --print-source sass` writes (scripts/gpu_suite_h200.sh
`power` part: ncu_sass_h200.csv) and prints markdown: the share of all warp-stall samples per opcode (the
warpgroup waits split by their depth, the FMNMX split into Stage-A's clamp and the rest) with each opcode's top
stall reasons, then the share per stall reason. With --columns it also writes a smaller CSV that keeps only the
address, the instruction, the sample counts and the stall reasons.

    python -m fsattn_diffusers.measure.ncu_stalls ncu_sass_h200.csv [--columns OUT.csv]
"""

import argparse
import collections
import csv
import re
import sys

CLAMP = "12582912"  # Stage-A's clamp constant (1.5 * 2^23, kernels.common.RNE_MAGIC) as ncu prints it


def number(text: str) -> float:
    text = text.replace(",", "").strip()
    try:
        return float(text)
    except ValueError:
        return 0.0


def opcode(source: str) -> str:
    m = re.match(r"\s*(@!?U?P\w+\s+)?([A-Z0-9_]+(?:\.[A-Z0-9_]+)?)", source)
    op = m.group(2) if m else source.strip()[:12]
    if op.startswith("WARPGROUP.DEPBAR"):
        return "WARPGROUP.DEPBAR " + source.split()[-1]
    if op == "FMNMX":
        return "FMNMX (Stage-A clamp)" if CLAMP in source else "FMNMX (row max, gate)"
    return op


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--columns", help="write the reduced CSV here")
    ap.add_argument("--top", type=int, default=20)
    args = ap.parse_args(argv)
    rows = list(csv.reader(open(args.csv, newline="")))
    start = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    hdr, data = rows[start], [r for r in rows[start + 1:] if len(r) == len(rows[start])]
    i_src, i_all = hdr.index("Source"), hdr.index("Warp Stall Sampling (All Samples)")
    reasons = [i for i, h in enumerate(hdr) if h.startswith("stall_") and "Not Issued" not in h]
    total = sum(number(r[i_all]) for r in data)
    if total == 0:
        print(f"{args.csv}: no warp-stall samples", file=sys.stderr)
        return 1
    per_op, per_reason = collections.Counter(), collections.Counter()
    op_reasons = collections.defaultdict(collections.Counter)
    count = collections.Counter()
    for r in data:
        op = opcode(r[i_src])
        per_op[op] += number(r[i_all])
        count[op] += 1
        for i in reasons:
            per_reason[hdr[i]] += number(r[i])
            op_reasons[op][hdr[i][len("stall_"):]] += number(r[i])
    print(f"{int(total)} warp-stall samples over {len(data)} SASS instructions ({args.csv})\n")
    print("| opcode | instructions | share of samples | top stall reasons (share of the opcode's samples) |")
    print("| --- | --- | --- | --- |")
    for op, s in per_op.most_common(args.top):
        top = ", ".join(f"{n} {v / s:.0%}" for n, v in op_reasons[op].most_common(3) if v > 0) if s else ""
        print(f"| {op} | {count[op]} | {s / total:.1%} | {top} |")
    print("\n| stall reason | share of samples |\n| --- | --- |")
    for name, s in per_reason.most_common():
        if s > 0:
            print(f"| {name[len('stall_'):]} | {s / total:.1%} |")
    if args.columns:
        keep = [hdr.index("Address"), i_src, i_all, hdr.index("Warp Stall Sampling (Not-issued Samples)"),
                hdr.index("Instructions Executed")] + reasons
        with open(args.columns, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow([hdr[i] for i in keep])
            for r in data:
                w.writerow([r[i] for i in keep])
    return 0


if __name__ == "__main__":
    sys.exit(main())

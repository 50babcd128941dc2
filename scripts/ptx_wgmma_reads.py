"""Instructions that read the accumulator registers of a wgmma still in flight, in a PTX file.

ptxas serializes every wgmma of a function (warning C7514) when a non-wgmma instruction reads accumulator registers
of a wgmma between its issue and the `wgmma.wait_group` that retires it. This walks the PTX in file order, and each
loop once more from its header to its back branch (so a wgmma left in flight across the back edge is followed into the
next iteration), tracking committed groups and `wait_group N`; it prints every other instruction that reads a
register of a group still pending. Branches inside a loop body are walked in layout order, not per path.

    python3 scripts/ptx_wgmma_reads.py KERNEL.ptx     (e.g. from `python -m fsattn_diffusers.measure.kernel_sass --out`)
"""

import re
import sys

REG = re.compile(r"%r\d+")


def walk(lines, order, inflight, pending, report):
    for i in order:
        line = lines[i].strip()
        if not line or line.startswith(("//", ".loc", "$L")):
            continue
        if "wgmma.mma_async" in line:
            pending |= set(REG.findall(line.split("}")[0]))
        elif "wgmma.commit_group" in line:
            inflight.append(set(pending))
            pending.clear()
        elif "wgmma.wait_group" in line:
            n = int(re.search(r"wait_group\.sync\.aligned (\d+)", line).group(1))
            del inflight[:max(0, len(inflight) - n)]
        elif "wgmma" not in line:
            live = set().union(*inflight) if inflight else set()
            hit = set(REG.findall(line)) & live
            if hit:
                report.append((i + 1, line[:100], sorted(hit)[:3]))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__.split("\n\n")[-1].strip(), file=sys.stderr)
        return 2
    lines = open(argv[0]).read().splitlines()
    report = []
    walk(lines, range(len(lines)), [], set(), report)
    for h, text in enumerate(lines):
        if "Loop Header" not in text:
            continue
        label = text.split(":")[0]
        back = [i for i, t in enumerate(lines) if re.search(r"bra(\.uni)?\s+" + re.escape(label) + ";", t)]
        header_no = label.split("_")[-1]
        members = [i for i, t in enumerate(lines) if f"Header=BB0_{header_no} " in t + " " or i == h]
        if not back:
            continue
        lo, hi = min(members + [h]), max(back)
        order = [i for i in range(h, hi + 1)] + [i for i in range(lo, h)]
        inflight, pending = [], set()
        walk(lines, order, inflight, pending, [])  # first pass: the state at the back edge
        walk(lines, order, inflight, pending, report)
    for line_no, text, regs in report:
        print(f"line {line_no}: {text}  (in flight: {', '.join(regs)})")
    print(f"{len(report)} reads of in-flight accumulator registers")
    return 1 if report else 0


if __name__ == "__main__":
    sys.exit(main())

"""Per-tile SASS instruction counts of the attention kernel's steady-state loop, compiled offline for sm_90.

The loop body is the span [target, BRA] of the backward branch that encloses the most QGMMA
instructions; counts are per thread (warp-instruction issue slots) per 128x128 key tile, including the
rare rollback branch's code (listed separately: the instructions between the gate's predicated branch and
its target, found as the span holding MUFU.EX2). Usage:
  PYTHONPATH=$PWD python scripts/kernel_sass_loop.py [OUTDIR] [variant ...]
"""
import collections
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from kernel_sass import BIN, compile_variant  # noqa: E402

VARIANTS = {
    "fp8": {},
    "fp8_fast": dict(FAST=True),
    "fp8_fast_perm": dict(FAST=True, PERM=True),
    "mxfp6P": dict(P_MX=True, SIGMA=3.0),
    "mxfp6P_fast": dict(P_MX=True, SIGMA=3.0, FAST=True),
    "mxfp6P_fast_perm": dict(P_MX=True, SIGMA=3.0, FAST=True, PERM=True),
}
LINE = re.compile(r"^\s+/\*([0-9a-f]+)\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)([^;]*);", re.M)


def loop_counts(sass):
    ins = [(int(a, 16), pred or "", op, rest) for a, pred, op, rest in LINE.findall(sass)]
    best = None
    for i, (addr, pred, op, rest) in enumerate(ins):
        if op.startswith("BRA"):
            m = re.search(r"0x([0-9a-f]+)", rest)
            if m and int(m.group(1), 16) < addr:
                tgt = int(m.group(1), 16)
                body = [x for x in ins if tgt <= x[0] <= addr]
                n = sum(1 for x in body if x[2].startswith(("QGMMA", "HGMMA")))
                if best is None or n > best[0] or (n == best[0] and len(body) > len(best[1])):
                    best = (n, body)
    body = best[1]
    # rare branch: a forward predicated BRA whose span contains MUFU.EX2
    rare = []
    for i, (addr, pred, op, rest) in enumerate(body):
        if op.startswith("BRA") and pred:
            m = re.search(r"0x([0-9a-f]+)", rest)
            if m and int(m.group(1), 16) > addr:
                span = [x for x in body if addr < x[0] < int(m.group(1), 16)]
                if any(x[2].startswith("MUFU") for x in span) and len(span) > len(rare):
                    rare = span
    c = collections.Counter(x[2].split(".")[0] for x in body)
    r = collections.Counter(x[2].split(".")[0] for x in rare)
    return c, r


def main():
    out = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1] in VARIANTS else None
    names = [a for a in sys.argv[1:] if a in VARIANTS] or list(VARIANTS)
    keys = ["QGMMA", "FFMA", "FMUL", "FADD", "FMNMX", "HMUL2", "HADD2", "HMNMX2", "F2FP", "F2F", "I2F", "SHF",
            "IMAD", "LOP3", "IADD3", "PRMT", "SHFL", "SEL", "FSEL", "BAR", "LDS", "STS", "MUFU", "LDL", "STL"]
    print("variant regs total steady rare | " + " ".join(keys))
    for name in names:
        k = compile_variant(**VARIANTS[name])
        cubin = f"/tmp/_loop_{name}.cubin"
        open(cubin, "wb").write(k.asm["cubin"])
        sass = subprocess.run([os.path.join(BIN, "cuobjdump"), "-sass", cubin], capture_output=True, text=True).stdout
        if out:
            open(os.path.join(out, f"{name}.sass"), "w").write(sass)
            open(os.path.join(out, f"{name}.ptx"), "w").write(k.asm["ptx"])
            open(os.path.join(out, f"{name}.ttgir"), "w").write(k.asm["ttgir"])
        c, r = loop_counts(sass)
        tot, rare = sum(c.values()), sum(r.values())
        ptxas = subprocess.run([os.path.join(BIN, "ptxas"), "-arch=sm_90a", "-v", "-o", "/dev/null", "-"],
                               input=k.asm["ptx"], capture_output=True, text=True).stderr
        regs = ",".join(re.findall(r"Used (\d+) registers", ptxas)) + "/spill" + ",".join(
            re.findall(r"(\d+) bytes spill stores", ptxas))
        cnt = " ".join(f"{x}={c.get(x, 0) - r.get(x, 0)}" for x in keys)
        print(f"{name} {regs} {tot} {tot - rare} {rare} | " + cnt,
              flush=True)


if __name__ == "__main__":
    main()

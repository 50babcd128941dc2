"""Offline Hopper compile report of the attention kernels (no GPU; the kernels, their compute capability and ptxas
target come from the registration of :data:`~fsattn_diffusers.measure.KERNEL_BACKEND`: its kernel package and device
rule, :data:`HOPPER`): registers, spills, shared memory, and SASS instruction counts of the steady-state key loop per
thread and 128-key tile, for the Triton kernel (the package's ``fused_attention``), the Gluon ping-pong kernel
(``fused_attention_gluon_pingpong``) and the INT8 Q/K kernel (``fused_attention_gluon_int8``).

    python -m fsattn_diffusers.measure.kernel_sass [--out DIR] [--only NAME,...] [--list]

Needs triton (3.6: ptxas and cuobjdump come in its wheel); no GPU. tests/test_kernel_compile.py compiles every
configuration and checks it fits the register file without spills. The loop is the backward branch enclosing the most
QGMMAs (one per partition in the Gluon kernel: both warpgroups' loops are listed, at their SASS address); "rare" is the
largest forward-predicated span inside it holding MUFU (the gate's rollback), left out of the per-op counts
("steady" = loop - rare). Out-of-line mbarrier retry blocks lie outside the loop's address range and are not counted. --out writes NAME.{sass,ptx,ttgir} for each configuration.
"""

from __future__ import annotations

import argparse
import collections
import inspect
import os
import re
import subprocess
import sys
import tempfile
from typing import Optional

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from fsattn_diffusers.backends import registered
from fsattn_diffusers.measure import KERNEL_BACKEND
from fsattn_diffusers.recipe import get_recipe
from fsattn_diffusers.sm90_numerics import I2F_MAGIC

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
#: The registered backend whose kernels are compiled here (its kernel package: ``KERNELS.kernel(module)``).
KERNELS = registered()[KERNEL_BACKEND]
ops = KERNELS.kernel("ops")
plan_for = KERNELS.kernel("plan").plan_for
#: The Hopper kernels' device rule (:class:`fsattn_diffusers.backends.CudaCapability`): what they are compiled for.
HOPPER = KERNELS.available
PTXAS_ARCH = HOPPER.ptxas_arch
TARGET = GPUTarget("cuda", 10 * HOPPER.capabilities[0][0] + HOPPER.capabilities[0][1], 32)
# Argument types by name (both kernels); pointers and padded lengths/strides get a real launch's divisibility by 16.
TYPES = {"Q8": "*fp8e4nv", "K8": "*fp8e4nv", "V8T": "*fp8e4nv", "QE": "*i32", "KE": "*i32", "VS": "*fp32",
         "BIAS": "*fp32", "KG": "*i32", "TSEL": "*i32",
         "OUT": "*bf16", "LSE": "*fp32", "STATS": "*i32", "FLAGS": "*i32", "KVL": "*i32",
         "NKW": "i32", "sob": "i32", "soh": "i32", "sos": "i32", "sod": "i32", "H": "i32", "SQ": "i32", "SK": "i32",
         "SQP": "i32", "SKP": "i32"}
DIV16 = ("SQP", "SKP", "sob", "soh", "sos")
KEYS = ["QGMMA", "WARPGROUP", "FFMA", "FMUL", "FADD", "FMNMX", "HMUL2", "HADD2", "HMNMX2", "F2FP", "SHF", "IMAD",
        "LOP3", "PRMT", "SHFL", "SEL", "BAR", "SYNCS", "LDS", "STS", "MUFU", "UTMALDG", "LDL", "STL"]
LINE = re.compile(r"^\s+/\*([0-9a-f]+)\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)([^;]*);", re.M)


def _signature(fn, types: dict, const: dict):
    """(signature, constexprs, attrs) for ``fn`` from its parameter list: constexprs from ``const`` or their defaults."""
    params = inspect.signature(fn.fn).parameters
    sig, constexprs, attrs = {}, {}, {}
    for i, (name, p) in enumerate(params.items()):
        if "constexpr" in str(p.annotation):
            if name not in const and p.default is inspect.Parameter.empty:
                raise KeyError(f"{fn.__name__}: constexpr {name} has no value here; add it to the configuration")
            sig[name], constexprs[name] = "constexpr", const.get(name, p.default)
        elif name in types:
            sig[name] = types[name]
            if types[name].startswith("*") or name in DIV16:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            raise KeyError(f"{fn.__name__}: no type for argument {name}; add it to TYPES")
    unknown = set(const) - set(params)
    if unknown:
        raise KeyError(f"{fn.__name__} has no parameters {sorted(unknown)}")
    return sig, constexprs, attrs


def _recipe_constants(recipe: str) -> dict:
    plan = plan_for(get_recipe(recipe))
    return dict(GATE=plan.gate, CAP=float(plan.gate_cap), SIGMA=float(plan.p_sigma), P_MX=plan.p_mxfp6,
                FLOOR=float(plan.gate_floor), LOWER=plan.lowers)


def _triton_constants(recipe: str) -> dict:
    plan = plan_for(get_recipe(recipe))
    extra = dict(H15=True, H15_EXP=127 + plan.p_sigma) if plan.h15 else {}
    return dict(_recipe_constants(recipe), DIAGONAL=plan.diagonal, **extra)


def compile_triton(recipe="mxfp8", d=128, num_warps=ops.NUM_WARPS, stages=ops.NUM_STAGES, **const):
    fsattn_fwd_kernel = KERNELS.kernel("fused_attention").fsattn_fwd_kernel
    c = dict(D=d, BM=ops.BLOCK_M, BN=ops.BLOCK_N, HAS_KVL=False, WRITE_LSE=False, NUM_STAGES=stages, RNE_CVT=False,
             **_triton_constants(recipe))
    c.update(const)
    sig, constexprs, attrs = _signature(fsattn_fwd_kernel, TYPES, c)
    src = ASTSource(fn=fsattn_fwd_kernel, signature=sig, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=TARGET, options={"num_warps": num_warps, "num_stages": stages})


def compile_gluon(recipe="mxfp8", d=128, stages=ops.PP_STAGES, **const):
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    pp = KERNELS.kernel("fused_attention_gluon_pingpong")
    def desc(rows, cols):
        layout = gl.NVMMASharedLayout.get_default_for([rows, cols], gl.float8e4nv)
        return f"tensordesc<fp8e4nv[{rows}, {cols}],{layout!r}>"

    bn = ops.BLOCK_N
    ones = desc(pp.ONES_N.value, bn)
    term = const.get("KEY_TERM", False)  # the key term's chained wgmma operands (else ones_desc, unread)
    types = dict(TYPES, q_desc=desc(pp.WG_ROWS.value, d), k_desc=desc(bn, d), v_desc=desc(d, bn), ones_desc=ones,
                 qx_desc=desc(pp.WG_ROWS.value, pp.KEY_TERM_COLS.value) if term else ones,
                 kx_desc=desc(bn, pp.KEY_TERM_COLS.value) if term else ones)
    rc = _recipe_constants(recipe)
    plan = plan_for(get_recipe(recipe))
    c = dict(D=d, BN=bn, HAS_KVL=False, WRITE_LSE=False, CAP=rc["CAP"], SIGMA=rc["SIGMA"], STAGES=stages,
             REGS=ops.PP_WORKER_REGS, FLOOR=plan.lowering_floor, DIAGONAL=plan.diagonal)
    c.update(const)
    sig, constexprs, attrs = _signature(pp.fsattn_fwd_gluon_pingpong_kernel, types, c)
    src = GluonASTSource(fn=pp.fsattn_fwd_gluon_pingpong_kernel, signature=sig, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=TARGET, options={"num_warps": 4})


def compile_gluon_int8(d=128, stages=None, recipe="int8-bf16", **const):
    """The INT8 Q/K kernel (the package's ``fused_attention_gluon_int8``) with ``recipe``'s settings."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    k8, ops_int8 = KERNELS.kernel("fused_attention_gluon_int8"), KERNELS.kernel("ops_int8")
    def desc(rows, cols, dtype, name):
        return f"tensordesc<{name}[{rows}, {cols}],{gl.NVMMASharedLayout.get_default_for([rows, cols], dtype)!r}>"

    bn = ops.BLOCK_N
    launch = ops_int8.launch_args(get_recipe(recipe))
    if launch["pv_fp8"]:  # V8T (D, BN) and the ones tile in E4M3
        v_desc, ones_desc = desc(d, bn, gl.float8e4nv, "fp8e4nv"), desc(8, bn, gl.float8e4nv, "fp8e4nv")
    else:
        v_desc, ones_desc = desc(bn, d, gl.bfloat16, "bf16"), desc(8, bn, gl.bfloat16, "bf16")
    types = dict(TYPES, q_desc=desc(k8.WG_ROWS.value, d, gl.int8, "i8"), k_desc=desc(bn, d, gl.int8, "i8"),
                 v_desc=v_desc, ones_desc=ones_desc, QS="*fp32", KS="*fp32",
                 b_desc=f"tensordesc<fp32[{bn}],{gl.NVMMASharedLayout.get_default_for([bn], gl.float32)!r}>")
    regs = ops_int8.INT8_TERM_WORKER_REGS if const.get("HAS_BIAS") else ops_int8.INT8_WORKER_REGS
    c = dict(D=d, BN=bn, HAS_KVL=False, WRITE_LSE=False, STAGES=stages or ops_int8.INT8_STAGES, REGS=regs, **launch)
    c = {k.upper(): v for k, v in dict(c, **const).items()}  # launch_args' names are the constexprs' in lower case
    sig, constexprs, attrs = _signature(k8.fsattn_fwd_gluon_int8_kernel, types, c)
    src = GluonASTSource(fn=k8.fsattn_fwd_gluon_int8_kernel, signature=sig, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=TARGET, options={"num_warps": 4})


#: Configurations whose spills (ptxas's spill-store bytes) must lie outside the key loops (52 B before the loop of the
#: speed tier's key-term launch).
SPILLS_OUTSIDE_LOOPS = ("gluon_int8_fp8_smooth_q_sel",)
CONFIGS = {  # name: (compile function, keyword arguments)
    "triton_mxfp8": (compile_triton, {}),
    "triton_mxfp8_paper": (compile_triton, dict(recipe="mxfp8-paper")),
    "triton_mxfp8_d64": (compile_triton, dict(d=64)),
    "triton_mxfp6": (compile_triton, dict(recipe="mxfp6")),
    "triton_mxfp8_nogate": (compile_triton, dict(GATE=False)),
    "triton_mxfp8_rowmax_h15": (compile_triton, dict(recipe="mxfp8+exponential=rowmax_h15")),
    "gluon_pingpong": (compile_gluon, {}),
    "gluon_pingpong_paper": (compile_gluon, dict(recipe="mxfp8-paper")),
    "gluon_pingpong_d64": (compile_gluon, dict(d=64)),
    "gluon_pingpong_st3": (compile_gluon, dict(stages=3)),
    # O's fp32 promotion every 2 key tiles, and never (O chained in the wgmma accumulator: Recipe.o_promotion_tiles)
    "gluon_pingpong_promote2": (compile_gluon, dict(O_PROMOTE=2)),
    "gluon_pingpong_chained": (compile_gluon, dict(O_PROMOTE=0)),
    "gluon_pingpong_lse_kvl": (compile_gluon, dict(WRITE_LSE=True, HAS_KVL=True)),
    "gluon_pingpong_smooth_q": (compile_gluon, dict(recipe="mxfp8+smooth_q+smooth_q_min_ratio=0", KEY_TERM=True)),
    "gluon_pingpong_smooth_q_sel": (compile_gluon, dict(recipe="mxfp8", KEY_TERM=True, TERM_SEL=True)),
    "gluon_pingpong_smooth_q_sel_off": (compile_gluon, dict(recipe="mxfp8", KEY_TERM=False, TERM_SEL=True)),
    "gluon_pingpong_mxfp6": (compile_gluon, dict(recipe="mxfp6", P_MX=True)),
    "gluon_pingpong_mxfp6_d64": (compile_gluon, dict(recipe="mxfp6", P_MX=True, d=64)),
    "gluon_pingpong_mxfp6_smooth_q": (compile_gluon, dict(recipe="mxfp6+smooth_q+smooth_q_min_ratio=0", P_MX=True,
                                                          KEY_TERM=True)),
    "triton_mxfp8_smooth_q": (compile_triton, dict(recipe="mxfp8+smooth_q+smooth_q_min_ratio=0", HAS_BIAS=True)),
    "gluon_int8": (compile_gluon_int8, {}),
    "gluon_int8_d64_lse_kvl": (compile_gluon_int8, dict(d=64, WRITE_LSE=True, HAS_KVL=True)),
    "gluon_int8_exact": (compile_gluon_int8, dict(recipe="int8-bf16+exponential=exact")),
    # Q smoothing's key term (the per-key terms loaded one per thread, then moved to the scores' columns)
    "gluon_int8_smooth_q": (compile_gluon_int8, dict(HAS_BIAS=True)),
    "gluon_int8_exact_smooth_q": (compile_gluon_int8, dict(recipe="int8-bf16+exponential=exact", HAS_BIAS=True)),
    # the per-slice switch: one launch per setting, the other slices' programs returning at once
    "gluon_int8_smooth_q_sel": (compile_gluon_int8, dict(HAS_BIAS=True, TERM_SEL=True)),
    "gluon_int8_smooth_q_sel_off": (compile_gluon_int8, dict(HAS_BIAS=False, TERM_SEL=True)),
    "gluon_int8_exact_smooth_q_sel": (compile_gluon_int8, dict(recipe="int8-bf16+exponential=exact", HAS_BIAS=True,
                                                              TERM_SEL=True)),
    "gluon_int8_exact_smooth_q_sel_off": (compile_gluon_int8, dict(recipe="int8-bf16+exponential=exact",
                                                                  HAS_BIAS=False, TERM_SEL=True)),
    # the speed tier (int8-fp8): FP8 P and V, O and l summed in fp32 per key tile
    "gluon_int8_fp8": (compile_gluon_int8, dict(recipe="int8-fp8")),
    "gluon_int8_fp8_d64_lse_kvl": (compile_gluon_int8, dict(recipe="int8-fp8", d=64, WRITE_LSE=True, HAS_KVL=True)),
    "gluon_int8_fp8_smooth_q_sel": (compile_gluon_int8, dict(recipe="int8-fp8", HAS_BIAS=True, TERM_SEL=True)),
    "gluon_int8_fp8_smooth_q_sel_off": (compile_gluon_int8, dict(recipe="int8-fp8", HAS_BIAS=False, TERM_SEL=True)),
}


def _branch_target(rest):
    m = re.search(r"0x([0-9a-f]+)", rest)
    return int(m.group(1), 16) if m else None


def loops(sass: str):
    """[(start, op counts of the loop body, op counts of its rare branch)] per key loop: see the module docstring."""
    ins = [(int(a, 16), pred or "", op, rest) for a, pred, op, rest in LINE.findall(sass)]
    count = lambda xs: collections.Counter(x[2].split(".")[0] for x in xs)  # noqa: E731
    found = []
    for addr, pred, op, rest in ins:
        tgt = _branch_target(rest) if op.startswith("BRA") and pred else None
        if tgt is None or tgt >= addr:
            continue
        body = [x for x in ins if tgt <= x[0] <= addr]
        if not any(x[2].startswith(("QGMMA", "HGMMA", "IGMMA")) for x in body):
            continue
        rare = []
        for a, p, o, r in body:
            t = _branch_target(r) if o.startswith("BRA") and p else None
            if t is not None and a < t <= addr:
                span = [x for x in body if a < x[0] < t]
                if any(x[2].startswith("MUFU") for x in span) and len(span) > len(rare):
                    rare = span
        found.append((tgt, count(body), count(rare)))
    # an enclosing loop (e.g. over the tiles of a persistent program) would repeat its inner loop's counts
    return [f for f in found if not any(g is not f and g[0] > f[0] and sum(g[1].values()) < sum(f[1].values())
                                        and f[1]["QGMMA"] > g[1]["QGMMA"] for g in found)] or found


def local_memory_in_loops(sass: str) -> int:
    """STL/LDL instructions (register spills) inside the key loops of :func:`loops`."""
    return sum(body["STL"] + body["LDL"] for _, body, _ in loops(sass))


def stage_a_rounded_products(sass: str) -> tuple:
    """``(n, total)``: of the ``total`` Stage-A results in ``sass`` (MUFU.EX2 inputs and clamps at 1.5 2^23, FMNMX with
    it), the ``n`` formed as an FADD of an FMUL's result, i.e. a product rounded before its addition where the
    reference models one FMA (sm90_numerics difference 14). Each operand's definition is the nearest earlier write
    of its register in the listing (straight-line reading: enough for these unrolled tiles)."""
    ins = [(op, rest) for _, _, op, rest in LINE.findall(sass)]

    def written(op, rest):  # the registers an instruction writes: a .64 / .128 load writes 2 / 4 from the first
        m = re.match(r"\s*R(\d+)\b", rest)
        if m is None or op.startswith("ST"):
            return ()
        width = (4 if ".128" in op else 2 if ".64" in op else 1) if op.startswith("LD") else 1
        return tuple(f"R{int(m.group(1)) + w}" for w in range(width))

    dest = [written(op, rest) for op, rest in ins]

    def sources(i):
        return re.findall(r"R\d+", ins[i][1].split(",", 1)[1]) if "," in ins[i][1] else []

    def definition(i, reg):
        return next((j for j in range(i - 1, -1, -1) if reg in dest[j]), None)

    clamp = str(int(I2F_MAGIC))  # 1.5 2^23 as cuobjdump prints it
    n = total = 0
    for i, (op, rest) in enumerate(ins):
        if not (op.startswith("MUFU.EX2") or (op.startswith("FMNMX") and clamp in rest)):
            continue
        total += 1
        j = definition(i, (sources(i) or [None])[0])
        if j is not None and ins[j][0].startswith("FADD") and any(
                (k := definition(j, r)) is not None and ins[k][0].startswith("FMUL") for r in sources(j)):
            n += 1
    return n, total


def ptxas_info(kernel) -> str:
    """ptxas's ``-v`` report (stderr) on a compiled kernel's PTX."""
    return subprocess.run([os.path.join(BIN, "ptxas"), f"-arch={PTXAS_ARCH}", "-v", "-o", os.devnull, "-"],
                          input=kernel.asm["ptx"], capture_output=True, text=True).stderr


def register_use(kernel, info: Optional[str] = None):
    """ptxas's (registers per thread, spill-store bytes) of a compiled kernel, one entry per function it reports
    (``info``: its :func:`ptxas_info`, when already taken)."""
    ptxas = ptxas_info(kernel) if info is None else info
    return ([int(x) for x in re.findall(r"Used (\d+) registers", ptxas)],
            [int(x) for x in re.findall(r"(\d+) bytes spill stores", ptxas)])


#: ptxas's note that it serializes the wgmma instructions (non-wgmma instructions define a wgmma's input registers
#: inside its pipeline stage): every GEMM then waits for the one before it.
SERIALIZED_WGMMA = "C7513"


#: Configurations that ptxas serializes, knowingly: O's promotion every 2 key tiles makes P's words before the PV
#: wait (else its loop-carried accumulator spills 688 B), and runs slower than promoting every tile (docs/design.md,
#: "The FP8 tensor cores' accumulation").
SERIALIZED_WGMMA_KNOWN = ("gluon_pingpong_promote2",)


def serialized_wgmma(kernel, info: Optional[str] = None) -> bool:
    """True when ptxas serializes the kernel's wgmma instructions (:data:`SERIALIZED_WGMMA`; ``info`` as for
    :func:`register_use`)."""
    return SERIALIZED_WGMMA in (ptxas_info(kernel) if info is None else info)


def sass_text(kernel) -> str:
    """cuobjdump's SASS listing of a compiled kernel."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        return subprocess.run([os.path.join(BIN, "cuobjdump"), "-sass", f.name], capture_output=True, text=True,
                              check=True).stdout


def report(name: str, kernel, out=None) -> list:
    sass = sass_text(kernel)
    regs, spills = register_use(kernel)
    if out:
        os.makedirs(out, exist_ok=True)
        for ext, text in (("sass", sass), ("ptx", kernel.asm["ptx"]), ("ttgir", kernel.asm["ttgir"])):
            with open(os.path.join(out, f"{name}.{ext}"), "w") as fh:
                fh.write(text)
    regs, spills = ",".join(map(str, regs)), ",".join(map(str, spills))
    rows = []
    for start, loop, rare in loops(sass):
        total, n_rare = sum(loop.values()), sum(rare.values())
        counts = " | ".join(str(loop.get(k, 0) - rare.get(k, 0)) for k in KEYS)
        rows.append(f"| {name} | {start:#x} | {regs} | {spills} | {kernel.metadata.shared} | {total} | {total - n_rare} "
                    f"| {n_rare} | {counts} |")
    return rows or [f"| {name} | no key loop found | {regs} | {spills} | {kernel.metadata.shared} |"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="write NAME.sass / .ptx / .ttgir here")
    ap.add_argument("--only", default=None, help=f"comma list of configurations (default all: {', '.join(CONFIGS)})")
    ap.add_argument("--list", action="store_true", help="print the configurations and exit")
    a = ap.parse_args(argv)
    if a.list:
        print("\n".join(f"{n}: {fn.__name__}({kw})" for n, (fn, kw) in CONFIGS.items()))
        return 0
    names = a.only.split(",") if a.only else list(CONFIGS)
    bad = [n for n in names if n not in CONFIGS]
    if bad:
        print(f"kernel_sass: unknown configuration {', '.join(bad)}; accepted: {', '.join(CONFIGS)}", file=sys.stderr)
        return 2
    print(f"{PTXAS_ARCH}, triton {triton.__version__}; loop counts per thread and key tile, steady = loop - rare")
    print("| config | loop at | regs | spill bytes | shared | loop | steady | rare | " + " | ".join(KEYS) + " |")
    print("| --- " * (8 + len(KEYS)) + "|")
    failed = 0
    for name in names:
        fn, kw = CONFIGS[name]
        try:
            print("\n".join(report(name, fn(**kw), a.out)), flush=True)
        except Exception as exc:  # noqa: BLE001 - one configuration's failure must not hide the others
            failed += 1
            print(f"| {name} | FAILED: {type(exc).__name__}: {str(exc)[:300]} |", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Compile the Gluon attention kernel (kernels/fused_attention_gluon.py) for sm_90a offline (no GPU) and report
registers, spills, shared memory and SASS op counts, like scripts/kernel_sass.py.

Usage: PYTHONPATH=$PWD python scripts/kernel_sass_gluon.py [OUTDIR]
"""
import collections, os, re, subprocess, sys

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource

sys.path.insert(0, os.getcwd())
from fsattn_diffusers.backends.triton_backend import kernels_package  # noqa: E402

kernels_package()
from fsattn_diffusers.kernels.fused_attention_gluon import fsattn_fwd_gluon_kernel  # noqa: E402

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def desc(block):
    layout = gl.NVMMASharedLayout.get_default_for(block, gl.float8e4nv)
    return f"tensordesc<fp8e4nv[{block[0]}, {block[1]}],{layout!r}>"


def compile_gluon(d=128, bm=128, bn=128, stages=3, num_warps=8, **const):
    sig = {"q_desc": desc([bm, d]), "k_desc": desc([bn, d]), "v_desc": desc([d, bn]), "QE": "*i32", "KE": "*i32",
           "VS": "*fp32", "OUT": "*bf16", "LSE": "*fp32", "STATS": "*i32", "KVL": "*i32", "sob": "i32",
           "soh": "i32", "sos": "i32", "sod": "i32", "H": "i32", "SQ": "i32", "SK": "i32", "SQP": "i32", "SKP": "i32"}
    c = dict(D=d, BM=bm, BN=bn, HAS_KVL=False, WRITE_LSE=False, CAP=4.0, SIGMA=4.0, STAGES=stages, PERM=True,
             num_warps=num_warps)
    c.update(const)
    sig.update({k: "constexpr" for k in c})
    names = list(sig)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in ("QE", "KE", "VS", "OUT", "LSE", "STATS", "KVL",
                                                                   "SQP", "SKP", "sob", "soh", "sos")}
    src = GluonASTSource(fn=fsattn_fwd_gluon_kernel, signature=sig, constexprs=c, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})


def report(k, out=None, tag="g"):
    cubin = "/tmp/_g.cubin"
    open(cubin, "wb").write(k.asm["cubin"])
    sass = subprocess.run([os.path.join(BIN, "cuobjdump"), "-sass", cubin], capture_output=True, text=True).stdout
    ops = collections.Counter(re.findall(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", sass, re.M))
    base = collections.Counter()
    for op, n in ops.items():
        base[op.split(".")[0]] += n
    ptxas = subprocess.run([os.path.join(BIN, "ptxas"), "-arch=sm_90a", "-v", "-o", "/dev/null", "-"],
                           input=k.asm["ptx"], capture_output=True, text=True).stderr
    if out:
        os.makedirs(out, exist_ok=True)
        open(os.path.join(out, f"{tag}.sass"), "w").write(sass)
        open(os.path.join(out, f"{tag}.ttgir"), "w").write(k.asm["ttgir"])
        open(os.path.join(out, f"{tag}.ptx"), "w").write(k.asm["ptx"])
    keys = ["QGMMA", "WARPGROUP", "FFMA", "FMUL", "FADD", "FMNMX", "SHF", "F2FP", "PRMT", "SHFL", "BAR", "SYNCS",
            "UTMALDG", "LDL", "STL"]
    return (re.findall(r"Used (\d+) registers", ptxas), re.findall(r"(\d+) bytes spill stores", ptxas),
            {k_: base.get(k_, 0) for k_ in keys}, k.metadata.shared)


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else None
    for tag, kw in {"gluon_d128": {}, "gluon_d64": dict(d=64), "gluon_lse_kvl": dict(WRITE_LSE=True, HAS_KVL=True),
                    "gluon_st2": dict(stages=2), "gluon_noperm": dict(PERM=False)}.items():
        try:
            print(tag, *report(compile_gluon(**kw), out, tag), flush=True)
        except Exception as e:  # noqa
            print(tag, "FAILED", repr(e)[:1500], flush=True)

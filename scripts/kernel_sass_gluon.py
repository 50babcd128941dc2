"""Compile the Gluon attention kernel (kernels/fused_attention_gluon.py) for sm_90a offline (no GPU) and report
registers, spills, shared memory and SASS op counts, like scripts/kernel_sass.py.

Usage: PYTHONPATH=$PWD python scripts/kernel_sass_gluon.py [OUTDIR]
"""
import os, sys

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource

sys.path.insert(0, os.getcwd())
from fsattn_diffusers.backends.triton_backend import kernels_package  # noqa: E402

kernels_package()
from fsattn_diffusers.kernels.fused_attention_gluon import fsattn_fwd_gluon_kernel  # noqa: E402
from fsattn_diffusers.kernels.fused_attention_gluon_pp import fsattn_fwd_gluon_pp_kernel  # noqa: E402
from fsattn_diffusers.kernels.ops import PP_WORKER_REGS  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_sass import report  # noqa: E402  (registers, spills, op counts, shared memory)


def desc(block):
    layout = gl.NVMMASharedLayout.get_default_for(block, gl.float8e4nv)
    return f"tensordesc<fp8e4nv[{block[0]}, {block[1]}],{layout!r}>"


def compile_gluon(d=128, bm=128, bn=128, stages=3, num_warps=8, pp=False, **const):
    """``pp``: the gluonpp kernel (64-row Q blocks per warpgroup, launched with 4 warps + a 4-warp worker)."""
    if pp:
        bm, num_warps = 64, 4
    sig = {"q_desc": desc([bm, d]), "k_desc": desc([bn, d]), "v_desc": desc([d, bn]), "QE": "*i32", "KE": "*i32",
           "VS": "*fp32", "OUT": "*bf16", "LSE": "*fp32", "STATS": "*i32", "KVL": "*i32", "sob": "i32",
           "soh": "i32", "sos": "i32", "sod": "i32", "H": "i32", "SQ": "i32", "SK": "i32", "SQP": "i32", "SKP": "i32"}
    c = dict(D=d, BM=bm, BN=bn, HAS_KVL=False, WRITE_LSE=False, CAP=4.0, SIGMA=4.0, STAGES=stages, PERM=True,
             num_warps=num_warps)
    if pp:  # FLAGS and NKW follow STATS
        names = list(sig)
        at = names.index("STATS") + 1
        sig = dict(list(sig.items())[:at] + [("FLAGS", "*i32"), ("NKW", "i32")] + list(sig.items())[at:])
        items = list(sig.items())  # the tensor-core row sum's ones tile follows v_desc
        sig = dict(items[:3] + [("ones_desc", desc([8, bn]))] + items[3:])
        c = dict(D=d, BN=bn, HAS_KVL=False, WRITE_LSE=False, CAP=4.0, SIGMA=4.0, STAGES=stages, REGS=PP_WORKER_REGS)
    c.update(const)
    sig.update({k: "constexpr" for k in c})
    names = list(sig)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in ("QE", "KE", "VS", "OUT", "LSE", "STATS", "KVL",
                                                                   "SQP", "SKP", "sob", "soh", "sos")}
    src = GluonASTSource(fn=fsattn_fwd_gluon_pp_kernel if pp else fsattn_fwd_gluon_kernel, signature=sig,
                         constexprs=c, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})


KEYS = ["QGMMA", "WARPGROUP", "FFMA", "FMUL", "FADD", "FMNMX", "SHF", "F2FP", "PRMT", "SHFL", "BAR", "SYNCS", "UTMALDG",
        "LDL", "STL"]


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else None
    for tag, kw in {"gluon_d128": {}, "gluon_d64": dict(d=64), "gluon_lse_kvl": dict(WRITE_LSE=True, HAS_KVL=True),
                    "gluon_st2": dict(stages=2), "gluon_noperm": dict(PERM=False), "gluon_bm64_w4": dict(bm=64, num_warps=4),
                    "pp_d128": dict(pp=True), "pp_d64": dict(pp=True, d=64), "pp_st4": dict(pp=True, stages=4),
                    "pp_lse_kvl": dict(pp=True, WRITE_LSE=True, HAS_KVL=True)}.items():
        try:
            print(tag, *report(compile_gluon(**kw), out, tag, KEYS), flush=True)
        except Exception as e:  # noqa
            print(tag, "FAILED", repr(e)[:1500], flush=True)

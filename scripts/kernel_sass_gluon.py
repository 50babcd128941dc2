"""Compile the Gluon attention kernel (kernels/fused_attention_gluon_pp.py) for sm_90a offline (no GPU) and report
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
from fsattn_diffusers.kernels.fused_attention_gluon_pp import fsattn_fwd_gluon_pp_kernel  # noqa: E402
from fsattn_diffusers.kernels.ops import PP_WORKER_REGS  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_sass import report  # noqa: E402  (registers, spills, op counts, shared memory)


def desc(block):
    layout = gl.NVMMASharedLayout.get_default_for(block, gl.float8e4nv)
    return f"tensordesc<fp8e4nv[{block[0]}, {block[1]}],{layout!r}>"


def compile_gluon(d=128, bn=128, stages=4, **const):
    """The gluonpp kernel (64-row Q blocks per warpgroup, launched with 4 warps + a 4-warp worker)."""
    sig = {"q_desc": desc([64, d]), "k_desc": desc([bn, d]), "v_desc": desc([d, bn]), "ones_desc": desc([8, bn]),
           "QE": "*i32", "KE": "*i32", "VS": "*fp32", "OUT": "*bf16", "LSE": "*fp32", "STATS": "*i32",
           "FLAGS": "*i32", "NKW": "i32", "KVL": "*i32", "sob": "i32", "soh": "i32", "sos": "i32", "sod": "i32",
           "H": "i32", "SQ": "i32", "SK": "i32", "SQP": "i32", "SKP": "i32"}
    c = dict(D=d, BN=bn, HAS_KVL=False, WRITE_LSE=False, CAP=4.0, SIGMA=4.0, STAGES=stages, REGS=PP_WORKER_REGS)
    c.update(const)
    sig.update({k: "constexpr" for k in c})
    names = list(sig)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in ("QE", "KE", "VS", "OUT", "LSE", "STATS", "KVL",
                                                                   "SQP", "SKP", "sob", "soh", "sos")}
    src = GluonASTSource(fn=fsattn_fwd_gluon_pp_kernel, signature=sig, constexprs=c, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})


KEYS = ["QGMMA", "WARPGROUP", "FFMA", "FMUL", "FADD", "FMNMX", "SHF", "F2FP", "PRMT", "SHFL", "BAR", "SYNCS", "UTMALDG",
        "LDL", "STL"]


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else None
    for tag, kw in {"pp_d128": {}, "pp_d64": dict(d=64), "pp_st3": dict(stages=3),
                    "pp_lse_kvl": dict(WRITE_LSE=True, HAS_KVL=True)}.items():
        try:
            print(tag, *report(compile_gluon(**kw), out, tag, KEYS), flush=True)
        except Exception as e:  # noqa
            print(tag, "FAILED", repr(e)[:1500], flush=True)

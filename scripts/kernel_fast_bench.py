"""Time the attention kernel, classic vs fast (FSATTN_KERNEL_VARIANT=fast), at the paper and Wan2.2 shapes on
one CUDA GPU, in one process, next to SDPA-cuDNN; check fast against classic and exact attention.

Usage: PYTHONPATH=$PWD python scripts/kernel_fast_bench.py [--shapes paper,wan22] [--recipes mxfp8,mxfp6,mxfp4]
       [--json PATH]
Prints one line per (shape, recipe, variant) and a table last. Kernel ms = attention kernel on pre-computed
operands; "with pre-pass" adds the pre-pass time (what fsattn bench's headline includes).
"""
import argparse
import json
import math
import sys

import torch
import triton

sys.path.insert(0, ".")
from fsattn_diffusers.backends.triton_backend import kernels_package  # noqa: E402

kernels_package()
from fsattn_diffusers.kernels.ops import attention_from_operands, prepass  # noqa: E402
from fsattn_diffusers.kernels.plan import plan_for  # noqa: E402
from fsattn_diffusers.recipe import PRESETS  # noqa: E402

SHAPES = {"paper": (1, 24, 32768, 128), "wan22": (1, 40, 75600, 128), "wan21": (1, 12, 32760, 128),
          "tiny": (1, 2, 256, 128)}  # tiny: a dry run of this script (TRITON_INTERPRET=1 --device cpu)
DEV = "cuda"


def timed(fn, rep_ms):
    if DEV == "cpu":
        import time
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    return triton.testing.do_bench(fn, warmup=max(25, rep_ms // 10), rep=rep_ms, return_mode="median")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="paper,wan22")
    ap.add_argument("--recipes", default="mxfp8,mxfp6,mxfp4")
    ap.add_argument("--variants", default="classic,fast",
                    help="comma list of VARIANT[:BLOCKMxWARPSxSTAGES], e.g. classic,fast,fast:64x4x2")
    ap.add_argument("--json", default=None)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    global DEV
    DEV = args.device
    rows = []
    for sname in args.shapes.split(","):
        b, h, s, d = SHAPES[sname]
        g = torch.Generator(device=DEV).manual_seed(0)
        q, k, v = (torch.randn((b, h, s, d), generator=g, device=DEV, dtype=torch.bfloat16) for _ in range(3))
        scale = 1.0 / math.sqrt(d)
        flops = 4.0 * b * h * s * s * d
        rep = 1500 if s < 50000 else 3000
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION] if DEV == "cuda" else [SDPBackend.MATH]):
            cudnn_ms = timed(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v), rep)
        print(f"{sname}: sdpa-cudnn {cudnn_ms:.3f} ms ({flops / cudnn_ms * 1e-9:.0f} TFLOP/s)", flush=True)
        idx = torch.randperm(s, generator=torch.Generator().manual_seed(0))[:64].to(DEV)
        sc = torch.einsum("bhqd,bhkd->bhqk", q[:, :, idx].double(), k.double()) * scale
        ex = torch.softmax(sc, -1) @ v.double()
        del sc
        for rname in args.recipes.split(","):
            plan = plan_for(PRESETS[rname])
            outs = {}
            for spec in args.variants.split(","):
                var, _, cfg = spec.partition(":")  # e.g. fast:64x4x2 = block_m 64, 4 warps, 2 stages
                kw = dict(zip(("block_m", "num_warps", "num_stages"), map(int, cfg.split("x")))) if cfg else {}
                ops = prepass(q, k, v, plan, scale, None, variant=var)
                out = torch.full_like(q, float("nan"))
                st = torch.zeros((2,), dtype=torch.int32, device=DEV)
                attention_from_operands(ops, out, plan, s, s, None, None, st, variant=var, **kw)
                if DEV == "cuda":
                    torch.cuda.synchronize()
                nan = int(torch.isnan(out).sum())
                ker = timed(lambda: attention_from_operands(ops, out, plan, s, s, None, None, None, variant=var, **kw),
                            rep)
                pre = timed(lambda: prepass(q, k, v, plan, scale, None, variant=var), 300)
                o = out[:, :, idx].double()
                err = float((o - ex).norm() / ex.norm())
                cos = float(torch.nn.functional.cosine_similarity(o.flatten(), ex.flatten(), dim=0))
                vs = float((out.float() - outs["classic"].float()).norm() / outs["classic"].float().norm()) \
                    if "classic" in outs else 0.0
                outs[spec] = out
                r = dict(shape=sname, recipe=rname, variant=spec, kernel_ms=ker, prepass_ms=pre,
                         kernel_tflops=flops / ker * 1e-9, speedup_vs_cudnn=cudnn_ms / (ker + pre),
                         cudnn_ms=cudnn_ms, rel_err=err, cos=cos, rel_vs_classic=vs, nan=nan,
                         rollback_rows=int(st[0]), rollback_tiles=int(st[1]))
                rows.append(r)
                print(f"  {rname:6} {spec:12} kernel {ker:8.3f} ms ({r['kernel_tflops']:5.0f} TFLOP/s) pre-pass "
                      f"{pre:.3f} ms -> {r['speedup_vs_cudnn']:.3f}x cuDNN | err {err:.4f} cos {cos:.5f} "
                      f"vs-classic {vs:.2e} NaN {nan} rollbacks {r['rollback_rows']}", flush=True)
                del ops
            del outs
    if args.json:
        json.dump(rows, open(args.json, "w"), indent=1)
    print("\n| shape | recipe | variant | kernel ms | TFLOP/s | x cuDNN (with pre-pass) | cos | vs classic |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['shape']} | {r['recipe']} | {r['variant']} | {r['kernel_ms']:.3f} | {r['kernel_tflops']:.0f} | "
              f"{r['speedup_vs_cudnn']:.3f}x | {r['cos']:.5f} | {r['rel_vs_classic']:.1e} |")


if __name__ == "__main__":
    main()

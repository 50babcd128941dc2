"""Where the ping-pong kernel's time goes: time kernels/fused_attention_gluon_pp.py with steady-state steps dropped
(``FSATTN_DEV_ABLATE`` bit mask, see that module; the outputs are wrong whenever the mask is non-zero) at one shape,
one subprocess per mask (the mask is read at import), next to SDPA-cuDNN.

Usage: PYTHONPATH=$PWD python scripts/gluon_ablate.py [--masks 0,1,2,4,8,16,17,49,64] [--shape paper] [--stages 4]
"""
import argparse
import json
import math
import os
import subprocess
import sys

SHAPES = {"paper": (1, 24, 32768, 128), "wan22": (1, 40, 75600, 128), "tiny": (1, 2, 256, 128)}
NAMES = {1: "gate", 2: "clamp", 4: "row sum", 8: "shift", 16: "Stage-A", 32: "Stage-B", 64: "clamp->fma.sat",
         128: "gate's reduction and branch", 256: "gate's branch", 512: "tree row max", 1024: "wait deps",
         2048: "row sum -> tensor cores", 4096: "gate -> OR of proxies"}


def child(shape, stages):
    import torch
    import triton

    sys.path.insert(0, ".")
    from fsattn_diffusers.backends.triton_backend import kernels_package

    kernels_package()
    from fsattn_diffusers.kernels.ops import attention_from_operands, prepass
    from fsattn_diffusers.kernels.plan import plan_for
    from fsattn_diffusers.recipe import PRESETS

    b, h, s, d = SHAPES[shape]
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn((b, h, s, d), generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    plan = plan_for(PRESETS["mxfp8"])
    ops = prepass(q, k, v, plan, 1.0 / math.sqrt(d), None, variant="gluonpp")
    out = torch.empty_like(q)
    run = lambda: attention_from_operands(ops, out, plan, s, s, None, None, None, variant="gluonpp",  # noqa: E731
                                          num_stages=stages)
    ms = triton.testing.do_bench(run, warmup=200, rep=1500, return_mode="median")
    res = {"ms": ms, "tflops": 4.0 * b * h * s * s * d / ms * 1e-9}
    idx = torch.randperm(s, generator=torch.Generator().manual_seed(0))[:64].to("cuda")
    sc = torch.einsum("bhqd,bhkd->bhqk", q[:, :, idx].double(), k.double()) / math.sqrt(d)
    ex = (torch.softmax(sc, -1) @ v.double()).flatten()
    o = out[:, :, idx].double().flatten()
    res["cos_vs_exact"] = float(torch.nn.functional.cosine_similarity(o, ex, dim=0))
    if os.environ.get("FSATTN_DEV_ABLATE", "0") == "0":
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            res["cudnn_ms"] = triton.testing.do_bench(
                lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v), warmup=200, rep=1500,
                return_mode="median")
    print("RESULT " + json.dumps(res), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--masks", default="0,1,2,4,8,16,17,49,64")
    ap.add_argument("--shape", default="paper")
    ap.add_argument("--stages", type=int, default=4)
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if a.child:
        return child(a.shape, a.stages)
    rows = []
    for mask in a.masks.split(","):
        env = dict(os.environ, FSATTN_DEV_ABLATE=mask)
        p = subprocess.run([sys.executable, __file__, "--child", "--shape", a.shape, "--stages", str(a.stages)],
                           env=env, capture_output=True, text=True, timeout=120)
        line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
        if not line:
            print(f"mask {mask}: FAILED rc={p.returncode} {p.stderr[-800:]}", flush=True)
            continue
        r = dict(json.loads(line[0][7:]), mask=int(mask),
                 dropped=", ".join(n for bit, n in NAMES.items() if int(mask) & bit) or "none (the kernel)",
                 shape=a.shape)
        rows.append(r)
        print(f"mask {mask:>4} ({r['dropped']}): {r['ms']:.3f} ms {r['tflops']:.0f} TFLOP/s cos {r['cos_vs_exact']:.5f}"
              + (f" | cuDNN {r['cudnn_ms']:.3f} ms" if "cudnn_ms" in r else ""), flush=True)
    if a.json:
        json.dump(rows, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()

"""Clock and power of the H200 while one workload runs back to back (nvidia-smi sampled every 100 ms).

Usage: PYTHONPATH=$PWD python scripts/probe_power.py [--seconds 3] [--shape paper] [--once]
Workloads at the shape: SDPA-cuDNN bf16, the default mxfp8 kernel on pre-computed operands, and an FP8
``torch._scaled_mm`` 8192^3 (a GEMM-only reference). For each: median SM clock, median power, the
throttle reasons seen, and the time per call. ``--once`` launches the mxfp8 kernel a few times and exits
(a target for ncu).
"""
import argparse
import math
import subprocess
import sys
import time

import torch

sys.path.insert(0, ".")
from fsattn_diffusers.backends.triton_backend import kernels_package  # noqa: E402

kernels_package()
from fsattn_diffusers.kernels.ops import attention_from_operands, prepass  # noqa: E402
from fsattn_diffusers.kernels.plan import plan_for  # noqa: E402
from fsattn_diffusers.recipe import PRESETS  # noqa: E402

SHAPES = {"paper": (1, 24, 32768, 128), "wan22": (1, 40, 75600, 128), "small": (1, 24, 8192, 128)}
QUERY = "timestamp,clocks.sm,power.draw,clocks_event_reasons.active,temperature.gpu"


def run_for(fn, seconds):
    fn()
    torch.cuda.synchronize()
    n, t0 = 0, time.time()
    while time.time() - t0 < seconds:
        fn()
        n += 1
        if n % 4 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return t0, time.time(), (time.time() - t0) / n * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--shape", default="paper")
    ap.add_argument("--once", action="store_true")
    a = ap.parse_args()
    b, h, s, d = SHAPES[a.shape]
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn((b, h, s, d), generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    plan = plan_for(PRESETS["mxfp8"])
    ops = prepass(q, k, v, plan, 1 / math.sqrt(d), None)
    out = torch.empty_like(q)

    def ours():
        attention_from_operands(ops, out, plan, s, s, None, None, None)

    if a.once:
        for _ in range(3):
            ours()
        torch.cuda.synchronize()
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def cudnn():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            torch.nn.functional.scaled_dot_product_attention(q, k, v)

    x = torch.randn(8192, 8192, device="cuda").to(torch.float8_e4m3fn)
    y = torch.randn(8192, 8192, device="cuda").to(torch.float8_e4m3fn).t()
    one = torch.ones((), device="cuda")

    def gemm():
        torch._scaled_mm(x, y, one, one, out_dtype=torch.bfloat16)

    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits", "-lms", "100"],
                           stdout=subprocess.PIPE, text=True)
    time.sleep(1.0)
    phases = []
    for name, fn, flops in (("sdpa-cudnn", cudnn, 4.0 * b * h * s * s * d), ("fsattn-mxfp8", ours, 4.0 * b * h * s * s * d),
                            ("fp8-gemm-8192", gemm, 2.0 * 8192 ** 3), ("fsattn-mxfp8 again", ours, 4.0 * b * h * s * s * d)):
        t0, t1, ms = run_for(fn, a.seconds)
        phases.append((name, t0, t1, ms, flops))
        time.sleep(1.0)
    smi.terminate()
    rows = []
    for line in smi.stdout.read().splitlines():
        f = [x.strip() for x in line.split(",")]
        try:
            ts = time.mktime(time.strptime(f[0].split(".")[0], "%Y/%m/%d %H:%M:%S")) + float("0." + f[0].split(".")[1])
            rows.append((ts, float(f[1]), float(f[2]), f[3], f[4]))
        except (ValueError, IndexError):
            continue
    print(f"shape {a.shape} {(b, h, s, d)}; samples {len(rows)}")
    print("| workload | ms/call | TFLOP/s | median SM MHz | min MHz | median W | max W | reasons |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, t0, t1, ms, flops in phases:
        sel = [r for r in rows if t0 + 0.5 <= r[0] <= t1]
        if not sel:
            print(f"| {name} | {ms:.3f} | {flops / ms * 1e-9:.0f} | - | - | - | - | no samples |")
            continue
        mhz = sorted(r[1] for r in sel)
        w = sorted(r[2] for r in sel)
        reasons = sorted(set(r[3] for r in sel))
        print(f"| {name} | {ms:.3f} | {flops / ms * 1e-9:.0f} | {mhz[len(mhz) // 2]:.0f} | {mhz[0]:.0f} | "
              f"{w[len(w) // 2]:.0f} | {w[-1]:.0f} | {' '.join(reasons)} |")


if __name__ == "__main__":
    main()

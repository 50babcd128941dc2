"""One device call: check the Triton kernel against the emulator and time variants against SDPA.

PYTHONUNBUFFERED=1 PYTHONPATH=$PWD python scripts/kernel_probe.py [--quick] ; writes $OUT/probe.json.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
import traceback

import torch

from fsattn_diffusers.backends.triton_backend import kernels_package

kernels_package()
from fsattn_diffusers.commands.bench import accuracy, environment, exact_rows, sdpa_fn, timed  # noqa: E402
from fsattn_diffusers.emulator import emulate_attention  # noqa: E402
from fsattn_diffusers.kernels.ops import attention_from_operands, fused_attention, prepass  # noqa: E402
from fsattn_diffusers.kernels.plan import plan_for  # noqa: E402
from fsattn_diffusers.recipe import PRESETS  # noqa: E402

OUT = os.environ.get("OUT", "/tmp")
LOG = []


def log(*a):
    s = " ".join(str(x) for x in a)
    print(s, flush=True)
    LOG.append(s)


def check_small():
    torch.manual_seed(0)
    for (b, h, sq, sk, d) in [(2, 3, 300, 200, 64), (1, 2, 257, 1000, 128)]:
        for name in ("mxfp8", "mxfp6", "mxfp4"):
            q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for s in (sq, sk, sk))
            kvl = torch.tensor([sk, sk // 3 + 1][:b], device="cuda")
            scale = d ** -0.5
            out, lse, st = fused_attention(q, k, v, plan_for(PRESETS[name]), scale=scale, kv_lens=kvl,
                                           return_lse=True, return_stats=True)
            emu, else_, _ = emulate_attention(q, k, v, PRESETS[name], scale=scale, kv_lens=kvl, return_lse=True)
            pos = torch.arange(sk, device="cuda")
            mask = (pos[None, :] < kvl[:, None])[:, None, None, :]
            ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask)
            ek, ck = accuracy(out, ref)
            ee, ce = accuracy(emu, ref)
            log(f"check {name} {(b, h, sq, sk, d)} kernel err {ek:.4f} cos {ck:.5f} | emu err {ee:.4f} cos {ce:.5f} | "
                f"lse maxdiff {(lse - else_).abs().max().item():.4f} nan {torch.isnan(out).any().item()} stats {st}")


def time_variants(b, h, s, d, variants, baselines=("cudnn", "flash"), warmup=50, rep=300):
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn((b, h, s, d), generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    scale = 1.0 / math.sqrt(d)
    flops = 4.0 * b * h * s * s * d
    rows = torch.randperm(s, generator=torch.Generator().manual_seed(0))[:128].sort().values.cuda()
    ref = exact_rows(q, k, v, rows, scale)
    res = {}
    for name in baselines:
        fn = sdpa_fn(q, k, v, name)
        o = fn()
        ms = timed(fn, warmup, rep)
        res[name] = ms
        log(f"time {(b, h, s, d)} sdpa-{name}: {ms:.3f} ms {flops / ms * 1e-9:.0f} TFLOP/s acc {accuracy(o[:, :, rows], ref)}")
        del o
    for tag, (recipe, plan_kw, launch_kw) in variants.items():
        try:
            plan = dataclasses.replace(plan_for(PRESETS[recipe]), **plan_kw)
            t0 = time.time()
            ops = prepass(q, k, v, plan, scale, None)
            out = torch.empty_like(q)
            stats = torch.zeros(2, dtype=torch.int32, device="cuda")
            attention_from_operands(ops, out, plan, s, s, None, None, stats, **launch_kw)  # counts once
            torch.cuda.synchronize()
            ct = time.time() - t0
            err, cos = accuracy(out[:, :, rows], ref)
            ms = timed(lambda: attention_from_operands(ops, out, plan, s, s, None, None, None, **launch_kw), warmup, rep)
            pre = timed(lambda: prepass(q, k, v, plan, scale, None), warmup, rep)
            res[tag] = ms + pre
            log(f"time {(b, h, s, d)} {tag:<22} kernel {ms:.3f} ms {flops / ms * 1e-9:.0f} TFLOP/s | +prepass {pre:.3f} ms -> "
                f"{flops / (ms + pre) * 1e-9:.0f} TFLOP/s {res['cudnn'] / (ms + pre):.3f}x cuDNN | err {err:.4f} cos {cos:.5f} "
                f"rollbacks {stats.tolist()} compile {ct:.1f}s")
            del ops, out
        except Exception:  # noqa: BLE001
            log(f"time {tag} FAILED\n{traceback.format_exc()[-2000:]}")
    return res


def main():
    env = environment()
    log(json.dumps(env))
    if "--check" in sys.argv:
        t0 = time.time()
        try:
            check_small()
        except Exception:  # noqa: BLE001
            log("check FAILED\n" + traceback.format_exc()[-3000:])
        log(f"checks took {time.time() - t0:.1f}s")
    V = {
        "mxfp8-classic-st3": ("mxfp8", {}, dict(variant="classic", num_stages=3)),
        "mxfp6": ("mxfp6", {}, dict(num_stages=3)),
        "mxfp8-ws": ("mxfp8", {}, dict(variant="ws")),
        "mxfp8-ws-st3": ("mxfp8", {}, dict(variant="ws", num_stages=3)),
        "mxfp8-ws-nogate": ("mxfp8", dict(gate=False), dict(variant="ws")),
    }
    time_variants(1, 24, 32768, 128, V)
    if "--quick" not in sys.argv:
        time_variants(1, 40, 75600, 128, {"mxfp8-ws": V["mxfp8-ws"]}, baselines=("cudnn",), warmup=100, rep=600)
    with open(os.path.join(OUT, "probe.log"), "w") as f:
        f.write("\n".join(LOG) + "\n")


if __name__ == "__main__":
    main()

"""``fsattn e2e``: denoising-step latency of a real-size transformer (random weights) under each policy."""

from __future__ import annotations

import json
import platform
import sys
import time

import torch

from ..cli import UsageError

NAME = "e2e"
HELP = "time whole denoising steps of Wan2.2-T2V-A14B / HunyuanVideo at real size (random weights) per policy"
POLICIES = ("bf16", "mxfp8", "mxfp6", "mxfp4")


def add_arguments(p) -> None:
    p.add_argument("--model", choices=("wan22", "hunyuan"), default="wan22")
    p.add_argument("--frames", type=int, default=None, help="video frames (Wan2.2: 81, HunyuanVideo: 129)")
    p.add_argument("--height", type=int, default=720)
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--steps", type=int, default=2, help="timed denoising steps per policy (after --warmup)")
    p.add_argument("--warmup", type=int, default=1, help="untimed warm-up forward calls per policy")
    p.add_argument("--policies", default=",".join(POLICIES), help="comma-separated; bf16 is always included")
    p.add_argument("--layers", type=int, default=None, help="override the layer count (smoke runs)")
    p.add_argument("--backend", default="auto")
    p.add_argument("--device", default="cuda")
    p.add_argument("--json", dest="json_path", default=None)


def run(args) -> int:
    from .. import e2e

    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    bad = [p for p in policies if p not in POLICIES]
    if bad:
        raise UsageError(f"unknown policy {bad[0]!r} for --policies; accepted: {', '.join(POLICIES)} "
                         f"(hybrid is projected from the measured mxfp6 and mxfp4 steps)")
    policies = ["bf16"] + [p for p in policies if p != "bf16"]
    if args.height % 16 or args.width % 16:
        raise UsageError(f"--height/--width must be multiples of 16, got {args.height}x{args.width}")
    if args.steps < 1:
        raise UsageError(f"--steps must be at least 1, got {args.steps}")
    scale = {} if args.layers is None else ({"num_layers": args.layers} if args.model == "wan22" else
                                            {"num_layers": args.layers, "num_single_layers": args.layers})
    make = e2e.wan22_spec if args.model == "wan22" else e2e.hunyuan_spec
    kwargs = dict(height=args.height, width=args.width, scale=scale)
    if args.frames is not None:
        kwargs["frames"] = args.frames
    spec = make(**kwargs)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda but no CUDA device is available; accepted: a CUDA device, or --device cpu")
    t0 = time.perf_counter()
    model = e2e.build_transformer(spec, device)
    inputs = e2e.make_inputs(spec, device)
    print(f"{spec.name}: {e2e.image_tokens(spec)} image tokens, {spec.calls_per_step} forward(s) per step, "
          f"built in {time.perf_counter() - t0:.0f} s", flush=True)
    results = {}
    for policy in policies:
        results[policy] = e2e.run_policy(model, inputs, spec, policy, args.steps, args.warmup, args.backend)
        r = results[policy]
        print(f"  {policy:<6} step {r['step_median_s']:.2f} s (attention {r['attention_s_per_step']:.2f} s, "
              f"{100 * r['attention_share']:.0f}%), rollback rate {r['rollback_rate']}", flush=True)
    table = e2e.summarize(results)
    print(f"\n{'policy':<8}{'step (s)':>10}{'20 steps (s)':>14}{'speedup':>9}{'attn share':>12}{'rollback':>10}")
    for name, row in table.items():
        share = "-" if row["attention_share"] is None else f"{100 * row['attention_share']:.0f}%"
        rb = "-" if row["rollback_rate"] is None else f"{row['rollback_rate']:.2e}"
        print(f"{name:<8}{row['step_s']:>10.2f}{row['projected_s']:>14.1f}{row['speedup']:>8.3f}x{share:>12}{rb:>10}")
    print("Excluded: text encoder, VAE decode, scheduler; hybrid = 6 mxfp6 + 14 mxfp4 measured step times.")
    if args.json_path:
        meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "torch": torch.__version__,
                "python": platform.python_version(), "argv": sys.argv,
                "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                "spec": {"name": spec.name, "latent": spec.latent, "tokens": e2e.image_tokens(spec),
                         "calls_per_step": spec.calls_per_step, "config": spec.config}}
        with open(args.json_path, "w") as fh:
            json.dump({"meta": meta, "results": results, "summary": table}, fh, indent=1, default=str)
        print(f"wrote {args.json_path}")
    return 0

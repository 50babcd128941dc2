"""``fsattn e2e``: denoising-step latency of a real-size video transformer under each attention policy.

Builds the Wan2.2-T2V-A14B or HunyuanVideo transformer at its real size with random weights
(:mod:`fsattn_diffusers.measure.e2e`), makes one step's inputs (latent (B, C, F, H/8, W/8) and text embeddings) and
times whole denoising steps under each policy: stock bf16 attention (always the first row), the baselines (FA3
bf16/FP8, SageAttention through diffusers' backend) and the fsattn presets. A step-scheduled policy (``hybrid``,
``hybrid-int8-mxfp8``, ``hybrid-int8``) is timed over one real run of ``--schedule-steps`` steps. Options: FP8 linear layers
(``--gemms fp8``), ``torch.compile`` of the repeated blocks, fewer layers for smoke runs, HunyuanVideo's padded text.

Output
------
A text table on stdout (step time, attention time and share, speedup over bf16, rollback rate per policy; text
encoder, VAE and scheduler excluded). ``--json``: the run's metadata (device, versions, date, command, model spec,
configuration), the per-policy records with their resolved recipes, and the summary table; ``--md``: the same as a
markdown table (the paper's Table 6 latency columns). Both files are rewritten after every policy, so an
interrupted run keeps what it measured.

Raises ``UsageError`` (exit 2, one line) for an unknown policy, a combination the run cannot honour
(``--compile`` with a scheduled policy, ``sage`` with HunyuanVideo, ``--text-valid`` with Wan) or a missing device.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch

from ..cli import UsageError, check_output_path

NAME = "e2e"
HELP = "time whole denoising steps of Wan2.2-T2V-A14B / HunyuanVideo at real size (random weights) per policy"
POLICIES = ("bf16", "fa3", "fa3-fp8", "sage", "mxfp8", "int8-bf16", "int8-fp8", "mxfp6", "mxfp4")
#: Step-scheduled policies: timed over one real run of --schedule-steps steps (the paper's hybrid, the Hopper one).
SCHEDULES = ("hybrid", "hybrid-int8-mxfp8", "hybrid-int8")
DEFAULT_POLICIES = ("bf16", "mxfp8", "mxfp6", "mxfp4")


def add_arguments(p) -> None:
    p.add_argument("--model", choices=("wan22", "hunyuan"), default="wan22")
    p.add_argument("--frames", type=int, default=None, help="video frames (Wan2.2: 81, HunyuanVideo: 129)")
    p.add_argument("--height", type=int, default=720)
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--steps", type=int, default=2, help="timed denoising steps per policy (after --warmup)")
    p.add_argument("--warmup", type=int, default=1, help="untimed warm-up forward calls per policy")
    p.add_argument("--policies", default=",".join(DEFAULT_POLICIES),
                   help=f"comma-separated of {', '.join(POLICIES + SCHEDULES)}; bf16 (stock SDPA) is always included; "
                        f"fa3 / fa3-fp8 (FlashAttention-3 BF16 / FP8) need the fa3-fwd package; sage (diffusers' "
                        f"SageAttention backend, set_attention_backend('sage'); Wan only) needs SageAttention 2; "
                        f"{', '.join(SCHEDULES)} are timed over "
                        f"one real run of --schedule-steps steps (with mxfp6 and mxfp4 also measured, hybrid's "
                        f"projection from their steps is reported beside it)")
    p.add_argument("--schedule-steps", type=int, default=20,
                   help=f"steps of the real run of a scheduled policy ({', '.join(SCHEDULES)}; default 20, the "
                        f"paper's)")
    p.add_argument("--gemms", choices=("bf16", "fp8"), default="bf16",
                   help="fp8: the blocks' linear layers in torchao float8 (dynamic, per-row scales), every policy")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the repeated blocks (fullgraph where it holds), every policy")
    p.add_argument("--layers", type=int, default=None, help="override the layer count (smoke runs)")
    p.add_argument("--text-valid", type=int, default=None,
                   help="HunyuanVideo: valid text tokens of 256, the rest padding (default: all valid)")
    p.add_argument("--backend", default="auto")
    p.add_argument("--device", default="cuda")
    p.add_argument("--json", dest="json_path", default=None)
    p.add_argument("--md", dest="md_path", default=None, help="markdown table (the paper's Table 6 latency columns)")


def run(args) -> int:
    from ..measure import e2e

    for flag, path in (("--json", args.json_path), ("--md", args.md_path)):
        if path is not None:
            check_output_path(path, flag, folder=False)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    bad = [p for p in policies if p not in POLICIES + SCHEDULES]
    if bad:
        raise UsageError(f"unknown policy {bad[0]!r} for --policies; accepted: {', '.join(POLICIES + SCHEDULES)}")
    schedules = [p for p in policies if p in SCHEDULES]
    policies = ["bf16"] + [p for p in policies if p != "bf16" and p not in SCHEDULES]
    if schedules and args.schedule_steps < 1:
        raise UsageError(f"--schedule-steps must be at least 1, got {args.schedule_steps}")
    if schedules and args.compile:
        raise UsageError(f"--compile with a scheduled policy ({', '.join(schedules)}) is not supported; accepted: "
                         f"{', '.join(SCHEDULES)} without --compile, or --compile with fixed policies")
    from ..integration.policy import get_policy

    for p in policies + schedules:
        get_policy(p)  # a baseline whose package is missing: one ValueError line, exit 2
    if args.model == "hunyuan" and "sage" in policies:
        raise UsageError("--model hunyuan with the sage policy: diffusers' sage backend takes no attention mask and "
                         "HunyuanVideo's transformer passes one on every call; accepted: sage with --model wan22")
    if args.height % 16 or args.width % 16:
        raise UsageError(f"--height/--width must be multiples of 16, got {args.height}x{args.width}")
    if args.steps < 1:
        raise UsageError(f"--steps must be at least 1, got {args.steps}")
    if args.text_valid is not None and args.model != "hunyuan":
        raise UsageError("--text-valid applies to --model hunyuan only (Wan's text attention is cross-attention)")
    if args.compile and args.warmup < 1:
        raise UsageError(f"--compile needs --warmup >= 1 (the warm-up forward compiles the blocks), got {args.warmup}")
    scale = {} if args.layers is None else ({"num_layers": args.layers} if args.model == "wan22" else
                                            {"num_layers": args.layers, "num_single_layers": args.layers})
    make = e2e.wan22_spec if args.model == "wan22" else e2e.hunyuan_spec
    kwargs = dict(height=args.height, width=args.width, scale=scale)
    if args.frames is not None:
        kwargs["frames"] = args.frames
    spec = make(**kwargs)
    if args.text_valid is not None and not 1 <= args.text_valid <= spec.text_tokens:
        raise UsageError(f"--text-valid must lie in 1..{spec.text_tokens} (HunyuanVideo's text tokens), "
                         f"got {args.text_valid}")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda but no CUDA device is available; accepted: a CUDA device, or --device cpu")
    from ..measure import e2e_config, e2e_report

    if args.gemms == "fp8":
        why = e2e_config.fp8_gemms_refusal(device)
        if why is not None:
            raise UsageError(why)
    t0 = time.perf_counter()
    model = e2e.build_transformer(spec, device)
    inputs = e2e.make_inputs(spec, device, text_valid=args.text_valid)
    gemm_layers = e2e_config.quantize_fp8_gemms(model) if args.gemms == "fp8" else None
    config = {"gemms": args.gemms, "compile": bool(args.compile)}
    print(f"{spec.name}: {e2e.image_tokens(spec)} image tokens, {spec.calls_per_step} forward(s) per step, "
          f"{e2e_report.config_label(config)}, built in {time.perf_counter() - t0:.0f} s"
          + (f" ({gemm_layers['quantized']} linear layers in FP8)" if gemm_layers else ""), flush=True)
    if args.compile:
        print(f"  compiled {e2e_config.compile_blocks(model)} repeated blocks (fullgraph=True)", flush=True)
    meta = run_meta(args, spec, device, config, gemm_layers)
    results = {}
    for policy in policies:
        results[policy] = e2e.run_policy(model, inputs, spec, policy, args.steps, args.warmup, args.backend,
                                         compiled=args.compile)
        r = results[policy]
        attn = "" if r["attention_s_per_step"] is None else \
            f" (attention {r['attention_s_per_step']:.2f} s, {100 * r['attention_share']:.0f}%)"
        comp = "" if not r.get("compile") else \
            f", fullgraph={r['compile']['fullgraph']} graph breaks {r['compile']['graph_breaks']}"
        print(f"  {policy:<7} step {r['step_median_s']:.2f} s{attn}, rollback rate {r['rollback_rate']}{comp}",
              flush=True)
        _write(args, meta, results, e2e.summarize(results), e2e_report)  # kept after every policy
    runs = {}
    for policy in schedules:
        run_ = e2e.run_schedule(model, inputs, spec, policy, args.schedule_steps, args.warmup, args.backend)
        runs[policy] = run_
        print(f"  {policy:<7} {run_['steps']} steps in {run_['total_s']:.1f} s (mean step {run_['step_mean_s']:.2f} s; "
              f"plan {'/'.join(run_['plan'])}; {run_['fallback_calls']} calls fell back)", flush=True)
        _write(args, meta, results, e2e.summarize(results, schedules=runs), e2e_report, runs)
    table = e2e.summarize(results, schedules=runs)
    print("\n" + e2e_report.text_table(table))
    n6 = 2 * e2e.HYBRID_ENDS
    print(f"Excluded: text encoder, VAE decode, scheduler. hybrid (projected) = {n6} mxfp6 + {e2e.PAPER_STEPS - n6} "
          f"mxfp4 measured step times; {', '.join(SCHEDULES)} = measured over a real run.")
    for path in (args.json_path, args.md_path):
        if path:
            print(f"wrote {os.path.abspath(path)}")
    return 0


def run_meta(args, spec, device, config, gemm_layers) -> dict:
    """The result file's ``meta``: :func:`fsattn_diffusers.measure.provenance.header` (date, commit, command,
    versions) with the device that ran, the run's configuration and the model's shape."""
    from ..measure import e2e, provenance

    meta = provenance.header()
    meta.update({"argv": sys.argv, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                 "resolution": f"{args.width}x{args.height}", "config": config, "text_valid": args.text_valid,
                 "gemm_layers": gemm_layers,
                 "spec": {"name": spec.name, "latent": spec.latent, "tokens": e2e.image_tokens(spec),
                          "calls_per_step": spec.calls_per_step, "config": spec.config}})
    return meta


def _write(args, meta, results, table, e2e_report, schedules=None) -> None:
    doc = {"meta": meta, "results": results, "schedules": schedules or {}, "summary": table}
    if args.json_path:
        with open(args.json_path, "w") as fh:
            json.dump(doc, fh, indent=1, default=str)
    if args.md_path:
        with open(args.md_path, "w") as fh:
            fh.write(e2e_report.markdown(doc))

"""``fsattn sweep``: quality (PSNR / SSIM / LPIPS against bf16) and speed of attention policies.

Every prompt runs under every policy from the same seed and initial latent; outputs in ``--out``:
results.csv, results.json, quality_vs_time.png, psnr_per_frame.png, grid_p00.png (one per prompt), report.md and
the videos. Re-running reuses finished videos. Exit code 1 when a video failed (the others' results
are still written).
"""

from __future__ import annotations

import os
import sys

from ..cli import UsageError, check_output_path, check_prompt

NAME = "sweep"
HELP = "compare attention policies against bf16: videos, PSNR/SSIM/LPIPS, time per step, plots, report"
DEFAULT_OUT = "fsattn_sweep"


def add_arguments(p) -> None:
    from ..quality.cli_common import add_video_arguments
    from ..quality.metrics import DEFAULT_EVERY
    from ..quality.sweep import DEFAULT_POLICIES

    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", action="extend", nargs="+", default=None, metavar="TEXT",
                     help="prompt(s); repeat the flag or list several")
    src.add_argument("--prompts", default=None, metavar="FILE", help="text file, one prompt per line (# comments)")
    from ..integration.policy import policy_names

    p.add_argument("--policies", action="append", default=None, metavar="LIST",
                   help=f"comma list of policies: {', '.join(policy_names())}, a preset with changes "
                        f"(mxfp8+proxy=u32) or a schedule (default: {','.join(DEFAULT_POLICIES)}; baselines: fa3, fa3-fp8, "
                        "sage = SageAttention through diffusers' set_attention_backend('sage')); a schedule such as "
                        "mxfp6:3,mxfp4:14,mxfp6:3 may appear inside (consecutive NAME:STEPS items form one "
                        "schedule; separate two schedules with ';' or a second --policies); bf16 is always added")
    add_video_arguments(p)
    p.add_argument("--every", type=int, default=DEFAULT_EVERY, help="compare every Nth frame (default: %(default)s)")
    p.add_argument("--grid-frames", type=int, default=4, help="frames per row of the frame grid (default: %(default)s)")
    p.add_argument("--backend", default="auto", help="fsattn attention backend: auto, triton, aiter, emulator")
    p.add_argument("--no-lpips", action="store_true", help="skip LPIPS (reported as unavailable)")
    p.add_argument("--lpips-weights", default=None, metavar="FILE",
                   help="AlexNet backbone weights (default: the torch cache's alexnet-owt-7be5be79.pth)")
    p.add_argument("--no-warmup", action="store_true", help="skip the untimed 1-step bf16 warm-up run")
    p.add_argument("--out", default=DEFAULT_OUT, help="output folder (default: %(default)s)")


def _prompts(args):
    from ..quality.sweep import read_prompts

    if args.prompts is not None:
        try:
            prompts = read_prompts(args.prompts)
        except OSError as exc:
            raise UsageError(f"--prompts {args.prompts}: cannot read ({exc.strerror or exc})") from None
        if not prompts:
            raise UsageError(f"--prompts {args.prompts} has no prompt (one per line; # starts a comment)")
        return prompts
    return [check_prompt(p) for p in args.prompt]


def _validate(args):
    from ..quality.cli_common import check_video_arguments
    from ..quality.metrics import need_skimage
    from ..quality.sweep import DEFAULT_POLICIES, parse_policies

    check_video_arguments(args, UsageError, every=1, grid_frames=1)
    try:
        policies = parse_policies(args.policies or [",".join(DEFAULT_POLICIES)])
        need_skimage()
    except (ValueError, ImportError) as exc:
        raise UsageError(str(exc)) from None
    prompts = _prompts(args)
    check_output_path(args.out, "--out", folder=True)
    return prompts, policies


def run(args) -> int:
    prompts, policies = _validate(args)
    from ..quality.cli_common import load_for_args
    from ..quality.lpips_metric import load_lpips, unavailable
    from ..quality.sweep import run_sweep

    pipe, spec = load_for_args(args, UsageError, NAME, args.backend)
    lpips = unavailable("switched off (--no-lpips)") if args.no_lpips else \
        load_lpips(args.lpips_weights, device=str(getattr(pipe, "device", "cpu")))
    if not lpips.available:
        print(f"fsattn sweep: {lpips.describe()}", file=sys.stderr)
    print(f"fsattn sweep: {len(prompts)} prompt(s) x {len(policies)} policies "
          f"({', '.join(p.label for p in policies)}); {spec.num_frames} frames {spec.width}x{spec.height}, "
          f"{spec.steps} steps, seed {spec.seed} -> {args.out}", file=sys.stderr)
    from ..integration.policy import schedule_line

    for item in policies:
        if item.label != "bf16":  # once per policy: what it resolves to at this step count
            print(f"fsattn sweep: schedule {schedule_line(item.policy, spec.steps)}", file=sys.stderr)
    result = run_sweep(pipe, spec, prompts, policies, args.out, every=args.every, lpips=lpips,
                       grid_frames=args.grid_frames, warmup=not args.no_warmup)
    from ..quality.results import means_text, policy_means

    print(means_text(policy_means(result)))
    reused = sum(1 for r in result.rows if r.reused)
    print(f"fsattn sweep: {len(result.rows)} videos ({reused} reused, {len(result.failed)} failed) in "
          f"{result.seconds:.1f} s; report: {os.path.abspath(result.files['report'])}")
    for r in result.failed:
        print(f"  failed: {r.prompt_id} / {r.policy}: {r.error}")
    return 1 if result.failed else 0

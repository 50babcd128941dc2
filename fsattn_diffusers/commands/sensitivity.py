"""``fsattn sensitivity``: how much softmax the video transformer needs.

Each intervention on the self-attention probabilities (top fraction, equal weights, K-step grid with
ratio R, octave grids anchored at the row maximum or on an absolute lattice, lerp2, score scaling)
runs the pipeline from the seed and initial latent of the bf16 video; outputs in ``--out``:
sensitivity.md / .csv / .json (PSNR / SSIM / LPIPS against bf16 next to the attention diagnostics),
damage_vs_jsd.png, and the sweep's files (results.csv, report.md, frame grids, videos).

``--attention-only`` instead runs one forward of the Wan2.2-A14B-size random-weight transformer and
reports, per intervention, the per-call diagnostics and attention-output error (attention.md / .json).
"""

from __future__ import annotations

import os
import sys

from ..cli import UsageError, check_output_path

NAME = "sensitivity"
HELP = "apply softmax interventions to self-attention: video damage vs bf16 next to attention diagnostics"
DEFAULT_OUT = "fsattn_sensitivity"


def add_arguments(p) -> None:
    from ..interventions import DEFAULT_INTERVENTIONS, SYNTAX
    from ..quality.cli_common import add_video_arguments
    from ..quality.metrics import DEFAULT_EVERY
    from ..quality.sensitivity import DEFAULT_ROWS
    from ..measure.sensitivity_attention import MODEL_SIZES

    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", action="extend", nargs="+", default=None, metavar="TEXT",
                     help="prompt(s); repeat the flag or list several")
    src.add_argument("--prompts", default=None, metavar="FILE", help="text file, one prompt per line (# comments)")
    p.add_argument("--interventions", action="append", default=None, metavar="LIST",
                   help=f"comma list of {SYNTAX} (default: {','.join(DEFAULT_INTERVENTIONS)})")
    add_video_arguments(p)
    p.add_argument("--at-steps", default=None, metavar="LIST",
                   help="intervene only on these 0-based denoising steps, e.g. 0-3,10 (default: all)")
    p.add_argument("--at-blocks", default=None, metavar="LIST",
                   help="intervene only in these 0-based transformer blocks, e.g. 0,1 (default: all)")
    p.add_argument("--rows", type=int, default=None,
                   help=f"query rows per call for the diagnostics (default: {DEFAULT_ROWS}; --attention-only: 256)")
    p.add_argument("--sample-seed", type=int, default=0, help="seed of the row sampling (default: %(default)s)")
    p.add_argument("--every", type=int, default=DEFAULT_EVERY, help="compare every Nth frame (default: %(default)s)")
    p.add_argument("--grid-frames", type=int, default=4, help="frames per row of the frame grid (default: %(default)s)")
    p.add_argument("--no-lpips", action="store_true", help="skip LPIPS (reported as unavailable)")
    p.add_argument("--lpips-weights", default=None, metavar="FILE",
                   help="AlexNet backbone weights (default: the torch cache's alexnet-owt-7be5be79.pth)")
    p.add_argument("--no-warmup", action="store_true", help="skip the untimed 1-step bf16 warm-up run")
    p.add_argument("--attention-only", action="store_true",
                   help="one forward of a random-weight transformer (--model-size): per-call diagnostics and "
                        "attention-output error of each intervention; --frames/--height/--width set the tokens "
                        "(default: wan22 81 x 720x1280, tiny 17 x 256x256)")
    p.add_argument("--model-size", choices=MODEL_SIZES, default="wan22",
                   help="--attention-only: wan22 = Wan2.2-T2V-A14B (one expert), tiny = 2-layer CPU check "
                        "(1,280 tokens by default)")
    p.add_argument("--layers", type=int, default=None, help="--attention-only: override the layer count")
    p.add_argument("--timestep", type=float, default=999.0, help="--attention-only: timestep of the forward")
    p.add_argument("--out", default=DEFAULT_OUT, help="output folder (default: %(default)s)")


def _validate(args):
    from ..interventions import DEFAULT_INTERVENTIONS, parse_interventions
    from ..quality.cli_common import check_video_arguments
    from ..quality.sensitivity import parse_index_set

    check_video_arguments(args, UsageError, every=1, grid_frames=1, rows=1, layers=1)
    if not args.attention_only:
        _prompts(args)
    check_output_path(args.out, "--out", folder=True)
    try:
        ivs = parse_interventions(args.interventions or [",".join(DEFAULT_INTERVENTIONS)])
        steps = parse_index_set(args.at_steps, "--at-steps")
        blocks = parse_index_set(args.at_blocks, "--at-blocks")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return ivs, steps, blocks


def _prompts(args):
    from .sweep import _prompts as sweep_prompts

    if args.prompt is None and args.prompts is None:
        raise UsageError("one of --prompt TEXT or --prompts FILE is required (or --attention-only)")
    return sweep_prompts(args)


def _attention_only(args, ivs) -> int:
    import torch

    from ..measure.sensitivity_attention import DEFAULT_SHAPES, run_attention_only, write_attention_outputs

    if args.model is not None:
        raise UsageError("--attention-only builds a random-weight transformer (--model-size); drop --model")
    if args.at_steps or args.at_blocks:
        raise UsageError("--at-steps/--at-blocks apply to pipeline runs, not to --attention-only")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        torch.empty(1, device=device)
    except (RuntimeError, AssertionError) as exc:
        raise UsageError(f"--device {device!r} is not usable here ({str(exc).splitlines()[0]})") from None
    dtype = {"auto": torch.bfloat16 if device.startswith("cuda") else torch.float32}.get(args.dtype) or \
        getattr(torch, args.dtype)
    frames, height, width = (d if v is None else v for v, d in
                             zip((args.frames, args.height, args.width), DEFAULT_SHAPES[args.model_size]))
    print(f"fsattn sensitivity: attention only, {args.model_size} at {frames} x {width}x{height}, {len(ivs)} "
          f"interventions on {device} -> {args.out}", file=sys.stderr)
    result = run_attention_only(ivs, model_size=args.model_size, frames=frames, height=height, width=width,
                                layers=args.layers, rows=args.rows or 256, sample_seed=args.sample_seed,
                                timestep=args.timestep, device=device, dtype=dtype, seed=args.seed, progress=True)
    files = write_attention_outputs(result, args.out)
    with open(files["report"], encoding="utf-8") as fh:
        print(fh.read())
    print(f"wrote {', '.join(os.path.abspath(p) for p in files.values())}")
    return 0


def run(args) -> int:
    ivs, steps, blocks = _validate(args)
    if args.attention_only:
        return _attention_only(args, ivs)
    prompts = _prompts(args)
    from ..quality.cli_common import load_for_args
    from ..quality.lpips_metric import load_lpips, unavailable
    from ..quality.metrics import need_skimage
    from ..quality.sensitivity import DEFAULT_ROWS, run_sensitivity

    try:
        need_skimage()
    except ImportError as exc:
        raise UsageError(str(exc)) from None
    pipe, spec = load_for_args(args, UsageError, NAME, "auto")
    lpips = unavailable("switched off (--no-lpips)") if args.no_lpips else \
        load_lpips(args.lpips_weights, device=str(getattr(pipe, "device", "cpu")))
    if not lpips.available:
        print(f"fsattn sensitivity: {lpips.describe()}", file=sys.stderr)
    print(f"fsattn sensitivity: {len(prompts)} prompt(s) x {len(ivs)} interventions + bf16; {spec.num_frames} frames "
          f"{spec.width}x{spec.height}, {spec.steps} steps, seed {spec.seed} -> {args.out}", file=sys.stderr)
    res = run_sensitivity(pipe, spec, prompts, ivs, args.out, steps=steps, layers=blocks,
                          rows=args.rows or DEFAULT_ROWS, sample_seed=args.sample_seed, every=args.every, lpips=lpips,
                          grid_frames=args.grid_frames, warmup=not args.no_warmup)
    from ..quality.results import means_text, policy_means

    print(means_text(policy_means(res["sweep"])))
    failed = [r for r in res["sweep"].rows if r.status != "ok"]
    print(f"fsattn sensitivity: {len(res['sweep'].rows)} videos ({len(failed)} failed) in "
          f"{res['sweep'].seconds:.1f} s; report: {os.path.abspath(res['files']['sens_report'])}")
    for r in failed:
        print(f"  failed: {r.prompt_id} / {r.policy}: {r.error}")
    return 1 if failed else 0

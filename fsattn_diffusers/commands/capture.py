"""``fsattn capture``: one bf16 run with every self-attention call analysed on sampled query rows.

Per call (step, layer, CFG branch, expert): the rollback rate at the gate of each recipe and its error
against BF16 attention, beside the conventional softmax on the same quantized operands. Outputs in
``--out``: calls.csv, calls.json, summary.md, rollback.png, capture.mp4 and, with ``--save-worst N``,
worst_calls.safetensors for ``fsattn accuracy --replay``.
"""

from __future__ import annotations

import os
import sys

from ..cli import UsageError, check_output_path, check_prompt

NAME = "capture"
HELP = "run a pipeline once in bf16 and record, per self-attention call, rollback rates and errors of each recipe"
DEFAULT_OUT = "fsattn_capture"
DEFAULT_PROMPT = "a red fox running through snow, cinematic"


def add_arguments(p) -> None:
    from ..quality.analysis import DEFAULT_RECIPES, DEFAULT_ROWS
    from ..quality.cli_common import add_video_arguments

    p.add_argument("--prompt", default=DEFAULT_PROMPT, help="text prompt (default: %(default)r)")
    add_video_arguments(p)
    p.add_argument("--recipes", default=",".join(DEFAULT_RECIPES),
                   help="comma list of recipes analysed on every call (default: %(default)s)")
    p.add_argument("--rows", type=int, default=DEFAULT_ROWS,
                   help="query rows sampled per call (all keys; default: %(default)s)")
    p.add_argument("--interventions", default="octave:2", metavar="LIST",
                   help="softmax interventions whose diagnostics (JSD, log errors, mass concentration against exact "
                        "softmax) every call also records; empty for none (default: %(default)s)")
    p.add_argument("--sample-seed", type=int, default=0, help="seed of the row sampling (default: %(default)s)")
    p.add_argument("--backend", default="emulator",
                   help="attention backend of the analysis (default: %(default)s, the reference numerics)")
    p.add_argument("--save-worst", type=int, default=0, metavar="N",
                   help="save Q/K/V of the N worst calls to worst_calls.safetensors (default: none)")
    p.add_argument("--out", default=DEFAULT_OUT, help="output folder (default: %(default)s)")


def _validate(args):
    from ..quality.analysis import resolve_recipes
    from ..quality.cli_common import check_video_arguments

    check_video_arguments(args, UsageError, rows=1, save_worst=0)
    try:
        recipes = resolve_recipes([r.strip() for r in args.recipes.split(",") if r.strip()])
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    args.prompt = check_prompt(args.prompt)
    check_output_path(args.out, "--out", folder=True)
    from ..interventions import parse_intervention

    try:
        args.interventions = [parse_intervention(i) for i in args.interventions.split(",") if i.strip()]
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return recipes


def run(args) -> int:
    recipes = _validate(args)
    from ..quality.capture import run_capture
    from ..quality.capture_report import write_capture_outputs
    from ..quality.cli_common import load_for_args

    pipe, spec = load_for_args(args, UsageError, NAME, "auto")
    print(f"fsattn capture: {spec.num_frames} frames {spec.width}x{spec.height}, {spec.steps} steps, seed "
          f"{spec.seed}; recipes {', '.join(r.name for r in recipes)}; {args.rows} rows per call -> {args.out}",
          file=sys.stderr)
    os.makedirs(args.out, exist_ok=True)
    from ..integration.policy import FixedPolicy
    from ..integration.runner import announce_backend

    announce_backend([FixedPolicy(r) for r in recipes], args.backend, getattr(pipe, "device", "cpu"))
    captured = run_capture(pipe, spec, args.prompt, os.path.join(args.out, "capture.mp4"), recipes=recipes,
                           rows=args.rows, seed=args.sample_seed, backend=args.backend,
                           save_worst=args.save_worst, interventions=args.interventions)
    meta = {"prompt": args.prompt, "spec": spec.key(), "rows": args.rows, "backend": args.backend,
            "sample_seed": args.sample_seed, "interventions": [i.label for i in args.interventions]}
    files = dict(write_capture_outputs(captured, args.out, meta), video=captured.video)
    with open(files["summary"], encoding="utf-8") as fh:
        print(fh.read().split("\n![", 1)[0].rstrip())
    print(f"wrote {', '.join(os.path.abspath(p) for p in files.values())}")
    return 0

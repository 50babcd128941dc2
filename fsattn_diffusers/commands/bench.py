"""``fsattn bench``: the command line of :mod:`fsattn_diffusers.measure.kernel_bench` (what is timed and how)."""

from __future__ import annotations

import json
import os

from ..measure.kernel_bench import BASELINES, RECIPES, SHAPES, bench_shape, environment, markdown, rounds_accepted

NAME = "bench"
HELP = "time the kernels against torch SDPA (cuDNN, flash), FlashAttention-3 (bf16, FP8) and SageAttention on a GPU"

def add_arguments(parser) -> None:
    parser.add_argument("--shapes", default="paper", help=f"comma list of {', '.join(SHAPES)} (default: paper)")
    parser.add_argument("--shape", action="append", default=[], metavar="B,H,S,D",
                        help="extra shape (repeatable); S may be S_q:S_k")
    parser.add_argument("--recipes", default=",".join(RECIPES), help="comma list of our recipes")
    parser.add_argument("--baselines", default=",".join(BASELINES),
                        help=f"comma list of {', '.join(BASELINES)} (those not installed are skipped with a line; "
                             "fa3/fa3-fp8 need the fa3-fwd package; sage runs whichever sageattention is "
                             "importable, SageAttention 2 or PyPI's 1.0.6, and the report names it)")
    parser.add_argument("--inputs", default="gaussian",
                        help="comma list of input families: gaussian (random normal, the default) or names of "
                             "the structured-input suite (fsattn accuracy --suite structured), e.g. "
                             "attention_sink,locality")
    parser.add_argument("--layout", choices=("bhsd", "bshd"), default="bhsd", help="input layout for our kernel")
    parser.add_argument("--warmup", type=float, default=100.0, help="do_bench warm-up, ms")
    parser.add_argument("--rep", type=float, default=500.0, help="do_bench repetition time, ms")
    parser.add_argument("--rounds", type=int, default=1,
                        help="1 (default) or an even number: time every method this many times, the methods in "
                             "turn within each round and in reverse every other round (A B C, C B A, ...), and "
                             "report the median over (forward, reverse) pairs of the pair's mean: clock and power "
                             "drift, and the place in the round, then reach all methods alike")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variant", default=None, choices=("gluon_pingpong", "triton"),
                        help="kernel variant (default: $FSATTN_KERNEL_VARIANT, else gluon_pingpong for the gated "
                             "recipes mxfp8/mxfp6/mxfp4 and triton for the rest); recipes gluon_pingpong does not "
                             "cover (no gate, Rowmax-H15) run triton")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--markdown", metavar="PATH", help="also write a markdown report")


def parse_shape(text: str):
    """``B,H,S,D`` or ``B,H,Sq:Sk,D`` -> (B, H, S_q, S_k, D)."""
    from ..cli import UsageError

    parts = text.split(",")
    if len(parts) != 4:
        raise UsageError(f"bad --shape {text!r}; accepted: B,H,S,D or B,H,Sq:Sk,D")
    try:
        b, h, d = int(parts[0]), int(parts[1]), int(parts[3])
        s_q, _, s_k = parts[2].partition(":")
        s_q = int(s_q)
        s_k = int(s_k) if s_k else s_q
    except ValueError:
        raise UsageError(f"bad --shape {text!r}; accepted: B,H,S,D or B,H,Sq:Sk,D") from None
    if min(b, h, s_q, s_k, d) < 1:
        raise UsageError(f"bad --shape {text!r}: sizes must be >= 1")
    return b, h, s_q, s_k, d


def run(args) -> int:
    import torch

    from ..cli import UsageError, check_output_path

    for flag, path in (("--json", args.json), ("--markdown", args.markdown)):
        if path is not None:
            check_output_path(path, flag, folder=False)

    shapes = []
    for name in [s for s in args.shapes.split(",") if s]:
        if name not in SHAPES:
            raise UsageError(f"unknown shape {name!r}; accepted: {', '.join(SHAPES)} or --shape B,H,S,D")
        b, h, s, d = SHAPES[name]
        shapes.append((b, h, s, s, d))
    shapes += [parse_shape(t) for t in args.shape]
    recipes = [r for r in args.recipes.split(",") if r]
    baselines = [x for x in args.baselines.split(",") if x]
    for x in baselines:
        if x not in BASELINES:
            raise UsageError(f"unknown baseline {x!r}; accepted: {', '.join(BASELINES)}")
    from ..measure.structured_inputs import FAMILIES

    inputs = [x for x in args.inputs.split(",") if x]
    for x in inputs:
        if x not in FAMILIES:
            raise UsageError(f"unknown --inputs {x!r}; accepted: {', '.join(FAMILIES)}")
        if x != "gaussian" and any(s_q != s_k for _, _, s_q, s_k, _ in shapes):
            raise UsageError(f"--inputs {x} needs S_q == S_k in every shape; accepted for S_q != S_k: gaussian")
    if not rounds_accepted(args.rounds):
        raise UsageError(f"bad --rounds {args.rounds}; accepted: 1, or an even integer (forward and reverse rounds "
                         "in pairs)")
    if not torch.cuda.is_available():
        raise UsageError("fsattn bench needs a CUDA GPU (a Hopper GPU for our kernels)")
    if args.variant:
        from ..backends import registered
        from ..measure import KERNEL_BACKEND

        # read at call time by prepass and attention_from_operands
        registered()[KERNEL_BACKEND].kernel("ops").VARIANT = args.variant
    env = environment(baselines)
    env["rounds"] = args.rounds
    env["kernel_variant"] = args.variant or os.environ.get(
        "FSATTN_KERNEL_VARIANT", "gluon_pingpong (gated recipes), triton (others)")
    print(f"device {env.get('device')} torch {env['torch']} triton {env['triton']}")
    sage = env.get("sageattention")
    if sage:
        print(f"sage: {sage.get('label') or 'skipped: ' + sage['missing']}")
    results = []
    for shp in shapes:
        for name in inputs:
            print(f"shape B,H,Sq,Sk,D = {shp}, inputs {name}")
            results += bench_shape(*shp, recipes, baselines, layout=args.layout, warmup=args.warmup, rep=args.rep,
                                   seed=args.seed, inputs=name, rounds=args.rounds)
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": env, "results": results}, f, indent=1)
    md = markdown(env, results)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(md)
    print(md)
    return 0

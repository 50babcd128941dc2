"""Arguments shared by the video commands (``fsattn generate``, ``sweep``, ``capture``, ``sensitivity``): the model and
the video settings, and their one-line checks."""

from __future__ import annotations

import sys

DTYPES = ("auto", "float32", "bfloat16", "float16")
#: Sizes are multiples of this (VAE stride 8 x patch 2); videos have 4k + 1 frames.
SIZE_MULTIPLE, TEMPORAL_STRIDE = 16, 4


def add_video_arguments(p) -> None:
    p.add_argument("--model", default=None,
                   help="diffusers pipeline directory or Hub id (Wan2.1, Wan2.2, HunyuanVideo); "
                        "default: the embedded tiny smoke model (random weights, noise-like video)")
    p.add_argument("--steps", type=int, default=None, help="denoising steps (default: the model's; smoke: 20)")
    p.add_argument("--frames", type=int, default=None, help="frames, 4k+1 (default: the model's; smoke: 17)")
    for name in ("height", "width"):
        p.add_argument(f"--{name}", type=int, default=None,
                       help=f"multiple of {SIZE_MULTIPLE} (default: the model's; smoke: 128)")
    p.add_argument("--guidance", type=float, default=None, help="guidance scale (default: the model's)")
    p.add_argument("--guidance-2", type=float, default=None,
                   help="Wan2.2 low-noise expert guidance / HunyuanVideo true-CFG scale (default: the model's)")
    p.add_argument("--negative-prompt", default=None, help="negative prompt (default: the model's)")
    p.add_argument("--seed", type=int, default=0, help="noise seed of every video (default: %(default)s)")
    p.add_argument("--device", default=None, help="cuda, cpu, ... (default: cuda if present)")
    p.add_argument("--dtype", default="auto", choices=DTYPES, help="model dtype (default: bf16 on CUDA, fp32 else)")


def check_video_arguments(args, usage_error, **minimums: int) -> None:
    """Raise ``usage_error`` (one line) for a bad size, frame count, step count or fsattn backend name, or for an
    argument below its minimum.

    Parameters
    ----------
    args : argparse.Namespace
    usage_error : type
        The exception raised (the command line's ``UsageError``).
    **minimums : int
        Further ``dest=minimum`` pairs (``rows=1``): ``--rows 0 must be >= 1``; an argument left at None is not
        checked.
    """
    for name in ("height", "width"):
        value = getattr(args, name)
        if value is not None and (value < SIZE_MULTIPLE or value % SIZE_MULTIPLE):
            raise usage_error(f"--{name} {value} is not a positive multiple of {SIZE_MULTIPLE}")
    if args.frames is not None and (args.frames < 1 or (args.frames - 1) % TEMPORAL_STRIDE):
        low = max(1, (args.frames - 1) // TEMPORAL_STRIDE * TEMPORAL_STRIDE + 1)
        raise usage_error(f"--frames {args.frames} is not 4k + 1 (the VAE compresses time by 4); "
                          f"try {low} or {low + TEMPORAL_STRIDE}")
    for name, low in dict(steps=1, **minimums).items():
        value = getattr(args, name)
        if value is not None and value < low:
            raise usage_error(f"--{name.replace('_', '-')} {value} must be >= {low}")
    backend = getattr(args, "backend", "auto")
    if backend != "auto":
        from ..backends import registered

        if backend not in registered():
            raise usage_error(f"unknown backend {backend!r}; accepted: auto, {', '.join(sorted(registered()))}")


def load_for_args(args, usage_error, command: str, backend: str):
    """Build the pipeline and the :class:`~.loading.VideoSpec` of ``args``; one-line errors as ``usage_error``."""
    import torch

    from ..integration.runner import LoadError
    from ..integration.tiny import SMOKE_NOTE
    from .loading import build_pipeline, video_spec

    try:
        device = torch.device(args.device) if args.device else None
        if device is not None:
            torch.empty(1, device=device)
    except (RuntimeError, AssertionError) as exc:
        raise usage_error(f"--device {args.device!r} is not usable here ({str(exc).splitlines()[0]})") from None
    dtype = None if args.dtype == "auto" else getattr(torch, args.dtype)
    if args.model is None:
        print(f"fsattn {command}: NOTE: {SMOKE_NOTE}", file=sys.stderr)
    try:
        pipe, settings = build_pipeline(args.model, device, dtype)
    except LoadError as exc:
        raise usage_error(str(exc)) from None
    spec = video_spec(settings, args.model, args.seed, backend, height=args.height, width=args.width,
                      num_frames=args.frames, steps=args.steps, guidance_scale=args.guidance,
                      guidance_scale_2=args.guidance_2, negative_prompt=args.negative_prompt)
    return pipe, spec

"""Command-line runner shared by the model scripts of this package."""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from .settings import RunSettings, configure_scheduler


def run(settings: RunSettings, argv: Optional[Sequence[str]] = None) -> int:
    """Parse ``argv``, load ``settings.hub_id`` (or ``--model``), generate with ``--policy``, write the MP4."""
    parser = argparse.ArgumentParser(description=f"{settings.name} with fsattn ({settings.source} settings)")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--model", default=settings.hub_id, help="directory or Hub id (default: %(default)s)")
    from fsattn_diffusers.integration.policy import POLICY_STRING_FORMS, policy_names

    parser.add_argument("--policy", default="hybrid", help=f"{', '.join(policy_names())}, {POLICY_STRING_FORMS}")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=f"{settings.name.split()[0]}.mp4")
    parser.add_argument("--offload", action="store_true", help="enable_model_cpu_offload (less GPU memory)")
    args = parser.parse_args(argv)

    from fsattn_diffusers.cli import UsageError
    from fsattn_diffusers.notices import one_line_warnings, quiet_third_party

    with one_line_warnings(parser.prog), quiet_third_party():
        try:  # bad input (prompt, output, policy, model) is one line and exit code 2, like the fsattn commands
            policy, pipe, device = _load(settings, args)
        except (ValueError, UsageError) as exc:
            print(f"{parser.prog}: error: {exc}", file=sys.stderr)
            return 2
        return _generate(settings, args, policy, pipe, device)


def _load(settings: RunSettings, args):
    """The policy, prompt and output path (checked before any weights load), the pipeline and the device."""
    from fsattn_diffusers.cli import check_output_path, check_prompt
    from fsattn_diffusers.integration.policy import get_policy
    from fsattn_diffusers.integration.runner import default_device, load_pipeline

    args.prompt = check_prompt(args.prompt)
    check_output_path(args.out, "--out", folder=False)
    policy = get_policy(args.policy)
    device = default_device()
    pipe = load_pipeline(args.model, device=device)
    configure_scheduler(pipe, settings)
    return policy, pipe, device


def _generate(settings: RunSettings, args, policy, pipe, device) -> int:
    from fsattn_diffusers.integration.policy import schedule_line
    from fsattn_diffusers.integration.runner import generate_video

    if args.offload:
        pipe.enable_model_cpu_offload()
    else:
        pipe.to(device)
    if hasattr(pipe.vae, "enable_tiling"):
        pipe.vae.enable_tiling()
    print(f"schedule {schedule_line(policy, settings.steps)}", file=sys.stderr)
    result = generate_video(pipe, args.prompt, out=args.out, height=settings.height, width=settings.width,
                            num_frames=settings.num_frames, steps=settings.steps,
                            guidance_scale=settings.guidance_scale, guidance_scale_2=settings.guidance_scale_2,
                            negative_prompt=settings.negative_prompt, seed=args.seed, fps=settings.fps,
                            policy=policy, backend=args.backend)
    print(f"wrote {result.path} ({result.num_frames} frames {result.width}x{result.height}, "
          f"{result.seconds:.1f} s)")
    print("\n".join(result.summary))
    return 0


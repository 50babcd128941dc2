"""``fsattn generate``: one video with a Wan / HunyuanVideo pipeline under an fsattn policy.

Without ``--model`` it builds the embedded offline smoke model (a tiny random-weight Wan2.2
pipeline; its video is noise-like). With ``--model`` it loads a diffusers checkpoint (directory or
Hub id) of Wan2.1, Wan2.2 or HunyuanVideo and uses that model's settings unless overridden.
"""

from __future__ import annotations

import os
import sys

from ..cli import UsageError, check_output_path, check_prompt

NAME = "generate"
HELP = "generate a video with fsattn attention (default: an offline tiny smoke model)"
DEFAULT_PROMPT = "a red fox running through snow, cinematic"
#: CPU threads for the smoke model (unless OMP_NUM_THREADS is set).
SMOKE_THREADS = 1


def add_arguments(p) -> None:
    from ..integration.policy import POLICY_STRING_FORMS, policy_names
    from ..quality.cli_common import add_video_arguments

    p.add_argument("--prompt", default=DEFAULT_PROMPT, help="text prompt (default: %(default)r)")
    add_video_arguments(p)
    p.add_argument("--policy", default="hybrid",
                   help=f"{' | '.join(policy_names())} | {POLICY_STRING_FORMS} "
                        "(default: %(default)s; fa3 and fa3-fp8 need an NVIDIA GPU and the fa3-fwd package; "
                        "sage (SageAttention through diffusers' set_attention_backend('sage'); Wan only))")
    p.add_argument("--backend", default="auto", help="attention backend: auto, triton, aiter, emulator")
    p.add_argument("--fps", type=int, default=None, help="frames per second of the MP4 (default: the model's)")
    p.add_argument("--out", default="fsattn_video.mp4", help="output MP4 path (default: %(default)s)")
    p.add_argument("--offload", action="store_true", help="enable_model_cpu_offload (saves GPU memory)")


def _validate(args):
    """Check every argument before anything heavy is loaded; return the resolved policy."""
    from ..integration.policy import get_policy
    from ..quality.cli_common import check_video_arguments

    try:
        policy = get_policy(args.policy)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    check_video_arguments(args, UsageError, fps=1)
    if not args.out.lower().endswith(".mp4"):
        raise UsageError(f"--out {args.out} must end with .mp4")
    check_output_path(args.out, "--out", folder=False)
    args.prompt = check_prompt(args.prompt)
    return policy


def _device_and_dtype(args):
    import torch

    from ..cli import usable_device
    from ..integration.runner import default_device

    device = usable_device(args.device) if args.device else default_device()
    if args.offload and device.type == "cpu":
        raise UsageError("--offload moves models between the CPU and a GPU; it needs --device cuda (or another GPU)")
    dtype = None if args.dtype == "auto" else getattr(torch, args.dtype)
    return device, dtype


def run(args) -> int:
    import torch

    policy = _validate(args)
    device, dtype = _device_and_dtype(args)
    threads = torch.get_num_threads()
    if args.model is None and device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        # The smoke model's tensors are tiny: intra-op threads only add synchronisation, which on a
        # busy 2-core machine made the run 5x slower (23.7 s vs 4.3 s for the pipeline call, measured).
        torch.set_num_threads(SMOKE_THREADS)
    try:
        return _run(args, policy, device, dtype)
    finally:
        torch.set_num_threads(threads)


def _run(args, policy, device, dtype) -> int:
    from ..integration.policy import schedule_line
    from ..integration.runner import LoadError, check_model, generate_video, load_pipeline
    from ..integration.tiny import SMOKE_NOTE, tiny_wan22_pipeline
    from ..pipelines.settings import TINY_WAN22, configure_scheduler, settings_for

    if args.model is None:
        print(f"fsattn generate: NOTE: {SMOKE_NOTE}", file=sys.stderr)
        pipe, settings = tiny_wan22_pipeline(), TINY_WAN22
        if dtype is not None:
            pipe.to(dtype=dtype)
    else:
        try:
            check_model(args.model)
            pipe = load_pipeline(args.model, device=device, dtype=dtype)
        except LoadError as exc:
            raise UsageError(str(exc)) from None
        settings = settings_for(pipe)
        configure_scheduler(pipe, settings)
    if args.offload:
        pipe.enable_model_cpu_offload(device=device)
    else:
        pipe.to(device)

    s = settings.with_overrides(height=args.height, width=args.width, num_frames=args.frames, steps=args.steps,
                                guidance_scale=args.guidance, guidance_scale_2=args.guidance_2, fps=args.fps,
                                negative_prompt=args.negative_prompt)
    print(f"fsattn generate: {s.name}, {s.num_frames} frames {s.width}x{s.height}, {s.steps} steps, "
          f"policy {policy.name}, backend {args.backend}, seed {args.seed}", file=sys.stderr)
    print(f"fsattn generate: schedule {schedule_line(policy, s.steps)}", file=sys.stderr)
    result = generate_video(pipe, args.prompt, out=args.out, height=s.height, width=s.width,
                            num_frames=s.num_frames, steps=s.steps, guidance_scale=s.guidance_scale,
                            guidance_scale_2=s.guidance_scale_2, negative_prompt=s.negative_prompt,
                            seed=args.seed, fps=s.fps, policy=policy, backend=args.backend)
    print(f"wrote {os.path.abspath(result.path)} ({result.num_frames} frames {result.width}x{result.height}, "
          f"{s.fps} fps; the pipeline call took {result.seconds:.1f} s)")
    print(f"per-step attention (policy {policy.name}; bf16 = stock diffusers attention):")
    for line in result.summary:
        print(f"  {line}")
    return 0

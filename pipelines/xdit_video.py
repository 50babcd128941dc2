"""Wan2.2 / HunyuanVideo through xDiT (Ulysses, ring, USP) with an fsattn policy.

Launch on 2 GPUs with Ulysses (``--ring_degree 2`` for ring; both for USP on 4)::

    torchrun --nproc_per_node 2 -m fsattn_diffusers.pipelines.xdit_video --model Wan2.2-T2V \\
        --ulysses_degree 2 --policy hybrid --prompt "a cat grooming itself" --num_inference_steps 20 \\
        --guidance_scale 4 --guidance_scale_2 3

``--model HunyuanVideo`` runs HunyuanVideo. Our flags: ``--policy`` (bf16, mxfp8, mxfp6, mxfp4, hybrid,
hybrid-int8-mxfp8, hybrid-int8 or a schedule), ``--fsattn_backend``, ``--fsattn_slot`` (the xDiT registry slot fsattn occupies) and
``--fsattn_cross_slot`` (where Wan's cross-attention stays on bf16). Every other flag goes to xDiT's own
runner (``xfuser.runner``) unchanged. xDiT's ``--use_hybrid_attn_schedule`` is refused: ``--policy`` is the
schedule. Needs ``pip install xfuser`` (0.7.x) on a CUDA machine and the model weights.
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional, Sequence, Tuple

from fsattn_diffusers.parallel.xdit_adapter import DEFAULT_SLOT, RING_SLOTS, default_cross_slot

#: xDiT flags that would fight our policy or our slot.
_SCHEDULE_FLAGS = ("--use_hybrid_attn_schedule", "--hybrid_attn_schedule", "--hybrid_attn_low_precision_backend",
                   "--hybrid_attn_high_precision_backend")


def split_argv(argv: Sequence[str]) -> Tuple[argparse.Namespace, List[str]]:
    """Our flags, and the rest for xDiT's runner."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--policy", default="hybrid")
    parser.add_argument("--fsattn_backend", default="auto")
    parser.add_argument("--fsattn_slot", default=DEFAULT_SLOT, type=str.upper, choices=RING_SLOTS)
    parser.add_argument("--fsattn_cross_slot", default=None, type=str.upper, choices=RING_SLOTS)
    return parser.parse_known_args(list(argv))


def _flag_value(argv: Sequence[str], flag: str) -> Optional[str]:
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def xdit_argv(ours: argparse.Namespace, rest: Sequence[str], supports_cross_backend: bool) -> List[str]:
    """xDiT's argv: ``rest`` plus ``--attention_backend SLOT`` (and the cross-attention slot for Wan)."""
    rest = list(rest)
    clash = [f for f in _SCHEDULE_FLAGS if any(a == f or a.startswith(f + "=") for a in rest)]
    if clash:
        raise ValueError(f"{clash[0]} conflicts with --policy (fsattn follows the denoising step itself); "
                         f"accepted: --policy hybrid, hybrid-int8-mxfp8 or a schedule like mxfp6:3,mxfp4:14,mxfp6:3")
    slot = ours.fsattn_slot
    given = _flag_value(rest, "--attention_backend")
    if given is None:
        rest += ["--attention_backend", slot]
    elif given.upper() != slot:
        raise ValueError(f"--attention_backend {given} differs from --fsattn_slot {slot}; fsattn replaces the "
                         f"kernel of that slot, so pass one of them only")
    cross = _flag_value(rest, "--cross_attention_backend")
    if cross is not None and cross.upper() == slot:
        raise ValueError(f"--cross_attention_backend {cross} is fsattn's slot; cross-attention stays bf16, "
                         f"accepted: another of {', '.join(RING_SLOTS)}")
    if cross is None and supports_cross_backend:
        rest += ["--cross_attention_backend", ours.fsattn_cross_slot or default_cross_slot(slot)]
    return rest


def main(argv: Optional[Sequence[str]] = None) -> int:
    ours, rest = split_argv(sys.argv[1:] if argv is None else argv)
    try:
        from xfuser import xFuserArgs
        from xfuser.config import FlexibleArgumentParser
        from xfuser.core.distributed import get_runtime_state
        from xfuser.core.utils.runner_utils import is_last_process
        from xfuser.model_executor.models.runner_models.base_model import MODEL_REGISTRY
        from xfuser.runner import xFuserModelRunner
    except Exception as exc:  # not installed, or its RuntimeError on a CPU-only torch
        print(f"xdit_video: xfuser (xDiT 0.7) cannot be imported here ({type(exc).__name__}: {exc}); it needs "
              f"a CUDA build of torch, triton and `pip install xfuser`", file=sys.stderr)
        return 2

    from fsattn_diffusers.xdit import install

    model_cls = MODEL_REGISTRY.get(_flag_value(rest, "--model") or "")
    supports_cross = bool(model_cls is not None and model_cls.capabilities.cross_attention_backend)
    parser = FlexibleArgumentParser(description="xDiT runner with fsattn attention")
    args = vars(xFuserArgs.add_runner_args(parser).parse_args(xdit_argv(ours, rest, supports_cross)))
    # Installed before loading, so that torch.compile warm-ups inside initialize() trace fsattn too.
    handle = install(ours.policy, slot=ours.fsattn_slot, cross_slot=ours.fsattn_cross_slot,
                     backend=ours.fsattn_backend)
    runner = xFuserModelRunner(args)
    input_args = runner.preprocess_args(args)
    runner.initialize(input_args)
    handle.configure_runtime(get_runtime_state(), ours.fsattn_cross_slot)
    handle.follow(runner.model.pipe)
    try:
        output, timings = runner.run(input_args)
        runner.save(output=output, timings=timings)
        if is_last_process():
            print(f"fsattn policy {handle.function.policy.name!r} in xDiT slot {handle.slot.name}:")
            print("\n".join(handle.summary()))
    finally:
        handle.uninstall()
        runner.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""diffusers integration: processors, step-scheduled policies, ``apply`` / ``remove``.

Quick use::

    import fsattn_diffusers
    handle = fsattn_diffusers.apply(pipe, policy="hybrid")   # every transformer's self-attention
    video = pipe(prompt, num_inference_steps=20).frames[0]
    print("\\n".join(handle.summary()))                      # what each step ran
    fsattn_diffusers.remove(pipe)                            # stock processors again
"""

from .install import FSAttnHandle, apply, installed, remove, self_attention_modules, step_summary
from .policy import (EndsPolicy, FixedPolicy, Policy, SchedulePolicy, describe, get_policy, hybrid_policy,
                     parse_schedule)
from .processors import HunyuanVideoFSAttnProcessor, WanFSAttnProcessor, key_padding_lengths
from .tracker import CallRecord, StepTracker

__all__ = [
    "apply", "remove", "installed", "FSAttnHandle", "step_summary", "self_attention_modules",
    "Policy", "FixedPolicy", "SchedulePolicy", "EndsPolicy", "get_policy", "hybrid_policy", "parse_schedule",
    "describe", "WanFSAttnProcessor", "HunyuanVideoFSAttnProcessor", "key_padding_lengths",
    "StepTracker", "CallRecord",
]

"""PSNR against bf16 of each policy on the embedded smoke model, per weight seed, with the recipe that ran at each
denoising step read from the handle's records (issue 41, item 8).

Usage::

    python scripts/smoke_policy_psnr.py [--seeds 20250101,1,2,3,4,5] [--policies mxfp8,mxfp4,mxfp6,hybrid]

The smoke model's defaults (17 frames 128x128, 20 steps, the Quick start's prompt, noise seed 0); frames are
rounded to 8 bits and PSNR pools the MSE over all frames. One thread, the emulator backend.
"""

import argparse
import collections
import math
import time
import warnings

import numpy as np
import torch

import fsattn_diffusers
from fsattn_diffusers.integration.tiny import SEED, tiny_wan22_pipeline
from fsattn_diffusers.pipelines.settings import TINY_WAN22

PROMPT = "a cat grooming itself meticulously with its tongue"


def run(pipe, policy):
    """The video (float64 in [0, 1]) and ``{step: {"recipe(transformer)", ...}}`` from the handle's records."""
    handle = fsattn_diffusers.apply(pipe, policy=policy, backend="emulator")
    try:
        s = TINY_WAN22
        out = pipe(PROMPT, height=s.height, width=s.width, num_frames=s.num_frames, num_inference_steps=s.steps,
                   guidance_scale=s.guidance_scale, guidance_scale_2=s.guidance_scale_2,
                   generator=torch.Generator("cpu").manual_seed(0), output_type="np").frames[0]
        per_step = collections.OrderedDict()
        for r in handle.records:
            per_step.setdefault(r.step, set()).add(f"{r.recipe}({r.transformer})")
    finally:
        fsattn_diffusers.remove(pipe)
    return np.asarray(out, dtype=np.float64), per_step


def psnr(a, b):
    mse = np.mean((np.round(a * 255) - np.round(b * 255)) ** 2)
    return math.inf if mse == 0 else 10 * math.log10(255 ** 2 / mse)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default=f"{SEED},1,2,3,4,5", help="weight seeds of the smoke model")
    p.add_argument("--policies", default="mxfp8,mxfp4,mxfp6,hybrid")
    args = p.parse_args()
    warnings.filterwarnings("ignore", message=".*emulator.*slow")
    torch.set_num_threads(1)
    policies = args.policies.split(",")
    for n, seed in enumerate(int(x) for x in args.seeds.split(",")):
        pipe = tiny_wan22_pipeline(seed=seed)
        pipe.set_progress_bar_config(disable=True)
        t0 = time.perf_counter()
        ref, _ = run(pipe, "bf16")
        cells = []
        for policy in policies:
            video, per_step = run(pipe, policy)
            cells.append(f"{policy} {psnr(video, ref):.1f} dB")
            if n == 0:
                print(f"  {policy}: " + "; ".join(f"{k}: {'/'.join(sorted(v))}" for k, v in per_step.items()))
        print(f"weights seed {seed} ({time.perf_counter() - t0:.0f} s): " + ", ".join(cells), flush=True)


if __name__ == "__main__":
    main()

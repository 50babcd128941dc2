"""q x 1e4 in fp32 on the CPU emulator: each preset's error against float64 softmax attention, next to the
conventional softmax on the same quantized operands (NUMERICS.md section 8). Prints one line per seed and preset."""

import torch

import fsattn_diffusers as fa
from fsattn_diffusers.accuracy import TABLE4_ROWS, error_and_cosine
from fsattn_diffusers.recipe import PRESETS

B, H, S, D = 1, 4, 1024, 128
PRESET_NAMES = ("mxfp8", "mxfp6", "mxfp4", "mxfp8-paper", "mxfp6-paper", "mxfp4-paper")


def main():
    for seed in (0, 1):
        g = torch.Generator().manual_seed(seed)
        q, k, v = (torch.randn(B, H, S, D, generator=g) for _ in range(3))
        q = q * 1e4
        ref = torch.softmax((q.double() @ k.double().transpose(-1, -2)) * D ** -0.5, -1) @ v.double()
        for name in PRESET_NAMES:
            out, st = fa.attention(q, k, v, name, layout="bhsd", backend="emulator", return_stats=True)
            conventional = PRESETS[name].replace(name=name + ":conventional", **TABLE4_ROWS["conventional"])
            conv = fa.attention(q, k, v, conventional, layout="bhsd", backend="emulator")
            e_p, e_c, e_pc = (error_and_cosine(a, b)[0] for a, b in ((out, ref), (conv, ref), (out, conv)))
            print(f"seed {seed} {name}: pipeline {e_p:.2%}, conventional on the same operands {e_c:.2%}, "
                  f"pipeline vs conventional {e_pc:.2%}, rollback rate {st['rollback_rate']:.2f}")


if __name__ == "__main__":
    main()

"""Time Wan's RoPE on one attention operand at Wan2.2-A14B 720p: the processors' torch version, diffusers' own
``apply_rotary_emb`` arithmetic (what the stock bf16 processor runs) and the fused kernel (kernels/rope.py).

Usage (GPU): PYTHONPATH=$PWD python scripts/rope_bench.py [--tokens 75600 --heads 40]
"""
import argparse
import sys

import torch
import triton

sys.path.insert(0, ".")
from fsattn_diffusers.backends.triton_backend import kernels_package  # noqa: E402

kernels_package()
from fsattn_diffusers.integration.processors import _rope_interleaved  # noqa: E402
from fsattn_diffusers.kernels.rope import rope_interleaved  # noqa: E402


def diffusers_rope(x, cos, sin):  # the arithmetic of diffusers 0.42 WanAttnProcessor.apply_rotary_emb
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    c, s = cos[..., 0::2], sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * c - x2 * s
    out[..., 1::2] = x1 * s + x2 * c
    return out.type_as(x)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=75600)
    ap.add_argument("--heads", type=int, default=40)
    a = ap.parse_args()
    s, h, d = a.tokens, a.heads, 128
    x = torch.randn((1, s, h * d), device="cuda", dtype=torch.bfloat16).unflatten(2, (h, d))
    ang = torch.rand((1, s, 1, d // 2), device="cuda") * 100
    cos, sin = torch.cos(ang).repeat_interleave(2, -1), torch.sin(ang).repeat_interleave(2, -1)
    ref = _rope_interleaved(x, cos, sin)
    print("fused == torch:", torch.equal(rope_interleaved(x, cos, sin), ref),
          " diffusers == torch:", torch.equal(diffusers_rope(x, cos, sin), ref))
    for name, fn in (("torch (processors)", _rope_interleaved), ("diffusers", diffusers_rope),
                     ("fused kernel", rope_interleaved)):
        ms = triton.testing.do_bench(lambda: fn(x, cos, sin), warmup=50, rep=500, return_mode="median")
        print(f"{name:<20} {ms:.3f} ms per operand ({2 * x.numel() * 2 / ms * 1e-6:.0f} GB/s of bf16 in+out)")


if __name__ == "__main__":
    main()

"""Reproduce the hang of the gluon_pingpong kernel with MXFP6 P and kv_lens (why kernels.ops.effective_variant runs
such calls on the triton kernel). Each case runs in a subprocess with a timeout; on the H200 (2026-12-01, triton 3.6):

    (B, H, S_q, S_k, D) = (1, 2, 256, 77, 128), kv_lens None -> runs; kv_lens [77] -> hangs
    (1, 2, 256, 256, 128), kv_lens [64], [96], [97] -> hang; (1, 2, 256, 300, 128), kv_lens [200] -> runs
    (1, 1, 128, 256, 128), kv_lens [100], [128], [129] -> run
    mxfp8 (fp8_row P) ran (1, 2, 256, 384, 128) with kv_lens [77] and (1, 1, 128, 256, 128) with [100]

(Those results came from an equivalent diagnostic run with int64 kv_lens; this script itself has not yet run on a GPU.)

    python scripts/repro_gluon_mxfp6_kv_lens_hang.py [--timeout S]

The gluon path is forced by patching the variant choice; the outputs are compared with the sm90 reference.
"""

import argparse
import subprocess
import sys

CASES = [((1, 2, 256, 77, 128), None), ((1, 2, 256, 77, 128), [77]), ((1, 2, 256, 256, 128), [97]),
         ((1, 2, 256, 300, 128), [200]), ((1, 1, 128, 256, 128), [100])]


def run_one(recipe: str, shape, lens) -> None:
    import torch

    from fsattn_diffusers.emulator import sm90_reference_attention
    from fsattn_diffusers.kernels import ops
    from fsattn_diffusers.kernels.plan import plan_for
    from fsattn_diffusers.recipe import get_recipe

    ops.effective_variant = lambda variant, plan, has_kv_lens=False: ops.GLUON_PINGPONG
    b, h, s_q, s_k, d = shape
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, generator=g).to(torch.bfloat16).cuda() for s in (s_q, s_k, s_k))
    kv = None if lens is None else torch.tensor(lens, device="cuda", dtype=torch.int32)
    plan = plan_for(get_recipe(recipe))
    operands = ops.prepass(q, k, v, plan, d ** -0.5, kv)
    out = torch.full_like(q, float("nan"))
    ops.attention_from_operands(operands, out, plan, s_q, s_k, kv, None, None)
    torch.cuda.synchronize()
    ref, _, _ = sm90_reference_attention(q, k, v, get_recipe(recipe), scale=d ** -0.5, kv_lens=kv)
    err = float((out.double() - ref.double()).norm() / ref.double().norm())
    print(f"ran, relative difference to the sm90 reference {err:.2e}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per case (default 30)")
    parser.add_argument("--case", nargs=3, help=argparse.SUPPRESS)  # recipe, shape, lens: the subprocess's own call
    args = parser.parse_args()
    if args.case:
        recipe, shape, lens = args.case
        run_one(recipe, tuple(int(x) for x in shape.split(",")), None if lens == "-" else [int(lens)])
        return 0
    for recipe in ("mxfp6", "mxfp8"):
        for shape, lens in CASES:
            label = f"{recipe} {shape} kv_lens={lens}"
            cmd = [sys.executable, __file__, "--case", recipe, ",".join(map(str, shape)),
                   "-" if lens is None else str(lens[0])]
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
                print(f"{label}: {(p.stdout.strip() or p.stderr.strip()[-400:])}", flush=True)
            except subprocess.TimeoutExpired:
                print(f"{label}: no result after {args.timeout:.0f} s (hang)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Which arithmetic the INT8 kernel computes when its Stage-A reads the biased scores with FP8 P (docs/design.md, "The
INT8 tiers' speed": the biased form with FP8 P put the LSE of 1-2.5% of the rows 0.018-0.069 nats from its reference).

The kernel is built from a copy of kernels/sm90/fused_attention_gluon_int8.py with ``BIASED`` true for FP8 P too (a
temporary module beside it, removed at exit) and set against four references of ``int8-fp8``: the unbiased scores
(the kernel in the tree), the biased form as sm90_numerics difference 14 models it (``Xb a - k`` one FMA, ``k`` one
FMA), the product ``Xb a`` rounded before the subtraction, and ``k`` with two roundings. The reference whose LSE the
kernel meets (rows > 1e-3: 0) names what it computes. Without a GPU (or ``KERNEL=emulator``) the emulator patched as
the modelled form stands in for the kernel: a check of the script itself.

    OUT=$OUT/d bash -c 'source scripts/device_env.sh && python3 scripts/int8_fp8_biased_stage_a_diagnosis.py'
"""
import atexit
import importlib
import os
import sys

import torch

import fsattn_diffusers as fa
from fsattn_diffusers import numerics as N
import fsattn_diffusers.sm90_numerics as sm90
from fsattn_diffusers.measure.structured_inputs import FAMILIES
from fsattn_diffusers.backends import reference_attention
from fsattn_diffusers.recipe import get_recipe

dev = "cuda" if torch.cuda.is_available() else "cpu"
KERNEL = os.environ.get("KERNEL", "triton" if dev == "cuda" else "emulator")
if KERNEL == "triton":  # the kernel module with BIASED for FP8 P, in place of the tree's
    from fsattn_diffusers.kernels.sm90 import fused_attention_gluon_int8 as tree
    src = open(tree.__file__).read()
    line = "    BIASED: gl.constexpr = not PV_FP8 "
    assert line in src, "the kernel's BIASED line moved; update this script"
    path = os.path.join(os.path.dirname(tree.__file__), "_int8_biased_fp8_diagnosis.py")
    with open(path, "w") as fh:
        fh.write(src.replace(line, "    BIASED: gl.constexpr = True "))
    atexit.register(os.remove, path)
    sys.modules[tree.__name__] = importlib.import_module(tree.__package__ + "._int8_biased_fp8_diagnosis")
M = sm90.I2F_MAGIC
orig_ts, orig_sa = N.SM90Int8Numerics.tile_scores, N.SM90Int8Numerics.stage_a


def f32(t):
    """Rounded to float32 once, kept in float64 (the FMA's one rounding when ``t`` is exact)."""
    return t.float().double()


def variant(name):
    """``(tile_scores, stage_a)`` of SM90Int8Numerics computing candidate ``name`` with FP8 P."""
    def ts(self, q, k):
        s = torch.matmul(q[..., :-1], k[..., :-1].transpose(1, 2))
        a = q[..., -1:] * k[..., -1][:, None, :]
        return s * a, N.ScoreParts(s, a)

    def sa(self, x, m, parts=None):
        if parts is None:
            return self._stage_a_scores(x, m)
        xb, a, mm, sg = parts.s.double() + M, parts.a.double(), m.double()[..., None], self.p_scale_log2
        if name == "R1_modelled":
            y = f32(xb * a - f32(a * M + (mm - sg)))
        elif name == "R2_product_rounded":
            y = f32(f32(xb * a) - f32(a * M + (mm - sg)))
        elif name == "R3_k_two_roundings":
            y = f32(xb * a - f32(f32(a * M) + (mm - sg)))
        p = torch.nan_to_num(torch.exp2(y.float()), nan=0.0)
        return p if parts.rows is None else torch.where(parts.rows[..., None], p, self._stage_a_scores(x, m))
    return ts, sa


def spiky():
    """tests/test_kernel_int8_gpu.py's rollback case."""
    from kernel_device import make
    q, k, v = make(1, 2, 256, 1024, 128, "bhsd", seed=5, spiky=True)
    k[:, :, 700] *= 40.0
    return q, k, v


sys.path.insert(0, "tests")
cases = {"sharp": lambda: FAMILIES["sharp"](1, 3, 1000, 128, torch.bfloat16, dev, 0),
         "k_channel_outliers": lambda: FAMILIES["k_channel_outliers"](1, 3, 1000, 128, torch.bfloat16, dev, 0)}
if dev == "cuda":
    cases["spiky"] = spiky
rec = get_recipe("int8-fp8")
for fam, mk in cases.items():
    q, k, v = mk()
    if KERNEL == "emulator":  # the script's own check: the emulator patched as R1 stands in for the kernel
        N.SM90Int8Numerics.tile_scores, N.SM90Int8Numerics.stage_a = variant("R1_modelled")
    out, lse = reference_attention("triton", q, k, v, rec, scale=128 ** -0.5)[:2] if KERNEL == "emulator" else \
        fa.attention(q, k, v, rec, layout="bhsd", backend="triton", return_lse=True)
    N.SM90Int8Numerics.tile_scores, N.SM90Int8Numerics.stage_a = orig_ts, orig_sa
    for name in ("R0_unbiased", "R1_modelled", "R2_product_rounded", "R3_k_two_roundings"):
        if name != "R0_unbiased":
            N.SM90Int8Numerics.tile_scores, N.SM90Int8Numerics.stage_a = variant(name)
        ro, rl = reference_attention("triton", q, k, v, rec, scale=128 ** -0.5)[:2]
        N.SM90Int8Numerics.tile_scores, N.SM90Int8Numerics.stage_a = orig_ts, orig_sa
        fin = torch.isfinite(rl)
        d = (lse[fin] - rl[fin]).abs()
        print(f"{fam:<20} {name:<22} lse max {d.max().item():.2e} rows>1e-3 {(d > 1e-3).float().mean().item():.4f} "
              f"out max {(out.float() - ro.float()).abs().max().item():.2e}", flush=True)

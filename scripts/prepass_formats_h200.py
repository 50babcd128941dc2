"""The pre-pass by operand format (mxfp8, mxfp6, mxfp4) and by kernel: K's token mean, K (mean, flags), Q (flags), V
and the whole pre-pass, for the element roundings (short forms against common.round_elem), the register caps of the
Q/K and MX V kernels, and a reference copy of the kernels (REF_KERNELS, a package directory holding another commit's
kernels/, optional). Every configuration's operands are compared bit for bit with the first one's. Paper and Wan2.2
720p shapes. Run on the H200 from the repository root:
    source scripts/device_env.sh; [REF_KERNELS=dir] python3 scripts/prepass_formats_h200.py"""
import importlib
import os
import sys

import torch

from fsattn_diffusers.exponent import LOG2E
from fsattn_diffusers.kernels import ops as kops
from fsattn_diffusers.kernels import prepass as pp
from fsattn_diffusers.kernels.plan import plan_for
from fsattn_diffusers.kernels.token_mean import token_mean
from fsattn_diffusers.measure.kernel_bench import timed
from fsattn_diffusers.recipe import get_recipe

W, R = 25, 120
ref = None
if os.environ.get("REF_KERNELS"):
    parent, name = os.path.split(os.path.abspath(os.environ["REF_KERNELS"]))
    sys.path.insert(0, parent)
    ref = (importlib.import_module(f"{name}.prepass"), importlib.import_module(f"{name}.ops"))
CONFIGS = {  # name: (prepass module, ops module, FAST_ELEM_ROUNDING, QK_MAX_REGS, V_MAX_REGS (MX V only))
    "round_elem, no caps": (pp, kops, False, None, None),
    "short roundings, no caps": (pp, kops, True, None, None),
    "short roundings, caps 128 (default)": (pp, kops, True, 128, 128),
}
if ref is not None:
    CONFIGS = {"reference kernels": (ref[0], ref[1], None, None, None), **CONFIGS}


def compare(got, want):
    """'bit-identical', 'equal values (N zeros of the other sign)' or 'VALUES DIFFER (N)' over the operand tensors."""
    n_bits = n_vals = 0
    for a, c in zip(got, want):
        if a.dtype == torch.float8_e4m3fn:  # NaN (K's padded keys) equals NaN
            n_bits += int((a.view(torch.uint8) != c.view(torch.uint8)).sum())
            af, cf = a.float(), c.float()
            n_vals += int(((af != cf) & ~(af.isnan() & cf.isnan())).sum())
        else:
            n_bits += int((a != c).sum())
            n_vals += int((a != c).sum())
    if n_vals:
        return f"VALUES DIFFER ({n_vals})"
    return "bit-identical" if not n_bits else f"equal values ({n_bits} zeros of the other sign)"


DEFAULTS = (pp.FAST_ELEM_ROUNDING, pp.QK_MAX_REGS, pp.V_MAX_REGS)
for shape in [(1, 24, 32768, 128), (1, 40, 75600, 128)]:
    b, h, s, d = shape
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(shape, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    scale = d ** -0.5
    flags = torch.zeros((b * h,), dtype=torch.int32, device="cuda")
    print(f"== {shape}", flush=True)
    print(f"  token_mean(K): {timed(lambda: token_mean(k), W, R):.3f} ms")
    for recipe in ("mxfp8", "mxfp6", "mxfp4"):
        plan = plan_for(get_recipe(recipe))
        km = token_mean(k)
        first = None
        for name, (mod, ops_mod, fast, qk_cap, v_cap) in CONFIGS.items():
            if fast is not None:
                mod.FAST_ELEM_ROUNDING, mod.QK_MAX_REGS, mod.V_MAX_REGS = fast, qk_cap, v_cap
            fk = lambda: mod.prepare_qk(k, plan, 1.0, tile_ref=True, nan_pad=True, mean=km, flags=flags)
            fq = lambda: mod.prepare_qk(q, plan, scale * LOG2E, tile_ref=True, flags=flags)
            fv = lambda: mod.prepare_v(v, plan, None, perm=True, flags=flags)
            fall = lambda: ops_mod.prepass(q, k, v, plan, scale, None, flags=flags)
            got = list(fk()[:2] + fq()[:2] + fv())
            if first is None:
                first, same = got, "(the operands compared against)"
            else:
                same = compare(got, first)
            tk, tq, tv, ta = (timed(f, W, R) for f in (fk, fq, fv, fall))
            print(f"  {recipe} {name:<36} K {tk:.3f}  Q {tq:.3f}  V {tv:.3f}  whole pre-pass {ta:.3f} ms  {same}",
                  flush=True)
        pp.FAST_ELEM_ROUNDING, pp.QK_MAX_REGS, pp.V_MAX_REGS = DEFAULTS
    del q, k, v
    torch.cuda.empty_cache()

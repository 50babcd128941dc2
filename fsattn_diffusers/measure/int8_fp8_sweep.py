"""CPU measurements that choose the Hopper speed tier's numerics (``int8-fp8``) against the model of SageAttention 2.

Every column runs on the same structured-suite inputs (:mod:`.structured_inputs`) in one process: the emulator in the
numerics of the Hopper kernels (those :data:`~fsattn_diffusers.measure.KERNEL_BACKEND` computes) for the INT8-Q/K +
FP8-P/V variants, :func:`.sage2_model.sage2_hopper_attention` for SageAttention 2, and exact float64 attention as the
reference. A variant is the preset with recipe changes (``"int8-fp8+exponential=
exact"``) and, for choices the library does not offer as a recipe field, one of :data:`MEASURE_ONLY`:

* ``sigma6``: P carried as ``E4M3(P 2^6)`` with the gate at 2 doublings (instead of ``2^4`` and 4);
* ``u8``: Stage-A's single-stage U8 proxy read as E4M3 (the exponent rounded in the log domain, no E4M3 cast);
* ``vblock``: V in E4M3 with one scale per channel and 128-key tile; ``vsmooth``: V's BF16 per-channel mean
  subtracted before the quantization and added to the output (exact: P's rows sum to the row sum).

``python -m fsattn_diffusers.measure.int8_fp8_sweep --shape 1,2,2048 --json OUT.json --variants ...``
"""

from __future__ import annotations

import argparse
import contextlib
import math
import time
from typing import Callable, Dict, List, Sequence

import torch

from .. import emulator as emulator_module
from ..emulator import emulate_attention
from ..exponent import PROXY_LAYOUT, SCHRAUDOLPH_EPS, U8_MAX_CODE
from ..formats import E4M3, QKFormat, round_to_elem
from ..numerics import numerics_for
from ..smoothing import subtract_mean, token_mean
from ..testing import exact_attention, relative_error
from . import kernel_recipe
from .provenance import finish, module_command
from .results_tables import at_sage_accuracy, sage_ratio_summary
from .sage2_model import sage2_hopper_attention
from .structured_inputs import FAMILIES
from .structured_suite import DTYPES

#: Measure-only changes of the kernels' INT8 numerics (module docstring), applied after the recipe's own.
MEASURE_ONLY = ("sigma6", "u8", "vblock", "vsmooth")
SAGE = "sage2-model"


class _Variant:
    """The :data:`MEASURE_ONLY` changes in ``extras``, mixed into the numerics class the kernels compute an INT8
    recipe in (:func:`_numerics`)."""

    extras: Sequence[str] = ()

    def __init__(self, recipe):
        super().__init__(recipe)
        if "sigma6" in self.extras:
            self.p_scale_log2, self.cap_log2 = 6, min(self.cap_log2, 2)

    def operands(self, q, k, v, scale, valid, bias=None):
        out = list(super().operands(q, k, v, scale, valid, bias))
        if "vblock" in self.extras:  # E4M3 with amax / 448 per channel and 128-key tile
            y = v.to(torch.float32).to(torch.bfloat16).to(torch.float32)
            b, h, s, d = y.shape
            pad = (-s) % self.tile_n
            yb = torch.nn.functional.pad(y, (0, 0, 0, pad)).reshape(b, h, -1, self.tile_n, d)
            amax = yb.abs().amax(dim=-2, keepdim=True)
            sc = torch.where(amax > 0, amax / E4M3.max_value, torch.ones_like(amax))
            out[2] = (round_to_elem(yb / sc, E4M3) * sc).reshape(b, h, -1, d)[:, :, :s]
        return tuple(out)

    def stage_a(self, x, m, parts=None):  # ``u8`` reads the scores, not the biased parts (sm90_numerics diff. 14)
        if "u8" not in self.extras:
            return super().stage_a(x, m, parts)
        mbits, bias, _ = PROXY_LAYOUT["u8"]
        t = torch.round((x.double() - m.double()[..., None]) * 2.0 ** mbits
                        + 2.0 ** mbits * (bias - SCHRAUDOLPH_EPS + self.p_scale_log2))
        t = torch.clamp(torch.nan_to_num(t, nan=0.0, neginf=0.0), 0, U8_MAX_CODE).to(torch.uint8)
        return t.view(torch.float8_e4m3fn).to(torch.float32)


@contextlib.contextmanager
def _numerics(recipe, extras: Sequence[str]):
    """Make the emulator build ``recipe``'s numerics with :class:`_Variant`'s ``extras`` mixed in, for ``recipe``."""
    if not extras:
        yield
        return
    original = emulator_module.numerics_for
    cls = type("Variant", (_Variant, type(original(recipe))), {"extras": tuple(extras)})
    emulator_module.numerics_for = lambda r: cls(r) if r == recipe else original(r)
    try:
        yield
    finally:
        emulator_module.numerics_for = original


def variant_fn(spec: str) -> Callable:
    """``fn(q, k, v, scale) -> out`` for a column spec: :data:`SAGE`, or ``recipe[:extra,extra]``."""
    if spec == SAGE:
        return lambda q, k, v, sc: sage2_hopper_attention(q, k, v, scale=sc)
    name, _, extra = spec.partition(":")
    extras = [e for e in extra.split(",") if e]
    for e in extras:
        if e not in MEASURE_ONLY:
            raise ValueError(f"unknown measure-only change {e!r}; accepted: {', '.join(MEASURE_ONLY)}")
    recipe = kernel_recipe(name)
    numerics_for(recipe)  # refuse a recipe the kernels' numerics do not take, before any input is drawn
    changes = [e for e in extras if e != "vsmooth"]  # those of the numerics class
    if changes and recipe.qk_format != QKFormat.INT8:
        raise ValueError(f"{', '.join(changes)} change the INT8 Q/K numerics; {name} has qk_format "
                         f"{recipe.qk_format}; accepted: a recipe with qk_format int8 (e.g. int8-fp8)")

    def fn(q, k, v, sc):
        mean = None
        if "vsmooth" in extras:
            mean = token_mean(v)
            v = subtract_mean(v, mean)
        with _numerics(recipe, changes):
            out = emulate_attention(q, k, v, recipe, scale=sc)[0]
        return out if mean is None else (out.to(torch.float32) + mean).to(q.dtype)
    return fn


def run(shape, head_dims, dtypes, families, seeds: int, specs: List[str], progress=print) -> Dict:
    """Errors against exact attention of every column spec on every (family, dtype, D) cell, mean over seeds."""
    b, h, s = shape
    fns = {spec: variant_fn(spec) for spec in specs}
    cells = []
    for dt in dtypes:
        for d in head_dims:
            for fam in families:
                errs = {spec: [] for spec in specs}
                t0 = time.perf_counter()
                for seed in range(seeds):
                    q, k, v = FAMILIES[fam](b, h, s, d, DTYPES[dt], "cpu", seed)
                    sc = 1.0 / math.sqrt(d)
                    ref = exact_attention(q, k, v, scale=sc)[0]
                    for spec, fn in fns.items():
                        out = fn(q, k, v, sc)
                        if not torch.isfinite(out).all():
                            raise RuntimeError(f"{spec} gave a non-finite output on {fam} {dt} D={d} seed {seed}")
                        errs[spec].append(relative_error(out, ref))
                cell = {"family": fam, "dtype": dt, "head_dim": d,
                        "err": {spec: sum(e) / len(e) for spec, e in errs.items()}}
                cells.append(cell)
                progress(f"{fam} {dt} D={d} ({time.perf_counter() - t0:.0f} s): " +
                         ", ".join(f"{spec} {v:.4f}" for spec, v in cell["err"].items()))
    return {"shape": list(shape), "head_dims": list(head_dims), "dtypes": list(dtypes), "families": list(families),
            "seeds": seeds, "columns": specs, "cells": cells, "bars": bars(cells, specs)}


def bars(cells: List[Dict], specs: List[str], against: str = SAGE) -> Dict:
    """SageAttention 2's accuracy (:data:`~.results_tables.AT_SAGE_ACCURACY`) per column against ``against``: gaussian
    ratio (max over its cells), geomean over all cells, worst cell."""
    if against not in specs:
        return {}
    out = {}
    for spec in specs:
        if spec == against:
            continue
        ratios = [(c["err"][spec] / c["err"][against], c) for c in cells]
        summary = sage_ratio_summary([(r, c["family"]) for r, c in ratios])
        worst_c = max(ratios, key=lambda rc: rc[0])[1]
        out[spec] = {"gaussian_max": summary["gaussian"] if math.isfinite(summary["gaussian"]) else None,
                     "geomean": summary["geomean"], "worst": summary["worst"],
                     "worst_cell": f"{worst_c['family']} {worst_c['dtype']} D={worst_c['head_dim']}",
                     "pass": at_sage_accuracy(summary)}
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="1,2,2048")
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--variants", required=True, help=f"comma-separated column specs separated by ';' "
                    f"(recipe[:extra,...] or {SAGE})")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    specs = [v for v in args.variants.split(";") if v]
    try:
        out = run(tuple(int(x) for x in args.shape.split(",")), [int(x) for x in args.head_dims.split(",")],
                  args.dtypes.split(","), args.families.split(","), args.seeds, specs)
    except ValueError as exc:  # a column spec or recipe the numerics refuse: one line
        ap.error(str(exc))
    out["command"] = module_command(__spec__.name, argv)
    finish(out, args.json, out["bars"])


if __name__ == "__main__":
    main()

"""Validate the CPU model of SageAttention 2's Hopper kernel (:mod:`.sage2_model`) against the ``sage`` column an H200
measured in a structured-suite result file (``benchmarks/results/structured_accuracy_int8_h200.json``).

The suite's cells are (family, dtype, head dim) at the file's shape and seeds, every query row. The model computes the
same inputs (the generators draw on the CPU from the seed, so both see the same tensors) on a subset of whole 16-row
query blocks (Sage's INT8 Q groups lie within one) and all keys, and compares with exact attention on those rows.

``python -m fsattn_diffusers.measure.sage2_check RESULT.json --rows 512 --json OUT.json``
"""

from __future__ import annotations

import argparse
import json
import math
import time
from typing import Dict, List, Optional

import torch

from ..testing import exact_attention, relative_error
from .provenance import finish, module_command
from .sage2_model import SAGE_Q_WARP, sage2_hopper_attention
from .structured_inputs import FAMILIES
from .structured_suite import DTYPES


def block_rows(s_q: int, rows: Optional[int], seed: int) -> Optional[torch.Tensor]:
    """``rows`` query rows in whole 16-row blocks chosen at random (seed ``10_000 + seed``), sorted; None for all."""
    if rows is None or rows >= s_q:
        return None
    gen = torch.Generator().manual_seed(10_000 + seed)
    n_blocks = s_q // SAGE_Q_WARP
    blocks = torch.randperm(n_blocks, generator=gen)[:max(1, rows // SAGE_Q_WARP)].sort().values
    return (blocks[:, None] * SAGE_Q_WARP + torch.arange(SAGE_Q_WARP)[None, :]).flatten()


def model_cell(family: str, dtype: str, d: int, shape, seeds: int, rows: Optional[int],
               acc_mant_bits: Optional[int] = None, heads: Optional[int] = None) -> float:
    """Mean over seeds of the model's relative error against exact attention on the chosen rows of the first
    ``heads`` heads (all by default; every head is drawn, so a head's inputs are those of the full shape)."""
    b, h, s = shape
    errs = []
    for seed in range(seeds):
        q, k, v = (t[:, :heads] for t in FAMILIES[family](b, h, s, d, DTYPES[dtype], "cpu", seed))
        sel = block_rows(s, rows, seed)
        ref = exact_attention(q if sel is None else q[:, :, sel], k, v, scale=1.0 / math.sqrt(d))[0]
        out = sage2_hopper_attention(q, k, v, scale=1.0 / math.sqrt(d), q_rows=sel, acc_mant_bits=acc_mant_bits)
        errs.append(relative_error(out, ref))
    return sum(errs) / len(errs)


def compare(measured: Dict, rows: Optional[int], families: Optional[List[str]] = None,
            acc_mant_bits: Optional[int] = None, heads: Optional[int] = None, seeds: Optional[int] = None,
            progress=print) -> Dict:
    """Model against the ``sage`` column of a structured-suite result (the file's ``result`` and ``meta``)."""
    meta, result = measured["meta"], measured["result"]
    shape, seeds = tuple(meta["shape"]), min(int(meta["seeds"]), seeds or int(meta["seeds"]))
    cells = []
    for case in result["cases"]:
        if families and case["family"] not in families:
            continue
        meas = case["columns"].get("sage", {}).get("err")
        if meas is None:
            continue
        t0 = time.perf_counter()
        model = model_cell(case["family"], case["dtype"], case["head_dim"], shape, seeds, rows, acc_mant_bits, heads)
        cells.append({"family": case["family"], "dtype": case["dtype"], "head_dim": case["head_dim"],
                      "measured": meas, "model": model, "ratio": model / meas})
        progress(f"{case['family']} {case['dtype']} D={case['head_dim']}: model {model:.5f} measured {meas:.5f} "
                 f"ratio {model / meas:.3f} ({time.perf_counter() - t0:.1f} s)")
    return {"shape": list(shape), "seeds": seeds, "query_rows": rows, "heads": heads, "acc_mant_bits": acc_mant_bits,
            "cells": cells, "summary": summarize(cells)}


def geomean(values: List[float]) -> float:
    return math.exp(sum(math.log(x) for x in values) / len(values)) if values else float("nan")


def summarize(cells: List[Dict]) -> Dict:
    """Per family: geometric mean and extremes of model / measured; over all cells the same."""
    fams: Dict[str, List[float]] = {}
    for c in cells:
        fams.setdefault(c["family"], []).append(c["ratio"])
    ratios = [c["ratio"] for c in cells]
    worst = max(cells, key=lambda c: abs(math.log(c["ratio"]))) if cells else None
    return {"per_family": {f: {"geomean": geomean(r), "min": min(r), "max": max(r)} for f, r in fams.items()},
            "geomean": geomean(ratios), "worst": worst}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("result", help="structured-suite result JSON with a 'sage' column")
    ap.add_argument("--rows", type=int, default=512, help="query rows per seed (whole 16-row blocks); 0: all")
    ap.add_argument("--families", default=None, help="comma-separated families (default all)")
    ap.add_argument("--heads", type=int, default=None, help="first heads only (default all)")
    ap.add_argument("--seeds", type=int, default=None, help="first seeds only (default the file's)")
    ap.add_argument("--acc-mant-bits", type=int, default=None, help="model the tile's FP8 PV accumulation")
    ap.add_argument("--json", default=None, help="write the comparison here")
    args = ap.parse_args(argv)
    with open(args.result) as fh:
        measured = json.load(fh)
    out = compare(measured, args.rows or None, args.families.split(",") if args.families else None,
                  args.acc_mant_bits, args.heads, args.seeds)
    out["command"] = module_command(__spec__.name, argv)
    out["measured_file"] = {key: measured["meta"].get(key) for key in ("command", "date", "commit", "device")}
    finish(out, args.json, out["summary"])


if __name__ == "__main__":
    main()

"""O's fp32 promotion interval on Hopper: the kernels' reference with the FP8 wgmma's accumulation modelled
(:mod:`fsattn_diffusers.numerics_accumulation`) at ``Recipe.o_promotion_tiles`` = 1, 2, 4, ..., never.

For each (family, recipe, interval): the output's error against exact attention and its distance from the every-tile
result (``||out_n - out_1|| / ||out_1||``), on the first ``rows`` query rows (query tile 0, whose key order and
statistics are those of the full call for the natural and diagonal orders alike) against all ``S`` keys. ``--model-1``
also runs interval 1 with the tile's own four chained wgmmas modelled (the every-tile kernel as it is); without it
``out_1`` is the reference's fp32 sum per tile.

``python -m fsattn_diffusers.measure.promotion_interval --keys 32768 --rows 128 --json OUT.json``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import time
from typing import Dict, List, Optional

from .. import emulator as em
from ..emulator import emulate_attention
from ..testing import exact_attention, relative_error
from . import kernel_recipe
from .provenance import finish, module_command
from .structured_inputs import FAMILIES
from .structured_suite import DTYPES


def run(families: List[str], recipes: List[str], intervals: List[Optional[int]], keys: int, rows: int, d: int,
        dtype: str, seed: int, heads: int = 1, model_1: bool = False, progress=print) -> Dict:
    """The table described in the module docstring: one dict per (family, recipe, interval)."""
    table = []
    for fam in families:
        q, k, v = FAMILIES[fam](1, heads, keys, d, DTYPES[dtype], "cpu", seed)
        q = q[:, :, :rows]
        sc = 1.0 / math.sqrt(d)
        ref = exact_attention(q, k, v, scale=sc)[0]
        for name in recipes:
            base = kernel_recipe(name)
            outs = {}
            todo = [("1", 1)] + ([("1-modelled", 1)] if model_1 else []) + [
                ("never" if n is None else str(n), n) for n in intervals if n != 1]
            for label, n in todo:
                recipe = base.replace(o_promotion_tiles=n)
                t0 = time.perf_counter()
                with _every_tile_modelled(label == "1-modelled"):
                    outs[label] = emulate_attention(q, k, v, recipe, scale=sc)[0]
                row = {"family": fam, "recipe": name, "interval": label, "err": relative_error(outs[label], ref),
                       "vs_every_tile": relative_error(outs[label], outs["1"]), "seconds": time.perf_counter() - t0}
                table.append(row)
                progress(json.dumps(row))
        del q, k, v, ref
    return {"rows": table}


@contextlib.contextmanager
def _every_tile_modelled(on: bool):
    """While on: the emulator's numerics model the PV accumulation at interval 1 too (the tile's chained wgmmas)."""
    if not on:
        yield
        return
    original = em.numerics_for

    def patched(recipe):
        num = original(recipe)
        num.__class__ = type("EveryTileModelled", (type(num),), {"models_pv_accumulation": True})
        return num
    em.numerics_for = patched
    try:
        yield
    finally:
        em.numerics_for = original


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default="clustered,sharp")
    ap.add_argument("--recipes", default="mxfp8,int8-fp8")
    ap.add_argument("--intervals", default="2,4,8,none", help="besides 1; 'none': never")
    ap.add_argument("--keys", type=int, default=32768)
    ap.add_argument("--rows", type=int, default=128)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--heads", type=int, default=1)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model-1", action="store_true", help="also interval 1 with the tile's wgmmas modelled")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    intervals = [None if x.lower() in ("none", "never", "0") else int(x) for x in args.intervals.split(",")]
    out = run(args.families.split(","), args.recipes.split(","), intervals, args.keys, args.rows, args.head_dim,
              args.dtype, args.seed, args.heads, args.model_1)
    out.update(command=module_command(__spec__.name, argv), keys=args.keys, query_rows=args.rows,
               head_dim=args.head_dim, heads=args.heads, dtype=args.dtype, seed=args.seed)
    finish(out, args.json)


if __name__ == "__main__":
    main()

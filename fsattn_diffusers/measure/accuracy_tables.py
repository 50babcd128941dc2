"""Reproductions of the paper's accuracy tables: Table 8 (proxy widths) and Table 4 (component ablation).

Every row carries our value and the paper's side by side (``ours``, ``paper``).
"""

from __future__ import annotations

import math
import time
from typing import Dict, List, Optional, Sequence

import torch

from ..emulator import emulate_attention
from ..exponent import SCHRAUDOLPH_EPS
from ..recipe import BF16_EMULATED, PAPER_SUFFIX, PRESETS, Recipe
from ..testing import error_and_cosine
from .provenance import recipe_record

# Paper Table 8: proxy -> (mantissa bits M, exponent bits E, min %, max %, RMS %, added RMS %).
PAPER_TABLE8 = {
    "continuous": (None, None, -3.939, 1.966, 1.770, None),
    "U32/FP32": (23, 8, -3.939, 1.966, 1.770, 0.000),
    "U16/FP16": (10, 5, -3.972, 2.000, 1.770, 0.020),
    "U16/BF16": (7, 8, -4.199, 2.242, 1.777, 0.162),
    "U8/E4M3": (3, 4, -8.012, 6.398, 3.141, 2.595),
}
# Samples of the fractional part f over one doubling for Table 8.
TABLE8_SAMPLES = 1 << 20


def schraudolph_relative_error(mbits: Optional[int], samples: int = TABLE8_SAMPLES) -> torch.Tensor:
    """Relative error ``(1 + f_hat) / 2^(f + eps) - 1`` over f in [0, 1) (Appendix B).

    ``f_hat = round(f 2^M) / 2^M`` (``mbits=None``: the continuous ramp, ``f_hat = f``). float64.
    """
    f = (torch.arange(samples, dtype=torch.float64) + 0.5) / samples
    f_hat = f if mbits is None else torch.round(f * 2.0 ** mbits) / 2.0 ** mbits
    return (1.0 + f_hat) / torch.exp2(f + SCHRAUDOLPH_EPS) - 1.0


def table8() -> List[Dict]:
    """Rows of Table 8 with ``ours`` and ``paper`` (percent)."""
    cont_rms = schraudolph_relative_error(None).pow(2).mean().sqrt().item()
    rows = []
    for proxy, (mbits, ebits, pmin, pmax, prms, padd) in PAPER_TABLE8.items():
        err = schraudolph_relative_error(mbits)
        rms = err.pow(2).mean().sqrt().item()
        added = None if mbits is None else math.sqrt(max(rms ** 2 - cont_rms ** 2, 0.0)) * 100
        rows.append({
            "proxy": proxy, "M": mbits, "E": ebits,
            "reach_log2": None if ebits is None else 2 ** (ebits - 1),
            "ours": {"min": err.min().item() * 100, "max": err.max().item() * 100, "rms": rms * 100,
                     "added_rms": added},
            "paper": {"min": pmin, "max": pmax, "rms": prms, "added_rms": padd},
        })
    return rows


#: The shape (B, H, S, D) and seed count of the paper's Table 4.
PAPER_TABLE4_SHAPE, PAPER_TABLE4_SEEDS = (1, 24, 32768, 128), 10
# Paper Table 4 (b=1, h=24, s=32768, d=128, ten seeds): row -> column -> (err %, cos).
PAPER_TABLE4 = {
    "conventional": {"bf16": (0.0, 1.0), "mxfp8": (5.39, 0.99855), "mxfp6": (6.17, 0.99810), "mxfp4": (20.45, 0.97890)},
    "+ l as GEMM": {"bf16": (0.026, 1.0), "mxfp8": (5.39, 0.99855), "mxfp6": (6.17, 0.99810), "mxfp4": (20.45, 0.97890)},
    "+ frozen max": {"bf16": (0.310, 1.0), "mxfp8": (5.42, 0.99853), "mxfp6": (6.17, 0.99810), "mxfp4": (20.45, 0.97890)},
    "+ Schraudolph U16": {"bf16": (1.798, 0.99984), "mxfp8": (5.69, 0.99838), "mxfp6": (6.46, 0.99791), "mxfp4": (20.53, 0.97872)},
    "U32 proxy": {"bf16": (1.798, 0.99984), "mxfp8": (5.69, 0.99838), "mxfp6": (6.46, 0.99791), "mxfp4": (20.53, 0.97872)},
    "U8 proxy": {"bf16": (3.69, 0.99934), "mxfp8": (5.99, 0.99822), "mxfp6": (6.71, 0.99775), "mxfp4": (20.64, 0.97854)},
}
TABLE4_COLUMNS = ("bf16", "mxfp8", "mxfp6", "mxfp4")
TABLE4_ROWS = {
    "conventional": dict(exponential="exact", frozen_max=False, rowsum_gemm=False),
    "+ l as GEMM": dict(exponential="exact", frozen_max=False, rowsum_gemm=True),
    "+ frozen max": dict(exponential="exact", frozen_max=True, rowsum_gemm=True),
    "+ Schraudolph U16": dict(exponential="schraudolph", proxy="u16", frozen_max=True, rowsum_gemm=True),
    "U32 proxy": dict(exponential="schraudolph", proxy="u32", frozen_max=True, rowsum_gemm=True),
    "U8 proxy": dict(exponential="schraudolph", proxy="u8", frozen_max=True, rowsum_gemm=True),
}


def paper_preset(name: str) -> Recipe:
    """The paper-faithful preset of a Table 4 column ``name``: ``PRESETS[name + "-paper"]`` where it exists, else
    ``PRESETS[name]``; the paper's BF16 column is the ``bf16-emulated`` preset."""
    return PRESETS.get(name + PAPER_SUFFIX) or PRESETS[BF16_EMULATED if name == "bf16" else name]


def table4_recipe(row: str, column: str) -> Recipe:
    """The recipe of one Table 4 cell: the column's paper operands (Table 3) with the row's components."""
    return paper_preset(column).replace(name=f"{column}:{row}", **TABLE4_ROWS[row])


def table4_setting_note(shape: Sequence[int], seeds: int, query_rows: Optional[int] = None) -> Optional[str]:
    """One line saying how a Table 4 run differs from the paper's setting (``None`` when it does not)."""
    paper = "x".join(map(str, PAPER_TABLE4_SHAPE))
    diffs = []
    if tuple(int(x) for x in shape) != PAPER_TABLE4_SHAPE:
        diffs.append(f"shape {'x'.join(map(str, shape))} (paper: {paper})")
    if seeds != PAPER_TABLE4_SEEDS:
        diffs.append(f"{seeds} seed{'s' if seeds != 1 else ''} (paper: {PAPER_TABLE4_SEEDS})")
    if query_rows is not None and query_rows < int(shape[2]):
        diffs.append(f"{query_rows} sampled query rows (paper: all)")
    if not diffs:
        return None
    return (f"note: ours differ from the paper's setting: {', '.join(diffs)}; for its setting: "
            f"--shape {','.join(map(str, PAPER_TABLE4_SHAPE))} --seeds {PAPER_TABLE4_SEEDS}")


def table4(shape: Sequence[int] = PAPER_TABLE4_SHAPE, seeds: int = PAPER_TABLE4_SEEDS, device: str = "cpu",
           query_rows: Optional[int] = None, rows: Sequence[str] = tuple(TABLE4_ROWS),
           columns: Sequence[str] = TABLE4_COLUMNS, progress=None) -> List[Dict]:
    """Component ablation on standard-normal inputs, against BF16 attention with the conventional softmax.

    Parameters
    ----------
    shape : (B, H, S, D); S_q = S_k = S.
    seeds : number of input seeds (0 .. seeds-1); errors and cosines are averaged over them.
    query_rows : optional number of query rows to evaluate (a fixed random subset, all S keys).
        Every quantity of the pipeline is per query row, so this samples the global error.

    Returns
    -------
    list of dict: ``row``, ``column``, ``ours`` {err_pct, cos}, ``paper`` {err_pct, cos}, ``seconds``, ``recipe``
    (every field of the cell's recipe) and ``computed_numerics`` (the emulator computes the recipe's own).
    """
    b, h, s, d = shape
    acc = {(r, c): [0.0, 0.0, 0.0] for r in rows for c in columns}
    for seed in range(seeds):
        gen = torch.Generator(device="cpu").manual_seed(seed)
        q, k, v = (torch.randn(b, h, s, d, generator=gen).to(device) for _ in range(3))
        if query_rows is not None and query_rows < s:
            pick = torch.randperm(s, generator=torch.Generator().manual_seed(10_000 + seed))[:query_rows]
            q = q[:, :, pick.to(device)]
        scale = d ** -0.5
        ref = emulate_attention(q, k, v, table4_recipe("conventional", "bf16"), scale=scale)[0]
        for r in rows:
            for c in columns:
                t0 = time.perf_counter()
                out = emulate_attention(q, k, v, table4_recipe(r, c), scale=scale)[0]
                err, cos = error_and_cosine(out, ref)
                cell = acc[(r, c)]
                cell[0] += err / seeds
                cell[1] += cos / seeds
                cell[2] += time.perf_counter() - t0
                if progress is not None:
                    progress(seed, r, c, err, cos)
    result = []
    for (r, c), (err, cos, secs) in acc.items():
        perr, pcos = PAPER_TABLE4[r][c]
        result.append({"row": r, "column": c, "ours": {"err_pct": err * 100, "cos": cos},
                       "paper": {"err_pct": perr, "cos": pcos}, "seconds": secs,
                       **recipe_record(table4_recipe(r, c), "emulator")})
    return result

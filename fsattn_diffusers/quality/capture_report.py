"""Write a capture's outputs: calls.csv / calls.json, summary.md, rollback.png, worst_calls.safetensors."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import statistics
import time
from typing import Dict, List, Optional

import numpy as np

from .analysis import REFERENCE_RECIPE, RECIPE_FIELDS, badness
from .results import csv_text, json_numbers, jsonable

CALLS_CSV, CALLS_JSON, SUMMARY_MD, ROLLBACK_PNG = "calls.csv", "calls.json", "summary.md", "rollback.png"
WORST_FILE = "worst_calls.safetensors"
#: Calls listed in the summary as the worst.
WORST_LISTED = 5
#: Identifies replay files (safetensors metadata key and format tag).
REPLAY_KEY, REPLAY_FORMAT = "fsattn_replay", "fsattn-capture-replay/1"
BASE_COLUMNS = ("call", "step", "num_steps", "timestep", "expert", "layer", "branch", "batch", "heads", "s_q",
                "s_k", "head_dim", "rows", "kv_len", "dtype")


def _values(rows: List[Dict], key: str) -> List[float]:
    return [r[key] for r in rows if isinstance(r.get(key), (int, float)) and not math.isnan(r[key])]


def recipe_summary(rows: List[Dict], names: List[str]) -> List[Dict]:
    """Per recipe: median / max rollback rate, calls with a rollback, median / max error, conventional error."""
    out = []
    for n in names:
        rates, errs, conv = (_values(rows, f"{n}_{f}") for f in ("rollback_rate", "err_pct", "conv_err_pct"))
        med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
        out.append({"recipe": n, "calls": len(rates), "median_rollback_rate": med(rates),
                    "max_rollback_rate": max(rates) if rates else None,
                    "calls_with_rollback": sum(1 for x in rates if x > 0),
                    "median_err_pct": med(errs), "max_err_pct": max(errs) if errs else None,
                    "median_conv_err_pct": med(conv), "max_conv_err_pct": max(conv) if conv else None})
    return out


def worst_calls(rows: List[Dict], names: List[str], count: int = WORST_LISTED) -> List[Dict]:
    """The ``count`` worst calls: highest rollback rate over the recipes, then highest error."""
    return sorted(rows, key=lambda r: badness(r, names), reverse=True)[:count]


def _heatmaps(rows: List[Dict], names: List[str]):
    layers = list(dict.fromkeys(r["layer"] for r in rows))
    steps = sorted({r["step"] for r in rows if r["step"] is not None})
    grids = {}
    for n in names:
        grid = np.full((len(layers), len(steps)), np.nan)
        for r in rows:
            value = r.get(f"{n}_rollback_rate")
            if r["step"] is None or value is None or math.isnan(value):
                continue
            i, j = layers.index(r["layer"]), steps.index(r["step"])
            grid[i, j] = value if math.isnan(grid[i, j]) else max(grid[i, j], value)
        grids[n] = grid
    return grids, [str(x) for x in layers], steps


def _fmt(value, digits=4) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.{digits}g}"
    return str(value)


def summary_lines(captured, meta: Dict) -> List[str]:
    names = [r.name for r in captured.recipes]
    spec = meta["spec"]
    lines = ["# fsattn capture", "",
             f"* model `{spec['model']}`, prompt {meta['prompt']!r}; {spec['num_frames']} frames "
             f"{spec['width']}x{spec['height']}, {spec['steps']} steps, seed {spec['seed']}",
             f"* {len(captured.rows)} self-attention calls (step x layer x CFG branch x batch entry); "
             f"{meta['rows']} sampled query rows per call, all keys; analysis backend `{meta['backend']}`",
             "* error: global relative error (%) against BF16 attention with the conventional softmax; `conv`: "
             "the conventional softmax on the recipe's own quantized operands; rollback rate: query x key tiles "
             "of the sampled rows where a row rolled back, over tiles visited", "",
             "| recipe | median rollback rate | max rollback rate | calls with rollback | median err % | "
             "max err % | median conv err % | max conv err % |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for s in recipe_summary(captured.rows, names):
        lines.append(f"| {s['recipe']} | {_fmt(s['median_rollback_rate'])} | {_fmt(s['max_rollback_rate'])} | "
                     f"{s['calls_with_rollback']}/{s['calls']} | {_fmt(s['median_err_pct'])} | "
                     f"{_fmt(s['max_err_pct'])} | {_fmt(s['median_conv_err_pct'])} | {_fmt(s['max_conv_err_pct'])} |")
    lines += softmax_lines(captured.rows, list(getattr(captured, "diag_columns", [])))
    lines += ["", f"## {WORST_LISTED} worst calls (highest rollback rate over the recipes, then highest error)", "",
              "| call | step | layer | branch | " + " | ".join(f"{n} rollback / err % / conv %" for n in names) + " |",
              "| --- | --- | --- | --- | " + " | ".join("---" for _ in names) + " |"]
    for r in worst_calls(captured.rows, names):
        cells = [f"{_fmt(r.get(f'{n}_rollback_rate'))} / {_fmt(r.get(f'{n}_err_pct'))} / "
                 f"{_fmt(r.get(f'{n}_conv_err_pct'))}" for n in names]
        lines.append(f"| {r['call']} | {r['step']} | {r['layer']} | {r['branch']} | " + " | ".join(cells) + " |")
    return lines


def softmax_lines(rows: List[Dict], columns: List[str]) -> List[str]:
    """Means over calls of the exact softmax's mass concentration and of each intervention's JSD / errors."""
    if not columns:
        return []
    mean = lambda key: statistics.fmean(_values(rows, key)) if _values(rows, key) else None  # noqa: E731
    lines = ["", "Exact softmax of the sampled rows (mean over calls): "
             f"{_fmt(mean('p_share_hi'))} of positions have p >= 0.1 and carry {_fmt(mean('p_mass_hi'))} of the "
             f"weight per row; {_fmt(mean('p_share_lo'))} have p < 1e-4 and carry {_fmt(mean('p_mass_lo'))}."]
    labels = list(dict.fromkeys(c[:-len("_jsd")] for c in columns if c.endswith("_jsd")))
    if labels:
        lines += ["", "| intervention | mean JSD | mean log RMSE | mean weighted log err | mean out err |",
                  "| --- | --- | --- | --- | --- |"]
        for n in labels:
            lines.append(f"| {n} | {_fmt(mean(n + '_jsd'))} | {_fmt(mean(n + '_log_rmse'))} | "
                         f"{_fmt(mean(n + '_weighted_log_err'))} | {_fmt(mean(n + '_out_rel_err'))} |")
    return lines


def write_worst(captured, path: str, meta: Dict) -> Optional[str]:
    """Save the kept worst calls as safetensors for ``fsattn accuracy --replay`` (None when none kept)."""
    if not captured.worst:
        return None
    from .store import save_safetensors

    tensors, calls = {}, []
    for key, n, item in sorted(captured.worst, reverse=True):
        name = f"call{n}"
        for t_name, t in item["tensors"].items():
            tensors[f"{name}.{t_name}"] = t.contiguous()
        calls.append({"name": name, "scale": item["scale"], "row": jsonable(item["row"])})
    header = {"format": REPLAY_FORMAT, "layout": "bhsd", "reference": dataclasses.asdict(REFERENCE_RECIPE),
              "recipes": [dataclasses.asdict(r) for r in captured.recipes], "backend": meta["backend"],
              "source": {k: meta[k] for k in ("prompt", "spec", "date")}, "calls": calls}
    save_safetensors(tensors, path, metadata={REPLAY_KEY: json.dumps(header)})
    return path


def write_capture_outputs(captured, out: str, meta: Dict) -> Dict[str, str]:
    """Write every output of a capture under ``out``; return ``{name: path}``."""
    os.makedirs(out, exist_ok=True)
    names = [r.name for r in captured.recipes]
    meta = dict(meta, date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    files = {"csv": os.path.join(out, CALLS_CSV), "json": os.path.join(out, CALLS_JSON),
             "summary": os.path.join(out, SUMMARY_MD)}
    columns = list(BASE_COLUMNS) + [f"{n}_{f}" for n in names for f in RECIPE_FIELDS]
    columns += list(getattr(captured, "diag_columns", []))  # softmax diagnostics (capture.softmax_fields)
    with open(files["csv"], "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        for r in captured.rows:
            writer.writerow({c: csv_text(r.get(c), 8) for c in columns})
    payload = {"meta": meta, "recipes": [dataclasses.asdict(r) for r in captured.recipes],
               "reference": dataclasses.asdict(REFERENCE_RECIPE),
               "summary": recipe_summary(captured.rows, names), "calls": captured.rows}
    with open(files["json"], "w") as fh:
        json.dump(json_numbers(payload), fh, indent=1, allow_nan=False)
    lines = summary_lines(captured, meta)
    try:
        from .plots import plot_rollback_heatmap

        grids, layers, steps = _heatmaps(captured.rows, names)
        if steps and layers:
            files["plot"] = plot_rollback_heatmap(grids, layers, steps, os.path.join(out, ROLLBACK_PNG))
            lines += ["", f"![rollback rate per step and layer]({ROLLBACK_PNG})"]
    except ImportError as exc:
        lines += ["", f"plot skipped: {exc}"]
    worst = write_worst(captured, os.path.join(out, WORST_FILE), meta)
    if worst:
        files["worst"] = worst
        lines += ["", f"Q/K/V of the {len(captured.worst)} worst calls: [{WORST_FILE}]({WORST_FILE}) "
                  f"(rerun: `fsattn accuracy --replay {os.path.join(out, WORST_FILE)}`)"]
    with open(files["summary"], "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
    return files

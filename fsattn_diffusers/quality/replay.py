"""``fsattn accuracy --replay FILE``: rerun the attention calls ``fsattn capture --save-worst`` saved.

Each saved call (sampled query rows, all keys, kv_lens, softmax scale) is analysed again with the
recipes of the capture; the values recorded during the capture are printed beside ours. With the same
backend and device they agree exactly (the emulator is deterministic).
"""

from __future__ import annotations

import json
import math
import os
from typing import Dict, List

import torch

from ..recipe import Recipe
from .analysis import analyse
from .capture_report import REPLAY_FORMAT, REPLAY_KEY

SHOWN = ("rollback_rate", "err_pct", "conv_err_pct")


def load_replay(path: str):
    """``(header, {call name: {"q", "k", "v"[, "kv_lens"]}})`` of a replay file (one-line ValueError)."""
    if not os.path.isfile(path):
        raise ValueError(f"--replay {path}: no such file")
    try:
        from safetensors import safe_open

        with safe_open(path, framework="pt") as fh:
            meta = fh.metadata() or {}
            tensors = {k: fh.get_tensor(k) for k in fh.keys()}
    except Exception as exc:  # not a safetensors file
        raise ValueError(f"--replay {path}: not a safetensors file ({str(exc).strip().splitlines()[0]})") from None
    if REPLAY_KEY not in meta:
        raise ValueError(f"--replay {path}: no {REPLAY_KEY!r} metadata; accepted: a file written by "
                         f"`fsattn capture --save-worst N`")
    header = json.loads(meta[REPLAY_KEY])
    if header.get("format") != REPLAY_FORMAT:
        raise ValueError(f"--replay {path}: format {header.get('format')!r}; accepted: {REPLAY_FORMAT}")
    calls: Dict[str, Dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        name, _, part = key.partition(".")
        calls.setdefault(name, {})[part] = t
    return header, calls


def _recorded(value):
    if isinstance(value, str) and value in ("inf", "-inf", "nan"):
        return float(value)
    return value


def replay(path: str, device: str = "cpu", backend: str = None) -> List[Dict]:
    """Analyse every saved call again; one row per call and recipe with ``ours`` and ``recorded``."""
    header, calls = load_replay(path)
    recipes = [Recipe(**r) for r in header["recipes"]]
    backend = backend or header.get("backend", "emulator")
    rows = []
    for call in header["calls"]:
        t = calls[call["name"]]
        q, k, v = (t[x].to(device) for x in ("q", "k", "v"))
        lens = t.get("kv_lens")
        ours = analyse(q, k, v, recipes, scale=call["scale"], kv_lens=None if lens is None else lens.to(device),
                       backend=backend)
        rec = call["row"]
        for r in recipes:
            rows.append({"call": call["name"], "step": rec.get("step"), "layer": rec.get("layer"),
                         "branch": rec.get("branch"), "recipe": r.name, "shape": list(q.shape), "s_k": k.shape[2],
                         "ours": {f: ours.get(f"{r.name}_{f}") for f in SHOWN},
                         "recorded": {f: _recorded(rec.get(f"{r.name}_{f}")) for f in SHOWN}})
    return rows


def _num(x) -> str:
    if x is None:
        return "-"
    return "nan" if isinstance(x, float) and math.isnan(x) else f"{x:.4f}"


def print_replay(rows: List[Dict]) -> None:
    print("replayed attention calls: ours | recorded by fsattn capture")
    print(f"{'call':<9}{'step':>5}  {'layer':<34}{'branch':<8}{'recipe':<8}"
          f"{'rollback rate':>22}{'err %':>22}{'conv err %':>22}")
    for r in rows:
        o, c = r["ours"], r["recorded"]
        cells = "".join(f"{_num(o[f]) + ' | ' + _num(c[f]):>22}" for f in SHOWN)
        print(f"{r['call']:<9}{str(r['step']):>5}  {str(r['layer'])[:33]:<34}{str(r['branch']):<8}"
              f"{r['recipe']:<8}{cells}")


def replay_command(path: str, device: str = "cpu", json_path: str = None) -> int:
    """Entry of ``fsattn accuracy --replay``: print the table, optionally write JSON."""
    rows = replay(path, device=device)
    print_replay(rows)
    if json_path:
        from .results import jsonable

        with open(json_path, "w") as fh:
            json.dump(jsonable({"replay": path, "rows": rows}), fh, indent=1, allow_nan=False)
        print(f"wrote {json_path}")
    return 0

"""Sweep results as tables: one row per prompt x policy plus per-policy means; CSV and JSON.

Conventions: in CSV and Markdown an infinite PSNR (frames identical to bf16's) is ``inf``; in the JSON
outputs (results.json, sensitivity.json, attention.json, calls.json) every number is a JSON number or
``null``: a non-finite value is ``null`` (:func:`json_numbers`), so an ``ok`` row with ``"psnr_db": null``
is identical to bf16. LPIPS that could not be computed is ``"unavailable"`` (never 0, never blank); metrics of
a failed video are empty (``null``) with ``status`` ``failed`` and the error in ``error``.
"""

from __future__ import annotations

import csv
import math
import statistics
from typing import Dict, List, Optional

from .metrics import mean_value, psnr_from_mse

CSV_COLUMNS = ("prompt_id", "prompt", "policy", "status", "reused", "videos", "failed", "psnr_db", "ssim",
               "lpips", "step_s", "step_median_s", "wall_s", "speed_vs_bf16", "latent_digest", "video", "note", "error")
MEAN_ID = "mean"


def jsonable(value):
    """JSON-safe copy for caches read back by :func:`from_json`: infinities and NaN become the strings
    ``"inf"``, ``"-inf"``, ``"nan"`` (the output files use :func:`json_numbers`)."""
    return _map_floats(value, lambda x: x if math.isfinite(x) else "nan" if math.isnan(x) else "inf" if x > 0
                       else "-inf")


def json_numbers(value):
    """Copy for the JSON output files: infinities and NaN become ``None`` (JSON ``null``), so every number
    field is a number or ``null`` (standard JSON; Python's ``Infinity`` is not)."""
    return _map_floats(value, lambda x: x if math.isfinite(x) else None)


def _map_floats(value, fn):
    """Copy of ``value`` (nested dicts, lists and tuples; tuples become lists) with ``fn`` applied to each float."""
    if isinstance(value, float):
        return fn(value)
    if isinstance(value, dict):
        return {k: _map_floats(v, fn) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_map_floats(v, fn) for v in value]
    return value


def from_json(value):
    """Inverse of :func:`jsonable` for metric values (``"inf"`` -> ``math.inf``)."""
    if value in ("inf", "-inf", "nan"):
        return float(value)
    return value


def _lpips_value(metrics, lpips_available: bool):
    if metrics is None:
        return None
    if not lpips_available or metrics.lpips is None:
        return "unavailable"
    return metrics.means["lpips"]


def video_rows(result) -> List[Dict]:
    """One dict per prompt x policy (metrics are means over the compared frames)."""
    out = []
    for r in result.rows:
        m = r.metrics
        out.append({
            "prompt_id": r.prompt_id, "prompt": r.prompt, "policy": r.policy, "status": r.status,
            "reused": r.reused, "psnr_db": None if m is None else m.means["psnr"],
            "ssim": None if m is None else m.means["ssim"], "lpips": _lpips_value(m, result.lpips_available),
            "step_s": r.step_s, "step_median_s": _median(r.step_times), "wall_s": r.wall_s,
            "latent_digest": r.latent_digest,
            "video": None if r.video is None else _rel(r.video, result.out), "note": r.note, "error": r.error,
            "mse": None if m is None else m.means["mse"],
            "frames": None if m is None else {
                "index": m.indices, "psnr_db": m.psnr, "mse": m.mse, "ssim": m.ssim,
                "lpips": m.lpips if m.lpips is not None else "unavailable"},
            "step_times": r.step_times,
        })
    return out


def _rel(path: str, start: str) -> str:
    from .store import relpath

    return relpath(path, start)


def _median(values: List[float]) -> Optional[float]:
    return float(statistics.median(values)) if values else None


def _mean(values: List[Optional[float]]) -> Optional[float]:
    values = [v for v in values if v is not None]
    return mean_value(values) if values else None


def policy_means(result) -> List[Dict]:
    """Per-policy means over the prompts whose video was compared with bf16.

    PSNR is that of the MSE pooled over every compared frame of the policy (videos have equal frame
    counts, so this is the mean of the videos' MSEs); SSIM and LPIPS are means of the video means.
    """
    by_policy = {it.label: [r for r in result.rows if r.policy == it.label] for it in result.policies}
    ref_step = _mean([r.step_s for r in by_policy.get("bf16", []) if r.status == "ok"])
    out = []
    for label, rows in by_policy.items():
        ok = [r for r in rows if r.status == "ok"]
        compared = [r.metrics for r in ok if r.metrics is not None]
        step = _mean([r.step_s for r in ok])
        lpips = "unavailable" if not result.lpips_available else _mean([m.means["lpips"] for m in compared])
        out.append({
            "prompt_id": MEAN_ID, "policy": label, "videos": len(ok), "failed": len(rows) - len(ok),
            "compared": len(compared),
            "psnr_db": psnr_from_mse(_mean([m.means["mse"] for m in compared])) if compared else None,
            "ssim": _mean([m.means["ssim"] for m in compared]), "lpips": lpips if compared else None,
            "step_s": step, "step_median_s": _median([t for r in ok for t in r.step_times]),
            "wall_s": _mean([r.wall_s for r in ok]),
            "speed_vs_bf16": ref_step / step if (ref_step and step) else None,
        })
    return out


def csv_text(value, digits: int = 6) -> str:
    """One CSV cell: ``inf`` for infinity, empty for None, floats to ``digits`` significant digits."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return f"{value:.{digits}g}"
    return str(value)


def write_csv(path: str, rows: List[Dict], means: List[Dict]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in list(rows) + list(means):
            writer.writerow({k: csv_text(row.get(k)) for k in CSV_COLUMNS})


def read_csv(path: str) -> List[Dict]:
    """Rows of a results.csv as strings (``inf`` and ``unavailable`` kept as written)."""
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def format_metric(value, digits: int = 4) -> str:
    """Text of a metric: ``inf`` for infinity, ``unavailable`` for None (use where None means that)."""
    if value is None:
        return "unavailable"
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:.{digits}f}"


def means_text(means: List[Dict]) -> str:
    """The per-policy means of :func:`policy_means` as an aligned text table for the terminal.

    Columns: policy, PSNR (dB, ``inf`` for a video identical to bf16), SSIM, LPIPS (``unavailable`` without its
    weights), mean seconds per denoising step, videos that failed; ``–`` where nothing was compared.
    """
    def cell(value, digits):
        return "–" if value is None else value if isinstance(value, str) else format_metric(value, digits)

    header = ("policy", "PSNR dB", "SSIM", "LPIPS", "s/step", "failed")
    body = [(m["policy"], cell(m["psnr_db"], 2), cell(m["ssim"], 6), cell(m["lpips"], 4), cell(m["step_s"], 3),
             str(m["failed"])) for m in means]
    widths = [max(len(row[i]) for row in [header] + body) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
                     .rstrip() for row in [header] + body)

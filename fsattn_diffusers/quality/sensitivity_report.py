"""Outputs of ``fsattn sensitivity``: sensitivity.csv / .json, damage_vs_jsd.png and sensitivity.md.

The sweep files (results.csv, results.json, report.md, frame grids, videos) are written beside them
by :func:`.report.write_outputs`.
"""

from __future__ import annotations

import csv
import json
import math
import os
import time
from typing import Dict, List

from .diagnostics import FIELDS
from .results import csv_text, json_numbers

SENS_CSV, SENS_JSON, SENS_MD, DAMAGE_PNG = "sensitivity.csv", "sensitivity.json", "sensitivity.md", "damage_vs_jsd.png"
#: Columns of sensitivity.csv (video metrics are means over prompts; diagnostics are means of the videos').
COLUMNS = ("intervention", "family", "videos", "psnr_db", "ssim", "lpips", "mse", "calls") + FIELDS

#: Video-damage axes of the damage-vs-JSD figure: (key, label, transform).
DAMAGE_AXES = (("mse", "video MSE vs bf16 (pixel units^2)"), ("one_minus_ssim", "1 - SSIM vs bf16"),
               ("lpips", "LPIPS vs bf16"))


def _finite_pos(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def plot_damage_vs_jsd(table: List[Dict], path: str, lpips_available: bool) -> str:
    """Video damage against the mean row-wise JSD, one point per intervention (log-log), coloured by family.

    Points with JSD 0 or no damage (identical video) cannot sit on log axes and are left out (listed
    in the report)."""
    from .plots import _figure, label_groups

    axes = [a for a in DAMAGE_AXES if a[0] != "lpips" or lpips_available]
    fig = _figure(4.4 * len(axes), 3.8)
    families = list(dict.fromkeys(r["family"] for r in table))
    colors = {f: f"C{i % 10}" for i, f in enumerate(families)}
    for i, (key, title) in enumerate(axes):
        ax = fig.add_subplot(1, len(axes), i + 1)
        seen, points = set(), []
        for r in table:
            y = (1.0 - r["ssim"]) if key == "one_minus_ssim" and isinstance(r.get("ssim"), (int, float)) else r.get(key)
            x = r.get("jsd")
            if not (_finite_pos(x) and _finite_pos(y)):
                continue
            fam = r["family"]
            ax.scatter([x], [y], s=30, color=colors[fam], label=None if fam in seen else fam)
            seen.add(fam)
            points.append((r["intervention"], math.log10(x), math.log10(y)))
        for labels, lx, ly, row in label_groups(points):  # log axes: group and stagger in log coordinates
            ax.annotate(", ".join(labels), (10 ** lx, 10 ** ly), textcoords="offset points", xytext=(3, 3 - 8 * row),
                        fontsize=6)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("mean row-wise JSD vs exact softmax (nats)")
        ax.set_title(title, fontsize=9)
        ax.grid(True, alpha=0.3, which="both")
        if seen:
            ax.legend(fontsize=6)
    fig.suptitle("equal JSD, different damage? one point per intervention", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    return path


def _cell(x, digits=4) -> str:
    if x is None:
        return "–"
    if isinstance(x, str):
        return x
    if isinstance(x, float):
        if math.isnan(x):
            return "nan"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        return f"{x:.{digits}g}"
    return str(x)


def write_sensitivity_outputs(result, table: List[Dict], per_video: Dict[tuple, dict], out: str,
                              selection: Dict) -> Dict[str, str]:
    """Write sensitivity.csv, sensitivity.json, damage_vs_jsd.png and sensitivity.md; return their paths."""

    files = {"sens_csv": os.path.join(out, SENS_CSV), "sens_json": os.path.join(out, SENS_JSON),
             "sens_report": os.path.join(out, SENS_MD)}
    with open(files["sens_csv"], "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for r in table:
            writer.writerow({c: csv_text(r.get(c)) for c in COLUMNS})
    plot_note = None
    try:
        files["damage_plot"] = plot_damage_vs_jsd(table, os.path.join(out, DAMAGE_PNG), result.lpips_available)
    except ImportError as exc:
        plot_note = f"plot skipped: {exc}"
    import platform

    import diffusers
    import torch

    meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "spec": result.spec.key(),
            "device": result.device, "seconds": result.seconds, "selection": selection,
            "versions": {"python": platform.python_version(), "torch": torch.__version__,
                         "diffusers": diffusers.__version__},
            "threads": torch.get_num_threads(), "load_average": list(os.getloadavg()),
            "lpips": {"available": result.lpips_available, "note": result.lpips_note},
            "prompts": [{"id": pid, "prompt": p} for pid, p in result.prompts], "plots_note": plot_note}
    videos = [{"prompt_id": pid, "intervention": label, **v} for (pid, label), v in per_video.items()]
    with open(files["sens_json"], "w") as fh:
        json.dump(json_numbers({"meta": meta, "table": table, "videos": videos}), fh, indent=1, allow_nan=False)
    with open(files["sens_report"], "w", encoding="utf-8") as fh:
        fh.write(_markdown(result, table, meta, files, plot_note))
    return files


def _markdown(result, table, meta, files, plot_note) -> str:
    s = result.spec
    lines = ["# fsattn sensitivity: softmax interventions in self-attention", "",
             f"* model `{s.model}`; {s.num_frames} frames {s.width}x{s.height}, {s.steps} steps, guidance "
             f"{s.guidance_scale}, seed {s.seed}; device `{result.device}`; {meta['date']}; "
             f"{result.seconds:.1f} s in all ({meta['threads']} torch threads, load average "
             f"{', '.join(f'{x:.2f}' for x in meta['load_average'])})",
             f"* intervened: steps {meta['selection']['steps']}, transformer blocks {meta['selection']['layers']} "
             "of self-attention (other calls: stock attention); interventions in float32 arithmetic",
             "* video metrics against the bf16 video (stock attention) of the same prompt, seed and initial latent; "
             "means over prompts (details: [report.md](report.md), [results.csv](results.csv))",
             f"* diagnostics against exact fp32 softmax on the same operands, {meta['selection']['rows']} sampled "
             f"query rows per call (seed {meta['selection']['sample_seed']}), pooled per video, then averaged: "
             "JSD (mean row-wise, nats), log RMSE (unweighted RMS of ln p~ - ln p over positions kept), weighted "
             "(the same weighted by p), out err (relative error of the attention output of the rows), zeroed "
             "(share of positions set to 0) and their exact mass, share / mass of positions with p~ >= 0.1 and "
             "p~ < 1e-4",
             f"* {result.lpips_note}", ""]
    if plot_note:
        lines += [f"* {plot_note}", ""]
    lines += ["| intervention | PSNR (dB) | SSIM | LPIPS | JSD | log RMSE | weighted | out err | zeroed | "
              "zeroed mass | share >= 0.1 | mass >= 0.1 | share < 1e-4 | mass < 1e-4 |",
              "| --- " * 14 + "|"]
    for r in table:
        lines.append("| " + " | ".join([r["intervention"], _cell(r["psnr_db"], 4), _cell(r["ssim"], 5),
                                        _cell(r["lpips"], 4)] + [_cell(r[f], 3) for f in (
                                            "jsd", "log_rmse", "weighted_log_err", "out_rel_err", "zero_share",
                                            "dropped_mass", "share_hi", "mass_hi", "share_lo", "mass_lo")]) + " |")
    ref = next((r for r in table if r.get("ref_share_hi") is not None), None)
    if ref is not None:
        lines += ["", f"Exact softmax of these calls: {_cell(100 * ref['ref_share_hi'], 3)}% of positions have "
                  f"p >= 0.1 and carry {_cell(100 * ref['ref_mass_hi'], 3)}% of the weight; "
                  f"{_cell(100 * ref['ref_share_lo'], 3)}% have p < 1e-4 and carry "
                  f"{_cell(100 * ref['ref_mass_lo'], 3)}%."]
    if "damage_plot" in files:
        left = [r["intervention"] for r in table if not (_finite_pos(r.get("jsd")) and _finite_pos(r.get("mse")))]
        lines += ["", "## Damage against JSD", "", f"![damage vs JSD]({os.path.basename(files['damage_plot'])})"]
        if left:
            lines += ["", f"Not on the log axes (JSD 0 or a video identical to bf16): {', '.join(left)}."]
    lines += ["", "## Files", "", "* [sensitivity.csv](sensitivity.csv), [sensitivity.json](sensitivity.json) "
              "(with per-call JSD / output error of every video)", "* [report.md](report.md): the per-video sweep "
              "report (frame grids, per-frame PSNR); videos under `videos/`", ""]
    return "\n".join(lines)

"""Write a sweep's outputs: results.csv / results.json, plots, frame grids and report.md."""

from __future__ import annotations

import json
import os
import platform
import time
from typing import Dict, List

from .results import format_metric, json_numbers, policy_means, video_rows, write_csv
from .store import relpath

RESULTS_CSV, RESULTS_JSON, REPORT_MD = "results.csv", "results.json", "report.md"
QUALITY_PNG, PSNR_FRAMES_PNG = "quality_vs_time.png", "psnr_per_frame.png"


def _versions() -> Dict[str, str]:
    import diffusers
    import torch

    return {"python": platform.python_version(), "torch": torch.__version__, "diffusers": diffusers.__version__}


def _cell(value, digits: int = 4) -> str:

    if value is None:
        return "–"
    if isinstance(value, str):
        return value
    return format_metric(value, digits)


def _psnr_curves(result) -> Dict[str, Dict[str, tuple]]:
    curves: Dict[str, Dict[str, tuple]] = {}
    for r in result.rows:
        if r.metrics is not None and r.policy != "bf16":
            curves.setdefault(r.prompt_id, {})[r.policy] = (r.metrics.indices, r.metrics.psnr)
    return curves


def _grids(result, store, count: int) -> Dict[str, str]:
    """One frame grid per prompt with a compared bf16 video: ``{prompt_id: path}``."""
    from .plots import caption, pick_columns, plot_frame_grid

    slugs = {it.label: it.slug for it in result.policies}
    out = {}
    columns = pick_columns(result.indices, count)
    for pid, prompt in result.prompts:
        rows = [r for r in result.rows if r.prompt_id == pid and r.metrics is not None]
        if not rows:
            continue
        cells = []
        for r in rows:
            frames = store.load_frames(pid, slugs[r.policy], columns)
            psnrs = dict(zip(r.metrics.indices, r.metrics.psnr))
            caps = None if r.policy == "bf16" else [caption(psnrs.get(i)) for i in columns]
            cells.append((r.policy, frames, caps))
        path = os.path.join(result.out, f"grid_{pid}.png")
        out[pid] = plot_frame_grid(cells, columns, path, title=f"{pid}: {prompt[:80]}")
    return out


def _schedules(result) -> Dict[str, Dict]:
    """``{label: {"steps": [entry name per step] or None, "line": one-line description}}`` at the
    sweep's step count (a policy that cannot resolve its schedule gets the reason as its line)."""
    from ..integration.policy import schedule_line

    n, out = result.spec.steps, {}
    for it in result.policies:
        try:
            out[it.label] = {"steps": it.policy.plan_names(n), "line": schedule_line(it.policy, n)}
        except Exception as exc:  # noqa: BLE001 - a failing policy is reported, not fatal to the report
            out[it.label] = {"steps": None, "line": f"{it.label}: cannot resolve ({type(exc).__name__}: {exc})"}
    return out


def write_outputs(result, store, grid_frames: int = 4) -> Dict[str, str]:
    """Write every output file of a sweep; return ``{name: path}``. Plots are skipped (noted) without matplotlib."""
    os.makedirs(result.out, exist_ok=True)
    rows, means = video_rows(result), policy_means(result)
    files = {"csv": os.path.join(result.out, RESULTS_CSV), "json": os.path.join(result.out, RESULTS_JSON)}
    write_csv(files["csv"], rows, means)
    plot_note = None
    try:
        from .plots import plot_psnr_per_frame, plot_quality_vs_time

        files["quality_plot"] = plot_quality_vs_time(means, os.path.join(result.out, QUALITY_PNG),
                                                     result.lpips_available)
        files["psnr_plot"] = plot_psnr_per_frame(_psnr_curves(result), os.path.join(result.out, PSNR_FRAMES_PNG))
        for pid, path in _grids(result, store, grid_frames).items():
            files[f"grid_{pid}"] = path
    except ImportError as exc:
        plot_note = f"plots skipped: {exc}"
    meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "versions": _versions(),
            "spec": result.spec.key(), "every": result.every, "frame_indices": result.indices,
            "reference": "bf16 (stock diffusers attention)", "seconds": result.seconds,
            "lpips": {"available": result.lpips_available, "note": result.lpips_note}, "plots_note": plot_note,
            "prompts": [{"id": pid, "prompt": p} for pid, p in result.prompts],
            "policies": [it.label for it in result.policies], "schedules": _schedules(result)}
    with open(files["json"], "w") as fh:
        json.dump(json_numbers({"meta": meta, "rows": rows, "means": means}), fh, indent=1, allow_nan=False)
    files["report"] = os.path.join(result.out, REPORT_MD)
    with open(files["report"], "w", encoding="utf-8") as fh:
        fh.write(report_markdown(result, rows, means, files, plot_note))
    return files


def report_markdown(result, rows: List[Dict], means: List[Dict], files: Dict[str, str], plot_note) -> str:
    s = result.spec
    rel = lambda p: relpath(p, result.out)  # noqa: E731
    lines = [
        "# fsattn quality sweep", "",
        f"* model: `{s.model}`; {s.num_frames} frames {s.width}x{s.height}, {s.steps} denoising steps, "
        f"guidance {s.guidance_scale}" + (f" / {s.guidance_scale_2}" if s.guidance_scale_2 is not None else "")
        + f", seed {s.seed}, attention backend `{s.backend}`",
        "* reference: **bf16** (stock diffusers attention); every policy of a prompt starts from the same seed "
        "and initial latent (digest per row in results.csv)",
        f"* metrics on frames {', '.join(map(str, result.indices))} (every {result.every}); SSIM and LPIPS "
        "averaged per video, then per policy; PSNR from the MSE pooled over those frames (per video, then "
        "over the policy's videos), so only identical videos give `inf`",
        f"* {result.lpips_note}",
        "* timings: `s/step` is the mean denoising step (first transformer call to the end of the last step); "
        "`wall s` includes text encoding and VAE decoding; an untimed 1-step bf16 warm-up run precedes the "
        "first generated video (unless `--no-warmup`)",
    ]
    lines.append(f"* schedules at {s.steps} steps (what each policy ran per denoising step):")
    lines += [f"  * `{label}`: {sched['line'].split(': ', 1)[1]}"
              + (" (stock diffusers attention)" if label == "bf16" else "")
              for label, sched in _schedules(result).items()]
    if not result.device.startswith("cuda"):
        lines.append(f"* device `{result.device}`: fsattn policies run the PyTorch emulator here (slow), so "
                     "`speed vs bf16` does not measure the kernels")
    if plot_note:
        lines.append(f"* {plot_note}")
    lines += ["", "## Per policy (means over prompts)", "",
              "| policy | videos | failed | PSNR (dB) | SSIM | LPIPS | s/step | wall s | speed vs bf16 |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for m in means:
        lines.append(f"| {m['policy']} | {m['videos']} | {m['failed']} | {_cell(m['psnr_db'], 2)} | "
                     f"{_cell(m['ssim'], 6)} | {_cell(m['lpips'], 4)} | {_cell(m['step_s'], 3)} | "
                     f"{_cell(m['wall_s'], 2)} | {_cell(m['speed_vs_bf16'], 2)} |")
    if "quality_plot" in files:
        lines += ["", "## Plots", "", f"![quality vs time per step]({rel(files['quality_plot'])})", "",
                  f"![per-frame PSNR]({rel(files['psnr_plot'])})"]
    grids = [(k[len("grid_"):], v) for k, v in files.items() if k.startswith("grid_")]
    if grids:
        lines += ["", "## Frame grids (bf16 first, then each policy)", ""]
        prompts = dict(result.prompts)
        for pid, path in grids:
            lines += [f"**{pid}**: {prompts[pid]}", "", f"![frame grid {pid}]({rel(path)})", ""]
    lines += ["", "## Per video", "",
              "| prompt | policy | status | PSNR (dB) | SSIM | LPIPS | s/step | wall s | video |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        status = r["status"] + (" (reused)" if r["reused"] else "")
        video = f"[mp4]({r['video']})" if r["video"] and r["status"] == "ok" else "–"
        lines.append(f"| {r['prompt_id']} | {r['policy']} | {status} | {_cell(r['psnr_db'], 2)} | "
                     f"{_cell(r['ssim'], 6)} | {_cell(r['lpips'], 4)} | {_cell(r['step_s'], 3)} | "
                     f"{_cell(r['wall_s'], 2)} | {video} |")
    problems = [r for r in rows if r["status"] != "ok" or r["note"]]
    if problems:
        lines += ["", "## Failures and notes", ""]
        for r in problems:
            lines.append(f"* {r['prompt_id']} / {r['policy']}: " + (r["error"] or r["note"]))
    lines += ["", "## Files", "", f"* [{RESULTS_CSV}]({RESULTS_CSV}), [{RESULTS_JSON}]({RESULTS_JSON}): one row per "
              "prompt x policy, then per-policy means (`prompt_id` = `mean`); PSNR of identical videos is `inf`",
              "* `videos/<prompt>/<policy>.mp4` (and `.frames.npz`: the lossless frames the metrics use)", ""]
    return "\n".join(lines)

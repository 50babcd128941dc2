"""Tables of ``fsattn e2e``: the latency columns of the paper's Table 6 for one model configuration.

One row per policy: the measured step, the projected 20-step latency, and the speedup over every
baseline the run measured (stock SDPA BF16, FlashAttention-3 BF16, FlashAttention-3 FP8, SageAttention through
diffusers' ``sage`` backend, the one imported named below the table), each from the
same process and configuration (GEMM precision, compiled or not).
"""

from __future__ import annotations

from typing import Dict, List, Optional

from .e2e import BASELINES, PAPER_STEPS
from .provenance import recipes_markdown

BASELINE_LABELS = {"bf16": "SDPA bf16", "fa3": "FA3 bf16", "fa3-fp8": "FA3 fp8", "sage": "SageAttention"}


def config_label(config: dict) -> str:
    """``"BF16 GEMMs, eager"`` / ``"FP8 GEMMs (torchao, per-row), compiled"``."""
    gemms = "FP8 GEMMs (torchao float8, per-row scales)" if config.get("gemms") == "fp8" else "BF16 GEMMs"
    return f"{gemms}, {'compiled blocks' if config.get('compile') else 'eager'}"


def _fmt(x: Optional[float], spec: str, none: str = "-") -> str:
    return none if x is None else format(x, spec)


def table_rows(summary: Dict[str, dict], steps_total: int = PAPER_STEPS) -> List[List[str]]:
    """Header + one row per policy of ``summary`` (:func:`fsattn_diffusers.measure.e2e.summarize`)."""
    present = [b for b in BASELINES if any(b in r.get("speedup_vs", {}) for r in summary.values())]
    header = ["policy", "step (s)", f"{steps_total} steps (s)"] + [f"vs {BASELINE_LABELS[b]}" for b in present] + \
        ["attention share", "rollback rate"]
    rows = [header]
    for name, r in summary.items():
        speedups = [f"{r['speedup_vs'][b]:.3f}x" if b in r.get("speedup_vs", {}) else "-" for b in present]
        share = None if r.get("attention_share") is None else 100 * r["attention_share"]
        rows.append([name, f"{r['step_s']:.2f}", f"{r['projected_s']:.1f}"] + speedups +
                    [_fmt(share, ".0f") + ("%" if share is not None else ""), _fmt(r.get("rollback_rate"), ".2e")])
    return rows


def markdown(doc: dict) -> str:
    """The markdown report of one ``fsattn e2e`` run (``doc``: its JSON document)."""
    meta, summary = doc["meta"], doc["summary"]
    rows = table_rows(summary)
    lines = [f"### {meta['spec']['name']} {meta.get('resolution', '')}: {config_label(meta.get('config', {}))}", "",
             f"Device: {meta.get('device')}; torch {meta.get('torch')}; date {meta.get('date')}; "
             f"commit {meta.get('commit') or '?'}.",
             f"Command: `{meta.get('command', '')}`", "",
             "| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
    lines += ["", f"Step = median of the timed denoising steps ({meta['spec']['calls_per_step']} transformer "
              f"forward(s) each, random weights, text encoder / VAE / scheduler excluded); {PAPER_STEPS} steps = "
              f"{PAPER_STEPS} x step. Speedup = baseline step / policy step, same run and configuration."]
    for name, row in summary.items():
        if row.get("note"):
            lines.append(f"{name}: {row['note']}.")
    sage = (doc.get("results", {}).get("sage") or {}).get("sageattention")
    if sage:
        lines.append(f"sage: diffusers' `sage` attention backend (`set_attention_backend(\"sage\")`) on every attention "
                     f"module; {sage['label']}.")
    compiled = {p: r.get("compile") for p, r in doc.get("results", {}).items() if r.get("compile")}
    if compiled:
        lines.append("Compile: " + "; ".join(
            f"{p} fullgraph={c['fullgraph']} graph breaks {c['graph_breaks']}"
            + (f" (first: {c['break']})" if c.get("break") else "") for p, c in compiled.items()) + ".")
    if meta.get("gemm_layers"):
        g = meta["gemm_layers"]
        lines.append(f"FP8 GEMMs: {g['quantized']} of {g['linear_total']} linear layers quantized (the repeated "
                     f"blocks').")
    runs = list(doc.get("results", {}).values()) + list((doc.get("schedules") or {}).values())
    return "\n".join(lines + recipes_markdown(runs)) + "\n"


def text_table(summary: Dict[str, dict]) -> str:
    """The same table as fixed-width text for the terminal."""
    rows = table_rows(summary)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     for r in rows)


__all__ = ["table_rows", "markdown", "text_table", "config_label", "BASELINE_LABELS"]

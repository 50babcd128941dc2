"""Text and markdown reports of the structured-input suite (:mod:`fsattn_diffusers.measure.structured_suite`)."""

from __future__ import annotations

from typing import Dict, List

from .structured_inputs import DESCRIPTIONS
from .provenance import recipes_markdown
from .structured_suite import summarize_checks

CHECK_KEYS = ("vs_fa3", "vs_gaussian", "finite", "inputs", "ran")


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.2f}"


def _cell_text(cell: Dict) -> str:
    if cell.get("err") is None:
        return "err"
    flag = "" if cell.get("nonfinite") == 0 and cell.get("inputs_unchanged") else "!"
    return f"{100 * cell['err']:.2f}{flag}"


def _sage_text(sage) -> str:
    """Which SageAttention (the identity dict of :func:`~fsattn_diffusers.integration.sage.sage_identity`, or
    ``{"missing": reason}``; older files: a version string or None)."""
    if isinstance(sage, dict):
        return sage.get("label") or f"not importable ({sage.get('missing')})"
    return str(sage)


def _column_seconds(result: Dict, column: str) -> float:
    return sum(case["columns"][column].get("seconds") or 0.0 for case in result["cases"])


def text_table(result: Dict) -> str:
    """Error % per case and column (``!``: NaN/inf where exact is finite, or an input was modified)."""
    cols = result["columns"]
    widths = [max(len(c), 7) + 1 for c in cols]
    head = f"{'family':<22}{'dtype':<9}{'D':>4} " + "".join(f"{c:>{w}}" for c, w in zip(cols, widths))
    lines = ["relative error % vs exact attention (" + result["exact"] + ")", head]
    for case in result["cases"]:
        line = f"{case['family']:<22}{case['dtype']:<9}{case['head_dim']:>4} "
        line += "".join(f"{_cell_text(case['columns'][c]):>{w}}" for c, w in zip(cols, widths))
        lines.append(line)
    return "\n".join(lines)


def checks_text(checks: List[Dict]) -> str:
    """One line per (case, recipe) with a checked format, plus a count of failures."""
    lines = ["bar checks (vs_fa3: err <= FA3-FP8 + 0.5 pp [+1 pp MXFP6]; vs_gaussian: err <= 1.5x own "
             "Gaussian [+1 pp MXFP6] where FA3-FP8 <= 1.5x its Gaussian; finite; inputs unchanged; ran)"]
    for row in checks:
        lines.append(f"  {row['family']:<22}{row['dtype']:<9}D={row['head_dim']:<4}{row['recipe']:<14}"
                     f"err {_pct(row['err']):>6}%  fa3-fp8 {_pct(row['fa3_err']):>6}%  "
                     + "  ".join(f"{k}={row[k]}" for k in CHECK_KEYS))
    for recipe, counts in summarize_checks(checks).items():
        lines.append(f"  {recipe}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    fails = [r for r in checks if any(r[k] == "fail" for k in CHECK_KEYS)]
    lines.append(f"bar checks: {len(checks)} rows, {len(fails)} with a failure")
    return "\n".join(lines)


def markdown(payload: Dict) -> str:
    """The whole report: setup, error/cosine table, bar checks, notes."""
    meta, result, checks = payload["meta"], payload["result"], payload["checks"]
    cols = result["columns"]
    lines = [f"# Structured-input accuracy suite — {meta.get('device', 'cpu')}", "",
             f"- date: {meta['date']}", f"- command: `{meta['command']}`",
             f"- torch {meta.get('torch')}, triton {meta.get('triton')}, python {meta.get('python')}, "
             f"fa3-fwd {meta.get('fa3_fwd')}, sageattention {_sage_text(meta.get('sageattention'))}",
             f"- shape (B, H, S) {tuple(meta['shape'])}, head dims {meta['head_dims']}, dtypes {meta['dtypes']}, "
             f"seeds {meta['seeds']}, backend {meta['backend']}, numerics {meta.get('numerics') or 'per recipe'}",
             f"- reference: {result['exact']}; cells: relative Frobenius error % / cosine, mean over seeds; "
             "`!` marks NaN/inf where the reference is finite or a modified input",
             *([] if payload.get("complete", True) else
               [f"- **incomplete**: {len(result['cases'])} cases so far (the file is rewritten after every case)"]),
             f"- wall time {result['seconds']:.1f} s; per column, summed over cases (first calls include "
             "compilation): " + ", ".join(f"{c} {_column_seconds(result, c):.1f} s" for c in cols), "",
             "| family | dtype | D | " + " | ".join(cols) + " |",
             "| --- | --- | --- | " + " | ".join("---" for _ in cols) + " |"]
    for case in result["cases"]:
        cells = []
        for c in cols:
            cell = case["columns"][c]
            if cell.get("err") is None:
                cells.append("error")
            else:
                cells.append(f"{_cell_text(cell)} / {cell['cos']:.5f}")
        lines.append(f"| {case['family']} | {case['dtype']} | {case['head_dim']} | " + " | ".join(cells) + " |")
    lines += ["", "## Bar checks", "",
              "vs_fa3: error <= FA3-FP8 error + 0.5 pp (MXFP6: + 1.5 pp). vs_gaussian: error <= 1.5x the recipe's "
              "own Gaussian error (MXFP6: + 1 pp), applied where FA3-FP8 stays within 1.5x its Gaussian error. "
              "`n/a`: no FA3-FP8 value, FA3-FP8 itself degrades, or a format without a bar (MXFP4).", "",
              "| family | dtype | D | recipe | err % | FA3-FP8 % | vs_fa3 | vs_gaussian | finite | inputs | ran |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in checks:
        lines.append(f"| {r['family']} | {r['dtype']} | {r['head_dim']} | {r['recipe']} | {_pct(r['err'])} | "
                     f"{_pct(r['fa3_err'])} | " + " | ".join(r[k] for k in CHECK_KEYS) + " |")
    lines += ["", "## Families", ""] + [f"- `{name}`: {DESCRIPTIONS[name]}" for name in
                                        dict.fromkeys(c["family"] for c in result["cases"])]
    if result["notes"]:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in result["notes"]]
    errors = sorted({f"{c}: {case['columns'][c]['error']}" for case in result["cases"] for c in cols
                     if case["columns"][c].get("error")})
    if errors:
        lines += [""] + [f"- {e}" for e in errors]
    numerics = result.get("computed_numerics", {})
    lines += recipes_markdown({"recipe": result.get("recipes", {}).get(c), "computed_numerics": numerics.get(c)}
                              for c in cols)
    return "\n".join(lines) + "\n"

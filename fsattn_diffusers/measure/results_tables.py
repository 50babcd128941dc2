"""The README's results tables, rendered from the committed result files (``benchmarks/results/*.json``).

``python -m fsattn_diffusers.measure.results_tables`` prints every table; ``--write`` puts each into README.md between
its markers ``<!-- results:NAME -->`` and ``<!-- /results:NAME -->``. ``tests/test_results.py`` renders them from the
committed JSON and compares with README.md, so the README cannot drift from the data. Each table ends with its
provenance line: the file, device, date and commit of every number in it.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .e2e_tables import (E2E_HOPPER_FILE, e2e_line, end_to_end, end_to_end_hopper, hybrid, scheduled_against_sage,
                         two_gpus)
from .result_files import ROOT, SHAPE_NAMES, load, markdown_table, meta, provenance, source, speedup_text
from .structured_inputs import DESCRIPTIONS


# ------------------------------------------------------------------------------------------------------ kernel speed

#: The recipes of the speed table, in its order.
SPEED_RECIPES = ("mxfp8", "mxfp6", "mxfp4", "int8-fp8", "int8-bf16", "int8-bf16+exponential=exact")
#: The bench run the speed table shows: the newest with every recipe of SPEED_RECIPES in one process.
SPEED_FILE = "bench_h100.json"


def _rows_by_shape(doc: Dict, inputs: str) -> Dict[tuple, Dict[str, Dict]]:
    """The rows of a bench result (``fsattn bench --json``) on the input family ``inputs``, per shape (B, H, S, D)
    and method, shapes in the file's order.

    Parameters
    ----------
    doc : dict
        The bench result: ``results`` rows with ``shape`` [B, H, Sq, Sk, D], ``inputs`` and ``method``.
    inputs : str
        The input family: ``"gaussian"`` or a family of :mod:`fsattn_diffusers.measure.structured_inputs`. Rows
        without ``inputs`` (files from before the bench took ``--inputs``) are gaussian's.

    Returns
    -------
    dict
        ``{(B, H, S, D): {method: row}}``.
    """
    by_shape: Dict[tuple, Dict[str, Dict]] = {}
    for r in doc["results"]:
        if _family(r) == inputs:
            by_shape.setdefault(tuple(r["shape"][:3] + r["shape"][4:]), {})[r["method"]] = r
    return by_shape


def _family(row: Dict) -> str:
    """A bench row's input family: its ``inputs``, gaussian for rows without one (files from before ``--inputs``)."""
    return row.get("inputs", "gaussian")


def _structured_families(doc: Dict) -> List[str]:
    """The input families of a bench result other than gaussian, in the file's order."""
    return [f for f in dict.fromkeys(_family(r) for r in doc["results"]) if f != "gaussian"]


def speed(root: str = ROOT) -> List[str]:
    """Per shape: the baselines and our recipes' whole call on gaussian inputs, from :data:`SPEED_FILE`; ratios are
    baseline time / ours. The file's other input families are :func:`speed_structured_inputs`'s."""
    name = SPEED_FILE
    doc = load(name, root)
    by_shape = _rows_by_shape(doc, "gaussian")
    rows = []
    for shape, m in by_shape.items():
        fp8, sage = m.get("fa3-fp8", {}), m.get("sageattention", {})
        for rec in SPEED_RECIPES:
            r = m.get(rec)
            if r is None:
                continue
            rows.append([SHAPE_NAMES.get(shape, str(shape)), f"**{rec}**", f"{r['ms']:.2f}",
                         f"{m['sdpa-cudnn']['ms']:.2f}", f"{m['fa3-bf16']['ms']:.2f}",
                         f"{fp8['ms']:.2f} ({fp8['kernel_ms']:.2f})" if fp8 else "-",
                         f"{sage['ms']:.2f}" if sage else "-",
                         " / ".join(speedup_text(r.get(k)) for k in ("speedup_vs_cudnn", "speedup_vs_best_bf16",
                                                            "speedup_vs_fa3_fp8", "speedup_vs_fa3_fp8_kernel",
                                                            "speedup_vs_sage")),
                         f"{r['rel_err'] * 100:.2f}"])
    header = ["shape (B, H, S, D)", "recipe", "ms", "SDPA cuDNN ms", "FA3 bf16 ms", "FA3 FP8 ms (kernel alone)",
              "SageAttention 2 ms", "vs cuDNN / FA3 bf16 / FA3 FP8 / FA3 FP8 kernel / SageAttention 2",
              "error % (normal inputs)"]
    first = next(iter(by_shape.values()), {})  # the baselines' error on the first shape's inputs
    errs = [f"{k} {first[k]['rel_err'] * 100:.2f}" for k in ("fa3-bf16", "fa3-fp8", "sageattention") if k in first]
    note = [f"Error % of the baselines on the same inputs: {', '.join(errs)}."] if errs else []
    tiers = {n: load(n, root) for n in dict.fromkeys(n for _, n in TIER_ROWS)}
    structured = {rec: sage_error_ratios(tiers[n]["result"]["cases"], rec) for rec, n in TIER_ROWS}
    e2e = load(E2E_HOPPER_FILE, root)
    other = {f: _rows_by_shape(doc, f) for f in _structured_families(doc)}
    schedules, schedule_sources = scheduled_against_sage(root)
    return (markdown_table(header, rows) + note + _pick_line(by_shape, structured, other)
            + e2e_line(e2e["summary"], schedules)
            + provenance([source(name, doc)] + [source(n, d) for n, d in tiers.items()]
                          + [source(E2E_HOPPER_FILE, e2e)] + schedule_sources))


def speed_structured_inputs(root: str = ROOT) -> List[str]:
    """Per input family of :data:`SPEED_FILE` other than gaussian, per shape: our recipes' whole call against
    SageAttention 2 on the same inputs, with both errors.

    Parameters
    ----------
    root : str
        The repository root holding ``benchmarks/results/``.

    Returns
    -------
    list of str
        The table's lines and its provenance line; without such runs, one line that says so and the provenance.
    """
    name = SPEED_FILE
    doc = load(name, root)
    families = _structured_families(doc)
    rows = []
    for family in families:
        label = f"{family} ({DESCRIPTIONS[family]})" if family in DESCRIPTIONS else family
        for shape, m in _rows_by_shape(doc, family).items():
            sage = m.get("sageattention")
            for rec in SPEED_RECIPES:
                r = m.get(rec)
                if r is None:
                    continue
                rows.append([SHAPE_NAMES.get(shape, str(shape)), label, f"**{rec}**", f"{r['ms']:.2f}",
                             f"{sage['ms']:.2f}" if sage else "-", speedup_text(r.get("speedup_vs_sage")),
                             f"{r['rel_err'] * 100:.2f}", f"{sage['rel_err'] * 100:.2f}" if sage else "-"])
    if not rows:
        what = " of the speed table's recipes" if families else ""
        return [f"The speed file ({name}) has no runs{what} on structured inputs."] + provenance([source(name, doc)])
    header = ["shape (B, H, S, D)", "inputs", "recipe", "ms", "SageAttention 2 ms", "vs SageAttention 2", "error %",
              "SageAttention 2 error %"]
    return markdown_table(header, rows) + provenance([source(name, doc)])


#: SageAttention 2's accuracy as a recipe must meet it on the structured suite to count as "at its accuracy": error
#: ratios (ours / its, per cell) at most ``gaussian`` on every gaussian cell, ``geomean`` in the geometric mean over
#: all cells, ``worst`` in any one cell.
AT_SAGE_ACCURACY = {"gaussian": 1.10, "geomean": 1.0, "worst": 1.3}


def sage_ratio_summary(ratios: Sequence[Tuple[float, str]]) -> Dict[str, float]:
    """``{"gaussian", "geomean", "worst"}`` of per-cell ``(error ratio over SageAttention 2's, family)`` pairs: the
    largest gaussian ratio (inf without a gaussian cell), the geometric mean and the largest ratio."""
    return {"gaussian": max((r for r, fam in ratios if fam == "gaussian"), default=math.inf),
            "geomean": math.exp(sum(math.log(r) for r, _ in ratios) / len(ratios)),
            "worst": max(r for r, _ in ratios)}


def at_sage_accuracy(summary: Dict[str, float]) -> bool:
    """Whether a :func:`sage_ratio_summary` is within :data:`AT_SAGE_ACCURACY`."""
    return all(summary[k] <= bar for k, bar in AT_SAGE_ACCURACY.items())


def sage_error_ratios(cases: List[Dict], rec: str) -> Dict[str, float]:
    """:func:`sage_ratio_summary` of ``rec``'s error over SageAttention 2's (the ``sage`` column) in a structured-suite
    result's cells."""
    return sage_ratio_summary([(c["columns"][rec]["err"] / c["columns"]["sage"]["err"], c["family"]) for c in cases])


def _pick_line(by_shape: Dict[tuple, Dict[str, Dict]], structured: Optional[Dict[str, Dict[str, float]]] = None,
               other_inputs: Optional[Dict[str, Dict[tuple, Dict[str, Dict]]]] = None) -> List[str]:
    """Which recipe of the table a Hopper user picks for speed (the highest ratio over SageAttention 2 at its slowest
    shape), for quality (the lowest error at its worst shape) and for both (at least SageAttention 2's speed at every
    shape, at its accuracy), with the ranges behind each. At its accuracy: within :data:`AT_SAGE_ACCURACY` on the
    structured suite where ``structured`` (recipe -> :func:`sage_error_ratios`) has the recipe, else at most its error
    on the bench's inputs at every shape. ``other_inputs`` (family -> :func:`_rows_by_shape`, the same bench's other
    input families) adds each named recipe's speed over SageAttention 2 there; the picks are made on ``by_shape``."""
    structured = structured or {}
    other_inputs = other_inputs or {}
    stats = {}
    for rec in SPEED_RECIPES:
        rows = [(m[rec], m.get("sageattention")) for m in by_shape.values() if rec in m]
        if not rows or any(sage is None or r.get("speedup_vs_sage") is None for r, sage in rows):
            continue
        if rec in structured:
            accurate = at_sage_accuracy(structured[rec])
        else:
            accurate = all(r["rel_err"] <= sage["rel_err"] for r, sage in rows)
        stats[rec] = ([r["speedup_vs_sage"] for r, _ in rows], [r["rel_err"] * 100 for r, _ in rows], accurate)
    if not stats:
        return []

    def span(v, fmt):
        lo, hi = fmt.format(min(v)), fmt.format(max(v))
        return lo if lo == hi else f"{lo}-{hi}"

    def said(rec):
        x, e, _ = stats[rec]
        extra = (f"; structured inputs {structured[rec]['geomean']:.3f}x its error in the geometric mean, "
                 f"{structured[rec]['gaussian']:.2f}x on gaussian" if rec in structured else "")
        for family, shapes in other_inputs.items():
            there = [m[rec]["speedup_vs_sage"] for m in shapes.values() if m.get(rec, {}).get("speedup_vs_sage")]
            if there:
                extra += f"; on `{family}` {span(there, '{:.3f}x')} SageAttention 2"
        return f"**{rec}** ({span(x, '{:.3f}x')} SageAttention 2, error {span(e, '{:.2f}')}%{extra})"

    fast = max(stats, key=lambda r: min(stats[r][0]))
    accurate = min(stats, key=lambda r: max(stats[r][1]))
    both = [r for r, (x, _, ok) in stats.items() if min(x) >= 1.0 and ok]
    both_said = (", ".join(said(r) for r in both) if both else
                 "none of these recipes: SageAttention 2 itself (the `sage` policy)")
    bars = AT_SAGE_ACCURACY
    return ["", f"Pick on Hopper, from this table: for speed {said(fast)}; for quality {said(accurate)}; for both (at "
                f"least SageAttention 2's speed at every shape, at its accuracy: on the structured suite at most "
                f"{bars['gaussian']:.2f}x its error on gaussian, {bars['geomean']:.2f}x in the geometric mean and "
                f"{bars['worst']:.2f}x in any cell, or without a structured comparison at most its error here) "
                f"{both_said}."]


# ---------------------------------------------------------------------------------------------------------- accuracy

def table4(root: str = ROOT) -> List[str]:
    name = "table4_h200.json"
    doc = load(name, root)
    cols = list(dict.fromkeys(r["column"] for r in doc["rows"]))
    cells = {(r["row"], r["column"]): r for r in doc["rows"]}
    rows = []
    for row in dict.fromkeys(r["row"] for r in doc["rows"]):
        rows.append([row] + [f"{cells[row, c]['ours']['err_pct']:.3f} ({cells[row, c]['paper']['err_pct']:g})"
                             for c in cols])
    return markdown_table(["components"] + [c.upper() for c in cols], rows) + provenance([source(name, doc)])


STRUCTURED_COLUMNS = ("fa3-fp8", "mxfp8", "conventional-mxfp8", "mxfp6", "mxfp4")


def structured(root: str = ROOT, dtype: str = "bfloat16", head_dim: int = 128,
               name: str = "structured_accuracy_h200.json") -> List[str]:
    doc = load(name, root)
    cols = [c for c in STRUCTURED_COLUMNS if c in doc["result"]["columns"]]
    rows = []
    for case in doc["result"]["cases"]:
        if case["dtype"] != dtype or case["head_dim"] != head_dim:
            continue
        rows.append([case["family"]] + [f"{case['columns'][c]['err'] * 100:.2f}" if case["columns"][c].get("err")
                                        is not None else "-" for c in cols])
    seeds = meta(doc).get("seeds")
    header = [f"family ({dtype.replace('float', 'f')}, D={head_dim}), error % (mean of {seeds} seeds)"] + cols
    return markdown_table(header, rows) + provenance([source(name, doc)])


#: The INT8 tiers' recipes, compared cell by cell with SageAttention 2 (the ``sage`` column), and the result file
#: each row comes from.
TIER_ROWS = (("int8-fp8", "structured_accuracy_int8_fp8_h100.json"),
             ("int8-bf16", "structured_accuracy_int8_h200.json"),
             ("int8-bf16+exponential=exact", "structured_accuracy_int8_h200.json"))
#: Cells above SageAttention 2 are named up to this many, else counted.
TIER_CELLS_NAMED = 4


def accurate_tier(root: str = ROOT) -> List[str]:
    """The INT8 tiers against SageAttention 2 over the cells (family x dtype x head dim) of their result files
    (:data:`TIER_ROWS`): geometric mean and range of the error ratio, gaussian, cells above it."""
    rows, sources = [], []
    for rec, name in TIER_ROWS:
        doc = load(name, root)
        cases = doc["result"]["cases"]
        sources.append(source(name, doc) + ("" if doc.get("complete", True) else
                                             f", {len(cases)} cells: the run was cut before the last"))
        ratios, above = [], []
        for c in cases:
            ours, sage = c["columns"][rec]["err"], c["columns"]["sage"]["err"]
            ratios.append(ours / sage)
            if ours > sage:
                above.append(f"{c['family']} {c['dtype'].replace('float', 'f')} D{c['head_dim']}")
        gauss, gauss_sage = ([c["columns"][col]["err"] * 100 for c in cases if c["family"] == "gaussian"]
                             for col in (rec, "sage"))
        geo = sage_ratio_summary([(r, c["family"]) for r, c in zip(ratios, cases)])["geomean"]
        named = f": {', '.join(above)}" if above and len(above) <= TIER_CELLS_NAMED else ""
        rows.append([f"**{rec}**", f"{geo:.3f}x", f"{min(ratios):.2f}x - {max(ratios):.2f}x",
                     f"{min(gauss):.2f} - {max(gauss):.2f} (SageAttention 2: {min(gauss_sage):.2f} - "
                     f"{max(gauss_sage):.2f})", f"{len(above)} of {len(ratios)}{named}"])
    seeds = meta(doc).get("seeds")
    header = ["recipe", "error / SageAttention 2's, geometric mean", "range over the cells", "gaussian error %",
              f"cells above SageAttention 2 ({seeds} seeds each)"]
    return markdown_table(header, rows) + provenance(sources)


#: README marker name -> renderer.
TABLES: Dict[str, Callable[..., List[str]]] = {"speed": speed, "speed_inputs": speed_structured_inputs,
                                               "table4": table4, "structured": structured,
                                               "accurate_tier": accurate_tier, "end_to_end": end_to_end,
                                               "end_to_end_hopper": end_to_end_hopper,
                                               "hybrid": hybrid, "two_gpus": two_gpus}


def render(name: str, root: str = ROOT) -> str:
    return "\n".join(TABLES[name](root)) + "\n"


def _pattern(name: str) -> "re.Pattern":
    return re.compile(rf"(<!-- results:{name} -->\n)(.*?)(<!-- /results:{name} -->)", re.S)


def readme_tables(text: str) -> Dict[str, str]:
    """The text between each pair of markers in ``text`` (README.md)."""
    return {name: m.group(2) for name in TABLES if (m := _pattern(name).search(text))}


def write_readme(path: str, root: str = ROOT) -> List[str]:
    """Replace every marked table of ``path``; return the names that changed."""
    with open(path) as fh:
        text = fh.read()
    changed = []
    for name in TABLES:
        new = render(name, root)
        m = _pattern(name).search(text)
        if m is None:
            raise SystemExit(f"{path}: no markers <!-- results:{name} --> ... <!-- /results:{name} -->")
        if m.group(2) != new:
            changed.append(name)
            text = text[:m.start(2)] + new + text[m.end(2):]
    with open(path, "w") as fh:
        fh.write(text)
    return changed


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fsattn_diffusers.measure.results_tables", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help="update README.md's marked tables in place")
    ap.add_argument("--root", default=ROOT, help="repository root (default: this checkout)")
    args = ap.parse_args(argv)
    if args.write:
        changed = write_readme(os.path.join(args.root, "README.md"), args.root)
        print(f"README.md: {', '.join(changed) if changed else 'no table'} changed")
        return 0
    for name in TABLES:
        sys.stdout.write(f"<!-- results:{name} -->\n{render(name, args.root)}<!-- /results:{name} -->\n\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

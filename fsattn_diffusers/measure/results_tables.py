"""The README's results tables, rendered from the committed result files (``benchmarks/results/*.json``).

``python -m fsattn_diffusers.measure.results_tables`` prints every table; ``--write`` puts each into README.md between
its markers ``<!-- results:NAME -->`` and ``<!-- /results:NAME -->``. ``tests/test_results.py`` renders them from the
committed JSON and compares with README.md, so the README cannot drift from the data. Each table ends with its
provenance line: the file, device, date and commit of every number in it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .structured_inputs import DESCRIPTIONS

#: The repository root (this file is fsattn_diffusers/measure/results_tables.py in a checkout).
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join("benchmarks", "results")
SHAPE_NAMES = {(1, 24, 32768, 128): "paper (1, 24, 32768, 128)",
               (1, 40, 75600, 128): "Wan2.2-A14B 720p (1, 40, 75600, 128)",
               (1, 24, 119040, 128): "HunyuanVideo 720p (1, 24, 119040, 128)"}


def load(name: str, root: str = ROOT) -> Dict:
    with open(os.path.join(root, RESULTS, name)) as fh:
        return json.load(fh)


def _meta(doc: Dict) -> Dict:
    return doc.get("meta") or doc.get("environment") or {}


def _source(name: str, doc: Dict) -> str:
    """``[file](path) (device, date, commit)`` of one result file."""
    m = _meta(doc)
    device = m.get("device") or ", ".join(m.get("devices", [])) or "?"
    if isinstance(m.get("devices"), list) and len(set(m["devices"])) == 1 and len(m["devices"]) > 1:
        device = f"{len(m['devices'])}x {m['devices'][0]}"
    return f"[{name}]({RESULTS}/{name}) ({device}, {str(m.get('date', '?'))[:10]}, {m.get('commit') or '?'})"


def _provenance(sources: Sequence[str]) -> List[str]:
    """The table's provenance line: every file its numbers come from, with device, date and commit."""
    return ["", "Source: " + "; ".join(dict.fromkeys(sources)) + "."]


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> List[str]:
    return ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |",
            *["| " + " | ".join(r) + " |" for r in rows]]


def _x(v: Optional[float]) -> str:
    return f"{v:.3f}x" if v else "-"


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
                         " / ".join(_x(r.get(k)) for k in ("speedup_vs_cudnn", "speedup_vs_best_bf16",
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
    schedules, schedule_sources = _scheduled_against_sage(root)
    return (_table(header, rows) + note + _pick_line(by_shape, structured, other)
            + _e2e_line(e2e["summary"], schedules)
            + _provenance([_source(name, doc)] + [_source(n, d) for n, d in tiers.items()]
                          + [_source(E2E_HOPPER_FILE, e2e)] + schedule_sources))


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
                             f"{sage['ms']:.2f}" if sage else "-", _x(r.get("speedup_vs_sage")),
                             f"{r['rel_err'] * 100:.2f}", f"{sage['rel_err'] * 100:.2f}" if sage else "-"])
    if not rows:
        what = " of the speed table's recipes" if families else ""
        return [f"The speed file ({name}) has no runs{what} on structured inputs."] + _provenance([_source(name, doc)])
    header = ["shape (B, H, S, D)", "inputs", "recipe", "ms", "SageAttention 2 ms", "vs SageAttention 2", "error %",
              "SageAttention 2 error %"]
    return _table(header, rows) + _provenance([_source(name, doc)])


def _e2e_line(summary: Dict[str, Dict], schedules: Sequence[Tuple[str, int, float]] = ()) -> List[str]:
    """Our policies of the Hopper end-to-end run (:data:`E2E_HOPPER_FILE`), fastest first, by their step time over
    SageAttention 2's (the ``sage`` policy); then each ``(policy, steps, speed over sage)`` of a real scheduled run
    (:func:`_scheduled_against_sage`)."""
    ours = [(p, r["speedup_vs"]["sage"]) for p, r in summary.items()
            if p not in dict(E2E_BASELINES) and r.get("speedup_vs", {}).get("sage")]
    if not ours:
        return []
    said = ", ".join(f"**{p}** {x:.3f}x" for p, x in sorted(ours, key=lambda t: -t[1]))
    runs = "".join(f"; **{p}** {x:.3f}x over a real {n}-step run (the hybrid table below)" for p, n, x in schedules)
    return ["", f"End to end (a Wan2.2 720p denoising step, random weights; the Hopper table below), speed over "
                f"SageAttention 2's (`sage`): {said}{runs}."]


def _scheduled_against_sage(root: str) -> Tuple[List[Tuple[str, int, float]], List[str]]:
    """``(policy, steps, speed over sage)`` of each committed :data:`HYBRID_RUNS` run that timed ``sage`` beside it,
    and the sources of those files."""
    found, sources = [], []
    for _, name, policy in HYBRID_RUNS:
        if not os.path.exists(os.path.join(root, RESULTS, name)):
            continue
        doc = load(name, root)
        x = doc["summary"].get(policy, {}).get("speedup_vs", {}).get("sage")
        if x:
            found.append((policy, doc["schedules"][policy]["steps"], x))
            sources.append(_source(name, doc))
    return found, sources


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
    return _table(["components"] + [c.upper() for c in cols], rows) + _provenance([_source(name, doc)])


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
    seeds = _meta(doc).get("seeds")
    header = [f"family ({dtype.replace('float', 'f')}, D={head_dim}), error % (mean of {seeds} seeds)"] + cols
    return _table(header, rows) + _provenance([_source(name, doc)])


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
        sources.append(_source(name, doc) + ("" if doc.get("complete", True) else
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
    seeds = _meta(doc).get("seeds")
    header = ["recipe", "error / SageAttention 2's, geometric mean", "range over the cells", "gaussian error %",
              f"cells above SageAttention 2 ({seeds} seeds each)"]
    return _table(header, rows) + _provenance(sources)


# ------------------------------------------------------------------------------------------------------ end to end

#: The Hopper policies end to end (Wan2.2, BF16 GEMMs, eager): every attention of ours and the baselines in one run.
E2E_HOPPER_FILE = "e2e_wan22_hopper_h100.json"
E2E_FILES = (("Wan2.2 720p × 81, BF16 GEMMs, eager", E2E_HOPPER_FILE),
             ("Wan2.2, FP8 GEMMs, eager", "e2e_wan22_fp8_gemms_h200.json"),
             ("Wan2.2, BF16 GEMMs, compiled", "e2e_wan22_bf16_gemms_compiled_h200.json"),
             ("Wan2.2, FP8 GEMMs, compiled", "e2e_wan22_fp8_gemms_compiled_h200.json"),
             ("HunyuanVideo 720p × 129, 64 of 256 text tokens", "e2e_hunyuan_h200.json"))


def end_to_end(root: str = ROOT) -> List[str]:
    rows, sources = [], []
    for label, name in E2E_FILES:
        doc = load(name, root)
        s = doc["summary"]
        ours = s["mxfp8"]
        rows.append([label] + [f"{s[p]['step_s']:.2f}" if p in s else "-" for p in ("bf16", "fa3", "fa3-fp8")]
                    + [f"**{ours['step_s']:.2f}**"] + [_x(ours["speedup_vs"].get(p)) for p in ("bf16", "fa3", "fa3-fp8")])
        sources.append(_source(name, doc))
    header = ["configuration", "SDPA bf16 s/step", "FA3 bf16", "FA3 FP8", "mxfp8", "mxfp8 vs SDPA", "vs FA3 bf16",
              "vs FA3 FP8"]
    return _table(header, rows) + _provenance(sources)


E2E_BASELINES = (("bf16", "SDPA bf16"), ("fa3", "FA3 bf16"), ("fa3-fp8", "FA3 FP8"), ("sage", "SageAttention 2"))


def end_to_end_hopper(root: str = ROOT) -> List[str]:
    """One row per policy of :data:`E2E_HOPPER_FILE`: step time, 20 steps, speedup over each baseline of the run and
    the share of the step spent in attention."""
    name = E2E_HOPPER_FILE
    doc = load(name, root)
    s = doc["summary"]
    base = [(p, label) for p, label in E2E_BASELINES if p in s]
    rows = []
    for policy, r in s.items():
        mark = "{}" if policy in dict(E2E_BASELINES) else "**{}**"
        rows.append([mark.format(policy), f"{r['step_s']:.2f}", f"{r['projected_s']:.1f}"]
                    + [_x(r["speedup_vs"].get(p)) for p, _ in base]
                    + [f"{100 * r['attention_share']:.0f}%" if r.get("attention_share") is not None else "-"])
    header = ["policy", "s/step", "20 steps (s)"] + [f"vs {label}" for _, label in base] + ["attention share"]
    return _table(header, rows) + _provenance([_source(name, doc)])


#: The real runs of a step-scheduled policy, in table order: (configuration, result file, policy). The paper's
#: ``hybrid`` (MXFP6 ends, MXFP4 between) and the Hopper hybrid (``int8-bf16`` ends, ``mxfp8`` between).
HYBRID_RUNS = (("Wan2.2 720p × 81, BF16 GEMMs, eager", "e2e_wan22_hybrid_h200.json", "hybrid"),
               ("Wan2.2 720p × 81, BF16 GEMMs, eager", "e2e_wan22_hopper_hybrid_h100.json", "hybrid-int8-mxfp8"))


def hybrid(root: str = ROOT) -> List[str]:
    """One row per :data:`HYBRID_RUNS` entry: the policy's real schedule (steps, the recipes per step, total and mean
    step time) against the same run's SDPA bf16 step and, where it ran, SageAttention 2's (``sage``)."""
    rows, sources = [], []
    for label, name, policy in HYBRID_RUNS:
        doc = load(name, root)
        s, run = doc["summary"], doc["schedules"][policy]
        plan = run["plan"]
        counts = ", ".join(f"{plan.count(n)} {n}" for n in dict.fromkeys(plan))
        sage = s.get("sage")
        rows.append([label, f"**{policy}**", _meta(doc).get("device", "?"), f"{s['bf16']['step_s']:.2f}",
                     f"{sage['step_s']:.2f}" if sage else "-", f"{run['total_s']:.1f} ({run['steps']} steps: {counts})",
                     f"{run['step_mean_s']:.2f}", _x(s[policy]["speedup"]),
                     _x(s[policy].get("speedup_vs", {}).get("sage")), str(run["fallback_calls"])])
        sources.append(_source(name, doc))
    header = ["configuration", "policy", "device", "SDPA bf16 s/step", "SageAttention 2 s/step", "real run (s)",
              "policy s/step", "vs SDPA bf16", "vs SageAttention 2", "calls fallen back"]
    return _table(header, rows) + _provenance(sources)


#: The two-GPU runs per framework, in table order: scripts/scaling_h200x2.sh's one-call parts (one mode each, with
#: their own 1-GPU runs) and the older both-modes file; the table shows whichever of them are committed.
TWO_GPU_FILES = (("diffusers", ("cp_scaling_ulysses_h200x2.json", "cp_scaling_ring_h200x2.json",
                                "cp_scaling_h200x2.json")),
                 ("xDiT", ("xdit_scaling_ulysses_h200x2.json", "xdit_scaling_ring_h200x2.json",
                           "xdit_scaling_h200x2.json")))
SETTING_NAMES = {"1gpu": "1 GPU", "ulysses": "Ulysses=2", "ring": "Ring=2"}


def _two_gpu_cell(row: Dict, one_gpu: bool) -> str:
    """``s/step (speedup vs bf16[, scaling 1 -> 2 GPUs])``, or why the policy did not run."""
    if row.get("unsupported"):
        return row["unsupported"]
    extra = "" if one_gpu or row.get("scaling") is None else f", {row['scaling']:.2f}x"
    speedup = "-" if row.get("speedup") is None else f"{row['speedup']:.2f}x"
    return f"{row['step_s']:.2f} ({speedup}{extra})"


def two_gpus(root: str = ROOT) -> List[str]:
    """One row per framework and setting of every committed two-GPU run (:data:`TWO_GPU_FILES`), one column per policy
    (the runs' summaries recomputed from their ``runs`` by :func:`fsattn_diffusers.measure.cp_scaling_report.summarize`,
    projections included), and whether every quantized policy's 2-GPU output is within the rule of its 1-GPU output."""
    from .cp_scaling_report import projections_of, summarize

    docs = []
    for label, names in TWO_GPU_FILES:
        for name in names:
            if os.path.exists(os.path.join(root, RESULTS, name)):
                doc = load(name, root)
                docs.append((label, name, doc, summarize(doc["runs"], doc["meta"]["world"],
                                                         projections_of(doc["meta"]))))
    policies: List[str] = []
    for _, _, _, summary in docs:
        for table in summary.values():
            policies += [p for p in table if p not in policies]
    policies.sort(key=lambda p: p != "bf16")  # bf16 first, then the runs' order
    rows, sources = [], []
    for label, name, doc, summary in docs:
        sources.append(_source(name, doc))
        for setting, table in summary.items():
            one_gpu = setting == "1gpu"
            failed = [p for p, r in table.items() if p != "bf16" and (r.get("match") or {}).get("ok") is False]
            ok = "-" if one_gpu else ("yes" if not failed else "no: " + ", ".join(failed))
            rows.append([label, SETTING_NAMES.get(setting, setting)]
                        + [_two_gpu_cell(table[p], one_gpu) if p in table else "-" for p in policies] + [ok])
    header = ["framework", "setting"] + policies + ["quantized outputs match 1 GPU"]
    legend = ["", "Cells: s/step (speedup over bf16 in the same setting; 2 GPUs: then scaling over the same policy on "
              "1 GPU of the same run). \"(projected)\": the step-scheduled policy projected over its 20-step plan from "
              "its recipes' step times."]
    return _table(header, rows) + legend + _provenance(sources)


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

"""The README's end-to-end tables, rendered from the committed ``fsattn e2e`` and two-GPU result files: one step of the
real-size transformer per policy, the real runs of the step-scheduled policies, and the two-GPU runs. Part of
:mod:`.results_tables` (which writes them into README.md)."""

from __future__ import annotations

import os
from typing import Dict, List, Sequence, Tuple

from .result_files import RESULTS, ROOT, load, markdown_table, meta, provenance, source, speedup_text

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
                    + [f"**{ours['step_s']:.2f}**"] + [speedup_text(ours["speedup_vs"].get(p)) for p in ("bf16", "fa3", "fa3-fp8")])
        sources.append(source(name, doc))
    header = ["configuration", "SDPA bf16 s/step", "FA3 bf16", "FA3 FP8", "mxfp8", "mxfp8 vs SDPA", "vs FA3 bf16",
              "vs FA3 FP8"]
    return markdown_table(header, rows) + provenance(sources)


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
                    + [speedup_text(r["speedup_vs"].get(p)) for p, _ in base]
                    + [f"{100 * r['attention_share']:.0f}%" if r.get("attention_share") is not None else "-"])
    header = ["policy", "s/step", "20 steps (s)"] + [f"vs {label}" for _, label in base] + ["attention share"]
    return markdown_table(header, rows) + provenance([source(name, doc)])


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
        rows.append([label, f"**{policy}**", meta(doc).get("device", "?"), f"{s['bf16']['step_s']:.2f}",
                     f"{sage['step_s']:.2f}" if sage else "-", f"{run['total_s']:.1f} ({run['steps']} steps: {counts})",
                     f"{run['step_mean_s']:.2f}", speedup_text(s[policy]["speedup"]),
                     speedup_text(s[policy].get("speedup_vs", {}).get("sage")), str(run["fallback_calls"])])
        sources.append(source(name, doc))
    header = ["configuration", "policy", "device", "SDPA bf16 s/step", "SageAttention 2 s/step", "real run (s)",
              "policy s/step", "vs SDPA bf16", "vs SageAttention 2", "calls fallen back"]
    return markdown_table(header, rows) + provenance(sources)


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
        sources.append(source(name, doc))
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
    return markdown_table(header, rows) + legend + provenance(sources)


def e2e_line(summary: Dict[str, Dict], schedules: Sequence[Tuple[str, int, float]] = ()) -> List[str]:
    """Our policies of the Hopper end-to-end run (:data:`E2E_HOPPER_FILE`), fastest first, by their step time over
    SageAttention 2's (the ``sage`` policy); then each ``(policy, steps, speed over sage)`` of a real scheduled run
    (:func:`scheduled_against_sage`)."""
    ours = [(p, r["speedup_vs"]["sage"]) for p, r in summary.items()
            if p not in dict(E2E_BASELINES) and r.get("speedup_vs", {}).get("sage")]
    if not ours:
        return []
    said = ", ".join(f"**{p}** {x:.3f}x" for p, x in sorted(ours, key=lambda t: -t[1]))
    runs = "".join(f"; **{p}** {x:.3f}x over a real {n}-step run (the hybrid table below)" for p, n, x in schedules)
    return ["", f"End to end (a Wan2.2 720p denoising step, random weights; the Hopper table below), speed over "
                f"SageAttention 2's (`sage`): {said}{runs}."]


def scheduled_against_sage(root: str) -> Tuple[List[Tuple[str, int, float]], List[str]]:
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
            sources.append(source(name, doc))
    return found, sources

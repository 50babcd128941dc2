"""The README's two-GPU table from the files scripts/scaling_h200x2.sh writes: one file per framework and mode, any
policies (sage, the INT8 tiers, a projected step-scheduled policy), a policy the framework does not run in a mode
and a quantized output outside the rule, rendered by ``e2e_tables.two_gpus`` from the runs (synthetic numbers)."""

import json
import os

import pytest

from fsattn_diffusers.measure import result_files, results_tables
from fsattn_diffusers.measure.cp_scaling_report import summarize, table_lines

POLICIES = ["bf16", "sage", "mxfp8", "int8-bf16"]
PLAN = ["int8-bf16"] * 3 + ["mxfp8"] * 14 + ["int8-bf16"] * 3
#: Synthetic step seconds: 1 GPU, then 2 GPUs (every policy scales by 1.9x except sage, 1.5x).
STEP_1GPU = {"bf16": 24.0, "sage": 20.0, "mxfp8": 16.0, "int8-bf16": 18.0}


def _run(setting, policy, step, match=None, unsupported=None):
    row = {"setting": setting, "policy": policy, "gpus": 1 if setting == "1gpu" else 2,
           "mode": None if setting == "1gpu" else setting, "rank": 0, "recipe": None, "computed_numerics": "baseline"}
    if unsupported:
        return dict(row, unsupported=unsupported)
    row.update(step_seconds=[step], step_median_s=step, first_forward_s=1.0, attention_s_per_step=step / 2,
               attention_share=0.5, rollback_rate=None)
    if match is not None:
        row["match"] = {"policy": policy, "ok": match, "rel_err_vs_1gpu": 1e-3, "cos_vs_1gpu": 0.9999}
    return row


def _doc(mode, *, sage_unsupported=False, bad=()):
    runs = [_run("1gpu", p, s) for p, s in STEP_1GPU.items()]
    for p, s in STEP_1GPU.items():
        if p == "sage" and sage_unsupported:
            runs.append(_run(mode, p, None, unsupported="not supported by xDiT's SAGE backend"))
        else:
            runs.append(_run(mode, p, s / (1.5 if p == "sage" else 1.9), match=p not in bad))
    meta = {"world": 2, "devices": ["NVIDIA H200"] * 2, "date": "2026-12-05T00:00:00Z", "commit": "abc1234",
            "command": "python -m ...", "policies": POLICIES, "modes": [mode],
            "projections": {"hybrid-int8-mxfp8": PLAN}}
    return {"meta": meta, "status": "complete", "runs": runs, "summary": {}}


@pytest.fixture
def root(tmp_path):
    folder = tmp_path / result_files.RESULTS
    folder.mkdir(parents=True)
    files = {"cp_scaling_ulysses_h200x2.json": _doc("ulysses"), "cp_scaling_ring_h200x2.json": _doc("ring"),
             "xdit_scaling_ring_h200x2.json": _doc("ring", sage_unsupported=True, bad=("int8-bf16",))}
    for name, doc in files.items():
        (folder / name).write_text(json.dumps(doc))
    return str(tmp_path)


def test_table_has_a_column_per_policy_and_a_row_per_file_and_setting(root):
    text = results_tables.render("two_gpus", root)
    print(text)
    lines = text.splitlines()
    assert lines[0] == ("| framework | setting | bf16 | sage | mxfp8 | int8-bf16 | hybrid-int8-mxfp8 (projected) | "
                        "quantized outputs match 1 GPU |")
    rows = [line for line in lines if line.startswith("| diffusers") or line.startswith("| xDiT")]
    assert [r.split(" | ")[1] for r in rows] == ["1 GPU", "Ulysses=2", "1 GPU", "Ring=2", "1 GPU", "Ring=2"]
    hybrid_1gpu = (6 * 18.0 + 14 * 16.0) / 20
    assert rows[0] == (f"| diffusers | 1 GPU | 24.00 (1.00x) | 20.00 (1.20x) | 16.00 (1.50x) | 18.00 (1.33x) | "
                       f"{hybrid_1gpu:.2f} ({24.0 / hybrid_1gpu:.2f}x) | - |")
    assert rows[1].startswith("| diffusers | Ulysses=2 | 12.63 (1.00x, 1.90x) | 13.33 (0.95x, 1.50x) | 8.42 (1.50x, "
                              "1.90x) |") and rows[1].endswith("| yes |")
    assert "| not supported by xDiT's SAGE backend |" in rows[5] and rows[5].endswith("| no: int8-bf16 |")
    assert "cp_scaling_ulysses_h200x2.json" in lines[-1] and "xdit_scaling_ring_h200x2.json" in lines[-1]
    assert "xdit_scaling_ulysses_h200x2.json" not in lines[-1]  # absent files are left out


def test_the_run_report_keeps_an_unsupported_policy_with_its_reason(root):
    doc = json.load(open(os.path.join(root, result_files.RESULTS, "xdit_scaling_ring_h200x2.json")))
    summary = summarize(doc["runs"], 2, doc["meta"]["projections"])
    ring = summary["ring"]
    assert ring["sage"]["step_s"] is None and ring["sage"]["scaling"] is None
    assert ring["sage"]["unsupported"] == "not supported by xDiT's SAGE backend"
    assert ring["hybrid-int8-mxfp8 (projected)"]["scaling"] == pytest.approx(1.9)
    lines = table_lines(dict(doc, summary=summary))
    assert "| 2 | ring | sage | - | - | - | - | - | - | - | - | not supported by xDiT's SAGE backend |" in lines
    assert any(line.startswith("| 2 | ring | int8-bf16 |") and line.endswith("| **NO** |") for line in lines)

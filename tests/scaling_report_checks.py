"""Checks shared by the two 2-process scaling runs on the CPU (``measure.cp_scaling`` and ``measure.xdit_scaling``):
run one in-process, check the shape of its report, and list the N-process outputs against the 1-process output."""

import json
import math
from typing import Callable, Dict, List, Tuple

import pytest

#: The policies each setting measures: bf16, mxfp8 and the hybrid's parts (mxfp6, mxfp4).
POLICIES = ["bf16", "mxfp8", "mxfp6", "mxfp4"]
SETTINGS = ("1gpu", "ulysses", "ring")


def run_report(main: Callable[[List[str]], int], out_dir) -> Tuple[Dict, str]:
    """Run a scaling module's ``main`` on the tiny Wan config, 2 CPU processes; returns (JSON report, Markdown)."""
    js, md = out_dir / "scaling.json", out_dir / "scaling.md"
    assert main(["--tiny", "--device", "cpu", "--world", "2", "--backend", "emulator",
                 "--policies", "bf16,mxfp8,hybrid", "--json", str(js), "--md", str(md)]) == 0
    return json.loads(js.read_text()), md.read_text()


def report_fixture(load_main: Callable[[], Callable[[List[str]], int]], folder: str):
    """A module-scoped fixture: the (JSON report, Markdown) of ``load_main()`` run by :func:`run_report`."""
    @pytest.fixture(scope="module")
    def report(tmp_path_factory):
        return run_report(load_main(), tmp_path_factory.mktemp(folder))
    return report


def check_every_setting_and_policy(doc: Dict, md: str) -> None:
    """Every (setting, policy) measured with finite times, the hybrid projected per setting, the table written."""
    assert doc["status"] == "complete" and doc["meta"]["weights_identical"] is True
    got = sorted((r["setting"], r["policy"]) for r in doc["runs"])
    assert got == sorted((s, p) for s in SETTINGS for p in POLICIES)
    for r in doc["runs"]:
        assert r["step_seconds"] and all(math.isfinite(x) and x > 0 for x in r["step_seconds"]), r
        assert math.isfinite(r["attention_share"]) and 0 < r["attention_share"] < 1, r
    for setting in SETTINGS:
        table = doc["summary"][setting]
        assert set(table) == set(POLICIES) | {"hybrid (projected)"} and table["bf16"]["speedup"] == 1.0
        for p, row in table.items():
            assert math.isfinite(row["step_s"]) and math.isfinite(row["speedup"]), (setting, p)
            if setting != "1gpu":
                assert row["gpus"] == 2 and math.isfinite(row["scaling"]) and row["scaling"] > 0, (setting, p)
    assert "| 2 | ring | hybrid (projected) |" in md and "| 1 | - | bf16 |" in md


def match_rows(doc: Dict, mode: str) -> Dict[str, Dict]:
    """Per policy, the 2-process output against the 1-process output in ``mode`` (printed, finite checked)."""
    rows = {r["policy"]: r["match"] for r in doc["runs"] if r["setting"] == mode}
    for p, m in rows.items():
        print(f"{mode:8} {p:6} rel err vs 1 process {m['rel_err_vs_1gpu']:.3e}  cos {m['cos_vs_1gpu']:.6f}  "
              f"e_single {m.get('e_single')}  e_sharded {m.get('e_sharded')}  ok {m['ok']}")
        assert math.isfinite(m["rel_err_vs_1gpu"]) and math.isfinite(m["cos_vs_1gpu"])
    return rows

"""The 2-GPU scaling run (measure.cp_scaling) end to end on the CPU: 2 gloo processes, the tiny Wan config.

Runs ``python -m fsattn_diffusers.measure.cp_scaling --tiny --device cpu --world 2`` in-process and checks the
report: every (setting, policy) measured, finite numbers, hybrid projected per setting, and the N-GPU output
of one transformer call matching the 1-GPU output for bf16 (stock attention through diffusers' templates; the
cuDNN forward op is replaced by torch's CPU flash SDPA on the CPU) and mxfp8.
"""

import json
import math

import pytest

from fsattn_diffusers.measure import cp_scaling as scaling

POLICIES = ["bf16", "mxfp8", "mxfp6", "mxfp4"]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("scaling")
    js, md = out / "scaling.json", out / "scaling.md"
    assert scaling.main(["--tiny", "--device", "cpu", "--world", "2", "--backend", "emulator",
                         "--policies", "bf16,mxfp8,hybrid", "--json", str(js), "--md", str(md)]) == 0
    return json.loads(js.read_text()), md.read_text()


def test_every_setting_and_policy_is_measured(report):
    doc, md = report
    assert doc["status"] == "complete"
    assert doc["meta"]["weights_identical"] is True
    assert doc["meta"]["env"] == scaling.NVLS_ENV
    got = sorted((r["setting"], r["policy"]) for r in doc["runs"])
    assert got == sorted((s, p) for s in ("1gpu", "ulysses", "ring") for p in POLICIES)
    for r in doc["runs"]:
        assert r["step_seconds"] and all(math.isfinite(x) and x > 0 for x in r["step_seconds"]), r
        assert math.isfinite(r["attention_share"]) and 0 < r["attention_share"] < 1, r
    for setting in ("1gpu", "ulysses", "ring"):
        table = doc["summary"][setting]
        assert set(table) == set(POLICIES) | {"hybrid (projected)"}
        assert table["bf16"]["speedup"] == 1.0
        for p, row in table.items():
            assert math.isfinite(row["step_s"]) and math.isfinite(row["speedup"]), (setting, p)
            if setting != "1gpu":
                assert row["gpus"] == 2 and math.isfinite(row["scaling"]) and row["scaling"] > 0, (setting, p)
    assert "| 2 | ring | hybrid (projected) |" in md and "| 1 | - | bf16 |" in md


@pytest.mark.parametrize("mode", ["ulysses", "ring"])
def test_two_process_output_matches_one_process(report, mode):
    doc, _ = report
    rows = {r["policy"]: r["match"] for r in doc["runs"] if r["setting"] == mode}
    for p, m in rows.items():
        print(f"{mode:8} {p:6} rel err vs 1 process {m['rel_err_vs_1gpu']:.3e}  cos {m['cos_vs_1gpu']:.6f}  "
              f"e_single {m.get('e_single')}  e_sharded {m.get('e_sharded')}  ok {m['ok']}")
        assert math.isfinite(m["rel_err_vs_1gpu"]) and math.isfinite(m["cos_vs_1gpu"])
    assert rows["bf16"]["ok"] and rows["bf16"]["rel_err_vs_1gpu"] <= scaling.BF16_TOLERANCE
    assert rows["mxfp8"]["ok"] and rows["mxfp8"]["cos_vs_1gpu"] > 0.999


def test_policy_expansion():
    assert scaling.expand_policies(["mxfp8", "hybrid"]) == ["bf16", "mxfp8", "mxfp6", "mxfp4"]
    with pytest.raises(ValueError, match="accepted"):
        scaling.expand_policies(["fp8"])

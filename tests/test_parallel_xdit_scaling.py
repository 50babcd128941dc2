"""The xDiT scaling run (measure.xdit_scaling) end to end on the CPU: 2 gloo processes, the tiny Wan config, real xfuser 0.7.

Runs ``python -m fsattn_diffusers.measure.xdit_scaling --tiny --device cpu --world 2`` in-process: xDiT's own
``xFuserWanTransformer3DWrapper``, its distributed init and groups (``initialize_model_parallel`` with
data-parallel 2, then Ulysses 2, then ring 2, yunchang's groups), its ``USP`` (all-to-all / torch's templated
ring attention) and runtime state, with fsattn installed in the ``SDPA_FLASH`` slot by
``fsattn_diffusers.xdit.install``. CPU stand-ins only where xfuser needs a CUDA device (see the module's
docstring): the ``CUDNN`` slot runs torch's CPU flash attention. ``sage`` runs xDiT's own ``SAGE`` slot
(``sageattn`` with its LSE; under the ring torch's templated ring merges it) on the CPU stand-in ``fake_sage``, a
package the spawned processes import when xfuser checks for SageAttention. Skipped when xfuser is not installed.
"""

import importlib.util
import math

import pytest

from fsattn_diffusers.measure import cp_scaling as scaling
from scaling_run import POLICIES, PROJECTED, run_report
from tolerances import SHARDED_COSINE_MIN

pytestmark = pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("xfuser", "yunchang", "distvae")),
                                reason="needs xfuser 0.7, yunchang and distvae (pip install xfuser)")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    from fsattn_diffusers.measure import xdit_scaling

    return run_report(xdit_scaling.main, tmp_path_factory.mktemp("xdit_scaling"))


def test_every_setting_and_policy_is_measured(report):
    doc, md = report
    assert doc["status"] == "complete" and doc["meta"]["weights_identical"] is True
    assert doc["meta"]["framework"] == "xdit" and doc["meta"]["xfuser"].startswith("0.7")
    assert doc["meta"]["env"] == scaling.NVLS_ENV
    got = sorted((r["setting"], r["policy"]) for r in doc["runs"])
    assert got == sorted((s, p) for s in ("1gpu", "ulysses", "ring") for p in POLICIES)
    for r in doc["runs"]:
        assert r["step_seconds"] and all(math.isfinite(x) and x > 0 for x in r["step_seconds"]), r
        assert math.isfinite(r["attention_share"]) and 0 < r["attention_share"] < 1, r
    for setting in ("1gpu", "ulysses", "ring"):
        table = doc["summary"][setting]
        assert set(table) == set(POLICIES) | {PROJECTED} and table["bf16"]["speedup"] == 1.0
        for p, row in table.items():
            assert math.isfinite(row["step_s"]) and math.isfinite(row["speedup"]), (setting, p)
            if setting != "1gpu":
                assert row["gpus"] == 2 and math.isfinite(row["scaling"]) and row["scaling"] > 0, (setting, p)
    assert "xDiT" in md and f"| 2 | ring | {PROJECTED} |" in md and "| 1 | - | bf16 |" in md
    assert "sage = xDiT's `SAGE` slot" in md and "| 2 | ring | sage |" in md
    assert all(r["sageattention"]["kind"] == "SageAttention 2" and r["attention_backend"] == "xdit:SAGE"
               for r in doc["runs"] if r["policy"] == "sage")


@pytest.mark.parametrize("mode", ["ulysses", "ring"])
def test_two_process_output_matches_one_process(report, mode):
    doc, _ = report
    rows = {r["policy"]: r["match"] for r in doc["runs"] if r["setting"] == mode}
    for p, m in rows.items():
        print(f"{mode:8} {p:6} rel err vs 1 process {m['rel_err_vs_1gpu']:.3e}  cos {m['cos_vs_1gpu']:.6f}  "
              f"e_single {m.get('e_single')}  e_sharded {m.get('e_sharded')}  ok {m['ok']}")
        assert m["ok"], (mode, p, m)
    assert rows["bf16"]["rel_err_vs_1gpu"] <= scaling.BF16_TOLERANCE
    if mode == "ulysses":  # all-to-all moves whole heads: same kernel calls, same numbers
        assert rows["bf16"]["rel_err_vs_1gpu"] == 0.0
    for p in POLICIES[1:]:  # the quantized kernel (or SageAttention) ran: differs from stock bf16
        assert rows[p]["e_sharded"] > 0 and rows[p]["cos_vs_1gpu"] > SHARDED_COSINE_MIN


def test_setting_degrees():
    from fsattn_diffusers.measure.xdit_scaling import setting_degrees

    assert setting_degrees("1gpu", 2) == dict(data_parallel_degree=2, ulysses_degree=1, ring_degree=1)
    assert setting_degrees("ulysses", 2) == dict(data_parallel_degree=1, ulysses_degree=2, ring_degree=1)
    assert setting_degrees("ring", 2) == dict(data_parallel_degree=1, ulysses_degree=1, ring_degree=2)

"""The 2-GPU scaling run (measure.cp_scaling) end to end on the CPU: 2 gloo processes, the tiny Wan config.

Runs ``python -m fsattn_diffusers.measure.cp_scaling --tiny --device cpu --world 2`` in-process with its default
policies (bf16, mxfp8, the INT8 tiers, the Hopper hybrid's recipes, sage) and checks the report: every (setting,
policy) measured, finite numbers, the Hopper hybrid projected per setting, and the N-GPU output of one transformer
call matching the 1-GPU output for bf16 (stock attention through diffusers' templates; the cuDNN forward op is
replaced by torch's CPU flash SDPA on the CPU) and every other policy. ``sage`` runs diffusers' own ``sage`` backend
(its ring and Ulysses templates, the ring merging the backend's LSE) on the CPU stand-in ``fake_sage``, written as a
package that the spawned processes import when they import diffusers.
"""

import math

import pytest

import fake_sage
from fsattn_diffusers.measure import cp_scaling as scaling
from fsattn_diffusers.measure.scaling_policies import PolicyKind, expand_policies, policy_kind
from scaling_run import POLICIES, PROJECTED, run_report
from tolerances import SHARDED_COSINE_MIN

@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return run_report(scaling.main, tmp_path_factory.mktemp("scaling"))


def test_every_setting_and_policy_is_measured(report):
    doc, md = report
    assert doc["status"] == "complete"
    assert doc["meta"]["weights_identical"] is True
    assert doc["meta"]["env"] == scaling.NVLS_ENV
    assert doc["meta"]["policies"] == POLICIES and list(doc["meta"]["projections"]) == ["hybrid-int8-mxfp8"]
    got = sorted((r["setting"], r["policy"]) for r in doc["runs"])
    assert got == sorted((s, p) for s in ("1gpu", "ulysses", "ring") for p in POLICIES)
    for r in doc["runs"]:
        assert r["step_seconds"] and all(math.isfinite(x) and x > 0 for x in r["step_seconds"]), r
        assert math.isfinite(r["attention_share"]) and 0 < r["attention_share"] < 1, r
    sage = [r for r in doc["runs"] if r["policy"] == "sage"]
    assert all(r["attention_backend"] == "diffusers:sage" and r["sageattention"]["kind"] == "SageAttention 2"
               and r["rollback_rate"] is None for r in sage)
    exact = next(r for r in doc["runs"] if r["policy"] == "int8-bf16+exponential=exact")
    assert exact["recipe"]["exponential"] == "exact" and exact["recipe"]["qk_format"] == "int8"
    for setting in ("1gpu", "ulysses", "ring"):
        table = doc["summary"][setting]
        assert set(table) == set(POLICIES) | {PROJECTED}
        assert table["bf16"]["speedup"] == 1.0
        runs = {r["policy"]: r["step_median_s"] for r in doc["runs"] if r["setting"] == setting}
        want = (6 * runs["int8-bf16"] + 14 * runs["mxfp8"]) / 20  # int8-bf16 on 3 + 3 of 20 steps, mxfp8 between
        assert table[PROJECTED]["step_s"] == pytest.approx(want)
        for p, row in table.items():
            assert math.isfinite(row["step_s"]) and math.isfinite(row["speedup"]), (setting, p)
            if setting != "1gpu":
                assert row["gpus"] == 2 and math.isfinite(row["scaling"]) and row["scaling"] > 0, (setting, p)
    assert f"| 2 | ring | {PROJECTED} |" in md and "| 1 | - | bf16 |" in md and "| 2 | ring | sage |" in md
    assert "hybrid-int8-mxfp8 (projected) = projection, not a timed policy: 6 int8-bf16 + 14 mxfp8 steps" in md


@pytest.mark.parametrize("mode", ["ulysses", "ring"])
def test_two_process_output_matches_one_process(report, mode):
    doc, _ = report
    rows = {r["policy"]: r["match"] for r in doc["runs"] if r["setting"] == mode}
    for p, m in rows.items():
        print(f"{mode:8} {p:28} rel err vs 1 process {m['rel_err_vs_1gpu']:.3e}  cos {m['cos_vs_1gpu']:.6f}  "
              f"e_single {m.get('e_single')}  e_sharded {m.get('e_sharded')}  ok {m['ok']}")
        assert math.isfinite(m["rel_err_vs_1gpu"]) and math.isfinite(m["cos_vs_1gpu"])
    assert rows["bf16"]["ok"] and rows["bf16"]["rel_err_vs_1gpu"] <= scaling.BF16_TOLERANCE
    for p in POLICIES[1:]:  # every quantized policy within the rule, and it differs from stock bf16 (it ran)
        assert rows[p]["ok"] and rows[p]["cos_vs_1gpu"] > SHARDED_COSINE_MIN and rows[p]["e_sharded"] > 0, (p, rows[p])


def test_policy_expansion():
    assert expand_policies(["mxfp8", "hybrid"]) == (["bf16", "mxfp8", "mxfp6", "mxfp4"],
                                                    {"hybrid": ["mxfp6"] * 3 + ["mxfp4"] * 14 + ["mxfp6"] * 3})
    measured, projections = expand_policies(["bf16", "int8-bf16+exponential=exact", "hybrid-int8-mxfp8"])
    assert measured == ["bf16", "int8-bf16+exponential=exact", "int8-bf16", "mxfp8"]
    assert projections["hybrid-int8-mxfp8"].count("int8-bf16") == 6 and len(projections["hybrid-int8-mxfp8"]) == 20
    assert [policy_kind(p) for p in ("bf16", "sage", "mxfp8")] == [PolicyKind.STOCK, PolicyKind.ATTENTION_BACKEND,
                                                                   PolicyKind.RECIPE]
    with pytest.raises(ValueError, match="accepted"):
        expand_policies(["fp8"])


def test_sage_without_sageattention_is_refused_before_any_process_starts(monkeypatch):
    fake_sage.hide(monkeypatch)
    with pytest.raises(ValueError, match="sage policy needs SageAttention"):
        expand_policies(["sage"])


def test_a_backend_diffusers_does_not_run_under_context_parallelism_is_reported_not_run(monkeypatch):
    """A diffusers backend without ``supports_context_parallel`` gets a one-line reason (recorded, not measured)."""
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    from fsattn_diffusers.measure.scaling_policies import context_parallel_refusal

    assert context_parallel_refusal("sage") == ""  # diffusers 0.42 registers sage for ring and Ulysses
    monkeypatch.setattr(_AttentionBackendRegistry, "_supports_context_parallel", set())
    assert context_parallel_refusal("sage") == \
        "not supported by diffusers' sage backend (not registered with supports_context_parallel)"

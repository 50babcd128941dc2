"""The 2-GPU scaling run (measure.cp_scaling) end to end on the CPU: 2 gloo processes, the tiny Wan config.

Runs ``python -m fsattn_diffusers.measure.cp_scaling --tiny --device cpu --world 2`` in-process and checks the
report: every (setting, policy) measured, finite numbers, hybrid projected per setting, and the N-GPU output
of one transformer call matching the 1-GPU output for bf16 (stock attention through diffusers' templates; the
cuDNN forward op is replaced by torch's CPU flash SDPA on the CPU) and mxfp8.
"""


import pytest

from fsattn_diffusers.measure import cp_scaling as scaling
from scaling_report_checks import check_every_setting_and_policy, match_rows, report_fixture
from tolerances import SHARDED_COSINE_MIN


report = report_fixture(lambda: scaling.main, "scaling")


def test_every_setting_and_policy_is_measured(report):
    doc, md = report
    check_every_setting_and_policy(doc, md)
    assert doc["meta"]["env"] == scaling.NVLS_ENV


@pytest.mark.parametrize("mode", ["ulysses", "ring"])
def test_two_process_output_matches_one_process(report, mode):
    doc, _ = report
    rows = match_rows(doc, mode)
    assert rows["bf16"]["ok"] and rows["bf16"]["rel_err_vs_1gpu"] <= scaling.BF16_TOLERANCE
    assert rows["mxfp8"]["ok"] and rows["mxfp8"]["cos_vs_1gpu"] > SHARDED_COSINE_MIN


def test_policy_expansion():
    assert scaling.expand_policies(["mxfp8", "hybrid"]) == ["bf16", "mxfp8", "mxfp6", "mxfp4"]
    with pytest.raises(ValueError, match="accepted"):
        scaling.expand_policies(["fp8"])

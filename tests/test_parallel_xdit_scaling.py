"""The xDiT scaling run (measure.xdit_scaling) end to end on the CPU: 2 gloo processes, the tiny Wan config, real xfuser 0.7.

Runs ``python -m fsattn_diffusers.measure.xdit_scaling --tiny --device cpu --world 2`` in-process: xDiT's own
``xFuserWanTransformer3DWrapper``, its distributed init and groups (``initialize_model_parallel`` with
data-parallel 2, then Ulysses 2, then ring 2, yunchang's groups), its ``USP`` (all-to-all / torch's templated
ring attention) and runtime state, with fsattn installed in the ``SDPA_FLASH`` slot by
``fsattn_diffusers.xdit.install``. CPU stand-ins only where xfuser needs a CUDA device (see the module's
docstring): the ``CUDNN`` slot runs torch's CPU flash attention. Skipped when xfuser is not installed.
"""

import importlib.util

import pytest

from fsattn_diffusers.measure import cp_scaling as scaling
from scaling_report_checks import check_every_setting_and_policy, match_rows, report_fixture
from tolerances import SHARDED_COSINE_MIN

pytestmark = pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("xfuser", "yunchang", "distvae")),
                                reason="needs xfuser 0.7, yunchang and distvae (pip install xfuser)")


def _xdit_main():
    from fsattn_diffusers.measure import xdit_scaling  # imports xfuser: only once the module is not skipped

    return xdit_scaling.main


report = report_fixture(_xdit_main, "xdit_scaling")


def test_every_setting_and_policy_is_measured(report):
    doc, md = report
    check_every_setting_and_policy(doc, md)
    assert doc["meta"]["framework"] == "xdit" and doc["meta"]["xfuser"].startswith("0.7")
    assert doc["meta"]["env"] == scaling.NVLS_ENV and "xDiT" in md


@pytest.mark.parametrize("mode", ["ulysses", "ring"])
def test_two_process_output_matches_one_process(report, mode):
    doc, _ = report
    rows = match_rows(doc, mode)
    for p, m in rows.items():
        assert m["ok"], (mode, p, m)
    assert rows["bf16"]["rel_err_vs_1gpu"] <= scaling.BF16_TOLERANCE
    if mode == "ulysses":  # all-to-all moves whole heads: same kernel calls, same numbers
        assert rows["bf16"]["rel_err_vs_1gpu"] == 0.0
    for p in ("mxfp8", "mxfp6", "mxfp4"):  # the quantized kernel ran (differs from stock bf16)
        assert rows[p]["e_sharded"] > 0 and rows[p]["cos_vs_1gpu"] > SHARDED_COSINE_MIN


def test_setting_degrees():
    from fsattn_diffusers.measure.xdit_scaling import setting_degrees

    assert setting_degrees("1gpu", 2) == dict(data_parallel_degree=2, ulysses_degree=1, ring_degree=1)
    assert setting_degrees("ulysses", 2) == dict(data_parallel_degree=1, ulysses_degree=2, ring_degree=1)
    assert setting_degrees("ring", 2) == dict(data_parallel_degree=1, ulysses_degree=1, ring_degree=2)

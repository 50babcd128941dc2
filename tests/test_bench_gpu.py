"""``fsattn bench``'s timing loop on a GPU (sm_90+): every method called once for accuracy, then timed in interleaved
rounds. The CPU tests of its parts (ratios, the round order, the report) are in tests/test_bench_baselines.py."""

import pytest

from kernel_device import CPU_INTERPRET, skip_module_without_sm90

skip_module_without_sm90()
if CPU_INTERPRET:
    pytest.skip("fsattn bench times CUDA kernels; not in Triton's interpreter", allow_module_level=True)
pytest.importorskip("triton")

from fsattn_diffusers.measure import kernel_bench as kb  # noqa: E402
from tolerances import BENCH_QUANTIZED_ERR_MAX, BF16_OPERANDS_ERR_MAX  # noqa: E402


@pytest.mark.parametrize("rounds", [1, 2])
def test_bench_rows_carry_medians_of_the_rounds(rounds):
    rows = kb.bench_shape(1, 2, 512, 512, 128, ["mxfp8", "mxfp6-paper"], ["cudnn"], warmup=2.0, rep=5.0,
                          rounds=rounds, log=lambda *a: None)
    for r in rows:
        print(r["method"], f"{r['ms']:.4f} ms err {r['rel_err']:.4f}", r.get("rounds_ms"))
    assert [r["method"] for r in rows] == ["sdpa-cudnn", "mxfp8", "mxfp6-paper"]
    for r in rows:
        assert r["ms"] > 0
        assert 0 <= r["rel_err"] < (BF16_OPERANDS_ERR_MAX if r["method"] == "sdpa-cudnn" else BENCH_QUANTIZED_ERR_MAX)
        if rounds > 1:
            assert sorted(r["rounds_ms"]) == (["kernel_ms", "ms", "prepass_ms"] if r["method"] != "sdpa-cudnn"
                                              else ["ms"])
            for part, values in r["rounds_ms"].items():
                assert len(values) == rounds and min(values) <= r[part] <= max(values)
        else:
            assert "rounds_ms" not in r
    ours = rows[1]
    assert ours["kernel_ms"] > 0 and ours["prepass_ms"] > 0 and ours["speedup_vs_cudnn"] > 0

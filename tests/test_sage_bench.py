"""SageAttention in ``fsattn bench`` and in the structured suite, on the CPU (SageAttention through its stand-in
``fake_sage``): the column, which SageAttention ran in the header and the rows, the ratios, the skip line."""

import math

import pytest
import torch

import fake_sage
from fsattn_diffusers.measure import kernel_bench as kb
from fsattn_diffusers.measure import structured_suite as suite
from fsattn_diffusers.testing import exact_attention, relative_error
from tolerances import BF16_OPERANDS_ERR_MAX

ENV = {"date": "d", "command": "fsattn bench", "torch": "t", "cuda": "c", "triton": "3.6", "python": "3.12"}


def _inputs(b=1, h=2, s=64, d=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, s, d, generator=g).to(torch.bfloat16) for _ in range(3)]


def _row(method, ms, **extra):
    return {"shape": [1, 24, 32768, 32768, 128], "method": method, "ms": ms, "tflops": 1.0, "rel_err": 0.05,
            "cos": 0.998, **extra}


def test_bench_sage_column_runs_the_imported_sage_and_names_it(monkeypatch, tmp_path):
    sage = fake_sage.install(monkeypatch, tmp_path, kind="2")
    q, k, v = _inputs()
    scale = 1 / math.sqrt(q.shape[-1])
    got = kb.baseline_callables(q, k, v, scale, ["sage"])
    fn, parts, extra = got["sage"]
    out = fn()
    assert relative_error(out, exact_attention(q, k, v, scale)[0]) < BF16_OPERANDS_ERR_MAX
    (call,) = sage.CALLS
    assert call["entry"] == "sm90" and call["tensor_layout"] == "HND" and call["sm_scale"] == scale
    assert parts == {} and extra["sageattention"]["kind"] == "SageAttention 2"
    assert extra["sageattention"]["path"].startswith(str(tmp_path))
    env = kb.environment(["sage"])
    assert env["sageattention"]["version"] == "2.2.0+d1a57a5"
    rows = kb.add_ratios([_row("sdpa-cudnn", 12.0), _row("sageattention", 10.0, **extra), _row("mxfp8", 8.0)])
    assert rows[-1]["speedup_vs_sage"] == pytest.approx(1.25) and rows[1]["speedup_vs_sage"] == pytest.approx(1.0)
    md = kb.markdown(env, rows)
    print(md)
    assert "| vs FA3 FP8 kernel | vs SageAttention |" in md
    assert "| sageattention (SageAttention 2 2.2.0+d1a57a5) |" in md and "| 1.250x |" in md
    assert "- sage (`sageattention` rows, `sageattn` whole call, its quantization included): SageAttention 2 " \
           "2.2.0+d1a57a5, sm90 kernel sageattn_qk_int8_pv_fp8_cuda_sm90" in md


def test_bench_sage_106_is_named_as_such(monkeypatch, tmp_path):
    fake_sage.install(monkeypatch, tmp_path, kind="1", dist_version="1.0.6")
    q, k, v = _inputs()
    _, _, extra = kb.baseline_callables(q, k, v, 0.125, ["sage"])["sage"]
    rows = kb.add_ratios([_row("sageattention", 10.0, **extra)])
    md = kb.markdown(kb.environment(["sage"]), rows)
    assert "| sageattention (SageAttention 1 1.0.6) |" in md and "SageAttention 1 1.0.6, Triton kernels" in md


def test_bench_sage_missing_is_skipped_with_the_reason(monkeypatch):
    fake_sage.hide(monkeypatch)
    got = kb.baseline_callables(*_inputs(), 0.125, ["sage"])
    assert isinstance(got["sage"], str) and "pip install sageattention (1.0.6, Triton)" in got["sage"]
    env = kb.environment(["sage"])
    md = kb.markdown(env, kb.add_ratios([_row("mxfp8", 8.0)]))
    assert "- sage: not run (sageattention is not importable" in md
    assert kb.add_ratios([_row("mxfp8", 8.0)])[0]["speedup_vs_sage"] is None
    assert "sageattention" not in kb.environment(["cudnn"])


def test_structured_suite_sage_column(monkeypatch, tmp_path):
    sage = fake_sage.install(monkeypatch, tmp_path, kind="2")
    cols, notes = suite.external_columns(torch.device("cuda"))
    assert "sage" in cols and not any(n.startswith("sage") for n in notes)
    q, k, v = (t.to(torch.float16) for t in _inputs(s=96))
    out = cols["sage"](q, k, v, 0.125)
    assert relative_error(out, exact_attention(q, k, v, 0.125)[0]) < BF16_OPERANDS_ERR_MAX
    assert sage.CALLS[-1]["sm_scale"] == 0.125
    fake_sage.hide(monkeypatch)
    cols, notes = suite.external_columns(torch.device("cuda"))
    assert "sage" not in cols
    (line,) = [n for n in notes if n.startswith("sage")]
    print(line)
    assert line.startswith("sage: skipped (sageattention is not importable") and "needs an NVIDIA GPU" in line


def test_structured_suite_records_which_sage_ran(monkeypatch, tmp_path):
    """The suite run with a sage column (external columns stubbed to run on the CPU): the column, its baseline
    record and which SageAttention it was."""
    fake_sage.install(monkeypatch, tmp_path, kind="2")
    real = suite.external_columns
    monkeypatch.setattr(suite, "external_columns",
                        lambda device: real(torch.device("cuda")))
    res = suite.run_suite(shape=(1, 1, 64), head_dims=(64,), dtypes=("bfloat16",), families=["gaussian"],
                          recipes=["mxfp8"], conventional=False)
    assert res["columns"] == ["mxfp8", "sage"] and res["computed_numerics"]["sage"] == "baseline"
    assert res["sageattention"]["kind"] == "SageAttention 2"
    cell = res["cases"][0]["columns"]["sage"]
    assert cell["err"] < BF16_OPERANDS_ERR_MAX and cell["inputs_unchanged"] and cell["nonfinite"] == 0
    from fsattn_diffusers.measure import provenance

    rows = dict(provenance.result_rows({"result": res}))
    assert rows["result.columns.sage"] == {"recipe": None, "computed_numerics": "baseline"}
    from fsattn_diffusers.measure.structured_report import markdown

    md = markdown({"meta": {"date": "d", "command": "c", "shape": [1, 1, 64], "head_dims": [64],
                            "dtypes": ["bfloat16"], "seeds": 1, "backend": "auto", "sageattention": res["sageattention"]},
                   "result": res, "checks": []})
    assert "sageattention SageAttention 2 2.2.0+d1a57a5, sm90 kernel" in md and "| sage |" in md

"""``fsattn bench``'s FlashAttention-3 baselines and ratios, on the CPU (FA3 through its CPU stand-in ``fake_fa3``)."""

import math

import fake_fa3
import pytest
import torch

from fsattn_diffusers.measure import kernel_bench as kb
from fsattn_diffusers.testing import exact_attention, relative_error
from tolerances import BF16_OPERANDS_ERR_MAX, FP8_OPERANDS_ERR_MAX, QUANTIZED_ERR_MIN


def _inputs(b=2, h=3, s=160, d=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, s, d, generator=g).to(torch.bfloat16) for _ in range(3)]


def test_fa3_callables_compute_attention_and_leave_inputs_alone(monkeypatch):
    fake_fa3.install(monkeypatch)
    q, k, v = _inputs()
    before = [t.clone() for t in (q, k, v)]
    scale = 1 / math.sqrt(q.shape[-1])
    fns = kb.fa3_fns(q, k, v, scale)
    ref = exact_attention(q, k, v, scale)[0]
    bf16 = fns["fa3"]()
    run, quantize, kernel = fns["fa3-fp8"]
    fp8 = run()
    e_bf16, e_fp8 = relative_error(bf16, ref), relative_error(fp8, ref)
    print(f"fa3-bf16 err {e_bf16:.4f}, fa3-fp8 err {e_fp8:.4f}")
    assert bf16.shape == fp8.shape == q.shape  # (B, H, S, D) views of FA3's BSHD output
    # FP8 operands: a few percent on N(0, 1)
    assert e_bf16 < BF16_OPERANDS_ERR_MAX and QUANTIZED_ERR_MIN < e_fp8 < FP8_OPERANDS_ERR_MAX
    assert torch.equal(kernel(), fp8)  # the timed halves compute the same call
    parts = quantize()
    assert [p[0].dtype for p in parts] == [torch.float8_e4m3fn] * 3 and parts[0][1].shape == (2, 3)
    fp8_calls = [c for c in fake_fa3.CALLS if c["q_descale"] is not None]
    assert fp8_calls and all(c["softmax_scale"] == scale for c in fake_fa3.CALLS)
    assert all(torch.equal(a, b) for a, b in zip((q, k, v), before))


def test_fa3_missing_gives_the_reason(monkeypatch):
    monkeypatch.setattr("fsattn_diffusers.backends.fa3_backend.fa3_missing", lambda: "fa3_fwd_interface is absent")
    assert kb.fa3_fns(*_inputs(), 0.125) == "fa3_fwd_interface is absent"


def _row(method, ms):
    return {"shape": [1, 24, 32768, 32768, 128], "method": method, "ms": ms, "tflops": 1.0, "rel_err": 0.05,
            "cos": 0.998}


def test_ratios_name_the_fastest_bf16_baseline():
    rows = kb.add_ratios([_row("sdpa-cudnn", 12.0), _row("sdpa-flash", 13.0), _row("fa3-bf16", 10.0),
                          dict(_row("fa3-fp8", 8.0), kernel_ms=7.2), _row("mxfp8", 7.5)])
    ours = rows[-1]
    print(ours)
    assert ours["best_bf16"] == "fa3-bf16"
    assert ours["speedup_vs_cudnn"] == pytest.approx(1.6)
    assert ours["speedup_vs_best_bf16"] == pytest.approx(10 / 7.5)
    assert ours["speedup_vs_fa3_fp8"] == pytest.approx(8 / 7.5)
    assert ours["speedup_vs_fa3_fp8_kernel"] == pytest.approx(7.2 / 7.5)  # FA3 FP8 without its quantization
    md = kb.markdown({"date": "d", "command": "fsattn bench", "torch": "t", "cuda": "c", "triton": "3.6",
                      "python": "3.12"}, rows)
    assert "| vs FA3 FP8 | vs FA3 FP8 kernel |" in md and "1.333x (fa3-bf16)" in md and "| 1.067x | 0.960x |" in md


def test_ratios_without_a_baseline_are_absent_not_made_up():
    rows = kb.add_ratios([_row("sdpa-flash", 13.0), _row("mxfp8", 6.5)])
    assert rows[1]["speedup_vs_cudnn"] is None and rows[1]["speedup_vs_fa3_fp8"] is None
    assert rows[1]["speedup_vs_fa3_fp8_kernel"] is None
    assert rows[1]["best_bf16"] == "sdpa-flash" and rows[1]["speedup_vs_best_bf16"] == pytest.approx(2.0)
    md = kb.markdown({"date": "d", "command": "c", "torch": "t", "cuda": "c", "triton": "t", "python": "p"}, rows)
    assert "| - | 2.000x (sdpa-flash) | - | - |" in md


def test_interleaved_rounds_time_every_method_in_turn():
    """Round after round, every method's parts once, the methods in the order given and reversed every other round:
    A B, B A, A B (not A A A, B B B, where the GPU's clock drift over the run would favour one method)."""
    order = []

    def timer(name, part, ms):
        def run():
            order.append((name, part))
            return ms
        return run

    timers = {"mxfp8": {"ms": timer("mxfp8", "ms", 1.0), "kernel_ms": timer("mxfp8", "kernel_ms", 0.5)},
              "sdpa-cudnn": {"ms": timer("sdpa-cudnn", "ms", 2.0)}}
    samples = kb.interleaved_samples(timers, 4)
    print(order)
    a, b = [("mxfp8", "ms"), ("mxfp8", "kernel_ms")], [("sdpa-cudnn", "ms")]
    assert order == a + b + b + a + a + b + b + a
    assert samples == {"mxfp8": {"ms": [1.0] * 4, "kernel_ms": [0.5] * 4}, "sdpa-cudnn": {"ms": [2.0] * 4}}
    for bad in (0, 3):
        with pytest.raises(ValueError, match="rounds must be 1 or an even number"):
            kb.interleaved_samples(timers, bad)


def test_paired_median_cancels_the_place_in_the_round():
    """Two methods of equal cost whose time grows with their place in the round (the clock follows the power drawn by
    what ran before): the paired median reports them equal, and ignores one slow pair."""
    cost = {"a": 10.0, "b": 10.0}
    calls = []

    def timer(name):
        def run():
            calls.append(name)
            place = len(calls) % 2  # 0: first in its round, 1: second
            slow = 5.0 if len(calls) in (5, 6) else 0.0  # round 3: both slowed by something else on the GPU
            return cost[name] + 0.5 * place + slow
        return run

    samples = kb.interleaved_samples({"a": {"ms": timer("a")}, "b": {"ms": timer("b")}}, 6)
    est = {name: kb.paired_median(parts["ms"]) for name, parts in samples.items()}
    print(samples, est)
    assert est["a"] == est["b"] == 10.25
    assert kb.paired_median([3.0]) == 3.0
    with pytest.raises(ValueError, match="1 or an even number"):
        kb.paired_median([1.0, 2.0, 3.0])


def test_markdown_says_how_the_times_were_taken():
    env = {"date": "d", "command": "c", "torch": "t", "cuda": "c", "triton": "t", "python": "p"}
    rows = kb.add_ratios([_row("sdpa-cudnn", 12.0), _row("mxfp8", 7.5)])
    one, six = kb.markdown(env, rows), kb.markdown(dict(env, rounds=6), rows)
    print(one.splitlines()[5], six.splitlines()[5], sep="\n")
    assert "one round (the methods timed one after another)" in one
    assert "6 interleaved rounds" in six and "median over the 3 (forward, reverse) pairs" in six


def test_bench_pairs_pairs_rounds_within_one_run(tmp_path, capsys):
    """measure.bench_pairs: X against X-paper per shape, from the rounds by the paired median (an odd count
    drops its last round), a single-round row from its value."""
    import json

    from fsattn_diffusers.measure import bench_pairs as mod

    shape = [1, 2, 256, 256, 64]
    rows = [dict(shape=shape, method="sdpa-cudnn", ms=9.0),
            dict(shape=shape, method="mxfp8", ms=5.0, prepass_ms=1.0, kernel_ms=4.0,
                 rounds_ms={"ms": [5.0, 6.0, 5.0, 6.0, 99.0], "prepass_ms": [1.0] * 5, "kernel_ms": [4.0] * 5}),
            dict(shape=shape, method="mxfp8-paper", ms=5.0, prepass_ms=0.5, kernel_ms=4.4)]
    f = tmp_path / "bench.json"
    f.write_text(json.dumps({"results": rows}))
    assert mod.main([str(f)]) == 0
    out = capsys.readouterr().out
    print(out)
    assert ("| 1,2,256,256,64 | mxfp8 / mxfp8-paper | 5.500 / 5.000 | 1.100x | 1.000 / 0.500 | 2.000x "
            "| 4.000 / 4.400 | 0.909x |") in out
    assert mod.main([str(f), "--pairs", "mxfp8"]) == 2

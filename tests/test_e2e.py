"""The end-to-end latency harness on a scaled-down transformer (CPU, emulator): it runs and reports."""

import pytest
import torch

from fsattn_diffusers.measure import e2e

TINY_WAN = dict(num_attention_heads=2, attention_head_dim=64, ffn_dim=64, num_layers=1, text_dim=32)
TINY_HUNYUAN = dict(num_attention_heads=2, attention_head_dim=64, num_layers=1, num_single_layers=1,
                    num_refiner_layers=1, text_embed_dim=32, pooled_projection_dim=16, rope_axes_dim=(16, 24, 24))


@pytest.mark.parametrize("make,scale", [(e2e.wan22_spec, TINY_WAN), (e2e.hunyuan_spec, TINY_HUNYUAN)])
def test_e2e_harness_times_every_policy(make, scale):
    spec = make(frames=5, height=64, width=64, scale=scale)
    spec.text_tokens = 8
    model = e2e.build_transformer(spec, "cpu", dtype=torch.float32)
    inputs = e2e.make_inputs(spec, "cpu", dtype=torch.float32)
    results = {p: e2e.run_policy(model, inputs, spec, p, steps=1, warmup=0, backend="emulator")
               for p in ("bf16", "mxfp6", "mxfp4")}
    table = e2e.summarize(results)
    print(table)
    assert set(table) == {"bf16", "mxfp6", "mxfp4", "hybrid (projected)"}
    assert table["bf16"]["speedup"] == 1.0 and all(r["step_s"] > 0 for r in table.values())
    assert results["bf16"]["rollback_rate"] is None and results["mxfp6"]["rollback_rate"] == 0.0
    assert 0 < results["mxfp6"]["attention_share"] < 1
    # stock processors are restored after each policy
    assert all(type(p).__name__.endswith("Processor2_0") or "FSAttn" not in type(p).__name__
               for p in model.attn_processors.values())


def test_paper_shapes():
    assert e2e.image_tokens(e2e.wan22_spec()) == 75600
    assert e2e.image_tokens(e2e.hunyuan_spec()) == 118800


def test_a_real_hybrid_run_switches_recipes_by_step():
    """``run_schedule`` times one real run: every step's calls use the plan's recipe (mxfp6 on the first and last 3
    of 20 steps here with 8 steps: apportioned), the stock processors come back, and summarize reports it."""
    from fsattn_diffusers.integration.policy import get_policy

    spec = e2e.wan22_spec(frames=5, height=64, width=64, scale=TINY_WAN)
    model = e2e.build_transformer(spec, "cpu", dtype=torch.float32)
    inputs = e2e.make_inputs(spec, "cpu", dtype=torch.float32)
    stock = {k: type(v) for k, v in model.attn_processors.items()}
    run = e2e.run_schedule(model, inputs, spec, "hybrid", steps=8, warmup=1, backend="emulator")
    print(run["plan"], run["ran"], run["fallback_calls"])
    assert run["plan"] == get_policy("hybrid").plan_names(8)
    assert set(run["plan"]) == {"mxfp6", "mxfp4"} and run["plan"][0] == run["plan"][-1] == "mxfp6"
    assert run["ran"] == [[name] for name in run["plan"]] and run["fallback_calls"] == 0
    assert len(run["step_seconds"]) == 8 and run["total_s"] == pytest.approx(sum(run["step_seconds"]))
    assert {k: type(v) for k, v in model.attn_processors.items()} == stock
    bf16 = e2e.run_policy(model, inputs, spec, "bf16", steps=1, warmup=0)
    table = e2e.summarize({"bf16": bf16}, schedules={"hybrid": run})
    assert table["hybrid"]["speedup"] == pytest.approx(bf16["step_median_s"] / run["step_mean_s"])
    assert "real 8-step run" in table["hybrid"]["note"]


def test_a_real_hopper_hybrid_run_switches_between_the_accurate_tier_and_mxfp8():
    """The Hopper hybrid through ``run_schedule`` (CPU, emulator): int8-bf16 on the end step of each side at 4
    steps, mxfp8 between, every call on its planned recipe."""
    spec = e2e.wan22_spec(frames=5, height=64, width=64, scale=TINY_WAN)
    model = e2e.build_transformer(spec, "cpu", dtype=torch.float32)
    inputs = e2e.make_inputs(spec, "cpu", dtype=torch.float32)
    run = e2e.run_schedule(model, inputs, spec, "hybrid-int8-mxfp8", steps=4, warmup=0, backend="emulator")
    print(run["plan"], run["ran"], run["fallback_calls"])
    assert run["plan"] == ["int8-bf16", "mxfp8", "mxfp8", "int8-bf16"]
    assert run["ran"] == [[name] for name in run["plan"]] and run["fallback_calls"] == 0

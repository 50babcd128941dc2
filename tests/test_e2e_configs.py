"""``fsattn e2e`` configurations on the CPU: the Table-6 style table, ``--gemms fp8`` refusal, compiled
blocks without graph breaks in our processor, and composition with diffusers' First Block Cache."""

import subprocess
import sys
import warnings

import pytest
import torch

import fake_fa3
import fsattn_diffusers
from fsattn_diffusers.measure import e2e, e2e_config, e2e_report
from fsattn_diffusers.integration.tiny import tiny_wan22_pipeline

pytestmark = pytest.mark.usefixtures("quiet_slow_backend_warning")


def _synthetic(step):
    return {"step_median_s": step, "attention_share": 0.5, "rollback_rate": None}


def test_run_meta_names_commit_command_device_and_shape(monkeypatch):
    import argparse

    from fsattn_diffusers.commands.e2e import run_meta
    from fsattn_diffusers.measure import provenance

    monkeypatch.setattr(provenance, "commit", lambda: "abc1234")
    args = argparse.Namespace(width=64, height=64, text_valid=None)
    spec = e2e.wan22_spec(frames=5, height=64, width=64, scale=dict(num_layers=1))
    meta = run_meta(args, spec, torch.device("cpu"), {"gemms": "bf16", "compile": False}, None)
    print({k: v for k, v in meta.items() if k != "spec"})
    assert meta["commit"] == "abc1234" and meta["device"] == "cpu" and meta["command"].startswith("fsattn")
    assert meta["date"] and meta["torch"] == torch.__version__ and meta["spec"]["tokens"] == e2e.image_tokens(spec)
    doc = {"meta": meta, "summary": e2e.summarize({"bf16": _synthetic(2.0)}), "results": {}}
    assert "commit abc1234." in e2e_report.markdown(doc)


def test_table6_from_synthetic_timings(tmp_path):
    steps = {"bf16": 24.0, "fa3": 21.0, "fa3-fp8": 16.8, "mxfp8": 16.0, "mxfp6": 15.0, "mxfp4": 12.0}
    summary = e2e.summarize({p: _synthetic(s) for p, s in steps.items()})
    mx = summary["mxfp8"]
    assert mx["projected_s"] == pytest.approx(320.0)
    assert mx["speedup_vs"] == pytest.approx({"bf16": 1.5, "fa3": 21.0 / 16.0, "fa3-fp8": 1.05})
    hybrid = 6 * 15.0 + 14 * 12.0  # 6 mxfp6 + 14 mxfp4 steps
    assert summary["hybrid (projected)"]["projected_s"] == pytest.approx(hybrid)
    assert summary["hybrid (projected)"]["speedup_vs"]["fa3"] == pytest.approx(21.0 * 20 / hybrid)
    doc = {"meta": {"spec": {"name": "wan2.2-t2v-a14b", "calls_per_step": 2}, "resolution": "1280x720",
                    "config": {"gemms": "fp8", "compile": True}, "device": "NVIDIA H200", "torch": "2.11",
                    "date": "2026-12-01", "command": "fsattn e2e --gemms fp8 --compile"},
           "summary": summary, "results": {}}
    md = e2e_report.markdown(doc)
    print(md)
    assert "FP8 GEMMs (torchao float8, per-row scales), compiled blocks" in md
    assert "| policy | step (s) | 20 steps (s) | vs SDPA bf16 | vs FA3 bf16 | vs FA3 fp8 |" in md
    assert "| mxfp8 | 16.00 | 320.0 | 1.500x | 1.312x | 1.050x |" in md
    # only the baselines the run measured get a column
    only_stock = e2e.summarize({p: _synthetic(steps[p]) for p in ("bf16", "mxfp8")})
    assert e2e_report.table_rows(only_stock)[0][3:] == ["vs SDPA bf16", "attention share", "rollback rate"]


def test_gemms_fp8_is_refused_on_cpu_with_one_line():
    res = subprocess.run([sys.executable, "-m", "fsattn_diffusers", "e2e", "--device", "cpu", "--gemms", "fp8"],
                         capture_output=True, text=True, timeout=120)
    print(res.returncode, res.stderr)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "FP8 tensor cores" in res.stderr


def test_fp8_gemm_filter_takes_the_blocks_linear_layers_only():
    pipe = tiny_wan22_pipeline()
    model = pipe.transformer.to(torch.bfloat16)
    keep = e2e_config.block_linear_filter(model)
    chosen = [n for n, m in model.named_modules() if keep(m, n)]
    print(chosen)
    assert chosen and all(n.startswith("blocks.") for n in chosen)
    assert "blocks.0.attn1.to_q" in chosen and "blocks.0.ffn.net.2" in chosen
    assert not any(keep(m, n) for n, m in model.named_modules() if n.startswith(("condition_embedder", "proj_out")))


@pytest.fixture
def tiny_block(monkeypatch):
    """Block 0 of the embedded tiny pipeline's transformer (BF16) and the arguments it is called with."""
    fake_fa3.install(monkeypatch)
    model = tiny_wan22_pipeline().transformer.to(torch.bfloat16)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, 16, 2, 8, 8, generator=g).to(torch.bfloat16)
    ctx = torch.randn(1, 8, 32, generator=g).to(torch.bfloat16)
    args, kwargs = e2e_config.block_inputs(model, model.blocks[0],
                                           lambda: model(x, torch.tensor([500.0]), ctx, return_dict=False))
    return model, args, kwargs


def assert_one_graph_matching_eager(block, args, kwargs, label):
    """Dynamo captures ``block`` in one graph with no break, and a ``fullgraph=True`` compile of it returns eager's
    outputs bit for bit (a tensor, or each tensor of a tuple)."""
    report = e2e_config.explain_block(block, args, kwargs)
    print(label, report)
    assert report["graphs"] == 1 and report["graph_breaks"] == 0, report["reasons"]
    with torch.no_grad():
        eager = block(*args, **kwargs)
        compiled = torch.compile(block, fullgraph=True, backend="eager")(*args, **kwargs)
    if isinstance(eager, torch.Tensor):
        eager, compiled = (eager,), (compiled,)
    assert len(compiled) == len(eager) and all(torch.equal(a, b) for a, b in zip(compiled, eager))


@pytest.mark.parametrize("policy,backend", [("bf16", "auto"), ("fa3", "auto"), ("fa3-fp8", "auto"),
                                            ("mxfp8", "emulator")])
def test_wan_block_with_our_processor_has_no_graph_break(tiny_block, policy, backend):
    """Dynamo captures the whole block in one graph with our processor installed (``fa3``/``fa3-fp8`` run
    the real backend code around a CPU stand-in of FA3's custom op; ``mxfp8`` the emulator, whose single
    key tile at this size takes no data-dependent branch), and a ``fullgraph=True`` compile matches eager."""
    model, args, kwargs = tiny_block
    fsattn_diffusers.apply(model, policy=policy, backend=backend)
    block = model.blocks[0]
    try:
        assert_one_graph_matching_eager(block, args, kwargs, policy)
    finally:
        fsattn_diffusers.remove(model)
        torch._dynamo.reset()


def test_step_schedule_breaks_the_graph_once_per_call_and_warm_compiled_reports_it(tiny_block):
    """A policy that changes with the step reads the step outside the graph (by design): the graph breaks
    at the step lookup of each attention call, nowhere else; ``warm_compiled`` then falls back from
    fullgraph and names the break."""
    model, args, kwargs = tiny_block
    fsattn_diffusers.apply(model, policy="mxfp6:1,mxfp4:1", backend="emulator")
    try:
        report = e2e_config.explain_block(model.blocks[0], args, kwargs)
        print(report)
        assert report["graph_breaks"] >= 1 and report["reasons"]
        assert all("torch.compiler.disable" in r and "processors.py" in r and "in _choose" in r
                   for r in report["reasons"])
        e2e_config.compile_blocks(model, fullgraph=True, backend="eager")
        info = e2e_config.warm_compiled(model, lambda: model.blocks[0](*args, **kwargs), backend="eager")
        print(info)
        assert info["fullgraph"] is False and info["break"]
    finally:
        fsattn_diffusers.remove(model)
        torch._dynamo.reset()


def test_run_policy_with_baselines_and_compiled_blocks(monkeypatch):
    """The e2e harness on a scaled-down Wan2.2 (CPU): FA3 baselines (CPU stand-in) next to mxfp8, with the
    blocks compiled (Dynamo, eager backend) for every policy; fullgraph holds for each."""
    fake_fa3.install(monkeypatch)
    spec = e2e.wan22_spec(frames=5, height=32, width=32, scale=dict(num_attention_heads=2, attention_head_dim=64,
                                                                  ffn_dim=64, num_layers=2, text_dim=32))
    spec.text_tokens = 8
    model = e2e.build_transformer(spec, "cpu")
    inputs = e2e.make_inputs(spec, "cpu")
    try:
        results = {p: e2e.run_policy(model, inputs, spec, p, steps=1, warmup=1, backend="emulator", compiled=True,
                                     compile_backend="eager")
                   for p in ("bf16", "fa3", "fa3-fp8", "mxfp8")}
    finally:
        torch._dynamo.reset()
    for p, r in results.items():
        print(p, r["step_median_s"], r["compile"])
        assert r["compile"]["fullgraph"] is True and r["compile"]["graph_breaks"] == 0
    assert results["fa3"]["rollback_rate"] is None and results["fa3"]["attention_share"] is None
    summary = e2e.summarize(results)
    assert set(summary["mxfp8"]["speedup_vs"]) == {"bf16", "fa3", "fa3-fp8"}
    assert all("FSAttn" not in type(p).__name__ for p in model.attn_processors.values())


def _cache_hooks(model):
    """``(module name, hook name)`` of every diffusers hook in ``model`` (First Block Cache hooks its blocks)."""
    found = []
    for name, module in model.named_modules():
        registry = getattr(module, "_diffusers_hook", None)
        if registry is not None:
            found += [(name, h) for h in sorted(registry.hooks)]
    return found


@pytest.mark.parametrize("order", ["apply_then_cache", "cache_then_apply"])
def test_apply_composes_with_first_block_cache(order):
    """diffusers' First Block Cache on both experts with fsattn before or after it: a video comes out, the
    cache really skips blocks (fewer attention calls than without it), and ``remove`` restores the stock
    processors and leaves the cache hooks in place."""
    from diffusers.hooks import FirstBlockCacheConfig

    pipe = tiny_wan22_pipeline()
    pipe.set_progress_bar_config(disable=True)
    experts = (pipe.transformer, pipe.transformer_2)
    stock = [{k: type(v) for k, v in t.attn_processors.items()} for t in experts]

    def run():
        return pipe("a red fox in the snow", height=32, width=32, num_frames=5, num_inference_steps=4,
                    guidance_scale=4.0, guidance_scale_2=3.0, generator=torch.Generator().manual_seed(0),
                    max_sequence_length=16, output_type="np").frames

    handle = fsattn_diffusers.apply(pipe, policy="mxfp8", backend="emulator")
    run()
    uncached_calls = len(handle.records)
    fsattn_diffusers.remove(pipe)

    def enable_cache():
        for t in experts:  # a large threshold: every step after the first of each expert reuses the cache
            t.enable_cache(FirstBlockCacheConfig(threshold=10.0))

    if order == "cache_then_apply":
        enable_cache()
        handle = fsattn_diffusers.apply(pipe, policy="mxfp8", backend="emulator")
    else:
        handle = fsattn_diffusers.apply(pipe, policy="mxfp8", backend="emulator")
        enable_cache()
    hooks = [_cache_hooks(t) for t in experts]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        video = run()
    cached_calls = len(handle.records)
    print(order, "video", video.shape, "attention calls uncached", uncached_calls, "cached", cached_calls, hooks)
    assert video.shape[:2] == (1, 5) and torch.isfinite(torch.as_tensor(video)).all()
    assert {r.recipe for r in handle.records} == {"mxfp8"}
    assert 0 < cached_calls < uncached_calls  # First Block Cache skipped the remaining blocks on some steps
    assert fsattn_diffusers.remove(pipe)
    assert [{k: type(v) for k, v in t.attn_processors.items()} for t in experts] == stock
    assert [_cache_hooks(t) for t in experts] == hooks
    assert all(("blocks.0", "fbc_leader_block_hook") in h for h in hooks)
    for t in experts:
        t.disable_cache()
        assert not _cache_hooks(t)


@pytest.mark.parametrize("block_name", ["transformer_blocks", "single_transformer_blocks"])
def test_hunyuan_blocks_with_padded_text_have_no_graph_break(monkeypatch, block_name):
    """HunyuanVideo's dual- and single-stream blocks with padded text (mask -> kv_lens, FA3's varlen entry
    through the CPU stand-in): one graph, and a fullgraph compile equals eager."""
    from fsattn_diffusers.integration.tiny import tiny_hunyuan_video_pipeline

    fake = fake_fa3.install(monkeypatch)
    model = tiny_hunyuan_video_pipeline().transformer.to(torch.bfloat16)
    cfg = model.config
    g = torch.Generator().manual_seed(0)
    mask = torch.zeros(1, 12, dtype=torch.bool)
    mask[:, :7] = True  # 7 of 12 text tokens valid
    kw = dict(hidden_states=torch.randn(1, cfg.in_channels, 2, 8, 8, generator=g).to(torch.bfloat16),
              timestep=torch.tensor([500.0]), encoder_attention_mask=mask,
              encoder_hidden_states=torch.randn(1, 12, cfg.text_embed_dim, generator=g).to(torch.bfloat16),
              pooled_projections=torch.randn(1, cfg.pooled_projection_dim, generator=g).to(torch.bfloat16),
              guidance=torch.tensor([6000.0]), return_dict=False)
    fsattn_diffusers.apply(model, policy="fa3-fp8")
    block = getattr(model, block_name)[0]
    try:
        args, kwargs = e2e_config.block_inputs(model, block, lambda: model(**kw))
        call = fake.CALLS[0]  # keys: all image tokens + 7 text tokens of the 12 (5 padded)
        assert call["entry"] == "varlen" and call["seqused_k"].tolist() == [call["max_seqlen_k"] - 5]
        assert_one_graph_matching_eager(block, args, kwargs, block_name)
    finally:
        fsattn_diffusers.remove(model)
        torch._dynamo.reset()

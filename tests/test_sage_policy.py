"""The ``sage`` policy: SageAttention through diffusers' own ``set_attention_backend("sage")``, on the tiny Wan
transformer with the CPU stand-in ``fake_sage`` (diffusers' dispatcher really asked for ``sage``)."""

import pytest
import torch

import fake_sage
import fsattn_diffusers
from fsattn_diffusers.integration.policy import _accepted, get_policy
from tolerances import STAND_IN_MODEL_ERR_MAX


def _wan():
    from fsattn_diffusers.integration.tiny import tiny_wan_transformer

    return tiny_wan_transformer(num_layers=2).to(torch.bfloat16)


def _inputs():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 16, 2, 8, 8, generator=g).to(torch.bfloat16)
    ctx = torch.randn(1, 8, 32, generator=g).to(torch.bfloat16)
    return x, torch.tensor([500.0]), ctx


def _backends(model):
    return {getattr(p, "_attention_backend", None) for p in model.attn_processors.values()}


def test_apply_sage_selects_diffusers_sage_backend_and_records_it(monkeypatch, tmp_path):
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

    sage = fake_sage.install(monkeypatch, tmp_path, kind="2")
    fake_sage.accept_in_diffusers(monkeypatch, sage)
    model = _wan()
    active = _AttentionBackendRegistry._active_backend
    x, t, ctx = _inputs()
    with torch.no_grad():
        stock = model(x, t, ctx, return_dict=False)[0]
        handle = fsattn_diffusers.apply(model, policy="sage")
        assert _backends(model) == {AttentionBackendName.SAGE}  # every attention module, as for a diffusers user
        try:
            out = model(x, t, ctx, return_dict=False)[0]
        finally:
            fsattn_diffusers.remove(model)
    # 2 blocks x (self-attention + cross-attention), all dispatched by diffusers to sageattn in its NHD layout
    assert len(sage.CALLS) == 4 and {c["tensor_layout"] for c in sage.CALLS} == {"NHD"}
    assert {(r.recipe, r.planned, r.backend) for r in handle.records} == {("sage", "sage", "diffusers:sage")}
    assert len(handle.records) == 2 and handle.plan(3) == ["sage"] * 3
    print(handle.summary())
    assert "sage (transformer) 2 attention calls/step" in handle.summary()[0]
    err = ((out.float() - stock.float()).norm() / stock.float().norm()).item()
    assert err < STAND_IN_MODEL_ERR_MAX  # the stand-in computes exact attention
    assert _backends(model) == {None} and _AttentionBackendRegistry._active_backend == active  # restored
    with torch.no_grad():
        model(x, t, ctx, return_dict=False)
    assert len(sage.CALLS) == 4


def test_sage_policy_is_listed_and_its_record_names_the_sage(monkeypatch, tmp_path):
    assert "sage" in _accepted()
    from fsattn_diffusers.cli import build_parser

    help_text = build_parser()._subparsers._group_actions[0].choices["generate"].format_help()
    assert "sage (SageAttention through diffusers'" in " ".join(help_text.split())
    sage = fake_sage.install(monkeypatch, tmp_path, kind="2")
    fake_sage.accept_in_diffusers(monkeypatch, sage)
    policy = get_policy("sage")
    assert policy.is_fixed and policy.attention_backend == "sage" and policy.backend is None
    from fsattn_diffusers.measure.provenance import policy_record

    rec = policy_record("sage")
    assert rec["recipe"] is None and rec["computed_numerics"] == "baseline"
    assert rec["attention_backend"] == "diffusers:sage" and rec["sageattention"]["kind"] == "SageAttention 2"


def test_sage_missing_is_one_line(monkeypatch):
    fake_sage.hide(monkeypatch)
    with pytest.raises(ValueError) as info:
        get_policy("sage")
    msg = str(info.value)
    print(msg)
    assert "\n" not in msg and msg.startswith("the sage policy needs SageAttention: sageattention is not importable")
    assert "pip install sageattention (1.0.6, Triton) or build SageAttention 2 from source for Hopper" in msg
    model = _wan()
    with pytest.raises(ValueError, match="needs SageAttention"):
        fsattn_diffusers.apply(model, policy="sage")
    assert all("FSAttn" not in type(p).__name__ for p in model.attn_processors.values())


def test_diffusers_refusing_106_says_what_is_imported(monkeypatch, tmp_path):
    """PyPI's 1.0.6: diffusers' sage backend wants >= 2.1.1 and refuses; the line says which SageAttention is here."""
    fake_sage.install(monkeypatch, tmp_path, kind="1", dist_version="1.0.6")
    fake_sage.refuse_in_diffusers(monkeypatch)
    with pytest.raises(ValueError) as info:
        get_policy("sage")
    msg = str(info.value)
    print(msg)
    assert "\n" not in msg and "diffusers refuses its sage backend" in msg
    assert "(importlib.metadata: 1.0.6)" in msg and "imported: SageAttention 1 1.0.6" in msg


def test_cli_sage_usage_errors(monkeypatch, tmp_path, capsys):
    from fsattn_diffusers.cli import main

    fake_sage.hide(monkeypatch)
    assert main(["e2e", "--device", "cpu", "--policies", "bf16,sage"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "sage policy needs SageAttention" in err
    sage = fake_sage.install(monkeypatch, tmp_path, kind="2")
    fake_sage.accept_in_diffusers(monkeypatch, sage)
    assert main(["e2e", "--device", "cpu", "--model", "hunyuan", "--policies", "sage"]) == 2
    assert "takes no attention mask" in capsys.readouterr().err


def test_e2e_times_the_sage_policy_through_diffusers(monkeypatch, tmp_path):
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    from fsattn_diffusers.measure import e2e, e2e_report

    sage = fake_sage.install(monkeypatch, tmp_path, kind="2")
    fake_sage.accept_in_diffusers(monkeypatch, sage)
    spec = e2e.wan22_spec(frames=5, height=64, width=64, scale=dict(num_attention_heads=2, attention_head_dim=64,
                                                                      ffn_dim=64, num_layers=1, text_dim=32))
    model = e2e.build_transformer(spec, "cpu", dtype=torch.float32)
    inputs = e2e.make_inputs(spec, "cpu", dtype=torch.float32)
    stock = {k: type(v) for k, v in model.attn_processors.items()}
    active = _AttentionBackendRegistry._active_backend
    results = {p: e2e.run_policy(model, inputs, spec, p, steps=1, warmup=0) for p in ("bf16", "sage")}
    r = results["sage"]
    # 2 forwards per step (CFG) x 2 attention calls, for the timed step and the instrumented one
    assert len(sage.CALLS) == 8 and r["attention_s_per_step"] > 0 and r["rollback_rate"] is None
    assert r["sageattention"]["kind"] == "SageAttention 2" and r["attention_backend"] == "diffusers:sage"
    assert {k: type(v) for k, v in model.attn_processors.items()} == stock and _backends(model) == {None}
    assert _AttentionBackendRegistry._active_backend == active
    table = e2e.summarize(results)
    assert table["sage"]["speedup_vs"]["sage"] == 1.0
    md = e2e_report.markdown({"meta": {"spec": {"name": spec.name, "calls_per_step": 2}}, "summary": table,
                              "results": results})
    print(md)
    assert "vs SageAttention" in md and "sage: diffusers' `sage` attention backend" in md


def test_apply_sage_refuses_hunyuan_video_before_changing_it(monkeypatch, tmp_path):
    from fsattn_diffusers.integration.tiny import tiny_hunyuan_transformer

    sage = fake_sage.install(monkeypatch, tmp_path, kind="2")
    fake_sage.accept_in_diffusers(monkeypatch, sage)
    model = tiny_hunyuan_transformer()
    before = {k: type(v) for k, v in model.attn_processors.items()}
    with pytest.raises(ValueError) as info:
        fsattn_diffusers.apply(model, policy="sage")
    assert "\n" not in str(info.value) and "HunyuanVideo's transformer passes one on every call" in str(info.value)
    assert {k: type(v) for k, v in model.attn_processors.items()} == before and _backends(model) == {None}

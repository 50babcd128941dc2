"""fsattn capture on the tiny Wan2.2 pipeline (2 steps, CFG, two experts) and replay of the worst calls."""

import json
import math
import os

import numpy as np
import pytest
import torch

from fsattn_diffusers import cli
from fsattn_diffusers.integration.install import self_attention_modules
from fsattn_diffusers.integration.runner import generate_video
from fsattn_diffusers.quality.analysis import analyse, resolve_recipes
from fsattn_diffusers.quality.capture import CAPTURE_BACKEND, run_capture
from fsattn_diffusers.quality.capture_report import write_capture_outputs
from fsattn_diffusers.quality.loading import build_pipeline, run_kwargs, video_spec
from fsattn_diffusers.quality.probe import RunProbe
from fsattn_diffusers.quality.replay import load_replay, replay
from tolerances import CAPTURED_ERR_PCT_MAX, FP64_ROUNDOFF

STEPS, ROWS, WORST = 2, 16, 2
SMALL = dict(height=32, width=32, num_frames=5, steps=STEPS)
PROMPT = "a cat sitting on a table"


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    pipe, settings = build_pipeline(None, torch.device("cpu"))
    spec = video_spec(settings, None, 0, "auto", **SMALL)
    out = str(tmp_path_factory.mktemp("capture"))
    with RunProbe(pipe) as probe:
        cap = run_capture(pipe, spec, PROMPT, os.path.join(out, "capture.mp4"), rows=ROWS, save_worst=WORST,
                          progress=False)
    meta = {"prompt": PROMPT, "spec": spec.key(), "rows": ROWS, "backend": "emulator"}
    files = write_capture_outputs(cap, out, meta)
    return pipe, spec, cap, files, probe.frames


def test_capture_records_layers_x_steps_x_branches(captured):
    pipe, spec, cap, files, _ = captured
    layers = len(self_attention_modules(pipe.transformer))
    assert layers == len(self_attention_modules(pipe.transformer_2))
    for r in cap.rows:
        print({k: r[k] for k in ("call", "step", "expert", "layer", "branch", "rows", "mxfp8_rollback_rate",
                                 "mxfp8_err_pct", "mxfp8_conv_err_pct", "mxfp4_err_pct")})
    branches = ("cond", "uncond")  # guidance > 1: the Wan pipeline calls the transformer twice per step
    assert len(cap.rows) == layers * STEPS * len(branches)
    seen = {(r["step"], r["layer"], r["branch"]) for r in cap.rows}
    assert len(seen) == len(cap.rows)
    for step in range(STEPS):
        experts = {r["expert"] for r in cap.rows if r["step"] == step}
        assert len(experts) == 1  # one expert per step (Wan2.2 boundary)
        assert {r["branch"] for r in cap.rows if r["step"] == step} == set(branches)
    assert {r["expert"] for r in cap.rows} == {"transformer", "transformer_2"}
    for r in cap.rows:
        assert r["rows"] == min(ROWS, r["s_q"])
        for name in ("mxfp8", "mxfp6", "mxfp4"):
            assert 0.0 <= r[f"{name}_rollback_rate"] <= 1.0
            assert 0.0 < r[f"{name}_err_pct"] < CAPTURED_ERR_PCT_MAX
            assert 0.0 < r[f"{name}_conv_err_pct"] < CAPTURED_ERR_PCT_MAX
        assert r["mxfp4_err_pct"] > r["mxfp8_err_pct"]


def test_capture_runs_the_stock_bf16_numerics(captured):
    pipe, spec, cap, files, frames = captured
    with RunProbe(pipe) as probe:
        generate_video(pipe, PROMPT, out=os.path.join(os.path.dirname(files["csv"]), "stock.mp4"), policy="bf16",
                       progress=False, **run_kwargs(spec))
    diff = np.abs(frames - probe.frames).max()
    print("max |capture - stock bf16| =", diff)
    assert diff == 0.0
    from fsattn_diffusers.backends import registered

    assert CAPTURE_BACKEND not in registered()  # the temporary backend is gone


def test_capture_outputs(captured):
    pipe, spec, cap, files, _ = captured
    import importlib.util

    keys = ("csv", "json", "summary", "worst") + (("plot",) if importlib.util.find_spec("matplotlib") else ())
    for key in keys:
        assert os.path.getsize(files[key]) > 0, key
    with open(files["csv"]) as fh:
        assert len(fh.read().strip().splitlines()) == 1 + len(cap.rows)
    with open(files["json"]) as fh:
        data = json.load(fh)
    assert [s["recipe"] for s in data["summary"]] == ["mxfp8", "mxfp6", "mxfp4"]
    summary = open(files["summary"]).read()
    print(summary)
    assert "median rollback rate" in summary and "5 worst calls" in summary
    assert ("rollback.png" in summary) == ("plot" in files)
    header, calls = load_replay(files["worst"])
    assert len(header["calls"]) == WORST == len(calls)


def test_replay_reproduces_the_recorded_values(captured, tmp_path, capsys):
    pipe, spec, cap, files, _ = captured
    rows = replay(files["worst"])
    for r in rows:
        print(r["call"], r["recipe"], r["ours"], r["recorded"])
        for key, value in r["ours"].items():
            assert value == pytest.approx(r["recorded"][key], rel=FP64_ROUNDOFF, abs=FP64_ROUNDOFF), (r["call"], key)
    out = tmp_path / "replay.json"
    assert cli.main(["accuracy", "--replay", files["worst"], "--json", str(out)]) == 0
    assert "recorded by fsattn capture" in capsys.readouterr().out
    assert len(json.loads(out.read_text())["rows"]) == WORST * 3


def test_replay_errors_are_one_line(tmp_path, capsys):
    from safetensors.torch import save_file

    other = tmp_path / "other.safetensors"
    save_file({"x": torch.zeros(2)}, str(other))
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_text("not a tensor file")
    for path, match in ((tmp_path / "missing.safetensors", "no such file"), (other, "no 'fsattn_replay' metadata"),
                        (garbage, "not a safetensors file")):
        rc = cli.main(["accuracy", "--replay", str(path)])
        err = capsys.readouterr().err.strip()
        print(err)
        assert rc == 2 and match in err and len(err.splitlines()) == 1


def test_analysis_sees_a_rollback():
    """A key in the second key tile scoring far above tile 0 (> 2^32 in base 2) must trigger the gate."""
    gen = torch.Generator().manual_seed(0)
    heads, rows, keys, dim = 2, 8, 256, 64
    q = torch.randn(1, heads, rows, dim, generator=gen)
    k = torch.randn(1, heads, keys, dim, generator=gen) * 0.1
    v = torch.randn(1, heads, keys, dim, generator=gen)
    k[0, :, 200] = q[0, :, 0] * 8.0  # query row 0 meets a score of ~8 |q|^2 / sqrt(d) in key tile 1
    out = analyse(q, k, v, resolve_recipes(["mxfp8", "mxfp4"]), scale=None, kv_lens=None)
    print({k_: v_ for k_, v_ in out.items()})
    for name in ("mxfp8", "mxfp4"):
        assert out[f"{name}_rollbacks"] >= heads and out[f"{name}_rollback_rate"] > 0
        assert math.isfinite(out[f"{name}_err_pct"])


def test_cli_capture_end_to_end(tmp_path, capsys):
    out = tmp_path / "cap"
    rc = cli.main(["capture", "--prompt", "a dog", "--steps", "1", "--frames", "5", "--height", "32", "--width", "32",
                   "--rows", "8", "--recipes", "mxfp8", "--guidance", "1.0", "--out", str(out)])
    text = capsys.readouterr()
    print(text.out)
    assert rc == 0
    assert "| mxfp8 |" in text.out and (out / "calls.csv").is_file() and (out / "capture.mp4").is_file()
    assert not (out / "worst_calls.safetensors").exists()
    with open(out / "calls.json") as fh:
        calls = json.load(fh)["calls"]
    assert {c["branch"] for c in calls} == {"cond"}  # guidance 1: no unconditional pass
    rc = cli.main(["capture", "--recipes", "mxfp9", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "unknown recipe 'mxfp9'" in err and len(err.splitlines()) == 1

"""fsattn sensitivity on the tiny offline Wan2.2 pipeline (2 steps, 5 frames of 32x32), the attention-only
mode on a tiny Wan2.2-architecture transformer, and the softmax fields of fsattn capture."""

import csv
import json
import math
import os

import pytest
import torch

pytest.importorskip("skimage")
pytest.importorskip("matplotlib")

from fsattn_diffusers import cli  # noqa: E402
from fsattn_diffusers.quality.sensitivity import parse_index_set  # noqa: E402
from tolerances import FP32_ACCUMULATED, FP32_ROUNDOFF, ZERO_SHARE_ABS  # noqa: E402

SMALL_ARGS = ["--steps", "2", "--frames", "5", "--height", "32", "--width", "32"]
PROMPT = "a red fox running through snow"
# Tiny Wan2.2: one expert per step, 2 blocks, cond + uncond -> 4 self-attention calls per step.
CALLS_PER_STEP = 4


def _table(out):
    with open(os.path.join(out, "sensitivity.csv"), newline="") as fh:
        return {r["intervention"]: r for r in csv.DictReader(fh)}


def test_cli_sensitivity_end_to_end(tmp_path, capsys):
    out = str(tmp_path / "sens")
    rc = cli.main(["sensitivity", "--prompt", PROMPT, "--interventions", "exact,top:0.5,grid:4:4,scale:0.8",
                   "--rows", "8", "--no-lpips", "--no-warmup", "--every", "2", "--out", out] + SMALL_ARGS)
    captured = capsys.readouterr()
    printed = captured.out
    print(printed)
    assert rc == 0 and "sensitivity.md" in printed
    assert "5/5" in captured.err and "0/1" not in captured.err  # one bar over bf16 + 4 interventions
    for name in ("sensitivity.md", "sensitivity.csv", "sensitivity.json", "damage_vs_jsd.png", "results.csv",
                 "report.md", "grid_p00.png"):
        assert os.path.isfile(os.path.join(out, name)), name
    table = _table(out)
    print({k: (v["psnr_db"], v["jsd"], v["out_rel_err"], v["calls"]) for k, v in table.items()})
    assert list(table) == ["exact", "top:0.5", "grid:4:4", "scale:0.8"]
    assert all(int(r["calls"]) == 2 * CALLS_PER_STEP for r in table.values())
    assert float(table["exact"]["jsd"]) == 0.0 and float(table["exact"]["out_rel_err"]) < FP32_ACCUMULATED
    assert float(table["top:0.5"]["zero_share"]) == pytest.approx(0.5, abs=ZERO_SHARE_ABS)
    for label in ("top:0.5", "grid:4:4", "scale:0.8"):
        assert float(table[label]["jsd"]) > 0
        assert float(table[label]["psnr_db"]) < float(table["exact"]["psnr_db"])
    with open(os.path.join(out, "sensitivity.json")) as fh:
        data = json.load(fh)
    assert data["meta"]["selection"] == {"steps": "all", "layers": "all", "rows": 8, "sample_seed": 0}
    assert {v["intervention"] for v in data["videos"]} == set(table)
    report = open(os.path.join(out, "sensitivity.md")).read()
    assert "damage_vs_jsd.png" in report and "| top:0.5 |" in report
    # A rerun reuses every video and the saved diagnostics.
    rc = cli.main(["sensitivity", "--prompt", PROMPT, "--interventions", "exact,top:0.5,grid:4:4,scale:0.8",
                   "--rows", "8", "--no-lpips", "--no-warmup", "--every", "2", "--out", out] + SMALL_ARGS)
    assert rc == 0
    again = _table(out)
    assert {k: v["jsd"] for k, v in again.items()} == {k: v["jsd"] for k, v in table.items()}


def test_sensitivity_on_chosen_steps_and_blocks(tmp_path, capsys):
    out = str(tmp_path / "sel")
    rc = cli.main(["sensitivity", "--prompt", PROMPT, "--interventions", "top:0.1,sharpen:0.01", "--at-steps", "1",
                   "--at-blocks", "0", "--rows", "4", "--no-lpips", "--no-warmup", "--out", out] + SMALL_ARGS)
    assert rc == 0
    table = _table(out)
    print(table)
    row = table["top:0.1@steps=1@blocks=0"]
    assert int(row["calls"]) == 2  # step 1, block 0, cond + uncond
    with open(os.path.join(out, "sensitivity.json")) as fh:
        videos = {v["intervention"]: v for v in json.load(fh)["videos"]}
    calls = videos["top:0.1@steps=1@blocks=0"]["calls"]
    assert {c["step"] for c in calls} == {1} and all(".blocks.0." in c["layer"] for c in calls)
    sharp = videos["sharpen:0.01@steps=1@blocks=0"]["calls"]
    print([(c["alpha"], c["jsd"]) for c in sharp])
    assert len(sharp) == 2 and all(c["alpha"] > 1 for c in sharp)


def test_index_sets():
    assert parse_index_set("0-2,7", "--at-steps") == {0, 1, 2, 7}
    assert parse_index_set(None, "--at-steps") is None
    with pytest.raises(ValueError, match="--at-steps '3-1'"):
        parse_index_set("3-1", "--at-steps")


@pytest.mark.parametrize("argv,match", [
    (["--prompt", "x", "--interventions", "top:2"], "fraction"),
    (["--prompt", "x", "--at-steps", "a"], "--at-steps 'a'"),
    ([], "one of --prompt"),
    (["--attention-only", "--model", "/nonexistent"], "drop --model"),
    (["--prompt", "x", "--rows", "0"], "--rows 0"),
])
def test_cli_sensitivity_usage_errors_are_one_line(argv, match, capsys, tmp_path):
    rc = cli.main(["sensitivity", "--out", str(tmp_path / "o")] + argv)
    err = capsys.readouterr().err.strip()
    print(err)
    assert rc == 2 and match in err and len(err.splitlines()) == 1


def test_cli_attention_only_tiny(tmp_path, capsys):
    out = str(tmp_path / "att")
    rc = cli.main(["sensitivity", "--attention-only", "--model-size", "tiny", "--frames", "5", "--height", "32",
                   "--width", "32", "--device", "cpu", "--rows", "8", "--interventions",
                   "exact,top:0.5,octave:2,scale:1.25", "--out", out])
    printed = capsys.readouterr().out
    print(printed)
    assert rc == 0 and "| octave:2 |" in printed
    with open(os.path.join(out, "attention.json")) as fh:
        data = json.load(fh)
    meta, summary = data["meta"], data["summary"]
    assert meta["tokens"] == 2 * 2 * 2 and meta["device"] == "cpu" and meta["config"]["num_layers"] == 2
    assert len(data["calls"]) == 2 and all(c["layer"].endswith("attn1") for c in data["calls"])
    assert summary["exact"]["out_rel_err"] < FP32_ROUNDOFF and summary["exact"]["jsd"] == 0.0
    for label in ("top:0.5", "octave:2", "scale:1.25"):
        assert summary[label]["jsd"] > 0 and summary[label]["out_rel_err"] > 0
        assert summary[label]["max_out_rel_err"] >= summary[label]["out_rel_err"]
    assert os.path.isfile(os.path.join(out, "attention.md"))


def test_capture_records_softmax_fields(tmp_path):
    from fsattn_diffusers.quality.capture import run_capture
    from fsattn_diffusers.quality.capture_report import write_capture_outputs
    from fsattn_diffusers.quality.loading import build_pipeline, video_spec

    pipe, settings = build_pipeline(None, torch.device("cpu"))
    spec = video_spec(settings, None, 0, "auto", height=32, width=32, num_frames=5, steps=1)
    cap = run_capture(pipe, spec, PROMPT, str(tmp_path / "c.mp4"), recipes=("mxfp8",), rows=8, progress=False,
                      interventions=("top:0.5", "octave:2"))
    row = cap.rows[0]
    print({k: v for k, v in row.items() if k.startswith(("p_", "top", "octave"))})
    assert 0 < row["p_share_hi"] + row["p_share_lo"] <= 1 and not math.isnan(row["p_mass_hi"])
    assert row["top:0.5_zero_share"] == pytest.approx(0.5, abs=ZERO_SHARE_ABS) and row["octave:2_jsd"] > 0
    assert not any(k.startswith("exact_") for k in row)
    files = write_capture_outputs(cap, str(tmp_path), {"prompt": PROMPT, "spec": spec.key(), "rows": 8,
                                                       "backend": "emulator"})
    with open(files["csv"], newline="") as fh:
        header = next(csv.reader(fh))
    assert "p_mass_hi" in header and "octave:2_weighted_log_err" in header
    assert "| octave:2 |" in open(files["summary"]).read()

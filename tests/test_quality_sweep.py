"""fsattn sweep on the tiny offline Wan2.2 pipeline: 2 steps, 5 frames of 32x32, bf16 / mxfp8 / hybrid."""

import json
import os
import shutil

import numpy as np
import pytest
import torch

pytest.importorskip("skimage")
pytest.importorskip("matplotlib")

from fsattn_diffusers import cli  # noqa: E402
from fsattn_diffusers.integration.policy import FixedPolicy, Policy  # noqa: E402
from fsattn_diffusers.quality import sweep as sweep_mod  # noqa: E402
from fsattn_diffusers.quality.loading import build_pipeline, run_kwargs, video_spec  # noqa: E402
from fsattn_diffusers.quality.probe import RunProbe, latent_digest  # noqa: E402
from fsattn_diffusers.quality.results import read_csv  # noqa: E402
from fsattn_diffusers.recipe import PRESETS  # noqa: E402
from fsattn_diffusers.quality.sweep import parse_policies, run_sweep  # noqa: E402
from tolerances import SWEEP_PSNR_DB_MIN  # noqa: E402

SMALL = dict(height=32, width=32, num_frames=5, steps=2)
SMALL_ARGS = ["--steps", "2", "--frames", "5", "--height", "32", "--width", "32"]
PROMPT = "a red fox running through snow"
POLICIES = ["bf16,mxfp8,hybrid"]
EVERY = 2  # frames 0, 2, 4


@pytest.fixture(scope="module")
def tiny():
    pipe, settings = build_pipeline(None, torch.device("cpu"))
    return pipe, video_spec(settings, None, 0, "auto", **SMALL)


@pytest.fixture(scope="module")
def swept(tiny, tmp_path_factory):
    pipe, spec = tiny
    out = str(tmp_path_factory.mktemp("sweep"))
    result = run_sweep(pipe, spec, [PROMPT], POLICIES, out, every=EVERY, progress=False)
    return out, result


class BrokenPolicy(Policy):
    """A policy that fails inside the pipeline run (at the first attention call)."""

    name = "broken"

    def schedule(self, num_steps):
        raise RuntimeError("boom: this policy always fails")


def test_policy_lists():
    labels = [p.label for p in parse_policies(["mxfp8,mxfp6:3,mxfp4:14,mxfp6:3,hybrid"])]
    print(labels)
    assert labels == ["bf16", "mxfp8", "mxfp6:3,mxfp4:14,mxfp6:3", "hybrid"]
    assert [p.label for p in parse_policies(["mxfp6:1,mxfp4:2;mxfp4:1,mxfp6:1", "stock,mxfp8"])] == \
        ["bf16", "mxfp6:1,mxfp4:2", "mxfp4:1,mxfp6:1", "mxfp8"]
    assert parse_policies(["mxfp6:3,mxfp4:14"])[1].slug == "mxfp6-3_mxfp4-14"
    with pytest.raises(ValueError, match="unknown policy 'mxfp9'"):
        parse_policies(["bf16,mxfp9"])


def test_sweep_writes_every_output(swept):
    out, result = swept
    for name in ("results.csv", "results.json", "quality_vs_time.png", "psnr_per_frame.png", "grid_p00.png",
                 "report.md", "latents/p00.safetensors"):
        assert os.path.isfile(os.path.join(out, name)), name
    for policy in ("bf16", "mxfp8", "hybrid"):
        for ext in (".mp4", ".frames.npz", ".json"):
            assert os.path.getsize(os.path.join(out, "videos", "p00", policy + ext)) > 0
    rows = read_csv(os.path.join(out, "results.csv"))
    for r in rows:
        print({k: r[k] for k in ("prompt_id", "policy", "status", "psnr_db", "ssim", "lpips", "step_s",
                                 "latent_digest")})
    videos = [r for r in rows if r["prompt_id"] == "p00"]
    means = [r for r in rows if r["prompt_id"] == "mean"]
    assert [r["policy"] for r in videos] == ["bf16", "mxfp8", "hybrid"] == [r["policy"] for r in means]
    assert all(r["status"] == "ok" and float(r["step_s"]) > 0 for r in videos)
    ref = videos[0]
    assert ref["psnr_db"] == "inf" and float(ref["ssim"]) == 1.0
    assert means[0]["psnr_db"] == "inf"
    for r in videos[1:]:
        assert r["psnr_db"] == "inf" or float(r["psnr_db"]) > SWEEP_PSNR_DB_MIN
        assert 0.0 < float(r["ssim"]) <= 1.0
    if not result.lpips_available:  # never zero, never blank
        assert all(r["lpips"] == "unavailable" for r in rows)
    assert len({r["latent_digest"] for r in videos}) == 1  # same initial latent for every policy
    with open(os.path.join(out, "results.json")) as fh:
        data = json.load(fh, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert len(data["rows"]) == 3 and len(data["means"]) == 3
    frames = data["rows"][0]["frames"]
    assert frames["index"] == [0, 2, 4] and frames["psnr_db"] == [None] * 3  # identical frames: null, never "inf"
    report = open(os.path.join(out, "report.md")).read()
    for needle in ("quality_vs_time.png", "psnr_per_frame.png", "grid_p00.png", "| hybrid |", "| inf |"):
        assert needle in report, needle


def test_every_policy_starts_from_the_seed_latent(swept, tiny):
    out, result = swept
    pipe, spec = tiny
    with RunProbe(pipe) as probe:  # a plain bf16 run from the seed alone
        from fsattn_diffusers.integration.runner import generate_video, to_uint8_frames

        generate_video(pipe, PROMPT, out=os.path.join(out, "plain.mp4"), policy="bf16", progress=False,
                       **run_kwargs(spec))
    digests = {r.policy: r.latent_digest for r in result.rows}
    print("digests", digests, "plain run", latent_digest(probe.latent))
    assert set(digests.values()) == {latent_digest(probe.latent)}
    stored = np.load(os.path.join(out, "videos", "p00", "bf16.frames.npz"))["frames"]
    assert np.array_equal(stored, to_uint8_frames(probe.frames)[::EVERY])


def test_rerun_reuses_existing_videos(swept, tiny, monkeypatch):
    out, first = swept
    pipe, spec = tiny
    mp4 = os.path.join(out, "videos", "p00", "mxfp8.mp4")
    before = os.stat(mp4).st_mtime_ns

    def no_generation(*args, **kwargs):
        raise AssertionError("a finished video was generated again")

    monkeypatch.setattr(sweep_mod, "_generate", no_generation)
    monkeypatch.setattr(sweep_mod, "warm_up", no_generation)
    again = run_sweep(pipe, spec, [PROMPT], POLICIES, out, every=EVERY, progress=False)
    print([(r.policy, r.reused, r.metrics.means) for r in again.rows])
    assert all(r.reused and r.status == "ok" for r in again.rows)
    assert os.stat(mp4).st_mtime_ns == before
    assert [r.metrics.psnr for r in again.rows] == [r.metrics.psnr for r in first.rows]


def test_a_failing_policy_leaves_the_others_intact(swept, tiny, tmp_path):
    out, first = swept
    pipe, spec = tiny
    copy = str(tmp_path / "sweep")
    shutil.copytree(out, copy)
    policies = ["bf16,mxfp8", BrokenPolicy(), FixedPolicy(PRESETS["mxfp6"])]  # mxfp6 runs after the failure
    result = run_sweep(pipe, spec, [PROMPT], policies, copy, every=EVERY, progress=False)
    for r in result.rows:
        print(r.policy, r.status, r.reused, r.error, None if r.metrics is None else r.metrics.means)
    by = {r.policy: r for r in result.rows}
    assert by["broken"].status == "failed" and "boom" in by["broken"].error
    assert by["bf16"].reused and by["mxfp8"].reused  # kept from the first sweep
    assert by["mxfp6"].status == "ok" and not by["mxfp6"].reused and by["mxfp6"].metrics is not None
    assert by["mxfp8"].metrics.psnr == next(r for r in first.rows if r.policy == "mxfp8").metrics.psnr
    rows = {(r["prompt_id"], r["policy"]): r for r in read_csv(os.path.join(copy, "results.csv"))}
    assert rows[("p00", "broken")]["status"] == "failed" and "boom" in rows[("p00", "broken")]["error"]
    assert rows[("p00", "broken")]["psnr_db"] == ""
    assert rows[("mean", "broken")]["failed"] == "1" and rows[("mean", "mxfp6")]["videos"] == "1"
    assert "boom" in open(os.path.join(copy, "report.md")).read()
    assert not os.path.exists(os.path.join(copy, "videos", "p00", "broken.json"))


def test_cli_sweep_end_to_end(tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("# two prompts\na cat\n\na dog\n")
    out = tmp_path / "out"
    rc = cli.main(["sweep", "--prompts", str(prompts), "--policies", "bf16,mxfp8", "--every", "4", "--no-warmup",
                   "--out", str(out)] + SMALL_ARGS)
    text = capsys.readouterr()
    print(text.out, text.err[-2000:])
    assert rc == 0
    rows = read_csv(str(out / "results.csv"))
    assert [(r["prompt_id"], r["policy"]) for r in rows] == [
        ("p00", "bf16"), ("p00", "mxfp8"), ("p01", "bf16"), ("p01", "mxfp8"), ("mean", "bf16"), ("mean", "mxfp8")]
    assert (out / "grid_p01.png").is_file() and "report:" in text.out


@pytest.mark.parametrize("argv,match", [
    (["--prompt", "x", "--policies", "bf16,mxfp9"], "unknown policy 'mxfp9'"),
    (["--prompts", "/nonexistent/prompts.txt"], "cannot read"),
    (["--prompt", "x", "--every", "0"], "--every 0 must be >= 1"),
    (["--prompt", "x", "--frames", "6"], "not 4k + 1"),
    (["--prompt", "x", "--height", "40"], "multiple of 16"),
    (["--prompt", "x", "--backend", "cuda-magic"], "unknown backend"),
])
def test_cli_sweep_usage_errors_are_one_line(argv, match, capsys):
    rc = cli.main(["sweep"] + argv)
    err = capsys.readouterr().err.strip()
    print(err)
    assert rc == 2 and match in err and len(err.splitlines()) == 1

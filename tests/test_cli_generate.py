"""``fsattn generate``: the offline smoke model end to end, --model directories, error paths."""

import json
import os
import subprocess
import sys

import pytest

from fsattn_diffusers.cli import main


pytestmark = pytest.mark.usefixtures("quiet_slow_backend_warning")


def _read_mp4(path):
    import imageio

    reader = imageio.get_reader(path, format="FFMPEG")
    try:
        return [frame for frame in reader]
    finally:
        reader.close()


def _generate(capsys, *argv):
    code = main(["generate", *argv])
    out, err = capsys.readouterr()
    print(out, err)
    return code, out, err


def test_smoke_model_writes_mp4_with_requested_frames(tmp_path, capsys):
    path = tmp_path / "smoke.mp4"
    code, out, err = _generate(capsys, "--steps", "4", "--frames", "9", "--height", "64", "--width", "48",
                               "--out", str(path))
    assert code == 0
    frames = _read_mp4(str(path))
    assert len(frames) == 9 and frames[0].shape == (64, 48, 3)
    assert f"wrote {path}" in out
    # hybrid at 4 steps: one end step on each side; Wan2.2's expert switch shows up too
    for line in ("step  0: mxfp6 (transformer) 4 attention calls/step",
                 "step  1: mxfp4 (transformer) 4 attention calls/step",
                 "step  2: mxfp4 (transformer_2) 4 attention calls/step",
                 "step  3: mxfp6 (transformer_2) 4 attention calls/step"):
        assert line in out
    assert err.count("noise-like") == 1 and "noise-like" not in out  # the smoke-model note once


@pytest.fixture(scope="module")
def saved_dirs(tmp_path_factory):
    from fsattn_diffusers.integration.tiny import tiny_hunyuan_video_pipeline, tiny_wan22_pipeline

    root = tmp_path_factory.mktemp("pipes")
    tiny_wan22_pipeline().save_pretrained(str(root / "wan"))
    tiny_hunyuan_video_pipeline().save_pretrained(str(root / "hunyuan"))
    return root


@pytest.mark.parametrize("kind,policy,summary", [
    ("wan", "mxfp8", "mxfp8 (transformer"),
    ("hunyuan", "bf16:1,mxfp4:1", "step  0: bf16 (transformer) 2 attention calls/step"),
])
def test_model_directory(saved_dirs, tmp_path, capsys, kind, policy, summary):
    path = tmp_path / f"{kind}.mp4"
    code, out, err = _generate(capsys, "--model", str(saved_dirs / kind), "--steps", "2", "--frames", "5",
                               "--height", "32", "--width", "32", "--policy", policy, "--out", str(path))
    assert code == 0
    assert len(_read_mp4(str(path))) == 5
    assert summary in out and "smoke model" not in out


def _bad_dirs(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    other = tmp_path / "other"
    other.mkdir()
    (other / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionPipeline"}))
    return empty, other


@pytest.mark.parametrize("argv,needle", [
    ("--model /no/such/dir", "does not exist"),
    ("--model EMPTY", "no model_index.json"),
    ("--model OTHER", "unknown model type 'StableDiffusionPipeline'"),
    ("--policy fp3", "unknown policy 'fp3'"),
    ("--policy mxfp6:3,mxfp4", "bad schedule"),
    ("--policy mxfp6:3,mxfp7:2", "unknown policy entry 'mxfp7'"),
    ("--height 100", "--height 100 is not a positive multiple of 16"),
    ("--width 8", "--width 8 is not a positive multiple of 16"),
    ("--frames 10", "--frames 10 is not 4k + 1"),
    ("--steps 0", "--steps 0 must be >= 1"),
    ("--backend nope", "unknown backend 'nope'"),
    ("--out video.avi", "must end with .mp4"),
])
def test_usage_errors_one_line_exit_2(tmp_path, capsys, argv, needle):
    empty, other = _bad_dirs(tmp_path)
    argv = [str(empty) if a == "EMPTY" else str(other) if a == "OTHER" else a for a in argv.split()]
    code, out, err = _generate(capsys, *argv, "--out" if "--out" not in argv else "--seed",
                               str(tmp_path / "x.mp4") if "--out" not in argv else "0")
    lines = err.strip().splitlines()
    assert code == 2
    assert len(lines) == 1 and lines[0].startswith("fsattn generate: error: ") and needle in lines[0], lines
    assert "Traceback" not in err and not os.path.exists(tmp_path / "x.mp4")


def test_console_entry_point_error_has_no_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "fsattn_diffusers.cli", "generate", "--frames", "6",
                           "--out", str(tmp_path / "x.mp4")], capture_output=True, text=True, timeout=120)
    print(proc.returncode, proc.stdout, proc.stderr)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == ["fsattn generate: error: --frames 6 is not 4k + 1 (the VAE "
                                                "compresses time by 4); try 5 or 9"]

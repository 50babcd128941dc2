"""What a new user sees on stderr: one-line errors (exit 2), one-line warnings, no third-party noise.

Every command runs through the real command line in a subprocess (``sys.executable -m ...``).
"""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

SMOKE = ["--steps", "2", "--frames", "1", "--height", "32", "--width", "32"]
#: Lines other packages print at import time (torchao's extensions, torch's pytree notes, diffusers).
NOISE = ("Failed to load", "_pytree.py", "Unable to import `torchao`", "is an Enum subclass")
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")


def _run(args, env=None, module="fsattn_diffusers", cwd=None, timeout=300):
    full_env = dict(os.environ, **(env or {}))
    start = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, env=full_env,
                         cwd=cwd, timeout=timeout)
    res.seconds = time.perf_counter() - start
    print(f"rc={res.returncode} in {res.seconds:.1f} s\nstdout: {res.stdout[-1500:]}\nstderr: {res.stderr[-3000:]}")
    return res


def _one_line_error(res, prefix):
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2, res.returncode
    assert "Traceback" not in res.stderr
    assert len(lines) == 1 and lines[0].startswith(prefix), lines
    return lines[0]


@NO_CUDA
@pytest.mark.parametrize("command", [["generate"], ["info"], ["sweep", "--prompt", "x"], ["capture"]])
def test_device_cuda_without_cuda_is_one_line(command, tmp_path):
    res = _run(command + ["--device", "cuda"], cwd=tmp_path)
    line = _one_line_error(res, f"fsattn {command[0]}: error: --device 'cuda'")
    assert "not usable here" in line


@pytest.mark.parametrize("command", [["generate"], ["sweep", "--prompt", "x"], ["capture"]])
def test_missing_model_directory_is_one_line(command, tmp_path):
    res = _run(command + ["--model", str(tmp_path / "no_such_model")], cwd=tmp_path)
    assert "does not exist" in _one_line_error(res, f"fsattn {command[0]}: error:")


UNREACHABLE = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "0"}


def _hub_env(tmp_path, **extra):
    return dict(UNREACHABLE, HF_HOME=str(tmp_path / "hf"), HF_HUB_CACHE=str(tmp_path / "hf" / "hub"), **extra)


def test_generate_with_an_unreachable_hub_says_so_in_one_line(tmp_path):
    res = _run(["generate", "--model", "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"], env=_hub_env(tmp_path))
    line = _one_line_error(res, "fsattn generate: error: cannot load Wan-AI/Wan2.1-T2V-1.3B-Diffusers")
    assert "Hub (http://127.0.0.1:9) is unreachable" in line and "--model DIR" in line


def test_an_unreachable_hub_is_found_quickly(tmp_path, monkeypatch):
    """The model check that ``fsattn generate`` and the pipeline runners make (``runner.check_model``), timed in this
    process after the imports, so that a start slowed by CPU sharing (pytest-xdist workers, other jobs) does not count:
    one refused request, where a load through diffusers retries for about 25 s before it gives up."""
    from huggingface_hub import constants

    from fsattn_diffusers.integration import runner

    monkeypatch.setattr(constants, "ENDPOINT", UNREACHABLE["HF_ENDPOINT"])
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    runner.hub_unreachable_reason.cache_clear()
    start = time.perf_counter()
    try:
        with pytest.raises(runner.LoadError) as err:
            runner.check_model("Wan-AI/Wan2.1-T2V-1.3B-Diffusers")
    finally:
        seconds = time.perf_counter() - start
        runner.hub_unreachable_reason.cache_clear()  # the next caller asks the Hub it is given
    print(f"{seconds:.2f} s: {err.value}")
    assert "Hub (http://127.0.0.1:9) is unreachable" in str(err.value)
    assert seconds < runner.HUB_TIMEOUT_S


def test_hub_offline_mode_is_named(tmp_path):
    res = _run(["generate", "--model", "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"],
               env=_hub_env(tmp_path, HF_HUB_OFFLINE="1"))
    assert "HF_HUB_OFFLINE is set" in _one_line_error(res, "fsattn generate: error:")


@pytest.mark.parametrize("runner", ["wan21_t2v", "wan22_t2v_a14b", "hunyuan_video"])
def test_pipeline_runners_give_one_line_for_an_unreachable_hub(runner, tmp_path):
    res = _run(["--prompt", "a cat"], env=_hub_env(tmp_path), module=f"fsattn_diffusers.pipelines.{runner}")
    line = _one_line_error(res, f"{runner}.py: error: cannot load")
    assert "Hub (http://127.0.0.1:9) is unreachable" in line and "--model DIR" in line  # runner.check_model's answer


def test_pipeline_runner_bad_policy_is_one_line(tmp_path):
    res = _run(["--prompt", "a cat", "--policy", "mxfp6:³", "--model", str(tmp_path)],
               module="fsattn_diffusers.pipelines.wan21_t2v")
    assert "accepted" in _one_line_error(res, "wan21_t2v.py: error:")


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gen") / "v.mp4"
    return _run(["generate", "--backend", "emulator", "--out", str(out)] + SMOKE)


def test_generate_warning_is_one_clean_line(smoke_run):
    assert smoke_run.returncode == 0
    warned = [ln for ln in smoke_run.stderr.splitlines() if "warning:" in ln]
    assert any("fsattn generate: warning: using the 'emulator' backend" in ln for ln in warned), warned
    assert "run_backend(" not in smoke_run.stderr and "api.py" not in smoke_run.stderr


def test_generate_prints_the_resolved_schedule_once(smoke_run):
    lines = [ln for ln in smoke_run.stderr.splitlines() if "schedule" in ln]
    assert lines == ["fsattn generate: schedule hybrid at 2 steps: steps 0-1 mxfp6 (defined for 20 steps, scaled)"]


def test_generate_stderr_has_no_third_party_import_noise(smoke_run):
    noise = [ln for ln in smoke_run.stderr.splitlines() if any(n in ln for n in NOISE)]
    assert smoke_run.returncode == 0 and noise == []


@pytest.mark.parametrize("args", [["info"], ["generate", "--help"]])
def test_info_and_help_stderr_is_clean(args):
    res = _run(args)
    assert res.returncode == 0 and res.stderr.strip() == ""


def test_library_warning_points_at_the_callers_line(tmp_path):
    script = tmp_path / "user_script.py"
    script.write_text(textwrap.dedent("""\
        import torch
        import fsattn_diffusers
        q = torch.randn(1, 64, 1, 64, generator=torch.Generator().manual_seed(0))
        out = fsattn_diffusers.attention(q, q, q, "mxfp8", backend="emulator")  # the user's line
        """))
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    print(res.stderr)
    assert res.returncode == 0
    assert f"{script}:4:" in res.stderr and "the user's line" in res.stderr
    assert "run_backend(" not in res.stderr and "api.py" not in res.stderr


def _fake_packages(tmp_path):
    """A torchao whose C++ extension fails to load (it logs, like torchao 0.18 on a CPU torch) and an xfuser
    whose import raises (like xfuser on a CPU-only torch)."""
    (tmp_path / "torchao").mkdir()
    (tmp_path / "torchao" / "__init__.py").write_text(
        "import logging\nlogging.getLogger('torchao').warning("
        "'Failed to load /opt/x/torchao/_C_fake.so: Could not load this library: /opt/x/torchao/_C_fake.so')\n")
    (tmp_path / "torchao" / "quantization.py").write_text(
        "Float8DynamicActivationFloat8WeightConfig = PerRow = quantize_ = object\n")
    (tmp_path / "xfuser").mkdir()
    (tmp_path / "xfuser" / "__init__.py").write_text("raise RuntimeError('xfuser needs a CUDA build of torch')\n")
    return {"PYTHONPATH": os.pathsep.join([str(tmp_path)] + sys.path)}


def test_info_says_when_an_installed_package_is_broken(tmp_path):
    res = _run(["info", "--device", "cpu"], env=_fake_packages(tmp_path))
    lines = {ln.split()[0]: ln for ln in res.stdout.splitlines() if ln.startswith("  ")}
    assert res.returncode == 0 and res.stderr.strip() == ""
    assert "installed but fails to import (RuntimeError: xfuser needs a CUDA build of torch)" in lines["xfuser"]
    # torchao's optional C++ extension plays no part here: only the float8 API fsattn e2e --gemms fp8 uses counts
    assert "C++" not in res.stdout and "_C_fake" not in res.stdout
    assert lines["torchao"].endswith("(float8 API for fsattn e2e --gemms fp8: imports)")


def test_sweep_report_shows_the_resolved_schedules(tmp_path):
    pytest.importorskip("skimage")
    pytest.importorskip("matplotlib")
    out = tmp_path / "sweep"
    res = _run(["sweep", "--prompt", "a cat", "--policies", "bf16,mxfp6,hybrid", "--no-warmup", "--no-lpips",
                "--backend", "emulator", "--out", str(out)] + SMOKE)
    assert res.returncode == 0
    meta = json.loads((out / "results.json").read_text())["meta"]
    print(meta["schedules"])
    assert meta["schedules"]["hybrid"]["steps"] == ["mxfp6", "mxfp6"]
    assert meta["schedules"]["bf16"]["steps"] == ["bf16", "bf16"]
    report = (out / "report.md").read_text()
    assert "* `hybrid`: steps 0-1 mxfp6 (defined for 20 steps, scaled)" in report
    printed = [ln for ln in res.stderr.splitlines() if "schedule" in ln]
    assert printed == ["fsattn sweep: schedule mxfp6 at 2 steps: steps 0-1 mxfp6",
                       "fsattn sweep: schedule hybrid at 2 steps: steps 0-1 mxfp6 (defined for 20 steps, scaled)"]


@pytest.mark.parametrize("args, names", [
    (["--inputs", "gaussian,nope"], "accepted: gaussian, k_channel_outliers"),
    (["--inputs", "attention_sink", "--shapes", "", "--shape", "1,2,256:128,64"], "S_q == S_k"),
    (["--rounds", "0"], "accepted: 1, or an even integer"),
    (["--rounds", "3"], "accepted: 1, or an even integer"),
])
def test_bench_refuses_unknown_or_unusable_inputs_in_one_line(args, names):
    line = _one_line_error(_run(["bench", *args]), "fsattn bench:")
    assert names in line

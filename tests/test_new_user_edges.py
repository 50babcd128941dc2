"""What a new user meets on a CPU machine (issue 41): sizes, noise from other packages, progress bars."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_attention_only_tiny_defaults_to_a_tiny_shape_and_shows_progress(capsys):
    from fsattn_diffusers.measure.sensitivity_attention import DEFAULT_SHAPES, run_attention_only

    res = run_attention_only(["exact"], model_size="tiny", rows=4, device="cpu", dtype=torch.float32, progress=True)
    err = capsys.readouterr().err
    meta = res["meta"]
    assert (meta["frames"], meta["height"], meta["width"]) == DEFAULT_SHAPES["tiny"] == (17, 256, 256)
    assert meta["tokens"] == 1280
    assert "attention calls" in err and "2/2" in err and "<" in err  # total and time left
    assert DEFAULT_SHAPES["wan22"] == (81, 720, 1280)


def _run_script(tmp_path, source):
    site = tmp_path / "site"
    (site / "torchao").mkdir(parents=True)
    (site / "torchao" / "__init__.py").write_text(textwrap.dedent("""
        import logging
        logging.getLogger("torchao").warning("Failed to load /opt/x/torchao/_C_fake.so: Could not load this library")
        logging.getLogger("torch.utils._pytree").warning(
            "<enum 'KernelPreference'> is an Enum subclass and is now natively supported by torch.compile as an "
            "opaque value type.")
    """))
    script = tmp_path / "user_script.py"
    script.write_text(textwrap.dedent(source))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site)] + sys.path))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=300)


def test_api_scripts_do_not_print_other_packages_import_notes(tmp_path):
    res = _run_script(tmp_path, """
        import logging
        import fsattn_diffusers
        import torchao
        logging.getLogger("torchao").warning("a torchao warning about the user's own work")
        logging.getLogger("diffusers.hooks.context_parallel").warning(
            "Expected input tensor to have 2 dimensions, but got 1 dimensions, split will not be applied.")
        print("done")
    """)
    print(res.stderr)
    assert res.returncode == 0 and res.stdout.strip() == "done"
    assert "_C_fake.so" not in res.stderr and "Enum subclass" not in res.stderr
    assert "split will not be applied" not in res.stderr
    assert "a torchao warning about the user's own work" in res.stderr  # only the known notes are dropped


def test_import_report_still_sees_the_notes():
    import logging

    from fsattn_diffusers.notices import filter_known_noise, quiet_third_party

    filter_known_noise()
    got = []
    with quiet_third_party(got):
        logging.getLogger("torchao").warning("Failed to load /x/_C.so: nope")
    assert got == [("torchao", "Failed to load /x/_C.so: nope")]


def test_random_weight_transformer_builds_without_the_float32_note(capfd):
    from fsattn_diffusers.measure import e2e
    from fsattn_diffusers.measure.sensitivity_attention import _model_spec

    spec = _model_spec("tiny", 5, 32, 32, None)
    model = e2e.build_transformer(spec, "cpu", dtype=torch.bfloat16)
    err = capfd.readouterr().err
    assert "should be kept in float32" not in err
    keep = model._keep_in_fp32_modules or []
    kept = [p.dtype for n, p in model.named_parameters() if any(k in n.split(".")[:-1] for k in keep)]
    assert kept and all(d == torch.float32 for d in kept)
    assert any(p.dtype == torch.bfloat16 for p in model.parameters())


def test_structured_suite_announces_its_total():
    from fsattn_diffusers.measure.structured_suite import run_suite

    totals, calls = [], []
    run_suite((1, 1, 64), head_dims=(64,), dtypes=("bfloat16",), families=["gaussian"], recipes=["mxfp8"],
              backend="emulator", external=False, on_total=totals.append, progress=lambda *a: calls.append(a))
    assert totals == [len(calls)] and len(calls) >= 2


def test_sweep_outputs_bar_json_and_file_modes(tmp_path, capsys):
    pytest.importorskip("skimage")
    import json
    import stat

    from fsattn_diffusers import cli

    out = tmp_path / "sw"
    old_umask = os.umask(0o022)
    try:
        rc = cli.main(["sweep", "--prompt", "a cat", "--policies", "bf16,mxfp8", "--no-lpips", "--steps", "1",
                       "--frames", "1", "--height", "32", "--width", "32", "--backend", "emulator", "--out", str(out)])
    finally:
        os.umask(old_umask)
    captured = capsys.readouterr()
    print(captured.err)
    final = [s for s in captured.err.replace("\r", "\n").splitlines() if s.startswith("sweep:")][-1]
    assert rc == 0 and "2/2" in final and "warm-up" not in final and "p00 mxfp8" in final
    assert f"report: {out / 'report.md'}" in captured.out  # absolute, as every "wrote" line

    def no_constants(name):
        raise AssertionError(f"non-standard JSON constant {name}")

    data = json.loads((out / "results.json").read_text(), parse_constant=no_constants)
    psnr = {r["policy"]: r["psnr_db"] for r in data["rows"]}
    assert psnr["bf16"] is None  # identical to bf16: null, never "inf"
    assert all(v is None or isinstance(v, float) for r in data["rows"] + data["means"] for k, v in r.items()
               if k in ("psnr_db", "ssim"))
    files = [p for p in out.rglob("*") if p.is_file()]
    assert any(p.suffix == ".safetensors" for p in files)
    modes = {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in files}
    assert set(modes.values()) == {"0o644"}, modes


def test_default_output_folders_are_ignored_by_git():
    if not os.path.isdir(os.path.join(ROOT, ".git")) and not os.path.isfile(os.path.join(ROOT, ".git")):
        pytest.skip("not a git checkout")
    names = ["fsattn_sweep/results.json", "fsattn_sensitivity/x.md", "fsattn_capture/calls.json", "fsattn_video.mp4"]
    res = subprocess.run(["git", "check-ignore", *names], cwd=ROOT, capture_output=True, text=True)
    assert res.stdout.split() == names


def _sixteen():
    import numpy as np

    rng = np.random.default_rng(0)
    labels = [f"policy{i:02d}" for i in range(16)]
    means = [dict(policy="bf16", step_s=1.0, psnr_db=float("inf"), ssim=1.0)]
    means += [dict(policy=lab, step_s=1.0 + i * 0.05, psnr_db=40 + 20 * rng.random(), ssim=0.9 + 0.1 * rng.random())
              for i, lab in enumerate(labels)]
    curves = {"p00": {lab: ([0, 4, 8], list(40 + 20 * rng.random(3))) for lab in labels}}
    return labels, means, curves


def test_sixteen_series_get_sixteen_colours_and_a_legend_beside_the_panels(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from fsattn_diffusers.quality import plots

    figures = []
    real_savefig = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **kw: (figures.append(self), real_savefig(self, *a, **kw)))
    labels, means, curves = _sixteen()
    plots.plot_quality_vs_time(means, str(tmp_path / "q.png"), False)
    plots.plot_psnr_per_frame(curves, str(tmp_path / "f.png"))
    for fig in figures:
        fig.canvas.draw()
        legend = fig.legends[0]
        assert [t.get_text() for t in legend.get_texts()] == labels
        box = legend.get_window_extent()
        for ax in fig.axes:
            assert not box.overlaps(ax.get_window_extent())  # the legend never covers a panel
        colours = {tuple(h.get_facecolor()[0]) if hasattr(h, "get_offsets") else h.get_color()
                   for h in legend.legend_handles}
        assert len(colours) == 16


def test_rollback_heatmap_stays_readable_for_many_steps(tmp_path):
    pytest.importorskip("matplotlib")
    import numpy as np
    from PIL import Image

    from fsattn_diffusers.quality.plots import plot_rollback_heatmap

    grids = {r: np.random.default_rng(0).random((2, 20)) for r in ("mxfp8", "mxfp6", "mxfp4")}
    path = plot_rollback_heatmap(grids, ["blocks.0.attn1", "blocks.1.attn1"], list(range(20)),
                                 str(tmp_path / "rollback.png"))
    w, h = Image.open(path).size
    assert w <= 1300 and h >= 150 * 3 and w / h < 3  # was 3135 x 275


def test_generate_help_lists_every_policy_it_accepts(capsys):
    from fsattn_diffusers import cli
    from fsattn_diffusers.integration.policy import DIFFUSERS_BACKEND_POLICIES, get_policy, policy_names

    with pytest.raises(SystemExit):
        cli.main(["generate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in policy_names():
        assert f" {name} |" in text or f"| {name} |" in text, name
        if not name.startswith("fa3") and name not in DIFFUSERS_BACKEND_POLICIES:  # those need their package
            get_policy(name)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the message of a machine without CUDA")
def test_fa3_on_a_cpu_machine_says_a_gpu_is_needed(capsys, tmp_path):
    from fsattn_diffusers import cli

    rc = cli.main(["generate", "--policy", "fa3", "--out", str(tmp_path / "v.mp4")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1
    assert "needs an NVIDIA Hopper GPU" in err and "no CUDA device" in err and "pip install" not in err


def test_table4_says_how_its_setting_differs_from_the_papers(capsys):
    from fsattn_diffusers import cli
    from fsattn_diffusers.measure.accuracy_tables import table4_setting_note

    assert table4_setting_note((1, 24, 32768, 128), 10) is None
    rc = cli.main(["accuracy", "--table", "4", "--shape", "1,1,64,64", "--device", "cpu"])
    out = capsys.readouterr().out
    assert rc == 0
    assert ("note: ours differ from the paper's setting: shape 1x1x64x64 (paper: 1x24x32768x128), 1 seed "
            "(paper: 10)") in out

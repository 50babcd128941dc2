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


def test_sweep_bar_drops_the_warm_up_label_after_the_warm_up(tmp_path, capsys):
    pytest.importorskip("skimage")
    from fsattn_diffusers import cli

    rc = cli.main(["sweep", "--prompt", "a cat", "--policies", "bf16", "--no-lpips", "--steps", "1", "--frames", "1",
                   "--height", "32", "--width", "32", "--out", str(tmp_path / "sw")])
    err = capsys.readouterr().err
    final = [s for s in err.replace("\r", "\n").splitlines() if s.startswith("sweep:")][-1]
    print(err)
    assert rc == 0 and "1/1" in final and "warm-up" not in final and "p00 bf16" in final

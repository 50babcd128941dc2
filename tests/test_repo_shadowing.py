"""The repository's top-level ``kernels/`` and ``pipelines/`` folders never shadow installed packages of those names.

``python -m ...`` run from the repository's root puts the root first on ``sys.path``; transformers 5.x imports
Hugging Face's ``kernels`` at start-up, so a ``kernels`` found there first broke every diffusers import (issue 41).
Each test runs a fresh interpreter with the repository's root as its working directory, as a user's would be.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KERNEL_MODULES = sorted(p.stem for p in (ROOT / "kernels").glob("*.py") if p.stem != "__init__")
PIPELINE_MODULES = sorted(p.stem for p in (ROOT / "pipelines").glob("*.py") if p.stem != "__init__")


def _run_module(tmp_path, source, extra_path=()):
    """Run ``source`` as ``python -m probe_module`` from the repository's root; return its JSON line."""
    (tmp_path / "probe_module.py").write_text(textwrap.dedent(source))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), *map(str, extra_path)]))
    res = subprocess.run([sys.executable, "-m", "probe_module"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


_WHERE = """
    import importlib, json, sys

    def where(name):
        try:
            mod = importlib.import_module(name)
        except ImportError as err:
            return "ImportError: " + str(err)
        return getattr(mod, "__file__", None) or "namespace"
"""


def test_diffusers_wan_transformer_imports_from_the_repository_root(tmp_path):
    out = _run_module(tmp_path, _WHERE + """
    import importlib.metadata
    from diffusers.models.transformers.transformer_wan import WanTransformer3DModel
    try:
        installed = str(importlib.metadata.distribution("kernels").locate_file(""))
    except importlib.metadata.PackageNotFoundError:
        installed = None
    print(json.dumps({"kernels": where("kernels"), "installed": installed, "sys_path0": sys.path[0]}))
    """)
    assert Path(out["sys_path0"]).resolve() == ROOT  # the working directory is searched first, as for a user
    if out["installed"]:  # Hugging Face's kernels (a dependency of transformers 5.x) is what `import kernels` gives
        assert Path(out["kernels"]).resolve().is_relative_to(Path(out["installed"]).resolve()), out
    else:
        assert out["kernels"].startswith("ImportError"), out
    assert not out["kernels"].startswith(str(ROOT)), out


def test_no_kernel_or_pipeline_module_imports_under_a_top_level_name(tmp_path):
    names = [f"kernels.{m}" for m in KERNEL_MODULES] + [f"pipelines.{m}" for m in PIPELINE_MODULES]
    out = _run_module(tmp_path, _WHERE + f"""
    print(json.dumps({{name: where(name) for name in {names!r}}}))
    """)
    assert len(out) >= 10
    imported = {name: f for name, f in out.items() if not f.startswith("ImportError")}
    assert imported == {}


def test_installed_packages_of_the_same_names_win(tmp_path):
    site = tmp_path / "site"
    for name in ("kernels", "pipelines"):
        (site / name).mkdir(parents=True)
        (site / name / "__init__.py").write_text(f"CUDAProperties = 'the installed {name}'\n")
    out = _run_module(tmp_path, """
    import json
    import kernels, pipelines
    from kernels import CUDAProperties
    print(json.dumps({"kernels": kernels.CUDAProperties, "pipelines": pipelines.CUDAProperties}))
    """, extra_path=[site])
    assert out == {"kernels": "the installed kernels", "pipelines": "the installed pipelines"}


def test_our_subpackages_and_entry_points_work_from_the_repository_root(tmp_path):
    out = _run_module(tmp_path, """
    import json
    import fsattn_diffusers.kernels.sm90.plan as plan
    import fsattn_diffusers.pipelines.settings as settings
    print(json.dumps({"plan": plan.__file__, "settings": settings.__file__}))
    """)
    assert out == {"plan": str(ROOT / "kernels" / "sm90" / "plan.py"), "settings": str(ROOT / "pipelines" / "settings.py")}


@pytest.mark.parametrize("argv,usage", [
    (["fsattn_diffusers", "generate", "--help"], "usage: fsattn generate"),
    (["fsattn_diffusers.pipelines.wan21_t2v", "--help"], "usage: wan21_t2v.py"),
])
def test_python_dash_m_from_the_root_gives_our_help(argv, usage):
    res = subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.startswith(usage) and "Traceback" not in res.stderr

"""The README's claims that a test can hold: CI runs its test line verbatim, its Python API snippet runs, the file
names it promises are the ones the tools write."""

import os
import re
import warnings

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _readme():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as fh:
        return fh.read()


def _block(after_heading, lang):
    text = _readme()
    section = text[text.index(after_heading):]
    return re.search(rf"```{lang}\n(.*?)```", section, re.S).group(1)


def test_ci_runs_the_readme_test_line_verbatim():
    lines = _block("## Quick start", "bash").strip().splitlines()
    assert len(lines) == 2 and "pytest" in lines[1]
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as fh:
        ci = [ln.strip() for ln in fh]
    assert lines[1].strip() in ci  # a line of its own, not a comment or part of another command
    assert "CI runs exactly this line" in _readme()


def test_the_python_api_snippet_runs():
    code = _block("## Python API", "python")
    scope = {}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*emulator.*slow")
        exec(compile(code, "README.md", "exec"), scope)  # noqa: S102 - our own README
    out, lse, stats = scope["fsa"].attention(scope["q"], scope["k"], scope["v"], "mxfp6", kv_lens=scope["lens"],
                                             return_lse=True, return_stats=True)
    assert out.shape == scope["q"].shape and scope["r"].proxy == "u32"


def test_the_sweep_file_names_in_the_readme_are_written():
    from fsattn_diffusers.quality import report

    text = _readme()
    assert "grid_<prompt>.png" not in text and "grid_p00.png" in text
    assert report.RESULTS_JSON in text and report.RESULTS_CSV in text  # grid_p00.png itself: test_sensitivity.py

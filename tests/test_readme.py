"""The README's claims that a test can hold: every code block runs as written on the embedded smoke model (CPU, under
a minute of CPU time each), CI runs its test line verbatim, the file names it promises are the ones the tools write."""

import os
import re
import shlex
import time
import warnings

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _readme():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as fh:
        return fh.read()


def _block(after_heading, lang):
    text = _readme()
    section = text[text.index(after_heading):]
    return re.search(rf"```{lang}\n(.*?)```", section, re.S).group(1)


#: A line before a code block that ends with ``*Needs ...:*`` says, visibly, what the block needs beyond the smoke model.
NEEDS = re.compile(r"\*Needs ([^*]+):\*\s*$")
#: The blocks that need more than a CPU and the smoke model: (section, first line of the block).
NEEDS_MORE = {("## Sequence parallel", "torchrun --nproc_per_node 2 -m fsattn_diffusers.pipelines.xdit_video "
                                       "--model Wan2.2-T2V \\"),
              ("## Sequence parallel", 'fsattn_diffusers.apply(pipe, policy="hybrid")')}
#: CPU seconds a block may take (one torch thread, so on an idle 2-core machine the wall time is below it too).
BLOCK_CPU_S = 60.0


def readme_blocks():
    """Every fenced code block of README.md: ``(section, language, code, needs)``, ``needs`` the ``*Needs ...:*``
    text of the line before it or None."""
    blocks, section, lines = [], None, _readme().splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("## "):
            section = lines[i].strip()
        if lines[i].startswith("```"):
            lang, end = lines[i][3:].strip(), lines.index("```", i + 1)
            needs = NEEDS.search(lines[i - 1]) if i else None
            blocks.append((section, lang, "\n".join(lines[i + 1:end]) + "\n", needs and needs.group(1)))
            i = end
        i += 1
    return blocks


def _commands(code):
    """Shell commands of a bash block: continuation lines joined, ``&&`` chains split, comments dropped."""
    for line in code.replace("\\\n", " ").splitlines():
        line = line.split(" #", 1)[0].strip()
        for command in filter(None, (c.strip() for c in line.split("&&"))):
            yield shlex.split(command)


def _run_bash(code):
    from fsattn_diffusers import cli

    for argv in _commands(code):
        if argv[:2] == ["pip", "install"]:
            continue  # this test runs in that install
        if argv[:3] == ["python", "-m", "pytest"]:
            continue  # this very run; CI runs the line verbatim (test_ci_runs_the_readme_test_line_verbatim)
        assert argv[0] == "fsattn", f"the README test does not know how to run {argv[0]!r} of {code!r}"
        assert cli.main(argv[1:]) == 0, argv


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_the_blocks_that_need_more_than_the_smoke_model_are_few_and_named():
    blocks = readme_blocks()
    assert {lang for _, lang, _, _ in blocks} == {"python", "bash"}
    marked = {(section, code.splitlines()[0]) for section, _, code, needs in blocks if needs}
    assert marked == NEEDS_MORE
    assert len(blocks) - len(marked) >= 4  # Quick start, Python API, Diffusers, sweep


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(readme_blocks())),
                         ids=[f"{section[3:].replace(' ', '_')}-{lang}-{i}"
                              for i, (section, lang, _, _) in enumerate(readme_blocks())])
def test_every_readme_block_runs_on_the_smoke_model(index, tmp_path, monkeypatch, one_thread, capsys):
    section, lang, code, needs = readme_blocks()[index]
    if needs:
        pytest.skip(f"the README says it needs {needs}")
    monkeypatch.chdir(tmp_path)
    start_cpu, start_wall = time.process_time(), time.perf_counter()
    if lang == "python":
        exec(compile(code, "README.md", "exec"), {})  # noqa: S102 - our own README
    else:
        _run_bash(code)
    cpu, wall = time.process_time() - start_cpu, time.perf_counter() - start_wall
    with capsys.disabled():
        print(f"\nREADME block {index} ({section}, {lang}): {cpu:.1f} s CPU, {wall:.1f} s wall")
    assert cpu < BLOCK_CPU_S


def test_ci_runs_the_readme_test_line_verbatim():
    lines = _block("## Quick start", "bash").strip().splitlines()
    assert len(lines) == 2 and "pytest" in lines[1]
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as fh:
        ci = [ln.strip() for ln in fh]
    assert lines[1].strip() in ci  # a line of its own, not a comment or part of another command
    assert "CI runs exactly this line" in _readme()


def test_the_python_api_snippet_computes_what_it_says():
    code = _block("## Python API", "python")
    scope = {}
    exec(compile(code, "README.md", "exec"), scope)  # noqa: S102 - our own README
    out, lse, stats = scope["fsa"].attention(scope["q"], scope["k"], scope["v"], "mxfp6", kv_lens=scope["lens"],
                                             return_lse=True, return_stats=True)
    assert out.shape == scope["q"].shape and scope["r"].proxy == "u32"


def test_the_sweep_file_names_in_the_readme_are_written():
    from fsattn_diffusers.quality import report

    text = _readme()
    assert "grid_<prompt>.png" not in text and "grid_p00.png" in text
    assert report.RESULTS_JSON in text and report.RESULTS_CSV in text  # grid_p00.png itself: test_sensitivity.py

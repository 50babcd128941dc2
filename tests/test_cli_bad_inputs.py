"""Bad output paths and blank prompts: one line, exit 2, before any model is built or any kernel runs."""

import os

import pytest

from fsattn_diffusers import cli


@pytest.fixture
def no_model_work(monkeypatch):
    """Every way a command builds a pipeline or a transformer fails the test if it is reached."""
    import fsattn_diffusers.integration.tiny as tiny
    import fsattn_diffusers.quality.loading as loading

    def reached(*args, **kwargs):
        raise AssertionError("model work started before the bad input was refused")

    monkeypatch.setattr(tiny, "tiny_wan22_pipeline", reached)
    monkeypatch.setattr(loading, "build_pipeline", reached)
    return reached


def _one_line_error(capsys, argv):
    rc = cli.main(argv)
    captured = capsys.readouterr()
    lines = [ln for ln in captured.err.splitlines() if ln.strip()]
    print(rc, captured.out, captured.err)
    assert rc == 2 and len(lines) == 1 and lines[0].startswith(f"fsattn {argv[0]}: error: "), (rc, lines)
    return lines[0]


@pytest.fixture
def a_file(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("a file, not a folder")
    return str(path)


#: command -> the arguments that make it otherwise valid and cheap.
PROMPTED = {"generate": [], "sweep": ["--prompt", "a cat"], "sensitivity": ["--prompt", "a cat"],
            "capture": []}


@pytest.mark.parametrize("command", ["generate", "sweep", "sensitivity", "capture"])
def test_out_under_an_unwritable_folder(no_model_work, capsys, tmp_path, command):
    out = "/proc/video.mp4" if command == "generate" else "/proc/x"
    if not os.path.isdir("/proc/self"):
        pytest.skip("no /proc here (not Linux)")
    line = _one_line_error(capsys, [command, *PROMPTED[command], "--out", out])
    assert f"--out {out}: cannot write in /proc" in line


@pytest.mark.parametrize("command", ["generate", "sweep", "sensitivity", "capture"])
def test_out_under_a_file(no_model_work, capsys, a_file, command):
    out = os.path.join(a_file, "video.mp4" if command == "generate" else "results")
    line = _one_line_error(capsys, [command, *PROMPTED[command], "--out", out])
    assert f"lies under {a_file}, which is a file" in line


@pytest.mark.parametrize("command", ["sweep", "sensitivity", "capture"])
def test_out_folder_that_is_a_file(no_model_work, capsys, a_file, command):
    line = _one_line_error(capsys, [command, *PROMPTED[command], "--out", a_file])
    assert f"--out {a_file} exists and is not a folder" in line


def test_generate_out_that_is_a_folder(no_model_work, capsys, tmp_path):
    folder = tmp_path / "video.mp4"
    folder.mkdir()
    assert f"--out {folder} is a folder" in _one_line_error(capsys, ["generate", "--out", str(folder)])


def test_a_writable_out_leaves_nothing_behind(tmp_path):
    cli.check_output_path(str(tmp_path / "new" / "deeper"), "--out", folder=True)
    cli.check_output_path(str(tmp_path / "video.mp4"), "--out", folder=False)
    assert os.listdir(tmp_path) == []  # neither the probe file nor the missing folders stay


@pytest.mark.parametrize("prompt", ["", "   ", "\t\n"])
@pytest.mark.parametrize("command", ["generate", "capture"])
def test_blank_prompt(no_model_work, capsys, tmp_path, command, prompt):
    out = str(tmp_path / ("v.mp4" if command == "generate" else "o"))
    line = _one_line_error(capsys, [command, "--prompt", prompt, "--out", out])
    assert f"--prompt {prompt!r} has no text" in line and not os.path.exists(out)


@pytest.mark.parametrize("prompts", [[""], ["  "], ["a cat", " "]])
@pytest.mark.parametrize("command", ["sweep", "sensitivity"])
def test_blank_prompt_among_several(no_model_work, capsys, tmp_path, command, prompts):
    line = _one_line_error(capsys, [command, "--prompt", *prompts, "--out", str(tmp_path / "o")])
    assert "has no text" in line and not os.path.exists(tmp_path / "o")


@pytest.mark.parametrize("argv,flag", [(["accuracy", "--table", "8", "--json", "PATH"], "--json"),
                                       (["e2e", "--json", "PATH"], "--json"),
                                       (["e2e", "--md", "PATH"], "--md"),
                                       (["bench", "--json", "PATH"], "--json")])
def test_report_files_under_a_file(capsys, a_file, argv, flag):
    path = os.path.join(a_file, "out.json")
    line = _one_line_error(capsys, [path if a == "PATH" else a for a in argv])
    assert f"{flag} {path} lies under {a_file}, which is a file" in line


@pytest.mark.parametrize("argv,says", [(["--prompt", " "], "--prompt ' ' has no text"),
                                       (["--prompt", "a cat", "--out", "/proc/wan.mp4"], "cannot write in /proc")])
def test_the_paper_setting_runners_refuse_bad_input_before_loading(no_model_work, monkeypatch, capsys, argv, says):
    import fsattn_diffusers.integration.runner as runner
    from fsattn_diffusers.pipelines._runner import run
    from fsattn_diffusers.pipelines.settings import WAN22_T2V_A14B

    monkeypatch.setattr(runner, "load_pipeline", no_model_work)
    assert run(WAN22_T2V_A14B, argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err

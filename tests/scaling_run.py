"""The two-process scaling runs (``measure.cp_scaling``, ``measure.xdit_scaling``) on the CPU, shared by their tests:
2 gloo processes, the tiny Wan config, the emulator, SageAttention 2 faked (tests/fake_sage.py)."""

import json

import pytest

import fake_sage

#: What the default --policies measure (hybrid-int8-mxfp8 adds no recipe of its own: int8-bf16 and mxfp8, projected).
POLICIES = ["bf16", "mxfp8", "int8-bf16", "int8-bf16+exponential=exact", "sage"]
PROJECTED = "hybrid-int8-mxfp8 (projected)"


def run_report(main, out):
    """``(json document, markdown)`` of ``main``'s run with the default policies, its files written under ``out``."""
    js, md = out / "report.json", out / "report.md"
    with pytest.MonkeyPatch.context() as mp:
        fake_sage.accept_in_diffusers(mp, fake_sage.install(mp, out / "sage", kind="2"))
        assert main(["--tiny", "--device", "cpu", "--world", "2", "--backend", "emulator",
                     "--json", str(js), "--md", str(md)]) == 0
    return json.loads(js.read_text()), md.read_text()

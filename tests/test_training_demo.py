"""The grid-softmax training demo runs end to end on a few steps and writes its JSON and PNG."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "grid_softmax_training_demo.py"


@pytest.mark.slow
def test_demo_writes_json_and_png(tmp_path):
    out = tmp_path / "demo"
    cmd = [sys.executable, str(SCRIPT), "--out", str(out), "--steps", "6", "--eval-every", "3", "--eval-batch", "32",
           "--batch", "8", "--variants", "softmax,K4 minmax hard_pre keep,K32 minmax lerp detach"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    print(res.stdout[-2000:], res.stderr[-2000:])
    assert res.returncode == 0
    data = json.loads(out.with_suffix(".json").read_text())
    assert {"command", "date_utc", "machine", "torch"} <= set(data["meta"])
    assert [r["variant"] for r in data["runs"]] == ["softmax", "K4 minmax hard_pre keep", "K32 minmax lerp detach"]
    for r in data["runs"]:
        assert r["curve"]["step"] == [3, 6] and all(x > 0 for x in r["curve"]["eval_loss"])
    assert out.with_suffix(".png").stat().st_size > 10_000


def test_demo_bad_variant_exits_2(tmp_path):
    res = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "x"), "--variants", "nope"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "accepted" in res.stderr and "Traceback" not in res.stderr

"""Public API: validation errors are one line saying what was wrong and what is accepted."""

import subprocess
import sys

import pytest
import torch

import fsattn_diffusers as fa
from fsattn_diffusers.recipe import Recipe


def t(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)), dtype=torch.float32).to(dtype)


BAD_CALLS = [
    (lambda: fa.attention(t(1, 8, 2, 64), t(1, 8, 3, 64), t(1, 8, 3, 64)), "shapes do not match"),
    (lambda: fa.attention(t(1, 8, 2, 64), t(1, 9, 2, 64), t(1, 8, 2, 64)), "shapes do not match"),
    (lambda: fa.attention(t(1, 8, 2, 48), t(1, 8, 2, 48), t(1, 8, 2, 48), "mxfp8"), "not a multiple of 32"),
    (lambda: fa.attention(t(1, 8, 2, 96), t(1, 8, 2, 96), t(1, 8, 2, 96), "mxfp6"), "not a power of two"),
    (lambda: fa.attention(t(1, 8, 2, 64).long(), t(1, 8, 2, 64).long(), t(1, 8, 2, 64).long()), "dtype"),
    (lambda: fa.attention(t(8, 2, 64), t(8, 2, 64), t(8, 2, 64)), "must be 4-D"),
    (lambda: fa.attention(t(1, 8, 2, 64), t(1, 8, 2, 64), t(1, 8, 2, 64), "mxfp3"), "unknown recipe"),
    (lambda: fa.attention(t(1, 8, 2, 64), t(1, 8, 2, 64), t(1, 8, 2, 64), layout="sbhd"), "unknown layout"),
    (lambda: fa.attention(t(1, 8, 2, 64), t(1, 8, 2, 64), t(1, 8, 2, 64), kv_lens=[9]), r"kv_lens values must lie"),
    (lambda: fa.attention(t(2, 8, 2, 64), t(2, 8, 2, 64), t(2, 8, 2, 64), kv_lens=[1]), r"shape \(2,\)"),
    (lambda: fa.attention(t(1, 8, 2, 64), t(1, 8, 2, 64), t(1, 8, 2, 64), scale=-1.0), "positive finite"),
    (lambda: fa.attention(t(1, 8, 2, 64), t(1, 8, 2, 64), t(1, 8, 2, 64), backend="cuda-magic"), "unknown backend"),
    (lambda: fa.attention(t(1, 8, 2, 64), t(1, 8, 2, 64).half(), t(1, 8, 2, 64)), "dtypes differ"),
    (lambda: Recipe(p_format="fp7"), "accepted"),
    (lambda: Recipe(tile_n=100), "multiple of 32"),
    (lambda: Recipe(rollback_cap_log2=0), "out of range"),
]


@pytest.mark.parametrize("call,match", BAD_CALLS)
def test_bad_input_gives_one_line_value_error(call, match):
    with pytest.raises(ValueError, match=match) as info:
        call()
    message = str(info.value)
    print(message)
    assert "\n" not in message and ("accepted" in message or "must" in message)


def test_return_tuple_order_and_stats_keys():
    q = t(1, 300, 2, 64)
    out, lse, stats = fa.attention(q, q, q, "mxfp6", return_lse=True, return_stats=True)
    assert out.shape == q.shape and lse.shape == (1, 2, 300)
    assert set(stats) == {"rollbacks", "tiles", "rollback_tiles", "rollback_rate"}
    assert isinstance(fa.attention(q, q, q, "bf16-emulated"), torch.Tensor)


def test_emulator_warns_once_that_it_is_slow(recwarn):
    from fsattn_diffusers import backends

    backends._WARNED.discard("slow:emulator")
    q = t(1, 40, 1, 64)
    fa.attention(q, q, q, "mxfp8")
    fa.attention(q, q, q, "mxfp8")
    slow = [w for w in recwarn if "slow" in str(w.message)]
    assert len(slow) == 1


def test_torch_compile_of_the_emulator_path():
    q = t(1, 130, 2, 64)
    fn = torch.compile(lambda a: fa.attention(a, a, a, "mxfp8", backend="emulator"), backend="eager")
    assert torch.equal(fn(q), fa.attention(q, q, q, "mxfp8", backend="emulator"))


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "fsattn_diffusers", *args], capture_output=True, text=True)


def test_cli_accuracy_table8_and_info():
    res = _cli("accuracy", "--table", "8")
    print(res.stdout)
    assert res.returncode == 0 and "U16/BF16" in res.stdout and "1.777 | 1.777" in res.stdout
    info = _cli("info")
    assert info.returncode == 0 and "emulator  usable" in info.stdout


def test_cli_accuracy_table4_small_json(tmp_path):
    out = tmp_path / "t4.json"
    res = _cli("accuracy", "--table", "4", "--shape", "1,1,256,64", "--json", str(out))
    assert res.returncode == 0, res.stderr
    import json

    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 24 and all({"ours", "paper"} <= set(r) for r in rows)


@pytest.mark.parametrize("args", [["accuracy", "--shape", "1,2"], ["accuracy", "--device", "nosuchdevice"],
                                  ["accuracy", "--seeds", "0"]])
def test_cli_errors_are_one_line_exit_2(args):
    res = _cli(*args)
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("fsattn")]
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr

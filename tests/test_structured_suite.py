"""Structured-input families, the exact reference, the suite end to end, and the bar checks."""

import json
import math
import subprocess
import sys
import types

import pytest
import torch

from fsattn_diffusers.measure import structured_suite as suite
from fsattn_diffusers.measure.structured_inputs import FAMILIES, get_family, position_features
from fsattn_diffusers.recipe import get_recipe
from fsattn_diffusers.testing import cosine, exact_attention, relative_error
from tolerances import (BF16_OPERANDS_ERR_MAX, FAKE_FA3_BF16_ERR_MAX, FAKE_FA3_FP8_ERR, FAMILY_CHANNEL_MEAN,
                        FAMILY_OFFSET_NORM_REL, FAMILY_PLAIN_CHANNEL_STD_MAX, FAMILY_SHARED_DIRECTION_COS,
                        FAMILY_SINK_MASS_MIN, FP32_ROUNDOFF, FP64_ROUNDOFF, FP64_SLACK, GAUSSIAN_FIRST_KEY_MASS_MAX,
                        SUITE_CELL_ERR, SUITE_SUBSAMPLE_PP)

B, H, S, D = 1, 2, 512, 64


def gen(name, s=S, d=D, dtype=torch.float32, seed=0):
    return FAMILIES[name](B, H, s, d, dtype, "cpu", seed)


def probs(q, k):
    return torch.softmax(q.double() @ k.double().transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)


# ---------------------------------------------------------------- families

@pytest.mark.parametrize("name", list(FAMILIES))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_family_shape_dtype_determinism(name, dtype):
    q, k, v = gen(name, dtype=dtype)
    q2, k2, v2 = gen(name, dtype=dtype)
    q3 = gen(name, dtype=dtype, seed=1)[0]
    for t in (q, k, v):
        assert t.shape == (B, H, S, D) and t.dtype == dtype and torch.isfinite(t).all()
    assert torch.equal(q, q2) and torch.equal(k, k2) and torch.equal(v, v2)
    assert not torch.equal(q, q3)


def test_unknown_family():
    with pytest.raises(ValueError, match="accepted: gaussian"):
        get_family("nope")


@pytest.mark.parametrize("target", ["q", "k", "qk"])
def test_offsets_are_where_they_should_be(target):
    base_q, base_k, _ = gen("gaussian")
    for kind in ("uniform", "sparse", "direction"):
        q, k, _ = gen(f"offset_{kind}_{target}")
        for name, t, base in (("q", q, base_q), ("k", k, base_k)):
            mean = t.mean(dim=2)  # (B, H, D): the shared offset plus noise of std 1/sqrt(S)
            norm = mean.norm(dim=-1)
            print(kind, target, name, "mean-vector norm", norm.flatten().tolist())
            if name in target:
                expected = 10 * math.sqrt(4) if kind == "sparse" else 3 * math.sqrt(D)
                assert torch.allclose(norm, torch.full_like(norm, expected), rtol=FAMILY_OFFSET_NORM_REL)
                if kind == "uniform":
                    assert (mean - 3).abs().max() < FAMILY_CHANNEL_MEAN
                if kind == "sparse":
                    assert ((mean - 10).abs() < FAMILY_CHANNEL_MEAN).sum(-1).eq(4).all()
                    assert (mean.abs() < FAMILY_CHANNEL_MEAN).sum(-1).eq(D - 4).all()
            else:
                assert torch.equal(t, base)
        if target == "qk":  # one shared vector for Q and K
            cos = torch.nn.functional.cosine_similarity(q.mean(2), k.mean(2), dim=-1)
            assert cos.min() > FAMILY_SHARED_DIRECTION_COS


@pytest.mark.parametrize("name,tensor", [("k_channel_outliers", 1), ("v_channel_outliers", 2)])
def test_channel_outliers(name, tensor):
    t = gen(name)[tensor]
    std = t.std(dim=2)  # (B, H, D)
    print(name, "largest channel stds", std.topk(5, dim=-1).values.tolist())
    big = std > 5
    assert big.sum(-1).eq(4).all()
    assert (std[big] > 9).all() and (std[big] < 21).all() and (std[~big] < FAMILY_PLAIN_CHANNEL_STD_MAX).all()


def test_sharp_scales_q():
    q, k, v = gen("sharp")
    q0, k0, v0 = gen("gaussian")
    assert torch.allclose(q, 4 * q0) and torch.equal(k, k0) and torch.equal(v, v0)


def test_sink_key_gets_most_mass():
    for s in (256, 2048):
        q, k, _ = FAMILIES["attention_sink"](1, 2, s, 128, torch.bfloat16, "cpu", 0)
        p = probs(q, k)
        sink, rest = p[..., 0].mean().item(), p[..., 1:].max(dim=-1).values.mean().item()
        print(f"S={s}: mean mass on the sink {sink:.3f}, mean largest other key {rest:.4f}")
        assert sink > FAMILY_SINK_MASS_MIN and sink > 20 * rest
    p0 = probs(*gen("gaussian")[:2])[..., 0].mean().item()
    assert p0 < GAUSSIAN_FIRST_KEY_MASS_MAX


def test_locality_decays_with_distance():
    s = 1024
    q, k, _ = gen("locality", s=s, d=128)
    p = probs(q, k)
    i = torch.arange(s)
    dist = (i[:, None] - i[None, :]).abs()
    mean_at = {dd: p[..., dist == dd].mean().item() * s for dd in (0, 1, 4, 16, 64, 256)}
    print("locality: mean weight x S at distance", mean_at)
    vals = list(mean_at.values())
    assert all(a > b for a, b in zip(vals, vals[1:]))
    assert vals[0] > 20 * vals[-1]
    pg = probs(*gen("gaussian", s=s, d=128)[:2])
    assert pg[..., dist <= 1].mean().item() * s < 2  # no locality without the component
    feat = position_features(s, 128).double()  # phi(i) . phi(i + 5) does not depend on i; phi . phi = D/2
    assert torch.allclose((feat[:-5] * feat[5:]).sum(-1), (feat[0] * feat[5]).sum(), atol=FP64_SLACK)
    assert torch.allclose((feat * feat).sum(-1), torch.full((s,), 64.0, dtype=torch.float64))


# ---------------------------------------------------------------- reference

def test_exact_attention_matches_sdpa_chunked_masked_and_bshd():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 70, 32, generator=g, dtype=torch.float64) for _ in range(3))
    lens = torch.tensor([70, 33])
    mask = (torch.arange(70)[None, :] < lens[:, None])[:, None, None, :]
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out, lse = exact_attention(q, k, v, kv_lens=lens, slab_elements=2 * 3 * 70 * 7)  # 7 rows per chunk
    assert torch.allclose(out, ref, atol=FP64_ROUNDOFF)
    s = (q @ k.transpose(-1, -2) / math.sqrt(32)).masked_fill(~mask, float("-inf"))
    assert torch.allclose(lse, torch.logsumexp(s, -1), atol=FP64_ROUNDOFF)
    out_t, _ = exact_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), kv_lens=lens, layout="bshd")
    assert torch.allclose(out_t.transpose(1, 2), ref, atol=FP64_ROUNDOFF)
    assert relative_error(ref, ref) == 0 and abs(cosine(ref, ref) - 1) < FP64_ROUNDOFF
    assert abs(relative_error(2 * ref, ref) - 1) < FP64_ROUNDOFF
    empty, lse0 = exact_attention(q, k, v, kv_lens=[0, 5])
    assert (empty[0] == 0).all() and torch.isinf(lse0[0]).all()


# ---------------------------------------------------------------- measuring one column

def test_measure_flags_nan_and_modified_inputs():
    q, k, v = gen("gaussian", s=64)
    ref = exact_attention(q, k, v)[0]

    def nan_fn(q, k, v):
        out = ref.clone().float()
        out[0, 0, 3, 5] = float("nan")
        return out

    def mutating_fn(q, k, v):
        k.mul_(1.0)  # bit-identical: not a modification
        q[0, 0, 0, 0] += 1.0
        return ref.float()
    cell = suite._measure(nan_fn, q, k, v, None, ref, False)
    assert cell["nonfinite"] == 1 and cell["inputs_unchanged"] is True
    cell = suite._measure(mutating_fn, q.clone(), k, v, None, ref, False)
    assert cell["inputs_unchanged"] is False and cell["nonfinite"] == 0 and cell["err"] < FP32_ROUNDOFF


def test_fa3_absent_and_fake_fa3_fp8(monkeypatch):
    monkeypatch.setitem(sys.modules, "fa3_fwd_interface", None)  # import fails
    cols, notes = suite.external_columns(torch.device("cuda"))
    assert "fa3-fp8" not in cols and any("fa3_fwd_interface not importable" in n for n in notes)
    cols, notes = suite.external_columns(torch.device("cpu"))
    assert cols == {} and "need a CUDA device" in notes[0]
    seen = {}

    def flash_attn_func(q, k, v, softmax_scale=None, causal=False, q_descale=None, k_descale=None, v_descale=None):
        if q_descale is not None:
            seen.update(dtype=q.dtype, descale=tuple(q_descale.shape), layout=tuple(q.shape))
        deq = [t.float() * (1.0 if ds is None else ds[:, None, :, None]) for t, ds in
               ((q, q_descale), (k, k_descale), (v, v_descale))]
        out = exact_attention(*deq, scale=softmax_scale, layout="bshd")[0]
        return out.to(torch.bfloat16), None
    monkeypatch.setitem(sys.modules, "fa3_fwd_interface", types.SimpleNamespace(flash_attn_func=flash_attn_func))
    cols, _ = suite.external_columns(torch.device("cuda"))
    q, k, v = gen("gaussian", s=128, dtype=torch.bfloat16)
    ref = exact_attention(q, k, v)[0]
    err8 = relative_error(cols["fa3-fp8"](q, k, v, D ** -0.5), ref)
    assert seen == {"dtype": torch.float8_e4m3fn, "descale": (B, H), "layout": (B, 128, H, D)}
    err16 = relative_error(cols["fa3-bf16"](q, k, v, D ** -0.5), ref)
    print(f"fake FA3: fp8 per-head scales {err8:.4f}, bf16 {err16:.4f}")
    assert FAKE_FA3_FP8_ERR[0] < err8 < FAKE_FA3_FP8_ERR[1] and err16 < FAKE_FA3_BF16_ERR_MAX


# ---------------------------------------------------------------- bar checks

def _case(family, cols, dtype="bfloat16", d=128):
    full = {name: {"err": e, "cos": 1 - e, "nonfinite": 0, "inputs_unchanged": True} for name, e in cols.items()}
    return {"family": family, "dtype": dtype, "head_dim": d, "columns": full}


FORMATS = {"mxfp8": "mxfp8", "mxfp6": "mxfp6", "mxfp4": "mxfp4"}


def _check(rows, family, recipe):
    return next(r for r in rows if r["family"] == family and r["recipe"] == recipe)


def test_bar_checks_pass_and_fail():
    cases = [
        _case("gaussian", {"mxfp8": 0.056, "mxfp6": 0.064, "mxfp4": 0.20, "fa3-fp8": 0.053}),
        # FA3 stays within 1.5x: both rules apply
        _case("ok", {"mxfp8": 0.060, "mxfp6": 0.075, "mxfp4": 0.5, "fa3-fp8": 0.058}),
        _case("over_fa3", {"mxfp8": 0.064, "mxfp6": 0.072, "mxfp4": 0.2, "fa3-fp8": 0.058}),
        _case("over_gauss", {"mxfp8": 0.0842, "mxfp6": 0.100, "mxfp4": 0.2, "fa3-fp8": 0.0794}),
        # FA3 degrades (> 1.5x its Gaussian): only the FA3 rule
        _case("fa3_degrades", {"mxfp8": 0.120, "mxfp6": 0.200, "mxfp4": 0.9, "fa3-fp8": 0.175}),
    ]
    rows = suite.bar_checks(cases, FORMATS)
    for r in rows:
        print(r["family"], r["recipe"], r["err"], r["limit_fa3"], r["limit_gauss"], r["vs_fa3"], r["vs_gaussian"])
    assert _check(rows, "gaussian", "mxfp8")["vs_gaussian"] == "pass"
    assert (_check(rows, "ok", "mxfp8")["vs_fa3"], _check(rows, "ok", "mxfp8")["vs_gaussian"]) == ("pass", "pass")
    # mxfp6: 7.5% <= 5.8 + 1.5 = 7.3? no -> fail; gaussian rule 1.5 * 6.4 + 1 = 10.6 -> pass
    assert (_check(rows, "ok", "mxfp6")["vs_fa3"], _check(rows, "ok", "mxfp6")["vs_gaussian"]) == ("fail", "pass")
    assert _check(rows, "over_fa3", "mxfp8")["vs_fa3"] == "fail"      # 6.4 > 5.8 + 0.5
    assert _check(rows, "over_fa3", "mxfp6")["vs_fa3"] == "pass"      # 7.2 <= 5.8 + 1.5
    assert _check(rows, "over_gauss", "mxfp8")["vs_fa3"] == "pass"    # 8.42 <= 7.94 + 0.5
    assert _check(rows, "over_gauss", "mxfp8")["vs_gaussian"] == "fail"   # 8.42 > 1.5 * 5.6 = 8.4
    assert _check(rows, "fa3_degrades", "mxfp8")["vs_gaussian"] == "n/a"
    assert _check(rows, "fa3_degrades", "mxfp8")["vs_fa3"] == "pass"  # 12.0 <= 17.5 + 0.5
    assert _check(rows, "fa3_degrades", "mxfp6")["vs_fa3"] == "fail"  # 20.0 > 17.5 + 1.5
    assert all(r["vs_fa3"] == r["vs_gaussian"] == "n/a" for r in rows if r["recipe"] == "mxfp4")
    assert all(r["finite"] == r["inputs"] == "pass" for r in rows)


def test_bar_checks_without_fa3_and_flags():
    gauss = _case("gaussian", {"mxfp8": 0.056})
    bad = _case("sink", {"mxfp8": 0.03})
    bad["columns"]["mxfp8"].update(nonfinite=3, inputs_unchanged=False)
    rows = suite.bar_checks([gauss, bad], {"mxfp8": "mxfp8"})
    assert all(r["vs_fa3"] == "n/a" and r["vs_gaussian"] == "n/a" for r in rows)
    assert (_check(rows, "sink", "mxfp8")["finite"], _check(rows, "sink", "mxfp8")["inputs"]) == ("fail", "fail")
    broken = _case("sharp", {"mxfp8": 0.05})
    broken["columns"]["mxfp8"] = {"err": None, "cos": None, "nonfinite": None, "inputs_unchanged": None, "error": "x"}
    row = _check(suite.bar_checks([gauss, broken], {"mxfp8": "mxfp8"}), "sharp", "mxfp8")
    assert row["ran"] == "fail" and row["finite"] == "n/a" and _check(rows, "sink", "mxfp8")["ran"] == "pass"


# ---------------------------------------------------------------- end to end

def test_suite_end_to_end_cli(tmp_path):
    js, md = tmp_path / "s.json", tmp_path / "s.md"
    cmd = [sys.executable, "-m", "fsattn_diffusers", "accuracy", "--suite", "structured", "--shape", "1,1,256",
           "--families", "offset_uniform_k,attention_sink", "--recipes", "mxfp8", "--dtypes", "bfloat16",
           "--head-dims", "64", "--query-rows", "128", "--json", str(js), "--markdown", str(md)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    print(res.stdout[-3000:], res.stderr[-1000:])
    assert res.returncode == 0
    payload = json.loads(js.read_text())
    cases = payload["result"]["cases"]
    assert [c["family"] for c in cases] == ["gaussian", "offset_uniform_k", "attention_sink"]
    assert payload["result"]["columns"] == ["mxfp8", "conventional-mxfp8"]
    for c in cases:
        for cell in c["columns"].values():
            assert SUITE_CELL_ERR[0] < cell["err"] < SUITE_CELL_ERR[1] and cell["nonfinite"] == 0
            assert cell["inputs_unchanged"] is True
    assert payload["meta"]["command"].startswith("python -m fsattn_diffusers accuracy --suite structured")
    assert payload["meta"]["date"] and payload["meta"]["torch"]
    assert any("fa3" in n and "skipped" in n for n in payload["result"]["notes"])
    assert len(payload["checks"]) == 3 and all(r["vs_fa3"] == "n/a" for r in payload["checks"])
    text = md.read_text()
    assert "| offset_uniform_k | bfloat16 | 64 |" in text and "## Bar checks" in text and "skipped" in text
    assert "bar checks: 3 rows" in res.stdout


def _accuracy_in_process(args, capsys):
    """``(exit code, stdout, stderr)`` of ``fsattn accuracy ARGS`` run by ``cli.main`` in this process (the command
    line in a process of its own: test_cli_bad_args_in_a_process)."""
    from fsattn_diffusers import cli

    capsys.readouterr()
    try:
        code = cli.main(["accuracy", *args])
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    out, err = capsys.readouterr()
    print(f"exit {code}\nstdout: {out[-1500:]}\nstderr: {err[-1500:]}")
    return code, out, err


def test_cli_bad_args_in_a_process():
    res = subprocess.run([sys.executable, "-m", "fsattn_diffusers", "accuracy", "--suite", "structured", "--families",
                          "nope"], capture_output=True, text=True, timeout=120)
    print(res.stderr)
    assert res.returncode == 2 and "--families: unknown nope" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1  # nothing else on stderr, third-party import notes included


@pytest.mark.parametrize("extra,needle", [
    (["--families", "nope"], "--families: unknown nope"),
    (["--shape", "1,2"], "--shape must be"),
    (["--recipes", "mxfp9"], "--recipes: unknown recipe 'mxfp9'"),
    (["--dtypes", "float32"], "--dtypes: unknown float32"),
    (["--head-dims", "x"], "--head-dims must be"),
    (["--table", "8"], "--suite and --table are exclusive"),
    (["--query-rows", "0"], "--query-rows must be at least 1"),
])
def test_cli_bad_args(extra, needle, capsys):
    code, _, err = _accuracy_in_process(["--suite", "structured", *extra], capsys)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_list_families(capsys):
    code, out, _ = _accuracy_in_process(["--list-families"], capsys)
    assert code == 0 and len(out.strip().splitlines()) == len(FAMILIES) == 16


def test_default_recipes_and_table4_paper_presets(monkeypatch):
    from fsattn_diffusers.measure import accuracy_tables as accuracy
    from fsattn_diffusers.recipe import PRESETS

    assert set(suite.default_recipes()) >= {"mxfp8", "mxfp6", "mxfp4"}
    assert all(n.startswith("mxfp") for n in suite.default_recipes())
    assert accuracy.table4_recipe("conventional", "mxfp8").hadamard == PRESETS["mxfp8"].hadamard
    paper = PRESETS["mxfp8"].replace(name="mxfp8-paper", tile_n=64)
    monkeypatch.setitem(PRESETS, "mxfp8-paper", paper)
    cell = accuracy.table4_recipe("+ frozen max", "mxfp8")
    assert cell.tile_n == 64 and cell.frozen_max and cell.exponential == "exact"
    assert accuracy.table4_recipe("conventional", "bf16").qk_format == "bf16"


def test_conventional_columns_follow_each_recipe():
    from fsattn_diffusers.measure.accuracy_tables import paper_preset, table4_recipe
    from fsattn_diffusers.recipe import PRESETS

    conv = suite.conventional_recipe(paper_preset("mxfp6").replace(numerics="sm90"))
    assert conv.numerics == "mi355x" and conv.exponential == "exact" and not conv.frozen_max
    assert conv.replace(name="x") == table4_recipe("conventional", "mxfp6").replace(name="x")
    # the default mxfp8 visits its own key tile first; its conventional column runs the natural order
    conv8 = suite.conventional_recipe(PRESETS["mxfp8"])
    print("mxfp8", PRESETS["mxfp8"].key_order, "-> conventional", conv8.key_order)
    assert PRESETS["mxfp8"].key_order == "diagonal" and conv8.key_order == "natural"
    res = suite.run_suite((1, 1, 64), head_dims=(64,), dtypes=("bfloat16",), families=["gaussian"],
                          recipes=["mxfp8", PRESETS["mxfp8"].replace(name="mxfp8-copy"), "bf16-emulated"], external=False)
    print(res["columns"])
    # one per distinct operand set
    assert res["columns"] == ["mxfp8", "mxfp8-copy", "bf16-emulated", "conventional-mxfp8"]
    row = res["cases"][0]["columns"]
    assert row["mxfp8"]["err"] == row["mxfp8-copy"]["err"] and row["bf16-emulated"]["err"] < BF16_OPERANDS_ERR_MAX


def test_query_rows_subset_is_row_exact_on_the_emulator():
    from fsattn_diffusers.recipe import PRESETS

    r = PRESETS["mxfp8-paper"]
    assert suite._rows_per_row_exact(r, "auto", torch.device("cpu"))
    assert not suite._rows_per_row_exact(r.replace(numerics="sm90"), "auto", torch.device("cpu"))
    assert not suite._rows_per_row_exact(r, "auto", torch.device("cuda"))
    full = suite.run_suite((1, 1, 256), head_dims=(64,), dtypes=("float16",), families=["gaussian"],
                           recipes=["mxfp8-paper"], external=False, conventional=False)
    sub = suite.run_suite((1, 1, 256), head_dims=(64,), dtypes=("float16",), families=["gaussian"],
                          recipes=["mxfp8-paper"], external=False, conventional=False, query_rows=128)
    e_full, e_sub = (res["cases"][0]["columns"]["mxfp8-paper"]["err"] for res in (full, sub))
    print(f"all rows {e_full:.4f}, 128 sampled rows {e_sub:.4f}")
    assert abs(e_full - e_sub) < SUITE_SUBSAMPLE_PP and "128 query rows" in sub["exact"]


def test_mi355x_emulator_rows_do_not_depend_on_other_rows():
    """In the natural key order without Q smoothing; the diagonal order makes a row's key tiles depend on its
    position, and Q smoothing a row's numerics on the other queries, so the suite runs such recipes on all rows
    (``_rows_per_row_exact``)."""
    import fsattn_diffusers as fsa
    from fsattn_diffusers.recipe import PRESETS

    q, k, v = gen("offset_uniform_qk", s=512)
    rows = torch.tensor([3, 100, 257, 511])
    assert not suite._rows_per_row_exact(get_recipe("mxfp8+key_order=natural"), "emulator", torch.device("cpu"))
    for name in ("mxfp8+key_order=natural+smooth_q=false", "mxfp4+key_order=natural+smooth_q=false"):
        assert suite._rows_per_row_exact(get_recipe(name), "emulator", torch.device("cpu"))
        full = fsa.attention(q, k, v, name, layout="bhsd", backend="emulator")[:, :, rows]
        part = fsa.attention(q[:, :, rows], k, v, name, layout="bhsd", backend="emulator")
        assert torch.equal(full, part), name
    assert PRESETS["mxfp8"].key_order == "diagonal"
    assert not suite._rows_per_row_exact(PRESETS["mxfp8"], "emulator", torch.device("cpu"))


def test_on_case_reports_partial_results():
    seen = []
    res = suite.run_suite((1, 1, 64), head_dims=(64,), dtypes=("bfloat16", "float16"), families=["sharp"],
                          recipes=["mxfp8"], external=False, on_case=lambda r: seen.append(len(r["cases"])))
    assert seen == [1, 2, 3, 4] and len(res["cases"]) == 4
    assert [c["family"] for c in res["cases"]] == ["gaussian", "sharp"] * 2


def test_suite_flags_without_suite_are_refused(capsys):
    code, _, err = _accuracy_in_process(["--table", "8", "--families", "sharp"], capsys)
    assert code == 2 and "--families need --suite structured" in err

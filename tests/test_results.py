"""The committed result files: every row records the recipe and the numerics computed, and README.md's results
tables are what ``fsattn_diffusers.measure.results_tables`` renders from them."""

import dataclasses
import glob
import json
import os

import pytest

from fsattn_diffusers.measure import e2e_tables, provenance, result_files, results_tables
from fsattn_diffusers.recipe import Recipe

ROOT = result_files.ROOT
JSONS = sorted(glob.glob(os.path.join(ROOT, result_files.RESULTS, "**", "*.json"), recursive=True))
#: Files whose rows are no fsattn recipe's (softmax interventions on stock attention): nothing to record.
NO_RECIPE_ROWS = {"sensitivity_attention_wan22_h200.json", "sensitivity_tiny_cpu.json"}
RECIPE_FIELDS = {f.name for f in dataclasses.fields(Recipe)}
#: Fields every recipe had since the first result file; a recipe resolved from older code carries at least these.
CORE_FIELDS = {"name", "qk_format", "p_format", "v_format", "exponential", "proxy", "frozen_max", "rollback",
               "rowsum_gemm", "hadamard", "numerics"}
COMPUTED = {"sm90", "mi355x", "fa3"}
#: Fields added after the committed files were written: a file from before may lack them (``o_promotion_tiles``: files
#: from before it ran kernels that promoted O every tile, or, before the fp32 O sum, never; the field cannot say which).
ADDED_LATER = {"o_promotion_tiles"}


def _recipes(row):
    """The recipe dicts of a row with their computed numerics (a step schedule records one per recipe)."""
    recipe, numerics = row["recipe"], row["computed_numerics"]
    if recipe is not None and "name" not in recipe:
        return [(recipe[name], numerics[name]) for name in recipe]
    return [(recipe, numerics)]


def test_results_folder_has_json_files():
    assert len(JSONS) >= 10


@pytest.mark.parametrize("path", JSONS, ids=os.path.basename)
def test_every_row_carries_a_full_recipe_and_the_numerics_computed(path):
    with open(path) as fh:
        doc = json.load(fh)
    rows = list(provenance.result_rows(doc))
    if os.path.basename(path) in NO_RECIPE_ROWS:
        assert not rows
        return
    assert rows, f"{path}: no rows found"
    for where, row in rows:
        assert "recipe" in row and "computed_numerics" in row, f"{path} {where}: no recipe / computed_numerics"
        required = CORE_FIELDS if "recipe_source" in row else RECIPE_FIELDS - ADDED_LATER
        for recipe, numerics in _recipes(row):
            if recipe is None:
                assert isinstance(numerics, str) and numerics, f"{path} {where}: a row without a recipe names what ran"
                continue
            missing = required - set(recipe)
            assert not missing, f"{path} {where}: recipe {recipe.get('name')!r} lacks {sorted(missing)}"
            assert numerics in COMPUTED, f"{path} {where}: computed_numerics {numerics!r}"


@pytest.mark.parametrize("path", JSONS, ids=os.path.basename)
def test_every_result_file_names_device_date_commit_and_command(path):
    with open(path) as fh:
        meta = result_files.meta(json.load(fh))
    assert meta.get("date"), f"{path}: no date"
    assert meta.get("commit"), f"{path}: no commit"
    assert meta.get("device") or meta.get("devices"), f"{path}: no device"
    assert meta.get("command") or meta.get("argv"), f"{path}: no command"


def test_readme_tables_are_rendered_from_the_committed_json():
    with open(os.path.join(ROOT, "README.md")) as fh:
        found = results_tables.readme_tables(fh.read())
    assert set(found) == set(results_tables.TABLES), "README.md lacks the markers of some results tables"
    for name in results_tables.TABLES:
        assert found[name] == results_tables.render(name), (
            f"README.md's {name!r} table differs from the committed JSON: run "
            "`python -m fsattn_diffusers.measure.results_tables --write`")


def test_recipe_record_is_every_field_and_what_the_backend_computes():
    rec = provenance.recipe_record("mxfp8", "triton")
    assert set(rec["recipe"]) == RECIPE_FIELDS and rec["recipe"]["numerics"] == "mi355x"
    assert rec["computed_numerics"] == "sm90"  # the Hopper kernels compute the sm90 variant whatever the recipe says
    assert provenance.recipe_record("mxfp8", "emulator")["computed_numerics"] == "mi355x"
    assert provenance.recipe_record("mxfp8+numerics=sm90", "emulator")["computed_numerics"] == "sm90"
    assert provenance.policy_record("bf16") == provenance.baseline_record()
    hybrid = provenance.policy_record("hybrid")
    assert set(hybrid["recipe"]) == {"mxfp6", "mxfp4"}


def test_numerics_md_states_what_is_computed_not_what_was_measured():
    """NUMERICS.md is the contract: no commit hashes, dates, timings or links to result files that are gone (the
    measurements live in docs/design.md)."""
    import re

    text = open(os.path.join(ROOT, "NUMERICS.md")).read()
    assert not re.findall(r"\bcommit [0-9a-f]{7}|\b[0-9a-f]{7,40}\b(?=[),])|20\d\d-\d\d-\d\d|\d ms\b", text)
    for link in re.findall(r"benchmarks/results/([\w./{},-]+)", text):
        for name in re.sub(r"\{([^}]*)\}", lambda m: m.group(1).split(",")[0], link).split():
            assert os.path.exists(os.path.join(ROOT, "benchmarks", "results", name.rstrip(".;"))), link


def test_the_pick_line_names_a_recipe_for_both_only_when_it_meets_sageattention_at_every_shape():
    from fsattn_diffusers.measure.results_tables import _pick_line

    def shape(fast_x, fast_err, acc_x, acc_err):
        return {"sageattention": {"rel_err": 0.04}, "mxfp8": {"speedup_vs_sage": fast_x, "rel_err": fast_err},
                "int8-bf16": {"speedup_vs_sage": acc_x, "rel_err": acc_err}}

    slow = {(1,): shape(1.1, 0.05, 0.95, 0.02), (2,): shape(1.2, 0.05, 1.01, 0.02)}
    fast = {(1,): shape(1.1, 0.05, 1.02, 0.02), (2,): shape(1.2, 0.05, 1.01, 0.02)}
    fast_less_accurate = {(1,): shape(1.1, 0.05, 1.02, 0.041), (2,): shape(1.2, 0.05, 1.01, 0.02)}
    within = {"gaussian": 1.03, "geomean": 0.94, "worst": 1.15}
    outside = {"gaussian": 1.12, "geomean": 0.94, "worst": 1.15}  # gaussian above its 1.10x
    lines = {name: " ".join(_pick_line(by_shape, structured)) for name, by_shape, structured in (
        ("none", slow, None), ("some", fast, None), ("bench error above", fast_less_accurate, None),
        ("structured within", fast_less_accurate, {"int8-bf16": within}),
        ("structured outside", fast, {"int8-bf16": outside}))}
    for name, line in lines.items():
        print(name, line, sep=": ")
    assert "for speed **mxfp8**" in lines["none"] and "for quality **int8-bf16**" in lines["none"]
    picked = "**int8-bf16** (1.010x-1.020x SageAttention 2, error 2.00"
    for name in ("none", "bench error above", "structured outside"):
        assert lines[name].endswith("none of these recipes: SageAttention 2 itself (the `sage` policy)."), name
    assert lines["some"].endswith(picked + "%).")
    assert lines["structured within"].endswith("**int8-bf16** (1.010x-1.020x SageAttention 2, error 2.00-4.10%; "
                                               "structured inputs 0.940x its error in the geometric mean, 1.03x on "
                                               "gaussian).")


def test_the_pick_line_says_each_pick_s_speed_on_the_bench_s_other_inputs_without_picking_on_them():
    from fsattn_diffusers.measure.results_tables import _pick_line

    def shape(fast_x, acc_x):
        return {"sageattention": {"rel_err": 0.04}, "mxfp8": {"speedup_vs_sage": fast_x, "rel_err": 0.05},
                "int8-bf16": {"speedup_vs_sage": acc_x, "rel_err": 0.02}}

    gaussian = {(1,): shape(1.1, 1.02), (2,): shape(1.2, 1.01)}
    offset = {"offset_uniform_q": {(1,): shape(0.5, 0.9), (2,): shape(0.6, 0.8)}}
    line = " ".join(_pick_line(gaussian, None, offset))
    print(line)
    assert "for speed **mxfp8** (1.100x-1.200x SageAttention 2, error 5.00%; on `offset_uniform_q` 0.500x-0.600x " \
           "SageAttention 2)" in line
    assert line.endswith("**int8-bf16** (1.010x-1.020x SageAttention 2, error 2.00%; on `offset_uniform_q` "
                         "0.800x-0.900x SageAttention 2).")


def test_commit_outside_git_comes_from_the_environment(monkeypatch):
    """A copy without .git (the device's) records the commit its caller sent in FSATTN_COMMIT, else None."""
    import subprocess

    def no_git(*args, **kwargs):
        return subprocess.CompletedProcess(args, 128, "", "fatal: not a git repository")

    monkeypatch.setattr(provenance.subprocess, "run", no_git)
    monkeypatch.delenv(provenance.COMMIT_ENV, raising=False)
    assert provenance.commit() is None
    monkeypatch.setenv(provenance.COMMIT_ENV, "abc1234")
    assert provenance.commit() == "abc1234"
    assert provenance.header()["commit"] == "abc1234"


def test_the_end_to_end_line_ranks_our_policies_against_sage_only():
    summary = {"bf16": {"speedup_vs": {"sage": 0.8}}, "sage": {"speedup_vs": {"sage": 1.0}},
               "fa3-fp8": {"speedup_vs": {"sage": 1.06}}, "int8-fp8": {"speedup_vs": {"sage": 0.9}},
               "mxfp8": {"speedup_vs": {"sage": 1.08}}, "int8-bf16": {"speedup_vs": {}}}
    line = e2e_tables.e2e_line(summary)[-1]
    print(line)
    assert line.endswith("**mxfp8** 1.080x, **int8-fp8** 0.900x.")
    assert "fa3-fp8" not in line and "bf16" not in line
    assert e2e_tables.e2e_line({"sage": {"speedup_vs": {"sage": 1.0}}}) == []
    with_run = e2e_tables.e2e_line(summary, [("hybrid-int8-mxfp8", 10, 1.0622)])[-1]
    print(with_run)
    assert with_run.endswith("**int8-fp8** 0.900x; **hybrid-int8-mxfp8** 1.062x over a real 10-step run "
                             "(the hybrid table below).")


def test_the_scheduled_runs_against_sage_are_those_of_the_committed_files():
    runs, sources = e2e_tables.scheduled_against_sage(result_files.ROOT)
    print(runs, sources)
    for policy, steps, x in runs:
        name = next(n for _, n, p in e2e_tables.HYBRID_RUNS if p == policy)
        doc = result_files.load(name)
        assert steps == len(doc["schedules"][policy]["plan"])
        assert abs(x - doc["summary"]["sage"]["step_s"] / doc["summary"][policy]["step_s"]) < 1e-9
    assert [p for p, _, _ in runs] == [p for _, n, p in e2e_tables.HYBRID_RUNS
                                         if "sage" in result_files.load(n)["summary"]]


def _bench_root(tmp_path, rows):
    """A repository root whose ``benchmarks/results/`` holds a bench file of ``rows`` (``fsattn bench --json``) and
    the smallest files of the other sources :func:`results_tables.speed` reads (:data:`~results_tables.TIER_ROWS`,
    :data:`~e2e_tables.E2E_HOPPER_FILE`)."""
    folder = tmp_path / result_files.RESULTS
    folder.mkdir(parents=True)
    meta = {"device": "NVIDIA H100 80GB HBM3", "date": "2026-12-07T00:00:00+00:00", "commit": "abc1234"}
    docs = {results_tables.SPEED_FILE: {"environment": meta, "results": rows},
            e2e_tables.E2E_HOPPER_FILE: {"meta": meta, "summary": {"sage": {"speedup_vs": {"sage": 1.0}}}}}
    columns = {rec: {"err": 0.03} for rec, _ in results_tables.TIER_ROWS}
    for _, name in results_tables.TIER_ROWS:
        docs[name] = {"meta": meta, "result": {"cases": [{"family": "gaussian",
                                                          "columns": {**columns, "sage": {"err": 0.04}}}]}}
    for name, doc in docs.items():
        (folder / name).write_text(json.dumps(doc))
    return str(tmp_path)


#: One shape's bench rows on gaussian inputs (baselines without ``inputs``, as files from before ``--inputs`` wrote
#: them) and on ``offset_uniform_q``, the same methods with other times and errors.
PAPER = [1, 24, 32768, 32768, 128]
GAUSSIAN_ROWS = [{"shape": PAPER, "method": "sdpa-cudnn", "ms": 15.0, "rel_err": 0.002},
                 {"shape": PAPER, "method": "fa3-bf16", "ms": 14.0, "rel_err": 0.0023},
                 {"shape": PAPER, "method": "sageattention", "ms": 12.0, "rel_err": 0.0388},
                 {"shape": PAPER, "inputs": "gaussian", "method": "mxfp8", "ms": 10.0, "rel_err": 0.0568,
                  "speedup_vs_sage": 1.2}]
OFFSET_ROWS = [{"shape": PAPER, "inputs": "offset_uniform_q", "method": "sdpa-cudnn", "ms": 15.5, "rel_err": 0.003},
               {"shape": PAPER, "inputs": "offset_uniform_q", "method": "sageattention", "ms": 12.5, "rel_err": 0.0912},
               {"shape": PAPER, "inputs": "offset_uniform_q", "method": "mxfp8", "ms": 20.0, "rel_err": 0.0734,
                "speedup_vs_sage": 0.625}]


def test_the_speed_tables_keep_each_input_family_of_a_shape_apart(tmp_path):
    """A bench run with ``--inputs gaussian,offset_uniform_q``: the speed table and its grouping take the gaussian rows
    (rows without ``inputs`` included), speed_inputs the offset rows, each with SageAttention 2 on the same inputs."""
    root = _bench_root(tmp_path, GAUSSIAN_ROWS + OFFSET_ROWS)
    doc = result_files.load(results_tables.SPEED_FILE, root)
    gaussian = results_tables._rows_by_shape(doc, "gaussian")
    offset = results_tables._rows_by_shape(doc, "offset_uniform_q")
    print({k: {m: (r["ms"], r["rel_err"]) for m, r in v.items()} for k, v in gaussian.items()})
    assert list(gaussian) == list(offset) == [(1, 24, 32768, 128)]
    assert {m: r["ms"] for m, r in gaussian[1, 24, 32768, 128].items()} == {
        "sdpa-cudnn": 15.0, "fa3-bf16": 14.0, "sageattention": 12.0, "mxfp8": 10.0}
    assert {m: r["ms"] for m, r in offset[1, 24, 32768, 128].items()} == {
        "sdpa-cudnn": 15.5, "sageattention": 12.5, "mxfp8": 20.0}

    speed = results_tables.speed(root)
    print("\n".join(speed))
    assert speed[2].startswith("| paper (1, 24, 32768, 128) | **mxfp8** | 10.00 | 15.00 | 14.00 | - | 12.00 | ")
    assert speed[2].endswith(" | 5.68 |") and len(speed) > 3 and not speed[3].startswith("|")
    picked = "(1.200x SageAttention 2, error 5.68%; on `offset_uniform_q` 0.625x SageAttention 2)"
    assert "sageattention 3.88" in speed[3] and picked in " ".join(speed)

    inputs = results_tables.speed_structured_inputs(root)
    print("\n".join(inputs))
    assert inputs[2:-2] == ["| paper (1, 24, 32768, 128) | offset_uniform_q (+3 on every channel of Q) | **mxfp8** | "
                            "20.00 | 12.50 | 0.625x | 7.34 | 9.12 |"]
    assert inputs[-1] == ("Source: [bench_h100.json](benchmarks/results/bench_h100.json) (NVIDIA H100 80GB HBM3, "
                          "2026-12-07, abc1234).")


def test_the_structured_speed_table_says_when_the_bench_ran_gaussian_inputs_only(tmp_path):
    root = _bench_root(tmp_path, GAUSSIAN_ROWS)
    lines = results_tables.speed_structured_inputs(root)
    print("\n".join(lines))
    assert lines[0] == "The speed file (bench_h100.json) has no runs on structured inputs."
    assert lines[1:] == ["", "Source: [bench_h100.json](benchmarks/results/bench_h100.json) (NVIDIA H100 80GB HBM3, "
                             "2026-12-07, abc1234)."]
    assert results_tables._rows_by_shape(result_files.load(results_tables.SPEED_FILE, root), "offset_uniform_q") == {}

"""The committed result files: every row records the recipe and the numerics computed, and README.md's results
tables are what ``fsattn_diffusers.measure.results_tables`` renders from them."""

import dataclasses
import glob
import json
import os

import pytest

from fsattn_diffusers.measure import provenance, results_tables
from fsattn_diffusers.recipe import Recipe

ROOT = results_tables.ROOT
JSONS = sorted(glob.glob(os.path.join(ROOT, results_tables.RESULTS, "**", "*.json"), recursive=True))
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
        meta = results_tables._meta(json.load(fh))
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
    line = results_tables._e2e_line(summary)[-1]
    print(line)
    assert line.endswith("**mxfp8** 1.080x, **int8-fp8** 0.900x.")
    assert "fa3-fp8" not in line and "bf16" not in line
    assert results_tables._e2e_line({"sage": {"speedup_vs": {"sage": 1.0}}}) == []

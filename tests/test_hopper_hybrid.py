"""The Hopper hybrid policy (int8-bf16 on the end steps, mxfp8 between) and the one-time notice that MXFP6/MXFP4
steps run no faster than mxfp8 on a Hopper GPU (faked here through the capability query: CPU only)."""

import sys
import types
import warnings

import pytest
import torch

from fsattn_diffusers import apply, notices, remove
from fsattn_diffusers.cli import build_parser, main
from fsattn_diffusers.integration import install
from fsattn_diffusers.integration.policy import (HOPPER_HYBRID, HYBRID_N_ENDS, HYBRID_REFERENCE_STEPS, EndsPolicy,
                                                 get_policy, hybrid_policy, policy_names)
from fsattn_diffusers.integration.tiny import tiny_wan_transformer
from fsattn_diffusers.recipe import PRESETS

ACCURATE, FAST = "int8-bf16", "mxfp8"
NOTICE = "no faster than mxfp8"


def _plan(n_end: int, n_middle: int) -> list:
    return [ACCURATE] * n_end + [FAST] * n_middle + [ACCURATE] * n_end


#: Steps -> (end steps on each side, middle steps): round(3 * steps / 20), at least 1, at most half the run.
PLANS = {20: (3, 14), 2: (1, 0), 4: (1, 2), 7: (1, 5), 10: (2, 6), 50: (8, 34)}


@pytest.mark.parametrize("steps", sorted(PLANS))
def test_the_hopper_hybrid_runs_the_accurate_tier_on_the_end_steps(steps):
    policy = get_policy(HOPPER_HYBRID)
    plan = policy.plan_names(steps)
    print(steps, plan)
    assert plan == _plan(*PLANS[steps])
    assert [e is PRESETS[n] for e, n in zip(policy.schedule(steps), plan)] == [True] * steps
    paper = hybrid_policy().plan_names(steps)  # the same end steps as the paper's hybrid at every length
    assert [n == ACCURATE for n in plan] == [n == "mxfp6" for n in paper]


def test_the_hopper_hybrid_over_one_step_and_an_unknown_step_count():
    policy = get_policy(HOPPER_HYBRID)
    assert policy.plan_names(1) == [ACCURATE]
    # no scheduler seen: the 20-step reference plan
    assert [policy.entry_at(i, None).name for i in range(20)] == _plan(3, 14)


def test_the_hopper_hybrid_is_an_ends_policy_on_the_papers_step_counts():
    ours, paper = get_policy(HOPPER_HYBRID), hybrid_policy()
    assert isinstance(ours, EndsPolicy) and ours.name == HOPPER_HYBRID
    assert ours.n_ends == paper.n_ends == HYBRID_N_ENDS
    assert ours.reference_steps == paper.reference_steps == HYBRID_REFERENCE_STEPS
    assert get_policy(HOPPER_HYBRID.upper()).name == HOPPER_HYBRID
    names = policy_names()
    assert names.index(HOPPER_HYBRID) == names.index("hybrid") + 1 and ACCURATE in names
    from fsattn_diffusers.measure import e2e

    assert (e2e.PAPER_STEPS, e2e.HYBRID_ENDS) == (HYBRID_REFERENCE_STEPS, HYBRID_N_ENDS)


def test_which_steps_hopper_runs_no_faster_than_mxfp8(monkeypatch):
    _fake_device(monkeypatch, (9, 0))
    cases = {"hybrid": ["mxfp6", "mxfp4"], HOPPER_HYBRID: [], "mxfp8": [], "mxfp4": ["mxfp4"], "bf16": [],
             ACCURATE: [], "mxfp8:3,mxfp6:2": ["mxfp6"], "mxfp8:30,mxfp4:1,mxfp8:30": ["mxfp4"]}
    for spec, want in cases.items():
        got, speed = install.slow_steps(get_policy(spec))
        print(spec, got, speed)
        assert got == want and (speed is None) == (not want)
    _fake_device(monkeypatch, (10, 0))  # no Hopper kernels there: nothing runs widened
    assert install.slow_steps(get_policy("hybrid")) == ([], None)


def _fake_device(monkeypatch, capability):
    """``capability`` (major, minor) of a faked CUDA device, or None for a machine without CUDA; triton, which the
    Hopper kernels need, is faked where it is not installed."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: capability is not None)
    monkeypatch.setitem(sys.modules, "triton", sys.modules.get("triton") or types.ModuleType("triton"))

    def query(device=None):
        if capability is None:
            raise AssertionError("the capability was queried without CUDA")
        return capability

    monkeypatch.setattr(torch.cuda, "get_device_capability", query)


@pytest.mark.parametrize("capability,expected", [((9, 0), "triton"), ((8, 0), "emulator"), ((8, 9), "emulator"),
                                                 ((10, 0), "emulator"), ((12, 0), "emulator"), (None, None)])
def test_hopper_is_read_from_the_capability_query(monkeypatch, capability, expected):
    from fsattn_diffusers.backends import fast_path

    _fake_device(monkeypatch, capability)
    device = install.this_device()
    got = None if device is None else fast_path(PRESETS["mxfp8"], device)[0]
    assert got == expected


@pytest.fixture
def notice_cleared():
    notices._WARNED.discard(install.SLOW_STEPS_NOTICE)
    yield
    notices._WARNED.discard(install.SLOW_STEPS_NOTICE)


def _notices(calls) -> list:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        calls()
    return [str(w.message) for w in caught if issubclass(w.category, notices.FSAttnWarning) and NOTICE in
            str(w.message)]


@pytest.mark.parametrize("capability,spec,backend,expected", [
    ((9, 0), "hybrid", "auto", 1), ((9, 0), "mxfp6", "auto", 1), ((9, 0), "mxfp4", "triton", 1),
    ((9, 0), HOPPER_HYBRID, "auto", 0), ((9, 0), FAST, "auto", 0), ((9, 0), ACCURATE, "auto", 0),
    ((9, 0), "hybrid", "emulator", 0), ((8, 0), "hybrid", "auto", 0), ((10, 0), "hybrid", "auto", 0),
    (None, "hybrid", "auto", 0)])
def test_apply_says_once_on_hopper_that_mx_blocks_are_slow_and_names_the_hopper_hybrid(
        monkeypatch, notice_cleared, capability, spec, backend, expected):
    model = tiny_wan_transformer()
    _fake_device(monkeypatch, capability)

    def calls():
        for _ in range(3):
            apply(model, policy=spec, backend=backend)
            remove(model)

    lines = _notices(calls)
    print(lines)
    assert len(lines) == expected
    if expected:
        line = lines[0]
        assert "\n" not in line and f"policy {get_policy(spec).name}:" in line and "sm_90" in line
        assert f"'{HOPPER_HYBRID}'" in line and "one scale per 32 keys of P" in line


def test_the_notice_is_once_per_process_across_policies(monkeypatch, notice_cleared):
    _fake_device(monkeypatch, (9, 0))
    lines = _notices(lambda: [install.warn_slow_steps(get_policy(s)) for s in ("hybrid", "mxfp4", "mxfp6")])
    assert len(lines) == 1 and lines[0].startswith("fsattn: policy hybrid: mxfp6 and mxfp4 run no faster than mxfp8")


def test_the_xdit_install_gives_the_same_notice(monkeypatch, notice_cleared):
    from test_parallel_xdit import fake_xdit

    from fsattn_diffusers.parallel import install as xdit_install

    _fake_device(monkeypatch, (9, 0))
    handles = []
    lines = _notices(lambda: handles.extend(xdit_install(s, **fake_xdit()) for s in (HOPPER_HYBRID, "hybrid")))
    for handle in handles:
        handle.uninstall()
    assert len(lines) == 1 and "policy hybrid:" in lines[0]


def test_the_clis_accept_the_hopper_hybrid(capsys):
    from fsattn_diffusers.commands import e2e as e2e_cmd
    from fsattn_diffusers.commands import generate
    from fsattn_diffusers.quality.sweep import parse_policies

    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.choices and "generate" in a.choices).choices
    for command in ("generate", "e2e", "sweep"):
        helps = [a.help for a in subparsers[command]._actions if "--polic" in "".join(a.option_strings)]
        print(command, helps)
        text = " ".join(helps)
        assert HOPPER_HYBRID in text and "hybrid" in text.replace(HOPPER_HYBRID, "")  # beside the paper's
    assert HOPPER_HYBRID in e2e_cmd.SCHEDULES
    assert generate._validate(parser.parse_args(["generate", "--policy", HOPPER_HYBRID])).name == HOPPER_HYBRID
    assert [p.label for p in parse_policies([f"mxfp8,{HOPPER_HYBRID}"])] == ["bf16", FAST, HOPPER_HYBRID]
    assert main(["generate", "--policy", "hybrid-int4"]) == 2  # one line listing the Hopper hybrid among the accepted
    err = capsys.readouterr().err
    print(err)
    assert err.count("\n") == 1 and err.startswith("fsattn generate: error:") and HOPPER_HYBRID in err


@pytest.mark.parametrize("steps", sorted(PLANS))
def test_the_int8_hopper_hybrid_runs_the_int8_speed_tier_between_the_end_steps(steps):
    """``hybrid-int8``: the accurate tier on the Hopper hybrid's end steps, the INT8 speed tier (``int8-fp8``) between;
    every tier of both Hopper hybrids is a policy ``fsattn e2e`` times on its own."""
    from fsattn_diffusers.commands import e2e as e2e_cmd
    from fsattn_diffusers.integration.policy import HOPPER_HYBRID_INT8
    from fsattn_diffusers.recipe import INT8_FP8

    plan = get_policy(HOPPER_HYBRID_INT8).plan_names(steps)
    print(steps, plan)
    assert plan == [INT8_FP8 if n == FAST else n for n in get_policy(HOPPER_HYBRID).plan_names(steps)]
    assert HOPPER_HYBRID_INT8 in e2e_cmd.SCHEDULES
    for name in (HOPPER_HYBRID, HOPPER_HYBRID_INT8):
        assert set(get_policy(name).plan_names(20)) <= set(e2e_cmd.POLICIES)

"""The Hopper hybrid policy (int8-bf16 on the end steps, mxfp8 between) and the one-time notice that MXFP6/MXFP4
steps run no faster than mxfp8 on a Hopper GPU (faked here: CPU only)."""

import warnings

import pytest

from fsattn_diffusers import notices
from fsattn_diffusers.integration import install
from fsattn_diffusers.integration.policy import (HOPPER_HYBRID, get_policy, hybrid_policy, policy_names,
                                                 slow_formats_on_sm90)

NOTICE_KEY = "mx block formats on sm90"


def test_the_hopper_hybrid_runs_the_accurate_tier_on_the_papers_end_steps():
    plan = get_policy(HOPPER_HYBRID).plan_names(20)
    print(plan)
    assert plan == ["int8-bf16"] * 3 + ["mxfp8"] * 14 + ["int8-bf16"] * 3
    for steps in (1, 4, 7, 50):  # the same end steps as the paper's hybrid at every length
        ours = get_policy(HOPPER_HYBRID).plan_names(steps)
        paper = hybrid_policy().plan_names(steps)
        print(steps, ours, paper)
        assert [n == "int8-bf16" for n in ours] == [n == "mxfp6" for n in paper]
    assert HOPPER_HYBRID in policy_names() and "int8-bf16" in policy_names()
    assert get_policy(HOPPER_HYBRID.upper()).name == HOPPER_HYBRID


def test_which_steps_hopper_runs_no_faster_than_mxfp8():
    cases = {"hybrid": ["mxfp6", "mxfp4"], HOPPER_HYBRID: [], "mxfp8": [], "mxfp4": ["mxfp4"], "bf16": [],
             "mxfp8:3,mxfp6:2": ["mxfp6"]}
    for spec, want in cases.items():
        got = slow_formats_on_sm90(get_policy(spec))
        print(spec, got)
        assert got == want


@pytest.mark.parametrize("on_hopper,spec,expected", [(True, "hybrid", 1), (True, "mxfp6", 1), (True, HOPPER_HYBRID, 0),
                                                     (True, "mxfp8", 0), (False, "hybrid", 0)])
def test_the_notice_comes_once_on_hopper_and_names_the_hopper_hybrid(monkeypatch, on_hopper, spec, expected):
    monkeypatch.setattr(install, "on_sm90", lambda: on_hopper)
    notices._WARNED.discard(NOTICE_KEY)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            install.warn_slow_formats_on_sm90(get_policy(spec))
    lines = [str(w.message) for w in caught if issubclass(w.category, notices.FSAttnWarning)]
    print(lines)
    notices._WARNED.discard(NOTICE_KEY)
    assert len(lines) == expected
    if expected:
        assert HOPPER_HYBRID in lines[0] and "no faster than mxfp8" in lines[0] and "\n" not in lines[0]

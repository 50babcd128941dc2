"""Policies: parsing, the paper's hybrid schedule and its scaling to other step counts."""

import pytest

from fsattn_diffusers.integration.policy import (EndsPolicy, FixedPolicy, SchedulePolicy, describe, get_policy,
                                                 hybrid_policy)
from fsattn_diffusers.recipe import PRESETS


def test_fixed_policies():
    assert get_policy("bf16").schedule(3) == [None, None, None]  # None = stock attention
    assert get_policy("stock").is_fixed
    for name in ("mxfp8", "mxfp6", "mxfp4", "exact"):
        policy = get_policy(name)
        assert isinstance(policy, FixedPolicy) and policy.schedule(2) == [PRESETS[name]] * 2
    assert get_policy(PRESETS["mxfp8"]).entry_at(7, 20) is PRESETS["mxfp8"]


def test_hybrid_is_paper_schedule_at_20_steps():
    plan = hybrid_policy().plan_names(20)
    print(plan)
    assert plan == ["mxfp6"] * 3 + ["mxfp4"] * 14 + ["mxfp6"] * 3
    assert get_policy("hybrid").plan_names(20) == plan


@pytest.mark.parametrize("steps,ends", [(1, 1), (2, 1), (4, 1), (10, 2), (20, 3), (30, 5), (40, 6), (50, 8)])
def test_hybrid_scales_with_step_count(steps, ends):
    plan = hybrid_policy().plan_names(steps)
    expected = ["mxfp6" if (i < ends or i >= steps - ends) else "mxfp4" for i in range(steps)]
    print(steps, plan)
    assert plan == expected


def test_schedule_string_matches_hybrid_and_scales():
    policy = get_policy("mxfp6:3,mxfp4:14,mxfp6:3")
    assert isinstance(policy, SchedulePolicy) and policy.reference_steps == 20
    for steps in (3, 10, 20, 30, 50):
        print(steps, policy.counts(steps))
        assert policy.plan_names(steps) == hybrid_policy().plan_names(steps)
    assert get_policy("bf16:2, mxfp4:6").plan_names(8) == ["bf16"] * 2 + ["mxfp4"] * 6
    assert describe(get_policy("bf16:1,mxfp8:2,bf16:1"), 8) == [(0, 1, "bf16"), (2, 5, "mxfp8"), (6, 7, "bf16")]


def test_ends_mapping_and_object():
    policy = get_policy({"ends": "bf16", "middle": "mxfp4", "n_ends": 2})
    assert isinstance(policy, EndsPolicy)
    assert policy.plan_names(8) == ["bf16"] * 2 + ["mxfp4"] * 4 + ["bf16"] * 2
    assert policy.plan_names(3) == ["bf16"] * 3  # ends never overlap beyond the run
    scaled = get_policy({"ends": "mxfp8", "middle": "mxfp6", "n_ends": 1, "reference_steps": 10})
    assert scaled.plan_names(20) == ["mxfp8"] * 2 + ["mxfp6"] * 16 + ["mxfp8"] * 2


def test_unknown_step_count_uses_reference():
    policy = hybrid_policy()
    assert policy.entry_at(0, None) is PRESETS["mxfp6"]
    assert policy.entry_at(5, None) is PRESETS["mxfp4"]
    assert policy.entry_at(19, None) is PRESETS["mxfp6"]
    assert policy.entry_at(99, 20) is PRESETS["mxfp6"]  # past the end: the last step's entry


@pytest.mark.parametrize("spec", ["fp3", "mxfp6:0,mxfp4:3", "mxfp6:3,,mxfp4:3", "mxfp6:x", "mxfp9:3",
                                  ":3", "mxfp6:-1", {"ends": "mxfp6"}, {"ends": "mxfp6", "middle": "mxfp4",
                                                                      "n_ends": 1, "bogus": 2}, 3.5])
def test_bad_specs_raise_one_line(spec):
    with pytest.raises(ValueError) as info:
        get_policy(spec)
    message = str(info.value)
    print(message)
    assert "\n" not in message and "accepted" in message

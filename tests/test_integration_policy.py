"""Policies: parsing, the paper's hybrid schedule and its scaling to other step counts."""

import pytest

from fsattn_diffusers.integration.policy import (EndsPolicy, FixedPolicy, SchedulePolicy, describe, get_policy,
                                                 hybrid_policy)
from fsattn_diffusers.integration.policy import NAMED_POLICIES, StepRule, policy_names
from fsattn_diffusers.notices import FSAttnWarning
from fsattn_diffusers.recipe import PRESETS, get_recipe


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
    with pytest.warns(FSAttnWarning, match="middle=mxfp4 never runs"):
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


@pytest.mark.parametrize("form", ["mxfp8+proxy=u32", "MXFP8 + smooth_q=false", "int8-bf16+exponential=exact",
                                  "bf16-emulated+proxy=u32"])
def test_a_preset_with_changes_is_a_fixed_policy_as_attention_takes_it(form):
    policy = get_policy(form)
    assert isinstance(policy, FixedPolicy) and policy.schedule(2) == [get_recipe(form.lower())] * 2


def test_schedule_entries_take_presets_with_changes():
    policy = get_policy("mxfp8+smooth_q=false:3,mxfp4:14,mxfp8+smooth_q=false:3")
    ends = policy.schedule(20)[0]
    assert ends == get_recipe("mxfp8+smooth_q=false") and ends.smooth_q is False and PRESETS["mxfp8"].smooth_q
    assert policy.plan_names(20) == ["mxfp8+smooth_q=false"] * 3 + ["mxfp4"] * 14 + ["mxfp8+smooth_q=false"] * 3
    mapping = get_policy({"ends": "mxfp6+proxy=u32", "middle": "mxfp4", "n_ends": 1})
    assert mapping.schedule(3)[0].proxy == "u32"


@pytest.mark.parametrize("spec,says", [("mxfp8+bogus=1", "unknown Recipe field 'bogus'"),
                                       ("mxfp8+proxy=u32:3,mxfp4+bogus:2", "unknown Recipe field 'bogus'"),
                                       ("bf16+proxy=u32", "bf16 is stock attention and takes no changes"),
                                       ("hybrid+proxy=u32", "unknown policy"),
                                       ("mxfp9+proxy=u32", "unknown policy")])
def test_bad_recipe_forms_say_what_is_wrong(spec, says):
    with pytest.raises(ValueError, match=says) as info:
        get_policy(spec)
    assert "\n" not in str(info.value) and "accepted" in str(info.value)


def test_the_unknown_policy_error_lists_every_form():
    with pytest.raises(ValueError) as info:
        get_policy("fp3")
    message = str(info.value)
    for form in ("mxfp8+proxy=u32", "mxfp6:3,mxfp4:14,mxfp6:3", "mxfp8+smooth_q=false:3", "ends, middle, n_ends",
                 "hybrid-int8-mxfp8", "fa3-fp8", "sage"):
        assert form in message


def test_the_named_policies_are_one_table():
    assert policy_names() == [n for n in NAMED_POLICIES if n != "stock"]
    for name, row in NAMED_POLICIES.items():
        if row.rule in (StepRule.EVERY_STEP, StepRule.ENDS):  # the others need their packages
            policy = get_policy(name)
            assert policy.name == ("bf16" if name == "stock" else name)
            assert {n for n in policy.plan_names(20)} == {e for e in row.entries}
    assert all(name in NAMED_POLICIES for name in PRESETS)

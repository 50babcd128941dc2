"""Policy rules a user relies on: schedule apportionment, refused / warned specifications, re-apply."""

import random
import warnings

import pytest
import torch

import fsattn_diffusers
from fsattn_diffusers.integration.policy import get_policy, hybrid_policy
from tolerances import FP64_SLACK

#: fsattn warnings are RuntimeWarnings (``fsattn_diffusers.notices.FSAttnWarning``).
FSAttnWarning = RuntimeWarning
NAMES = ("bf16", "mxfp8", "mxfp6", "mxfp4")


def _shares(reference, n):
    return [c * n / sum(reference) for c in reference]


def _random_schedules(count, seed=0):
    """``(names, steps)`` per schedule; about half of them symmetric."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        k = rng.randint(1, 7)
        ref = [rng.randint(1, 20) for _ in range(k)]
        names = [rng.choice(NAMES) for _ in range(k)]
        if rng.random() < 0.5:  # a symmetric one
            ref = ref[: (k + 1) // 2] + ref[: k // 2][::-1]
            names = names[: (k + 1) // 2] + names[: k // 2][::-1]
        out.append((names, ref))
    return out


def test_brief_example_stays_symmetric_and_within_one_step():
    policy = get_policy("bf16:1,mxfp6:2,mxfp4:14,mxfp6:2,bf16:1")
    counts = policy.counts(15)
    shares = _shares([1, 2, 14, 2, 1], 15)
    print(counts, [round(s, 2) for s in shares])
    assert sum(counts) == 15 and counts == counts[::-1]
    assert all(abs(c - s) <= 1 for c, s in zip(counts, shares))


def test_apportion_properties_over_many_schedules():
    worst = 0.0
    checked = 0
    for names, ref in _random_schedules(400):
        k = len(ref)
        palindrome = k > 1 and list(zip(names, ref)) == list(zip(names, ref))[::-1]
        policy = get_policy(",".join(f"{a}:{c}" for a, c in zip(names, ref)))
        for n in range(1, 61):
            counts = policy.counts(n)
            assert sum(counts) == n and all(c >= 0 for c in counts), (ref, n, counts)
            if n >= k:
                assert min(counts) >= 1, (ref, n, counts)
            if palindrome and (k % 2 or n % 2 == 0):
                assert counts == counts[::-1], (ref, n, counts)
            shares = _shares(ref, n)
            if min(shares) >= 1:
                devs = [abs(c - s) for c, s in zip(counts, shares)]
                worst = max(worst, max(devs))
                assert max(devs) <= 1 + FP64_SLACK, (ref, n, counts, shares)
                if not palindrome:
                    assert max(devs) < 1, (ref, n, counts, shares)
                checked += 1
    print(f"{checked} (schedule, steps) pairs with every share >= 1 step; worst deviation {worst:.3f} steps")
    assert checked > 1000


@pytest.mark.parametrize("steps,ends", [(4, 1), (10, 2), (20, 3), (30, 5), (50, 8)])
def test_documented_hybrid_end_counts_hold_for_the_schedule_string(steps, ends):
    counts = get_policy("mxfp6:3,mxfp4:14,mxfp6:3").counts(steps)
    print(steps, counts, hybrid_policy().n_end_steps(steps))
    assert counts == [ends, steps - 2 * ends, ends] and hybrid_policy().n_end_steps(steps) == ends


@pytest.mark.parametrize("spec", ["mxfp6:³", "mxfp6:²,mxfp4:3", "mxfp6:١"])
def test_non_ascii_step_counts_are_one_line_errors(spec):
    with pytest.raises(ValueError) as info:
        get_policy(spec)
    print(info.value)
    assert "\n" not in str(info.value) and "accepted" in str(info.value) and "int()" not in str(info.value)


def test_policy_none_is_refused_with_the_accepted_values():
    with pytest.raises(ValueError) as info:
        get_policy(None)
    print(info.value)
    assert "'bf16'" in str(info.value) and "hybrid" in str(info.value) and "\n" not in str(info.value)


def test_n_ends_beyond_the_run_warns_once():
    policy = get_policy({"ends": "bf16", "middle": "mxfp4", "n_ends": 50})
    with pytest.warns(FSAttnWarning, match="middle=mxfp4 never runs") as caught:
        plan = policy.plan_names(4)
    print(plan, caught[0].message)
    assert plan == ["bf16"] * 4 and caught[0].filename == __file__  # attributed to this (the user's) code
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert get_policy({"ends": "bf16", "middle": "mxfp4", "n_ends": 1}).plan_names(4)[1] == "mxfp4"
        hybrid_policy().plan_names(2)  # a scaled policy: documented, no warning


def test_schedule_line_says_what_hybrid_resolves_to():
    from fsattn_diffusers.integration.policy import schedule_line

    line = schedule_line(get_policy("hybrid"), 2)
    print(line)
    assert line == "hybrid at 2 steps: steps 0-1 mxfp6 (defined for 20 steps, scaled)"
    assert schedule_line(get_policy("mxfp8"), 3) == "mxfp8 at 3 steps: steps 0-2 mxfp8"


def test_second_apply_warns_and_the_first_handle_stops():
    from fsattn_diffusers.integration.tiny import tiny_wan_transformer

    model = tiny_wan_transformer()
    first = fsattn_diffusers.apply(model, policy="mxfp8", backend="emulator")
    with pytest.warns(FSAttnWarning, match="replaces the installation of policy mxfp8") as caught:
        second = fsattn_diffusers.apply(model, policy="mxfp6", backend="emulator")
    print(caught[0].message)
    assert caught[0].filename == __file__
    assert not first.active and second.active
    fsattn_diffusers.remove(model)
    assert not second.active
    with pytest.raises(ValueError, match="policy=None"):
        fsattn_diffusers.apply(model, policy=None)
    assert torch.is_tensor(next(model.parameters()))

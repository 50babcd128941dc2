"""How many steps each segment of a step schedule gets at another step count (:func:`apportion`)."""

from __future__ import annotations

import itertools
import math
from typing import List, Optional, Sequence


def _largest_remainder(shares: Sequence[float], total: int) -> List[int]:
    """Floors plus one step for the largest fractional parts (earlier segment first on ties)."""
    counts = [int(math.floor(x + 1e-9)) for x in shares]
    order = sorted(range(len(shares)), key=lambda i: (-(shares[i] - counts[i]), i))
    for i in order[:max(total - sum(counts), 0)]:
        counts[i] += 1
    return counts


def _symmetric(shares: Sequence[float], adjusted: Sequence[float], total: int, low: int) -> Optional[List[int]]:
    """Palindromic counts for a palindromic schedule, or ``None`` when none exists (an even number of
    segments and an odd total). Each outer segment takes its ``adjusted`` share rounded down or up (at
    least ``low``), the middle segment the rest; the choice closest to ``shares`` wins (smallest largest
    deviation, then smallest squared deviations, then more steps on the outer segments)."""
    k = len(shares)
    half = k // 2
    if half > 12:  # 2**12 candidates at most
        return None
    options = [sorted({max(low, int(math.floor(a + 1e-9))), max(low, int(math.ceil(a - 1e-9)))})
               for a in adjusted[:half]]
    best, best_key = None, None
    for first in itertools.product(*options):
        first = list(first)
        rest = total - 2 * sum(first)
        if k % 2:
            if rest < low:
                continue
            counts = first + [rest] + first[::-1]
        elif rest != 0:
            continue
        else:
            counts = first + first[::-1]
        devs = [abs(c - x) for c, x in zip(counts, shares)]
        key = (round(max(devs), 9), round(sum(d * d for d in devs), 9), [-c for c in first])
        if best_key is None or key < best_key:
            best, best_key = counts, key
    return best


def apportion(reference: Sequence[int], num_steps: int, palindrome: bool = False) -> List[int]:
    """Split ``num_steps`` over segments of ``reference`` steps in proportion to them.

    Parameters
    ----------
    reference : sequence of int (K,)
        Steps of each segment in the schedule as written (their sum is the reference length).
    num_steps : int
        Steps of the run.
    palindrome : bool
        The schedule reads the same backwards: return palindromic counts whenever any exist (not for
        an even K with an odd ``num_steps``); the middle segment takes what the mirrored pairs leave.

    Returns
    -------
    list of int (K,)
        Counts summing to ``num_steps``. While ``num_steps >= K`` every segment keeps at least one step
        (a segment whose share is below one step gets one, the others share the rest); every other
        segment gets its share rounded down or up (largest remainder, earlier segment first on ties),
        so it stays within one step of its share (the middle segment of a symmetric schedule: at most
        one step). A share is ``reference[i] * num_steps / sum(reference)``.
    """
    k, ref = len(reference), sum(reference)
    fixed: dict = {}
    while True:  # segments below one step get one while there are enough steps
        free = [i for i in range(k) if i not in fixed]
        left = num_steps - len(fixed)
        weight = sum(reference[i] for i in free)
        shares = {i: reference[i] * left / weight for i in free} if free and weight else {}
        small = [i for i in free if shares[i] < 1] if num_steps >= k else []
        if not small:
            break
        fixed.update({i: 1 for i in small})
    if palindrome:
        adjusted = [1.0 if i in fixed else shares[i] for i in range(k)]
        counts = _symmetric([c * num_steps / ref for c in reference], adjusted, num_steps,
                            1 if num_steps >= k else 0)
        if counts is not None:
            return counts
    if not free:
        return [fixed[i] for i in range(k)]
    out = dict(fixed)
    out.update(zip(free, _largest_remainder([shares[i] for i in free], left)))
    return [out[i] for i in range(k)]

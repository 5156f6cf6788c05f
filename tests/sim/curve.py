"""The budget whose cut probability is nearest a target, found by bisection instead of a scan.

A larger output cap never cuts more turns: a turn's cut probability is a survival function of
the budget (for a thinking preset, a mixture of such over the thought's length), so it never
rises with the budget (tests/sim/test_truth.py checks it for the text presets). On such a curve
a bisection finds the budget a scan of every budget would pick, the smallest of the nearest,
with a few dozen evaluations instead of thousands (a thinking preset's evaluation sums over
every thought length: the scan was most of the truth tests' time).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache


def nearest_budget(probability: Callable[[int], float], target: float, lo: int, hi: int) -> int:
    """The smallest budget `b` in ``range(lo, hi)`` minimising ``abs(probability(b) - target)``,
    as ``min(range(lo, hi), key=lambda b: (abs(probability(b) - target), b))`` finds it, for a
    `probability` that never rises with `b`."""
    p = cache(probability)
    # The last budget still at or above the target (lo - 1: none); every later one is below it.
    above, below = lo - 1, hi
    while below - above > 1:
        mid = (above + below) // 2
        if p(mid) >= target:
            above = mid
        else:
            below = mid
    # Nothing before `above` is nearer (they are at least p(above)), nothing after `below` either.
    best = min((b for b in (above, below) if lo <= b < hi), key=lambda b: (abs(p(b) - target), b))
    # The curve may be flat there: the first budget of its plateau (the first at or below its value).
    value, first, last = p(best), lo - 1, best
    while last - first > 1:
        mid = (first + last) // 2
        if p(mid) <= value:
            last = mid
        else:
            first = mid
    return last

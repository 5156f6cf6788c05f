"""The cap a tool's calls need: from the complete calls' sizes and the observed cuts of a sweep.

A call of n tokens fits a cap b when n < b (the turn's end must fit too; output == cap is a
cut, `LengthSignal.CAP_REACHED`). For a cap b at or below a cell's budget B, that cell's calls
tell exactly which would be cut at b: its cut calls (they needed at least B) and its complete
calls of b tokens or more. So the share cut at b is estimated over the cells with B >= b,
pooled: each of those calls is one Bernoulli observation of "needs b or more", so the count
is binomial and its Wilson 95% interval exact in coverage (`pooled_survival`). The answer for
a target x (`tool_budget`) is the smallest b whose estimate is at or under x, with the
interval from the smallest b whose lower bound is to the smallest whose upper bound is; none
up to the sweep's largest budget: the calls fit no budget of the sweep.

Tests: tests/run/test_tool_truth.py (against the simulator's exact per-tool budgets).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from collector.analysis.stats import wilson_interval

__all__ = ["pooled_survival", "tool_budget"]


@dataclass(slots=True)
class _Cell:
    """What `tool_budget` reads of one (group, tool, budget) row."""

    budget: int
    calls: int
    cut: int
    sizes: list[int]


def pooled_survival(cells: Iterable[tuple[int, int, int, Sequence[int]]]) -> list[tuple[int, int, int]]:
    """``(b, k, n)`` for each cap b where the estimate changes, ascending, up to the largest
    cell budget: k of the n calls (or turns) of the cells with budget >= b need b tokens or
    more (their cut ones, and their complete ones of size >= b). Cells are ``(cell budget,
    calls, cut, ascending complete sizes)``; see the module docstring."""
    rows = [_Cell(b, n, k, list(s)) for b, n, k, s in cells if n]
    if not rows:
        return []
    largest = max(c.budget for c in rows)
    # The estimate only changes where a size stops counting (size + 1) or a cell leaves the
    # pool (B + 1): the smallest cap of each constant stretch is one of these.
    candidates = {1, *(s + 1 for c in rows for s in c.sizes), *(c.budget + 1 for c in rows)}
    out = []
    for b in sorted(x for x in candidates if x <= largest):
        pool = [c for c in rows if c.budget >= b]
        n = sum(c.calls for c in pool)
        k = sum(c.cut + len(c.sizes) - bisect_left(c.sizes, b) for c in pool)
        out.append((b, k, n))
    return out


def tool_budget(cells: Iterable[tuple[int, int, int, Sequence[int]]], target: float
                ) -> tuple[int | None, int | None, int | None, float, int]:
    """(budget, low, high, rate at budget, largest budget) of one tool from its cells, each
    ``(cell budget B, calls, cut, ascending complete sizes)``: see the module docstring."""
    cells = list(cells)
    largest = max((b for b, n, _, _ in cells if n), default=0)
    point = low = high = None
    rate_at = math.nan
    for b, k, n in pooled_survival(cells):
        lo, hi = wilson_interval(k, n)
        if low is None and lo <= target:
            low = b
        if point is None and k / n <= target:
            point, rate_at = b, k / n
        if high is None and hi <= target:
            high = b
            break
    return point, low, high, rate_at, largest

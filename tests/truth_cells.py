"""The acceptance rule a measured truncation table is held to against the simulator's truth.

Several cells' 95% intervals all cover their truth only part of the time even when
everything is right (six cells: about 74%), so the ground-truth tests ask for what a correct
pipeline gives reliably: every truth inside its cell's 99.9% Wilson interval, and few outside
the 95% interval `collector stats` reports (how few is the test's to say). Used by
tests/system/harness/test_harness_truth.py; tests/run/test_ground_truth.py and
tests/system/run/test_demo_truth.py apply the same rule.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from collector.analysis.stats import GroupStats, wilson_interval

Z999 = 3.29
"""The normal quantile of a central 99.9% interval."""


def cells_off_truth(
    cells: Mapping[tuple[str, int], GroupStats], truth: Callable[[str, int], float]
) -> tuple[list[str], list[str]]:
    """The (model, budget) cells whose `truth` is outside the reported 95% interval, and those
    outside the 99.9% Wilson interval, each as `model@budget: truth T, measured M`."""
    outside_95: list[str] = []
    outside_999: list[str] = []
    for (model, budget), group in sorted(cells.items()):
        expected = truth(model, budget)
        low, high = group.truncation_interval
        wide_low, wide_high = wilson_interval(group.truncated, group.valid, z=Z999)
        where = f"{model}@{budget}: truth {expected:.3f}, measured {group.truncation_rate:.3f}"
        if not low <= expected <= high:
            outside_95.append(where)
        if not wide_low <= expected <= wide_high:
            outside_999.append(where)
    return outside_95, outside_999

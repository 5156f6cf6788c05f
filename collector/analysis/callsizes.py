"""How many output tokens a turn, and a call to each tool, needs: cumulative distributions per
model, read against the sweep's budgets (the report's and the notebook's size figures).

A cut turn's size is not observed: it needed at least its cap. So a curve is not the plain
distribution of the recorded sizes (that would hide exactly the turns that matter): it is
the product-limit (Kaplan-Meier) estimate with the cut ones right-censored at their cap.
A turn of a cell with budget B is known not to end at t for every t < B, so it counts in
the risk set there; a complete one ends at its size. The curve is monotone, defined up to
the sweep's largest budget, and stops there below 1 by the share that needs more. With one
budget it is exactly the share of that cell's turns that fit; with several it uses every
cell below its cap. The per-tool budget answers (`collector.analysis.toolstats`) read the
binomial estimate at each cap instead, for its exact interval; both estimate the same
share, so where a tool's curve crosses 1 - x lies the budget that keeps its cuts at x.

- `size_curves(table)`: from an episode table (`by` columns, ``budget``, `turns`, `messages`);
- `compute_size_curves(run)`: the same from a run directory;
- `size_curve_table(source)`: the curves as Arrow, one row per point (for the notebook).

Tests: tests/analysis/test_callsizes.py.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from collector.analysis.committed import read_columns
from collector.analysis.toolstats import ToolStatsResult, aggregate_tools, turn_fields
from collector.storage.mirror import resolve_run

__all__ = ["ALL_TURNS", "SizeCurve", "compute_size_curves", "product_limit", "size_curve_table",
           "size_curves"]

#: The series of every turn's output tokens (calls and answers), beside one per tool.
ALL_TURNS = "all turns"


@dataclass(slots=True)
class SizeCurve:
    """One cumulative distribution: `series` is `ALL_TURNS` or a tool's name."""

    key: dict[str, Any]
    """The `by` values without budget (the model, by default)."""
    series: str
    points: list[tuple[int, float]] = field(default_factory=list)
    """(t, estimated share needing at most t tokens), ascending in t."""
    budgets: list[int] = field(default_factory=list)
    """The budgets swept for this key (the model's, for a tool's curve too): the figure marks them."""
    count: int = 0
    """Turns (or calls) the curve rests on."""


def product_limit(cells: Sequence[tuple[int, int, int, Sequence[int]]]) -> list[tuple[int, float]]:
    """(t, estimated share of sizes at most t) at each size seen and at the largest budget - 1,
    ascending; cells are ``(cell budget, count, cut, ascending complete sizes)``. A cut one of
    a cell with budget B is censored at B (at risk for every t < B, never an event)."""
    cells = [c for c in cells if c[1]]
    if not cells:
        return []
    largest = max(c[0] for c in cells)
    ends = Counter(s for c in cells for s in c[3])
    censored: Counter[int] = Counter()
    for b, _, cut, _ in cells:
        censored[b] += cut
    at_risk = sum(c[1] for c in cells)
    survival = 1.0
    points: list[tuple[int, float]] = []
    for t in sorted({*ends, *censored, largest - 1}):
        if t >= largest:
            break
        # The cuts of a cell with budget t leave the risk set first: they needed at least t,
        # and whether exactly t is not known. Then the sizes known to be t end here.
        at_risk -= censored[t]
        if at_risk > 0 and ends[t]:
            survival *= 1.0 - ends[t] / at_risk
        points.append((t, 1.0 - survival))
        at_risk -= ends[t]
    return points


def _curve(key: dict[str, Any], series: str, cells: list[tuple[int, int, int, list[int]]],
           budgets: list[int]) -> SizeCurve:
    return SizeCurve(key=key, series=series, points=product_limit(cells), budgets=budgets,
                     count=sum(c[1] for c in cells))


def size_curves(table: pa.Table, by: Sequence[str] = ("model",), tools: ToolStatsResult | None = None
                ) -> list[SizeCurve]:
    """Per `by` group (without budget): the curve of all turns, then one per tool, by name.
    `tools`: the table's per-tool statistics when already computed by `by` + budget."""
    by = tuple(c for c in by if c != "budget")
    cells_by = (*by, "budget")
    turn_cells: dict[tuple[Any, ...], list[tuple[int, int, int, list[int]]]] = {}
    cell_of = list(zip(*(table.column(c).to_pylist() for c in cells_by), strict=True))
    per_cell: dict[tuple[Any, ...], list[Any]] = {}
    turns = turn_fields(table) if table.num_rows else None
    rows, cuts, tokens = ((turns.row.tolist(), turns.cut.tolist(), turns.tokens.tolist()) if turns
                          else ([], [], []))
    for row, cut, size in zip(rows, cuts, tokens, strict=True):
        entry = per_cell.setdefault(cell_of[row], [0, 0, []])
        entry[0] += 1
        if cut:
            entry[1] += 1
        else:
            entry[2].append(size)
    for cell, (n, k, sizes) in per_cell.items():
        turn_cells.setdefault(cell[:-1], []).append((cell[-1], n, k, sorted(sizes)))
    tool_cells: dict[tuple[Any, ...], dict[str, list[tuple[int, int, int, list[int]]]]] = {}
    if tools is None or tools.by != cells_by:
        tools = aggregate_tools(table, cells_by)
    for g in tools.groups:
        key = tuple(g.key[c] for c in by)
        tool_cells.setdefault(key, {}).setdefault(g.key["tool"], []).append(
            (g.key["budget"], g.calls, g.cut, g.sizes))
    out = []
    for key in sorted(turn_cells, key=lambda k: tuple(str(v) for v in k)):
        named = dict(zip(by, key, strict=True))
        swept = sorted({c[0] for c in turn_cells[key]})  # a tool's curve marks the model's budgets
        out.append(_curve(named, ALL_TURNS, turn_cells[key], swept))
        for tool, cells in sorted(tool_cells.get(key, {}).items()):
            out.append(_curve(named, tool, cells, swept))
    return out


def compute_size_curves(run_dir: str | Path, by: Sequence[str] = ("model",)) -> list[SizeCurve]:
    """`size_curves` of a run's committed episodes."""
    columns = sorted({*by, "budget", "turns", "messages"})
    return size_curves(read_columns(resolve_run(run_dir), columns), by)


def size_curve_table(source: str | Path | pa.Table, by: Sequence[str] = ("model",)) -> pa.Table:
    """The curves as Arrow: `by` columns, ``series``, ``tokens``, ``cdf``, and ``budgets`` (the
    swept budgets of the row's key, to mark), one row per point."""
    curves = size_curves(source, by) if isinstance(source, pa.Table) else compute_size_curves(source, by)
    rows = [{**c.key, "series": c.series, "tokens": t, "cdf": p, "budgets": c.budgets}
            for c in curves for t, p in c.points]
    if rows:
        return pa.Table.from_pylist(rows)
    return pa.table({**{c: pa.array([], pa.string()) for c in by if c != "budget"},
                     "series": pa.array([], pa.string()), "tokens": pa.array([], pa.int64()),
                     "cdf": pa.array([], pa.float64()), "budgets": pa.array([], pa.list_(pa.int64()))})

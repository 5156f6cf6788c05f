"""Per-task truncation: the tasks whose episodes are cut far more than their cell's
(`collector stats --per task`).

Why: a cell's truncation rate is an average over tasks, and cuts cluster. A task that asks
for a long e-mail is cut at a cap where a lookup never is; at 10% for the cell, the user
must see that it is 60% on a few tasks and 0% on the rest before changing the cap (or
before training on a data set from which those tasks silently drop out).

Per group (model x budget by default, any scalar columns with `by`) and ``task_id``:
``episodes`` (that did not end in error: errors say nothing about the model), ``truncated``
(`is_truncated`), ``truncation_rate`` with its Wilson 95% interval (``trunc_low``,
``trunc_high``), the cell's own ``cell_rate``, and ``clustered``: the task's lower bound is
above the cell's rate, so its excess is not the noise of a few samples. Rows are sorted by
cell, then by rate, highest first. The table shows the clustered tasks of each cell; CSV,
JSON and Arrow carry every task.

Tests: tests/run/test_tool_truth.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from collector.analysis.stats import (
    StatsFormat,
    aligned_lines,
    format_rows,
    read_columns,
    requested_grouping,
    settled_grouping,
    sort_key,
    wilson_interval,
)
from collector.stop import StopReason

__all__ = ["TaskRow", "TaskStatsResult", "aggregate_tasks", "compute_task_stats", "format_task_stats"]


@dataclass(slots=True)
class TaskRow:
    """One task in one cell: `key` holds the `by` values and ``task_id``."""

    key: dict[str, Any]
    episodes: int
    truncated: int
    cell_episodes: int
    cell_truncated: int

    @property
    def truncation_rate(self) -> float:
        return self.truncated / self.episodes if self.episodes else math.nan

    @property
    def truncation_interval(self) -> tuple[float, float]:
        return wilson_interval(self.truncated, self.episodes)

    @property
    def cell_rate(self) -> float:
        return self.cell_truncated / self.cell_episodes if self.cell_episodes else math.nan

    @property
    def clustered(self) -> bool:
        """The task's 95% lower bound lies above its cell's rate."""
        return self.episodes > 0 and self.truncation_interval[0] > self.cell_rate

    def as_dict(self) -> dict[str, Any]:
        low, high = self.truncation_interval
        return {**self.key, "episodes": self.episodes, "truncated": self.truncated,
                "truncation_rate": self.truncation_rate, "trunc_low": low, "trunc_high": high,
                "cell_rate": self.cell_rate, "clustered": self.clustered}


@dataclass(slots=True)
class TaskStatsResult:
    """What `compute_task_stats` returns and `format_task_stats` prints."""

    by: tuple[str, ...]
    rows: list[TaskRow]

    def columns(self) -> list[str]:
        return [*self.by, "task_id", "episodes", "truncated", "truncation_rate", "trunc_low", "trunc_high",
                "cell_rate", "clustered"]

    def clustered(self) -> list[TaskRow]:
        return [r for r in self.rows if r.clustered]

    def to_arrow(self) -> pa.Table:
        """Every task's row as Arrow (for pandas, polars, the notebook)."""
        if self.rows:
            return pa.Table.from_pylist([r.as_dict() for r in self.rows])
        return pa.table({n: pa.array([], pa.float64()) for n in self.columns()})


def aggregate_tasks(table: pa.Table, by: Sequence[str]) -> TaskStatsResult:
    """Per-task rates of an episode table (`by` columns, ``task_id``, `stop_reason`, `is_truncated`)."""
    by = tuple(by)
    table = table.select(list(dict.fromkeys([*by, "task_id", "stop_reason", "is_truncated"])))  # not turns
    reasons = table.column("stop_reason")
    if pa.types.is_dictionary(reasons.type):
        reasons = reasons.cast(pa.string())
    valid = table.filter(pc.not_equal(reasons, StopReason.ERROR.value))
    valid = valid.set_column(valid.schema.get_field_index("is_truncated"), "is_truncated",
                             pc.cast(valid.column("is_truncated"), pa.int64()))
    counted = valid.group_by([*by, "task_id"], use_threads=False).aggregate(
        [([], "count_all"), ("is_truncated", "sum")]).to_pylist()
    cells: dict[tuple[Any, ...], list[int]] = {}
    for row in counted:
        cell = cells.setdefault(tuple(row[c] for c in by), [0, 0])
        cell[0] += row["count_all"]
        cell[1] += row["is_truncated_sum"] or 0
    rows = []
    for row in counted:
        cell_n, cell_k = cells[tuple(row[c] for c in by)]
        rows.append(TaskRow(key={**{c: row[c] for c in by}, "task_id": row["task_id"]},
                            episodes=row["count_all"], truncated=row["is_truncated_sum"] or 0,
                            cell_episodes=cell_n, cell_truncated=cell_k))
    rows.sort(key=lambda r: (*(sort_key(r.key[c]) for c in by), -r.truncation_rate, -r.episodes,
                             str(r.key["task_id"])))
    return TaskStatsResult(by=by, rows=rows)


def compute_task_stats(run_dir: str | Path, by: Sequence[str] = ()) -> TaskStatsResult:
    """Per-task truncation of a run's committed episodes, per cell (model x budget by default,
    with provider first when the run has several). ConfigError for a `by` that is not a
    scalar column."""
    by, default = requested_grouping(by)
    table = read_columns(run_dir, sorted({*by, "task_id", "stop_reason", "is_truncated"}))
    by = settled_grouping(table, by, default)
    return aggregate_tasks(table, by)


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:.1f}%"


def _table(result: TaskStatsResult) -> str:
    headers = [*result.by, "task", "episodes", "truncated", "95% CI", "cell"]
    lines = []
    for r in result.clustered():
        low, high = r.truncation_interval
        lines.append([*(str(r.key[c]) for c in result.by), str(r.key["task_id"]), str(r.episodes),
                      _pct(r.truncation_rate), f"[{100 * low:.1f}, {100 * high:.1f}]", _pct(r.cell_rate)])
    out = aligned_lines(headers, lines, len(result.by) + 1)
    tasks = len({r.key["task_id"] for r in result.rows})
    out.append(f"{len(lines)} of {len(result.rows)} task rows ({tasks} tasks) are cut far more than their "
               "cell: the task's 95% lower bound is above the cell's rate (--format csv/json: every task)")
    return "\n".join(out)


def format_task_stats(result: TaskStatsResult, fmt: StatsFormat = "table") -> str:
    """Render per-task statistics: the clustered tasks as a table, or every task as CSV / JSON."""
    if fmt == "table":
        return _table(result)
    return format_rows([r.as_dict() for r in result.rows], result.columns(), fmt,
                       {"by": list(result.by), "per": "task"}, None, [])

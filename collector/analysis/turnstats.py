"""Per-turn truncation: turns cut by the output cap out of turns, by turn index and by kind.

Why a table of its own: an episode is truncated when *any* of its turns is cut, so a model
whose tool call fits from budget 37 up but whose answer after the tool result rambles to
the cap reads 100% truncated at every budget, and the fit of the call is invisible. Per
turn, the call's row falls to 0% at 37 while the answer's stays at 100%.

Per group (model x budget by default, any scalar columns with `by`), two kinds of rows:

- by turn index (``turn_index`` 0, 1, 2...): the turns of that position in their episodes;
- by turn kind (``turn_kind``): ``call`` for a turn that carried a tool call (or one left
  unparsed in its text), ``answer`` for the rest. A turn cut before its call began shows no
  call and counts as an answer: the index rows are the view without that ambiguity.

Each row has ``turns``, ``cut`` (finish class `length`), ``cut_rate`` and its Wilson 95%
interval (``cut_low``, ``cut_high``). Every turn that came back counts, in every committed
episode: a turn is an observation of the model at that budget even when the episode later
ended in error. With a `target`, per group without budget and per turn row: the smallest
budget whose cut rate is at or under it, and the smallest whose upper bound is
(`collector.analysis.stats.pick_budgets`, the same rule as the episode table).

Tests: tests/analysis/test_stats_tables.py, tests/run/test_truth_cli.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from collector.analysis.stats import (
    BudgetPick,
    StatsFormat,
    format_rows,
    pick_budgets,
    read_columns,
    requested_grouping,
    rows_with_picks,
    settled_grouping,
    sort_key,
    target_lines,
    wilson_interval,
)

__all__ = ["TurnGroup", "TurnStatsResult", "aggregate_turns", "compute_turn_stats", "format_turn_stats"]

#: Row order of the kinds after the index rows of a group.
KINDS = ("call", "answer")


@dataclass(slots=True)
class TurnGroup:
    """One row: the `by` values plus ``turn_index`` or ``turn_kind`` in `key`, then the counts."""

    key: dict[str, Any]
    turns: int = 0
    cut: int = 0

    @property
    def valid(self) -> int:
        """The denominator (every turn counts); named as in `GroupStats` for `pick_budgets`."""
        return self.turns

    @property
    def truncation_rate(self) -> float:
        return self.cut / self.turns if self.turns else math.nan

    @property
    def truncation_interval(self) -> tuple[float, float]:
        return wilson_interval(self.cut, self.turns)

    def as_dict(self) -> dict[str, Any]:
        low, high = self.truncation_interval
        return {**self.key, "turns": self.turns, "cut": self.cut, "cut_rate": self.truncation_rate,
                "cut_low": low, "cut_high": high}


@dataclass(slots=True)
class TurnStatsResult:
    """What `compute_turn_stats` returns and `format_turn_stats` prints."""

    by: tuple[str, ...]
    groups: list[TurnGroup]
    target: float | None = None
    picks: list[BudgetPick] = field(default_factory=list)

    def columns(self) -> list[str]:
        names = [*self.by, "turn_index", "turn_kind", "turns", "cut", "cut_rate", "cut_low", "cut_high"]
        if self.target is not None:
            names += ["target", "target_budget", "target_budget_confident"]
        return names

    def rows(self) -> list[dict[str, Any]]:
        """One flat dict per row; with a target, each carries its own row's pick."""
        return rows_with_picks(self.groups, self.target, self.picks)

    def to_arrow(self) -> pa.Table:
        """The table as Arrow (for pandas, polars, the notebook)."""
        names = self.columns()
        rows = self.rows()
        if rows:
            return pa.Table.from_pylist(rows, schema=_schema(self.by, rows, names))
        return pa.table({n: pa.array([], pa.float64()) for n in names})


def _schema(by: Sequence[str], rows: list[dict[str, Any]], names: list[str]) -> pa.Schema:
    # turn_index and turn_kind are each null on half the rows: give them their types outright.
    inferred = pa.Table.from_pylist([{c: r[c] for c in by} for r in rows]).schema if by else pa.schema([])
    fixed = {"turn_index": pa.int64(), "turn_kind": pa.string(), "turns": pa.int64(), "cut": pa.int64(),
             "target_budget": pa.int64(), "target_budget_confident": pa.int64()}
    return pa.schema([inferred.field(n) if n in by else pa.field(n, fixed.get(n, pa.float64()))
                      for n in names])


def _flat_turns(table: pa.Table, by: Sequence[str]) -> pa.Table:
    """One row per turn: the episode's `by` values, the turn's index, kind and whether it was cut."""
    turns = table.column("turns").combine_chunks()
    parents = pc.list_parent_indices(turns)
    flat = pc.list_flatten(turns)
    has_call = pc.or_(pc.greater(flat.field("num_tool_calls"), 0),
                      pc.fill_null(flat.field("unparsed_tool_call"), False))
    columns = {c: pc.take(table.column(c), parents) for c in by}
    columns["turn_index"] = flat.field("index")
    columns["turn_kind"] = pc.if_else(has_call, "call", "answer")
    columns["cut"] = pc.cast(pc.equal(flat.field("finish_class"), "length"), pa.int64())
    return pa.table(columns)


def _count(flat: pa.Table, by: Sequence[str], axis: str) -> list[TurnGroup]:
    counted = flat.group_by([*by, axis]).aggregate([([], "count_all"), ("cut", "sum")])
    groups = []
    for row in counted.to_pylist():
        key: dict[str, Any] = {c: row[c] for c in by}
        key["turn_index"] = row["turn_index"] if axis == "turn_index" else None
        key["turn_kind"] = row["turn_kind"] if axis == "turn_kind" else None
        groups.append(TurnGroup(key=key, turns=row["count_all"], cut=row["cut_sum"] or 0))
    return groups


def _order(g: TurnGroup, by: Sequence[str]) -> tuple[Any, ...]:
    """The episode table's order of the `by` values, then index rows, then call, then answer."""
    keys = tuple(sort_key(g.key[c]) for c in by)
    index = g.key["turn_index"]
    position = (0, index) if index is not None else (1, KINDS.index(g.key["turn_kind"]))
    return (*keys, position)


def aggregate_turns(table: pa.Table, by: Sequence[str], target: float | None = None) -> TurnStatsResult:
    """The per-turn statistics of an episode table (any table with `by` columns and `turns`)."""
    by = tuple(by)
    flat = _flat_turns(table, by) if table.num_rows else None
    groups: list[TurnGroup] = []
    if flat is not None and flat.num_rows:
        groups = _count(flat, by, "turn_index") + _count(flat, by, "turn_kind")
    groups.sort(key=lambda g: _order(g, by))
    result = TurnStatsResult(by=by, groups=groups, target=target)
    if target is not None:
        source = groups if "budget" in by else aggregate_turns(table, (*by, "budget")).groups
        keys = [*(c for c in by if c != "budget"), "turn_index", "turn_kind"]
        rated = [g for g in source if "budget" in g.key]
        picks = pick_budgets(rated, target, [*keys, "budget"])
        rest = [c for c in by if c != "budget"]
        result.picks = sorted(picks, key=lambda p: _order(TurnGroup(key=p.key), rest))  # as the rows
    return result


def compute_turn_stats(run_dir: str | Path, by: Sequence[str] = (), target: float | None = None
                       ) -> TurnStatsResult:
    """Per-turn truncation of a run's committed episodes (`collector stats --per turn`).

    Empty `by` groups by model x budget, with provider first when the run has several.
    ConfigError for a `by` column that is not a scalar column or a target outside [0, 1].
    """
    by, default = requested_grouping(by, target)
    wanted = sorted({*by, "turns", *(("budget",) if target is not None else ())})
    table = read_columns(run_dir, wanted)
    by = settled_grouping(table, by, default)
    return aggregate_turns(table, by, target)


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:.1f}%"


def _label(key: dict[str, Any]) -> str:
    names = [str(v) for k, v in key.items() if k not in ("turn_index", "turn_kind")]
    index = key.get("turn_index")
    turn = f"turn {index}" if index is not None else f"{key.get('turn_kind')} turns"
    return ", ".join([*names, turn])


def _table(result: TurnStatsResult) -> str:
    headers = [*result.by, "turn", "turns", "cut", "95% CI"]
    lines = []
    for g in result.groups:
        low, high = g.truncation_interval
        ci = "-" if math.isnan(low) else f"[{100 * low:.1f}, {100 * high:.1f}]"
        turn = str(g.key["turn_index"]) if g.key["turn_index"] is not None else str(g.key["turn_kind"])
        lines.append([*(str(g.key[c]) for c in result.by), turn, str(g.turns), _pct(g.truncation_rate), ci])
    widths = [max(len(h), *(len(r[i]) for r in lines)) if lines else len(h) for i, h in enumerate(headers)]
    nkeys = len(result.by) + 1

    def fmt(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i < nkeys else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    out = [fmt(headers), fmt(["-" * w for w in widths]), *(fmt(r) for r in lines)]
    total = sum(g.turns for g in result.groups if g.key["turn_index"] is not None)
    out.append(f"{total} turns; cut = finish class length (any length signal); turn: index in the episode, "
               "or kind (call: the turn carried a tool call; answer: it did not)")
    if result.target is not None:
        out.extend(target_lines(result.picks, result.target, "turns cut", "turns", _label))
    return "\n".join(out)


def format_turn_stats(result: TurnStatsResult, fmt: StatsFormat = "table") -> str:
    """Render per-turn statistics as an aligned text table, CSV, or JSON (NaN: empty / null)."""
    if fmt == "table":
        return _table(result)
    return format_rows(result.rows(), result.columns(), fmt, {"by": list(result.by), "per": "turn"},
                       result.target, result.picks)

"""Per-tool truncation: which tool's calls the cap cuts, how large each tool's calls are, and
the budget each tool needs (`collector stats --per tool`).

Why per tool: the cuts of a run concentrate on the tools with large arguments (a file
body, an e-mail, a SQL query) while a lookup fits any cap; the per-cell rate averages the
two and hides which cap the long tool needs.

Per group (model x budget by default, any scalar columns with `by`) and tool, one row:

- ``calls``: calls attempted: every call of a turn that was not cut, plus one per cut turn
  that was writing a call to this tool;
- ``cut``: cut turns that were writing a call to this tool, and ``cut_rate`` with its
  Wilson 95% interval (``cut_low``, ``cut_high``);
- ``malformed``: calls with malformed arguments in turns that were not cut;
- ``tokens_p50`` / ``p90`` / ``p99`` / ``max``: the output tokens of the turn each complete call
  came in (its arguments, and the reasoning and text written before it in the same turn).
  A turn that carried several calls counts its tokens for each: it is the cap the turn
  needed for them to run, and nothing from a turn runs unless all of it fits.

How a cut call's tool is known. On every wire the tool's name arrives before its
arguments (a Chat Completions call's first delta, a Responses `function_call` item's
`output_item.added`, an Anthropic `tool_use` block's `content_block_start`), and the
adapters keep a cut call with its name in the record (`messages[].tool_calls`, status
malformed or partial): the cut turn was writing its *last* recorded call. A cut turn with
no recorded call cannot be attributed: cut in its reasoning or its text before any call
began, a cut final answer, a call left unparsed in the text, or a Gemini call (Gemini drops
a call the cap left open). Those are counted apart per group (``unattributed``), never
guessed into a tool. Calls a cut turn had finished before the one it was writing did not
run either, but the cap did not cut them; they are left out of the rows.

The budget per tool (with `target` x). A call of n tokens fits a cap b when n < b (the
turn's end must fit too; output == cap is a cut, `LengthSignal.CAP_REACHED`). For a cap b
at or below a cell's budget B, that cell's calls tell exactly which would be cut at b: its
cut calls (they needed at least B) and its complete calls of b tokens or more. So the cut
share at b is estimated over the cells with B >= b, pooled, with a Wilson 95% interval,
for every b up to the sweep's largest budget (`tool_budget`). The answer is the smallest b
whose estimate is at or under x (``budget``), with the interval [``budget_low``,
``budget_high``]: the smallest b whose lower bound is, and the smallest whose upper bound
is (the true budget lies between when the bands cover the true shares). A tool no cap of
the sweep brings to x is flagged ``fits_no_budget``: its calls need more than the sweep's
largest budget (the cut calls there say how much more only that it is more).

Tests: tests/run/test_tool_truth.py, tests/analysis/test_callsizes.py.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
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

__all__ = ["ToolBudget", "ToolGroup", "ToolStatsResult", "aggregate_tools", "compute_tool_stats",
           "format_tool_stats", "pooled_survival", "quantile", "tool_budget", "turn_fields"]

#: The quantiles of the complete calls' sizes each row reports.
QUANTILES = (0.5, 0.9, 0.99)


def quantile(ordered: Sequence[int], q: float) -> float:
    """The nearest-rank `q` quantile of an ascending list (NaN when empty)."""
    if not ordered:
        return math.nan
    return float(ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))])


@dataclass(slots=True)
class ToolGroup:
    """One row: the `by` values and ``tool`` in `key`, then the counts and the call sizes."""

    key: dict[str, Any]
    calls: int = 0
    cut: int = 0
    malformed: int = 0
    sizes: list[int] = field(default_factory=list)
    """Output tokens of the turn of each complete call, ascending once aggregated."""

    @property
    def valid(self) -> int:
        return self.calls

    @property
    def truncation_rate(self) -> float:
        return self.cut / self.calls if self.calls else math.nan

    @property
    def truncation_interval(self) -> tuple[float, float]:
        return wilson_interval(self.cut, self.calls)

    def as_dict(self) -> dict[str, Any]:
        low, high = self.truncation_interval
        return {**self.key, "calls": self.calls, "cut": self.cut, "cut_rate": self.truncation_rate,
                "cut_low": low, "cut_high": high, "malformed": self.malformed,
                **{f"tokens_p{round(100 * q)}": quantile(self.sizes, q) for q in QUANTILES},
                "tokens_max": float(self.sizes[-1]) if self.sizes else math.nan}


@dataclass(slots=True)
class ToolBudget:
    """For one tool of one model (a group without budget): the cap its calls need."""

    key: dict[str, Any]
    target: float
    budget: int | None
    """Smallest cap whose estimated cut share is at or under the target (None: none in the sweep)."""
    budget_low: int | None
    """Smallest cap whose Wilson 95% lower bound is at or under the target."""
    budget_high: int | None
    """Smallest cap whose Wilson 95% upper bound is at or under the target (None: none is)."""
    rate: float = math.nan
    """The estimated cut share at `budget`."""
    largest: int = 0
    """The sweep's largest budget measured for this tool: no answer can lie beyond it."""
    calls: int = 0
    fits_no_budget: bool = False
    """No cap of the sweep brings the tool's cut share to the target."""


@dataclass(slots=True)
class ToolStatsResult:
    """What `compute_tool_stats` returns and `format_tool_stats` prints."""

    by: tuple[str, ...]
    groups: list[ToolGroup]
    unattributed: list[tuple[dict[str, Any], int]] = field(default_factory=list)
    """Per `by` group: cut turns with no recorded call (their tool cannot be known)."""
    target: float | None = None
    budgets: list[ToolBudget] = field(default_factory=list)

    def columns(self) -> list[str]:
        names = [*self.by, *ToolGroup(key={"tool": None}).as_dict()]
        if self.target is not None:
            names += ["target", "target_budget", "target_budget_low", "target_budget_high", "fits_no_budget"]
        return names

    def rows(self) -> list[dict[str, Any]]:
        """One flat dict per row; with a target, each carries its tool's budget answer."""
        rows = [g.as_dict() for g in self.groups]
        if self.target is None:
            return rows
        for g, row in zip(self.groups, rows, strict=True):
            pick = next((b for b in self.budgets if all(g.key.get(k) == v for k, v in b.key.items())), None)
            row["target"] = self.target
            row["target_budget"] = pick.budget if pick else None
            row["target_budget_low"] = pick.budget_low if pick else None
            row["target_budget_high"] = pick.budget_high if pick else None
            row["fits_no_budget"] = pick.fits_no_budget if pick else None
        return rows

    def to_arrow(self) -> pa.Table:
        """The table as Arrow (for pandas, polars, the notebook)."""
        rows = self.rows()
        if rows:
            return pa.Table.from_pylist(rows)
        return pa.table({n: pa.array([], pa.float64()) for n in self.columns()})


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


def turn_fields(table: pa.Table) -> tuple[list[int], list[int], list[bool], list[int]]:
    """Every turn of the table as four parallel lists: its episode's row, its index, whether it
    was cut (finish class `length`), its output tokens. Only these fields are read (a turn
    also holds token ids and text a Python list of the whole struct would copy)."""
    turns = table.column("turns").combine_chunks()
    flat = pc.list_flatten(turns)
    cut = pc.fill_null(pc.equal(flat.field("finish_class"), "length"), False)
    return (pc.list_parent_indices(turns).to_pylist(), flat.field("index").to_pylist(), cut.to_pylist(),
            flat.field("output_tokens").to_pylist())


def _calls_by_turn(table: pa.Table) -> dict[tuple[int, int], list[tuple[str, str]]]:
    """(episode row, turn index) -> the turn's recorded calls as (name, status), in order."""
    messages = table.column("messages").combine_chunks()
    flat = pc.list_flatten(messages)
    assistant = pc.fill_null(pc.and_(pc.equal(flat.field("role"), "assistant"),
                                     pc.is_valid(flat.field("turn_index"))), False)
    owner = pc.list_parent_indices(messages).filter(assistant)
    kept = flat.filter(assistant)
    calls = kept.field("tool_calls")
    message_of = pc.list_parent_indices(calls).to_pylist()
    named = pc.list_flatten(calls)
    rows, indices = owner.to_pylist(), kept.field("turn_index").to_pylist()
    out: dict[tuple[int, int], list[tuple[str, str]]] = {}
    for m, name, status in zip(message_of, named.field("name").to_pylist(), named.field("status").to_pylist(),
                               strict=True):
        out.setdefault((rows[m], indices[m]), []).append((name, status))
    return out


def aggregate_tools(table: pa.Table, by: Sequence[str], target: float | None = None) -> ToolStatsResult:
    """The per-tool statistics of an episode table (`by` columns, `turns`, `messages`)."""
    by = tuple(by)
    groups: dict[tuple[Any, ...], ToolGroup] = {}
    unattributed: dict[tuple[Any, ...], int] = {}
    keys = list(zip(*(table.column(c).to_pylist() for c in by), strict=True)) if by else [()] * table.num_rows
    recorded = _calls_by_turn(table) if table.num_rows else {}
    rows, indices, cuts, tokens = turn_fields(table) if table.num_rows else ([], [], [], [])
    for row, index, cut, size in zip(rows, indices, cuts, tokens, strict=True):
        calls = recorded.get((row, index), [])
        if cut:
            if not calls:
                unattributed[keys[row]] = unattributed.get(keys[row], 0) + 1
                continue
            g = _group(groups, by, keys[row], calls[-1][0])
            g.calls += 1
            g.cut += 1
            continue
        for name, status in calls:
            g = _group(groups, by, keys[row], name)
            g.calls += 1
            g.malformed += status == "malformed"
            g.sizes.append(size)
    ordered = sorted(groups.values(), key=lambda g: tuple(sort_key(g.key[c]) for c in (*by, "tool")))
    for g in ordered:
        g.sizes.sort()
    result = ToolStatsResult(by=by, groups=ordered, target=target,
                             unattributed=[(dict(zip(by, k, strict=True)), n)
                                           for k, n in sorted(unattributed.items(),
                                                              key=lambda kv: tuple(map(sort_key, kv[0])))])
    if target is not None:
        result.budgets = _budgets(ordered, by, target) if "budget" in by else []
    return result


def _group(groups: dict[tuple[Any, ...], ToolGroup], by: Sequence[str], key: tuple[Any, ...], tool: str
           ) -> ToolGroup:
    g = groups.get((*key, tool))
    if g is None:
        g = groups[(*key, tool)] = ToolGroup(key={**dict(zip(by, key, strict=True)), "tool": tool})
    return g


def _budgets(groups: Sequence[ToolGroup], by: Sequence[str], target: float) -> list[ToolBudget]:
    rest = [*(c for c in by if c != "budget"), "tool"]
    series: dict[tuple[Any, ...], list[ToolGroup]] = {}
    for g in groups:
        series.setdefault(tuple(g.key[c] for c in rest), []).append(g)
    out = []
    for key, gs in series.items():
        point, low, high, rate, largest = tool_budget(
            ((g.key["budget"], g.calls, g.cut, g.sizes) for g in gs), target)
        out.append(ToolBudget(key=dict(zip(rest, key, strict=True)), target=target, budget=point,
                              budget_low=low, budget_high=high, rate=rate, largest=largest,
                              calls=sum(g.calls for g in gs), fits_no_budget=point is None))
    return out


def compute_tool_stats(run_dir: str | Path, by: Sequence[str] = (), target: float | None = None
                       ) -> ToolStatsResult:
    """Per-tool truncation of a run's committed episodes (`collector stats --per tool`).

    Empty `by` groups by model x budget, with provider first when the run has several.
    ConfigError for a `by` column that is not a scalar column or a target outside [0, 1].
    """
    by, default = requested_grouping(by, target)
    if target is not None and "budget" not in by:
        by = (*by, "budget")  # the per-tool budget is read off the sweep's cells
    table = read_columns(run_dir, sorted({*by, "turns", "messages"}))
    by = settled_grouping(table, by, default)
    return aggregate_tools(table, by, target)


# --- formatting ---------------------------------------------------------------------------


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:.1f}%"


def _tokens(x: float) -> str:
    return "-" if math.isnan(x) else str(int(x))


def _name(key: dict[str, Any]) -> str:
    return ", ".join(str(v) for v in key.values())


def budget_lines(budgets: Sequence[ToolBudget], target: float) -> list[str]:
    """The per-tool `--target` answer in words."""
    want = _pct(target)
    out = [f"target: calls cut at or under {want} of a tool's calls; the smallest budget that meets it "
           "(from the complete calls' sizes and the cuts, 95% interval):"]
    for b in budgets:
        if b.budget is None:
            out.append(f"  {_name(b.key)}: FITS NO BUDGET of the sweep (up to {b.largest}): "
                       f"more than {want} of its {b.calls} calls need more")
            continue
        high = str(b.budget_high) if b.budget_high is not None else f"above {b.largest}"
        out.append(f"  {_name(b.key)}: budget {b.budget} (estimated {_pct(b.rate)} cut), "
                   f"interval [{b.budget_low}, {high}]")
    return out


def _table(result: ToolStatsResult) -> str:
    headers = [*result.by, "tool", "calls", "cut", "95% CI", "malformed", "tokens p50", "p90", "p99", "max"]
    lines = []
    for g in result.groups:
        d = g.as_dict()
        low, high = g.truncation_interval
        ci = "-" if math.isnan(low) else f"[{100 * low:.1f}, {100 * high:.1f}]"
        lines.append([*(str(g.key[c]) for c in result.by), str(g.key["tool"]), str(g.calls),
                      _pct(g.truncation_rate), ci, str(g.malformed), _tokens(d["tokens_p50"]),
                      _tokens(d["tokens_p90"]), _tokens(d["tokens_p99"]), _tokens(d["tokens_max"])])
    out = aligned_lines(headers, lines, len(result.by) + 1)
    out.append("cut: the cut turn was writing a call to this tool (its name arrives before its arguments); "
               "tokens: output tokens of the turn of each complete call")
    if result.unattributed:
        counts = "; ".join(f"{_name(k) or 'all'}: {n}" for k, n in result.unattributed)
        out.append(f"cut turns with no recorded call (tool unknown: cut before a call began, "
                   f"a cut answer, or a wire that drops a cut call): {counts}")
    if result.target is not None:
        out.extend(budget_lines(result.budgets, result.target))
    return "\n".join(out)


def format_tool_stats(result: ToolStatsResult, fmt: StatsFormat = "table") -> str:
    """Render per-tool statistics as an aligned text table, CSV, or JSON (NaN: empty / null)."""
    if fmt == "table":
        return _table(result)
    head = {"by": list(result.by), "per": "tool",
            "unattributed": [{**k, "cut_turns": n} for k, n in result.unattributed]}
    return format_rows(result.rows(), result.columns(), fmt, head, result.target, result.budgets)

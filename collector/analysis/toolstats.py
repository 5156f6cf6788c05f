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
largest budget (its cut calls there say only that they need more, not how much). The rule is
`collector.analysis.toolbudget`'s.

Tests: tests/run/test_tool_truth.py, tests/analysis/test_callsizes.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
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
from collector.analysis.toolbudget import tool_budget

__all__ = [
    "ToolBudget",
    "ToolGroup",
    "ToolStatsResult",
    "TurnArrays",
    "aggregate_tools",
    "compute_tool_stats",
    "format_tool_stats",
    "quantile",
    "turn_fields",
]

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
class TurnArrays:
    """Every turn of an episode table, field by field (a turn also holds token ids and text
    that a Python copy of the whole struct would drag along): its episode's row, its index,
    whether it was cut (finish class `length`), its output tokens."""

    row: np.ndarray
    index: np.ndarray
    cut: np.ndarray
    tokens: np.ndarray


def turn_fields(table: pa.Table) -> TurnArrays:
    """The turns of `table` as `TurnArrays`."""
    turns = table.column("turns").combine_chunks()
    flat = pc.list_flatten(turns)
    cut = pc.fill_null(pc.equal(flat.field("finish_class"), "length"), False)
    return TurnArrays(row=pc.list_parent_indices(turns).to_numpy(zero_copy_only=False),
                      index=pc.fill_null(flat.field("index"), 0).to_numpy(zero_copy_only=False),
                      cut=cut.to_numpy(zero_copy_only=False),
                      tokens=pc.fill_null(flat.field("output_tokens"), 0).to_numpy(zero_copy_only=False))


def _recorded_calls(table: pa.Table) -> tuple[np.ndarray, np.ndarray, pa.Array, np.ndarray]:
    """Every call the assistant messages recorded, in order: its episode's row, its turn's
    index, its tool's name, whether its arguments were malformed."""
    messages = table.column("messages").combine_chunks()
    flat = pc.list_flatten(messages)
    assistant = pc.fill_null(pc.and_(pc.equal(flat.field("role"), "assistant"),
                                     pc.is_valid(flat.field("turn_index"))), False)
    owner = pc.list_parent_indices(messages).filter(assistant).to_numpy(zero_copy_only=False)
    kept = flat.filter(assistant)
    calls = kept.field("tool_calls")
    message_of = pc.list_parent_indices(calls).to_numpy(zero_copy_only=False)
    named = pc.list_flatten(calls)
    turn_index = kept.field("turn_index").to_numpy(zero_copy_only=False)
    malformed = pc.fill_null(pc.equal(named.field("status"), "malformed"), False)
    return (owner[message_of], turn_index[message_of], named.field("name"),
            malformed.to_numpy(zero_copy_only=False))


def aggregate_tools(table: pa.Table, by: Sequence[str], target: float | None = None) -> ToolStatsResult:
    """The per-tool statistics of an episode table (`by` columns, `turns`, `messages`).

    Vectorized: 100,000 episodes take about a second (bench/report.py), the Python work being
    per group, never per call."""
    by = tuple(by)
    if not table.num_rows:
        return ToolStatsResult(by=by, groups=[], target=target)
    keys = list(zip(*(table.column(c).to_pylist() for c in by), strict=True)) if by else [()] * table.num_rows
    distinct = {k: i for i, k in enumerate(dict.fromkeys(keys))}
    group_of_row = np.fromiter((distinct[k] for k in keys), dtype=np.int64, count=len(keys))
    turns = turn_fields(table)
    c_row, c_turn, c_name, c_malformed = _recorded_calls(table)
    # A turn's key, and each call's turn found by it (every recorded call has its turn).
    width = int(max(turns.index.max(initial=0), c_turn.max(initial=0))) + 1
    turn_key = turns.row.astype(np.int64) * width + turns.index
    order = np.argsort(turn_key, kind="stable")
    call_key = c_row.astype(np.int64) * width + c_turn
    at = order[np.minimum(np.searchsorted(turn_key, call_key, sorter=order), len(order) - 1)]
    known = turn_key[at] == call_key
    c_cut = turns.cut[at] & known
    c_tokens = turns.tokens[at]
    # The cut turn was writing its last recorded call; its earlier calls are left out.
    last = np.r_[call_key[1:] != call_key[:-1], True] if len(call_key) else np.zeros(0, dtype=bool)
    counted = known & (~c_cut | last)
    tools = pc.dictionary_encode(c_name)
    names = tools.dictionary.to_pylist() if len(c_name) else []
    codes = tools.indices.to_numpy(zero_copy_only=False) if len(c_name) else np.zeros(0, dtype=np.int64)
    combined = group_of_row[c_row] * max(len(names), 1) + codes
    combined, c_cut, c_tokens, c_malformed = (combined[counted], c_cut[counted], c_tokens[counted],
                                              c_malformed[counted])
    cells, inverse = np.unique(combined, return_inverse=True)
    calls = np.bincount(inverse, minlength=len(cells))
    cut = np.bincount(inverse, weights=c_cut, minlength=len(cells))
    malformed = np.bincount(inverse, weights=c_malformed & ~c_cut, minlength=len(cells))
    complete = ~c_cut
    by_cell = np.argsort(inverse[complete], kind="stable")
    sizes = np.split(c_tokens[complete][by_cell], np.cumsum(np.bincount(inverse[complete],
                                                                         minlength=len(cells)))[:-1])
    group_keys = list(distinct)
    groups = []
    for i, cell in enumerate(cells):
        g, tool = divmod(int(cell), max(len(names), 1))
        groups.append(ToolGroup(key={**dict(zip(by, group_keys[g], strict=True)), "tool": names[tool]},
                                calls=int(calls[i]), cut=int(cut[i]), malformed=int(malformed[i]),
                                sizes=sorted(int(x) for x in sizes[i])))
    # Cut turns with no recorded call: their tool cannot be known.
    recorded = np.unique(call_key)
    lost = turns.cut & ~np.isin(turn_key, recorded)
    lost_counts = np.bincount(group_of_row[turns.row[lost]], minlength=len(group_keys))
    unattributed = sorted(((dict(zip(by, group_keys[g], strict=True)), int(n))
                           for g, n in enumerate(lost_counts) if n),
                          key=lambda kv: tuple(map(sort_key, kv[0].values())))
    ordered = sorted(groups, key=lambda g: tuple(sort_key(g.key[c]) for c in (*by, "tool")))
    result = ToolStatsResult(by=by, groups=ordered, target=target, unattributed=unattributed)
    if target is not None:
        result.budgets = _budgets(ordered, by, target) if "budget" in by else []
    return result


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

"""Truncation statistics over a run: the table `collector stats` prints and the notebook plots.

Per group (model x budget by default, any scalar columns with `by`):

- ``episodes``: committed episodes in the group, errors included;
- ``truncation_rate`` with a Wilson 95% interval (``trunc_low``, ``trunc_high``): the share
  of episodes with at least one turn cut by the output cap (`is_truncated`, whether or not
  the cut ended the episode);
- ``thinking_cut_rate``: share of episodes with a turn whose cap was spent on reasoning (no
  text, no call: `LengthSignal.REASONING`), a part of the truncation rate; the table shows
  it as "thinking cut" when any occurred;
- ``malformed_rate``, ``done_rate``: shares ending as `malformed_tool_call` / `done`;
- ``error_rate``: share ending as `error`, over *all* episodes;
- ``mean_reward``; ``wasted_output_tokens`` (total spent on cut or discarded turns) and
  ``wasted_fraction`` of all output tokens;
- ``length_rate``, ``max_steps_rate``, ``timeout_rate``, ``context_overflow_rate``: the other
  stop reasons, so that the shares of every reason add up (the table shows a column for each
  one that occurs);
- ``retries`` and ``retries_<cause>`` (`429`, `5xx`, `timeout`, `dropped`, `other`): requests
  retried in the group's episodes, and ``errors``: episodes that ended as `error`. A rate
  measured through a provider storm says so.

With more than one provider in the run, the default grouping is provider x model x budget:
a sweep over providers is never pooled into one row. A sweep with a reasoning axis
(`sweep.reasoning`) adds ``reasoning`` to the default grouping the same way.

Why errors leave the other denominators: an `error` episode is the provider's or the
environment's failure, not the model's behaviour at that budget; one that failed on its
first call says nothing about truncation. So every behaviour rate and the mean reward are
over ``valid = episodes - errors``; the error rate is reported beside them so nothing hides.

Why Wilson: the rates that matter are small (a few percent truncation) on a few hundred
episodes, where the normal interval runs below zero and undercovers; Wilson's does neither
and is defined at 0 and n successes.

With a `target`, per model (per `by` group without `budget`): the smallest budget whose
truncation rate is at or under it (``budget``), and the smallest whose *upper* 95% bound is
(``budget_confident``), the one to pick when a surprise costs more than tokens. Every
format carries them: json as ``picks``, csv and Arrow as the columns ``target``,
``target_budget`` and ``target_budget_confident`` on each row of the group.

Speed: only the needed columns are read (`collector.analysis.committed.read_columns`: Arrow
shards memory-mapped in a few threads, a pyarrow dataset for Parquet or mixed schemas), and
one `group_by` over ``by + stop_reason`` does the counting in Arrow; Python only folds the
few resulting groups.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import pyarrow as pa
import pyarrow.compute as pc

# The readers moved to `committed`; other modules still import them from here.
from collector.analysis.committed import read_columns, read_committed, run_dataset, stored_columns
from collector.analysis.outside import CellTiming, causes_text, outside_by_cell, timing_text
from collector.errors import ConfigError
from collector.record.shards import SCHEMA
from collector.stop import StopReason

#: z for a two-sided 95% interval.
Z95 = 1.959963984540054

StatsFormat = Literal["table", "csv", "json"]

_MEASURES = ["is_truncated", "reward", "wasted_output_tokens", "output_tokens"]
#: Retry causes counted per group (`collector.providers.http.retry_cause`), in column order.
RETRY_CAUSES = ("429", "5xx", "timeout", "dropped", "abort", "other")
#: Stop reasons with a rate of their own beside truncated / malformed / done / error.
_OTHER_REASONS = (StopReason.LENGTH, StopReason.MAX_STEPS, StopReason.TIMEOUT, StopReason.CONTEXT_OVERFLOW)


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval for `successes` out of `n` (NaN, NaN when n is 0)."""
    if n <= 0:
        return math.nan, math.nan
    p = successes / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # At 0 and n successes the bounds are exactly 0 and 1; say so rather than 0.9999999999999999.
    low = 0.0 if successes <= 0 else max(0.0, centre - half)
    high = 1.0 if successes >= n else min(1.0, centre + half)
    return low, high


@dataclass(slots=True)
class GroupStats:
    """One row of the table: the `by` values in `key`, then the statistics."""

    key: dict[str, Any]
    episodes: int = 0
    valid: int = 0
    """Episodes that did not end in error: the denominator of every behaviour rate."""
    truncated: int = 0
    malformed: int = 0
    done: int = 0
    errors: int = 0
    reward_sum: float = 0.0
    wasted_output_tokens: int = 0
    output_tokens: int = 0
    thinking_cut: int = 0
    """Valid episodes with a turn whose cap was spent on reasoning (`LengthSignal.REASONING`)."""
    reasons: dict[str, int] = field(default_factory=dict)
    """Episodes per stop reason (errors included)."""
    retries: dict[str, int] = field(default_factory=dict)
    """Retried requests per cause (`RETRY_CAUSES`)."""
    error_causes: dict[str, int] = field(default_factory=dict)
    """`error` episodes per recorded cause (`error.type`: `collector.analysis.outside`)."""
    timing: CellTiming = field(default_factory=CellTiming)
    """Where the wall time went (`collector.analysis.outside`)."""

    def reason_rate(self, reason: StopReason) -> float:
        """Share of the valid episodes that ended with `reason`."""
        return self.reasons.get(reason.value, 0) / self.valid if self.valid else math.nan

    @property
    def retried(self) -> int:
        return sum(self.retries.values())

    @property
    def truncation_rate(self) -> float:
        return self.truncated / self.valid if self.valid else math.nan

    @property
    def truncation_interval(self) -> tuple[float, float]:
        return wilson_interval(self.truncated, self.valid)

    @property
    def thinking_cut_rate(self) -> float:
        return self.thinking_cut / self.valid if self.valid else math.nan

    @property
    def malformed_rate(self) -> float:
        return self.malformed / self.valid if self.valid else math.nan

    @property
    def done_rate(self) -> float:
        return self.done / self.valid if self.valid else math.nan

    @property
    def error_rate(self) -> float:
        return self.errors / self.episodes if self.episodes else math.nan

    @property
    def mean_reward(self) -> float:
        return self.reward_sum / self.valid if self.valid else math.nan

    @property
    def wasted_fraction(self) -> float:
        return self.wasted_output_tokens / self.output_tokens if self.output_tokens else math.nan

    def as_dict(self) -> dict[str, Any]:
        """The flat row: key columns, then every statistic (the csv/json/Arrow shape)."""
        low, high = self.truncation_interval
        return {
            **self.key,
            "episodes": self.episodes,
            "valid": self.valid,
            "truncated": self.truncated,
            "truncation_rate": self.truncation_rate,
            "trunc_low": low,
            "trunc_high": high,
            "thinking_cut_rate": self.thinking_cut_rate,
            "malformed_rate": self.malformed_rate,
            "done_rate": self.done_rate,
            "error_rate": self.error_rate,
            **{f"{r.value}_rate": self.reason_rate(r) for r in _OTHER_REASONS},
            "mean_reward": self.mean_reward,
            "wasted_output_tokens": self.wasted_output_tokens,
            "wasted_fraction": self.wasted_fraction,
            "errors": self.errors,
            "retries": self.retried,
            **{f"retries_{c}": self.retries.get(c, 0) for c in RETRY_CAUSES},
            "error_causes": causes_text(self.error_causes),
            **self.timing.as_dict(),
        }


@dataclass(slots=True)
class BudgetPick:
    """For one model (one `by` group without budget): the smallest budget meeting the target."""

    key: dict[str, Any]
    budget: int | None
    """Smallest budget whose truncation rate is at or under the target (None: none is)."""
    budget_confident: int | None
    """Smallest budget whose Wilson 95% upper bound is at or under the target."""
    budgets: list[int] = field(default_factory=list)
    """The budgets measured (with at least one valid episode), ascending."""
    best_budget: int | None = None
    """The budget with the lowest truncation rate (the largest among ties): what came closest."""
    best_rate: float = math.nan
    """The truncation rate at `best_budget`."""
    budget_rate: float = math.nan
    """The truncation rate measured at `budget`."""
    confident_upper: float = math.nan
    """The Wilson 95% upper bound at `budget_confident`."""


def rows_with_picks(groups: Sequence[Any], target: float | None, picks: Sequence[BudgetPick]
                    ) -> list[dict[str, Any]]:
    """`as_dict()` of each group (of episodes or of turns); with a target, each row carries the
    pick of the series its key belongs to (`target`, `target_budget`, `target_budget_confident`)."""
    rows: list[dict[str, Any]] = [g.as_dict() for g in groups]
    if target is None:
        return rows
    for g, row in zip(groups, rows, strict=True):
        pick = next((p for p in picks if all(g.key.get(k) == v for k, v in p.key.items())), None)
        row["target"] = target
        row["target_budget"] = pick.budget if pick is not None else None
        row["target_budget_confident"] = pick.budget_confident if pick is not None else None
    return rows


@dataclass(slots=True)
class StatsResult:
    """What `compute_stats` returns and `format_stats` prints."""

    by: tuple[str, ...]
    groups: list[GroupStats]
    target: float | None = None
    picks: list[BudgetPick] = field(default_factory=list)

    @property
    def episodes(self) -> int:
        return sum(g.episodes for g in self.groups)

    def rows(self) -> list[dict[str, Any]]:
        """One flat dict per group; with a target, each carries its own group's pick."""
        return rows_with_picks(self.groups, self.target, self.picks)

    def columns(self) -> list[str]:
        """The names of `rows()`' keys, also when there are no rows."""
        names = [*self.by, *GroupStats(key={}).as_dict()]
        if self.target is not None:
            names += ["target", "target_budget", "target_budget_confident"]
        return names

    def to_arrow(self) -> pa.Table:
        """The table as Arrow (for pandas, polars, the notebook)."""
        rows = self.rows()
        if rows:
            return pa.Table.from_pylist(rows)
        return pa.table({n: pa.array([], pa.float64()) for n in self.columns()})


def groupable_columns() -> list[str]:
    """Columns `by` may name: the scalar columns of the shard schema."""
    return [f.name for f in SCHEMA if not pa.types.is_nested(f.type)]




def requested_grouping(by: Sequence[str], target: float | None = None) -> tuple[tuple[str, ...], bool]:
    """The grouping a command asked for, checked, and whether it is the default: an empty `by`
    is provider x model x budget (`settled_grouping` drops provider for a one-provider run).
    ConfigError for a `by` column that is not a scalar shard column or a target outside [0, 1]."""
    default = not tuple(by)
    by = tuple(by) or ("provider", "model", "budget")
    allowed = groupable_columns()
    for c in by:
        if c not in allowed:
            raise ConfigError(f"cannot group by {c!r}; choose from {', '.join(allowed)}")
    if target is not None and not 0.0 <= target <= 1.0:
        raise ConfigError(f"target must be between 0 and 1 (got {target})")
    return by, default


def settled_grouping(table: pa.Table, by: tuple[str, ...], default: bool) -> tuple[str, ...]:
    """`by`, or model x budget when it is the default and the run holds one provider."""
    if default and pc.count_distinct(table.column("provider")).as_py() <= 1:
        return ("model", "budget")
    return by


def aggregate(table: pa.Table, by: Sequence[str], target: float | None = None) -> StatsResult:
    """The statistics of an episode table (any table with the shard columns `by` + measures)."""
    by = tuple(by)
    reasons = table.column("stop_reason")
    if not pa.types.is_dictionary(reasons.type):
        table = table.set_column(table.schema.get_field_index("stop_reason"), "stop_reason",
                                 reasons.cast(pa.string()).dictionary_encode())
    # Single-threaded: the tables are small, and pyarrow's threaded group-by fails ("thread
    # index N is out of range") in a process where something resized its CPU pool after
    # start-up, as Ray Data does when a notebook uses both.
    thinking = "thinking_cut" in table.column_names  # shards written before issue 16 lack it
    counted = table.group_by([*by, "stop_reason"], use_threads=False).aggregate(
        [([], "count_all"), ("is_truncated", "sum"), ("reward", "sum"),
         ("wasted_output_tokens", "sum"), ("output_tokens", "sum"),
         *([("thinking_cut", "sum")] if thinking else [])]
    )
    groups: dict[tuple[Any, ...], GroupStats] = {}
    for row in counted.to_pylist():
        key = tuple(row[c] for c in by)
        g = groups.get(key)
        if g is None:
            g = groups[key] = GroupStats(key=dict(zip(by, key, strict=True)))
        n = row["count_all"]
        reason = row["stop_reason"]
        g.episodes += n
        g.reasons[reason] = g.reasons.get(reason, 0) + n
        g.wasted_output_tokens += row["wasted_output_tokens_sum"] or 0
        g.output_tokens += row["output_tokens_sum"] or 0
        if reason == StopReason.ERROR:
            g.errors += n
            continue
        g.valid += n
        g.truncated += row["is_truncated_sum"] or 0
        g.thinking_cut += row.get("thinking_cut_sum") or 0
        g.reward_sum += row["reward_sum"] or 0.0
        if reason == StopReason.MALFORMED_TOOL_CALL:
            g.malformed += n
        elif reason == StopReason.DONE:
            g.done += n
    _count_retries(table, by, groups)
    for key, outside in outside_by_cell(table, by).items():
        g = groups.get(key)
        if g is not None:
            g.error_causes, g.timing = outside.error_causes, outside.timing
    ordered = sorted(groups.values(), key=lambda g: tuple(sort_key(g.key[c]) for c in by))
    result = StatsResult(by=by, groups=ordered, target=target)
    if target is not None:
        if "budget" in by:
            result.picks = pick_budgets(ordered, target, by)
        else:
            per_budget = aggregate(table, ("model", "budget"))
            result.picks = pick_budgets(per_budget.groups, target, ("model", "budget"))
    return result


def _count_retries(table: pa.Table, by: Sequence[str], groups: dict[tuple[Any, ...], GroupStats]) -> None:
    """Add the `retries` list column's causes to each group (a table without it adds nothing)."""
    if "retries" not in table.column_names:
        return
    retries = table.column("retries").combine_chunks()
    if len(retries) == 0 or retries.null_count == len(retries):
        return
    causes = pc.list_flatten(retries)
    if len(causes) == 0:
        return
    rows = pc.list_parent_indices(retries)
    flat = pa.table({c: pc.take(table.column(c), rows) for c in by}).append_column("cause", causes)
    counted = flat.group_by([*by, "cause"]).aggregate([([], "count_all")])
    for row in counted.to_pylist():
        g = groups.get(tuple(row[c] for c in by))
        if g is not None:
            cause = row["cause"] if row["cause"] in RETRY_CAUSES else "other"
            g.retries[cause] = g.retries.get(cause, 0) + row["count_all"]


def sort_key(value: Any) -> tuple[int, Any]:
    """Row order of a group value: None first, numbers numerically, everything else as text."""
    if value is None:
        return (0, "")
    if isinstance(value, int | float):
        return (1, value)
    return (2, str(value))


class Rated(Protocol):
    """A row `pick_budgets` can choose from: the episode table's or the per-turn table's."""

    @property
    def key(self) -> dict[str, Any]: ...
    @property
    def valid(self) -> int: ...
    @property
    def truncation_rate(self) -> float: ...
    @property
    def truncation_interval(self) -> tuple[float, float]: ...


def pick_budgets(groups: Sequence[Rated], target: float, by: Sequence[str]) -> list[BudgetPick]:
    """Per `by` group without budget: the smallest budget at or under `target` (point and upper bound)."""
    rest = [c for c in by if c != "budget"]
    per: dict[tuple[Any, ...], list[Rated]] = {}
    for g in groups:
        per.setdefault(tuple(g.key[c] for c in rest), []).append(g)
    picks = []
    for key, gs in per.items():
        gs = sorted((g for g in gs if g.valid), key=lambda g: g.key["budget"])
        point = next((g for g in gs if g.truncation_rate <= target), None)
        sure = next((g for g in gs if g.truncation_interval[1] <= target), None)
        best = min(reversed(gs), key=lambda g: g.truncation_rate, default=None)
        picks.append(BudgetPick(
            key=dict(zip(rest, key, strict=True)),
            budget=point.key["budget"] if point is not None else None,
            budget_confident=sure.key["budget"] if sure is not None else None,
            budgets=[g.key["budget"] for g in gs],
            best_budget=best.key["budget"] if best is not None else None,
            best_rate=best.truncation_rate if best is not None else math.nan,
            budget_rate=point.truncation_rate if point is not None else math.nan,
            confident_upper=sure.truncation_interval[1] if sure is not None else math.nan,
        ))
    return picks


def compute_stats(
    run_dir: str | Path, by: Sequence[str] = (), target: float | None = None
) -> StatsResult:
    """The statistics table of a run's committed episodes, grouped `by` scalar columns.

    Empty `by` is the default grouping: model x budget, with provider first when the run
    holds more than one provider (a provider sweep is never pooled).

    Raises ConfigError for a `by` column that is not a scalar shard column or a target
    outside [0, 1], OutputError when `run_dir` is not a run directory.
    """
    by, default = requested_grouping(by, target)
    wanted = sorted({*by, "stop_reason", *_MEASURES, *(("model", "budget") if target is not None else ())})
    axis = stored_columns(run_dir, "reasoning") if default else []
    extra = stored_columns(run_dir, "retries", "thinking_cut", "duration_s", "timing", "error")
    table = read_columns(run_dir, [*wanted, *extra, *axis])
    by = settled_grouping(table, by, default)
    if axis and pc.count_distinct(table.column("reasoning")).as_py() >= 1:
        by = (*by, "reasoning")  # a sweep over reasoning settings is never pooled either
    return aggregate(table, by, target)


# --- formatting ---------------------------------------------------------------------------


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:.1f}%"


def _num(x: float, digits: int = 3) -> str:
    return "-" if math.isnan(x) else f"{x:.{digits}f}"


def _retried(retries: dict[str, int]) -> str:
    total = sum(retries.values())
    if not total:
        return "0"
    return f"{total} (" + ", ".join(f"{c}: {retries[c]}" for c in RETRY_CAUSES if retries.get(c)) + ")"


def _table(result: StatsResult) -> str:
    # A column for every stop reason that occurs, so the shares visibly add up; retries only
    # when some request was retried (then per cell, by cause).
    extra = [r for r in _OTHER_REASONS if any(g.reasons.get(r.value) for g in result.groups)]
    retried = any(g.retried for g in result.groups)
    thinking = any(g.thinking_cut for g in result.groups)
    headers = [*result.by, "episodes", "truncated", "95% CI", *(["thinking cut"] if thinking else []),
               "malformed", "done",
               *(r.value for r in extra), "error", "reward", "wasted tok", "wasted",
               *(["retried"] if retried else [])]
    lines = []
    for g in result.groups:
        low, high = g.truncation_interval
        ci = "-" if math.isnan(low) else f"[{100 * low:.1f}, {100 * high:.1f}]"
        error = _pct(g.error_rate) + (f" ({g.errors})" if g.errors else "")
        lines.append([*(str(g.key[c]) for c in result.by), str(g.episodes), _pct(g.truncation_rate), ci,
                      *([_pct(g.thinking_cut_rate)] if thinking else []), _pct(g.malformed_rate),
                      _pct(g.done_rate), *(_pct(g.reason_rate(r)) for r in extra),
                      error, _num(g.mean_reward), str(g.wasted_output_tokens), _pct(g.wasted_fraction),
                      *([_retried(g.retries)] if retried else [])])
    widths = [max(len(h), *(len(r[i]) for r in lines)) if lines else len(h) for i, h in enumerate(headers)]
    nkeys = len(result.by)

    def fmt(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i < nkeys else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    out = [fmt(headers), fmt(["-" * w for w in widths]), *(fmt(r) for r in lines)]
    footer = f"{result.episodes} episodes; rates except error are over episodes that did not end in error"
    if retried:
        total: dict[str, int] = {}
        for g in result.groups:
            for cause, n in g.retries.items():
                total[cause] = total.get(cause, 0) + n
        footer += f"; {_retried(total).replace(' (', ' requests retried (', 1)}"
    out.append(footer)
    causes = [g for g in result.groups if g.error_causes]
    if causes:
        out.append("errors by cause:")
        out.extend(f"  {_name(g.key)}: {causes_text(g.error_causes)}" for g in causes)
    # The time block is for runs with a sandbox (an image per episode): elsewhere the table
    # stays a function of what the episodes did, not of how fast the machine was (the csv
    # and json carry the shares for every run).
    timed = [g for g in result.groups if g.timing.episodes]
    if any(g.timing.images_built or g.timing.images_cached for g in timed):
        out.append("time per episode (share of wall time; one episode at a time per worker):")
        out.extend(f"  {_name(g.key)}: {timing_text(g.timing)}" for g in timed)
    if result.target is not None:
        out.extend(target_lines(result.picks, result.target, "truncation", "episodes"))
    return "\n".join(out)


def _name(key: dict[str, Any]) -> str:
    return ", ".join(str(v) for v in key.values()) or "all"


def target_lines(picks: Sequence[BudgetPick], target: float, what: str, of: str,
                 label: Callable[[dict[str, Any]], str] = _name) -> list[str]:
    """The `--target` answer in words: what was asked, then per group what was found."""
    want = _pct(target)
    out = [f"target: {what} at or under {want} of {of}; the smallest budget that meets it:"]
    for p in picks:
        name = label(p.key)
        if p.budget is None:
            if not p.budgets:
                out.append(f"  {name}: no budget measured (no episode that did not end in error)")
                continue
            span = f"{p.budgets[0]} to {p.budgets[-1]}" if len(p.budgets) > 1 else str(p.budgets[0])
            out.append(f"  {name}: none of the {len(p.budgets)} budgets measured ({span}) meets {want}; "
                       f"the lowest {what} is {_pct(p.best_rate)}, at budget {p.best_budget}")
            continue
        found = f"  {name}: budget {p.budget} (measured {_pct(p.budget_rate)})"
        if p.budget_confident is None:
            found += (f"; none meets it with 95% confidence (every upper bound is above {want}: "
                      "more episodes per budget would narrow the interval)")
        else:
            found += (f"; with 95% confidence, budget {p.budget_confident} "
                      f"(upper bound {_pct(p.confident_upper)})")
        out.append(found)
    return out


def _clean(value: Any) -> Any:
    return None if isinstance(value, float) and math.isnan(value) else value


def format_stats(result: StatsResult, fmt: StatsFormat = "table") -> str:
    """Render a `StatsResult` as an aligned text table, CSV, or JSON (NaN becomes empty/null)."""
    if fmt == "table":
        return _table(result)
    return format_rows(result.rows(), result.columns(), fmt, {"by": list(result.by)},
                       result.target, result.picks)


def aligned_lines(headers: Sequence[str], lines: Sequence[Sequence[str]], nkeys: int) -> list[str]:
    """A text table: the header, a rule, the rows; the first `nkeys` columns left-aligned (the
    group's values), the rest right-aligned (numbers)."""
    widths = [max(len(h), *(len(r[i]) for r in lines)) if lines else len(h) for i, h in enumerate(headers)]

    def fmt(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i < nkeys else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    return [fmt(headers), fmt(["-" * w for w in widths]), *(fmt(r) for r in lines)]


def format_rows(
    rows: Sequence[dict[str, Any]], columns: Sequence[str], fmt: StatsFormat, head: dict[str, Any],
    target: float | None, picks: Sequence[Any],
) -> str:
    """CSV or JSON of a statistics table (NaN becomes empty / null): the one renderer of the
    per-episode and the per-turn tables. `head` leads the JSON object; `picks` are dataclasses."""
    clean = [{k: _clean(v) for k, v in r.items()} for r in rows]
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(columns), lineterminator="\n")
        writer.writeheader()
        writer.writerows(clean)
        return buf.getvalue().rstrip("\n")
    if fmt == "json":
        payload: dict[str, Any] = {**head, "rows": clean}
        if target is not None:
            payload["target"] = target
            payload["picks"] = [{k: _clean(v) for k, v in asdict(p).items()} for p in picks]
        return json.dumps(payload, indent=1)
    raise ConfigError(f"unknown stats format {fmt!r} (expected table, csv or json)")


__all__ = [
    "BudgetPick",
    "GroupStats",
    "StatsResult",
    "aggregate",
    "aligned_lines",
    "compute_stats",
    "format_rows",
    "format_stats",
    "groupable_columns",
    "pick_budgets",
    "read_columns",
    "read_committed",
    "requested_grouping",
    "rows_with_picks",
    "run_dataset",
    "settled_grouping",
    "sort_key",
    "target_lines",
    "wilson_interval",
]

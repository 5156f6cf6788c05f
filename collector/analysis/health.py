"""Group health: can a group-relative advantage (GRPO) learn anything from these episodes?

A *group* is the `samples_per_task` samples of one task in one cell (model x budget, with
provider and reasoning when the sweep has those axes): the episodes a group-relative
advantage compares with one another. A group whose samples all got the same reward has
zero variance and gives no gradient. `collector stats --groups` counts, per cell:

- ``groups``: groups with at least one committed episode;
- ``complete``: groups whose every sample (``samples_per_task``, from
  ``.collector/config.resolved.json``) is committed, whatever it ended as;
- ``graded_groups``: groups with at least one sample that is not an infrastructure failure;
- ``zero_variance``: graded groups whose graded samples all have the same reward;
- ``zero_variance_share``: the graded episodes in those groups over all graded episodes;
- ``zero_variance_cut``: zero-variance groups whose every graded sample ended cut
  (stop reason ``length`` or ``context_overflow``): no signal *because of* the budget;
- ``infra_failures``: episodes that ended as ``error`` or ``timeout``, and
  ``failed_groups``: groups with no graded sample at all.

Why infrastructure failures stay out: an ``error`` (the provider or the environment failed)
or ``timeout`` (the wall clock ran out) episode is stored with reward 0 but is not the
model's answer; counting it as a zero would invent variance (one failure in a group of
successes) or hide it. They are counted apart, never as rewards. Cut and malformed
episodes *are* the model's doing and count with their reward (0).

`health_findings` is `collector check --health`: hollow turns, identical samples at a
non-zero temperature, all-failure tasks, per-task cut-rate outliers, and a failure share
above a threshold, each finding naming its episode ids.

Tests: tests/analysis/test_health.py
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from collector.analysis.committed import read_columns, read_committed, stored_columns
from collector.analysis.regrade import annotated_table, resolved_run_config
from collector.analysis.source import Source
from collector.analysis.stats import StatsFormat, format_rows, groupable_columns, sort_key, wilson_interval
from collector.errors import ConfigError, OutputError
from collector.stop import StopReason
from collector.storage.manifest import RESOLVED_CONFIG

__all__ = [
    "CUT_REASONS",
    "INFRA_REASONS",
    "CellHealth",
    "Finding",
    "GroupHealthResult",
    "compute_group_health",
    "format_group_health",
    "health_findings",
    "resolved_run_config",
]

#: Stop reasons that are the infrastructure's failure, not the model's: kept out of rewards.
INFRA_REASONS = frozenset({StopReason.ERROR.value, StopReason.TIMEOUT.value})
#: Stop reasons of an episode a cut turn ended (reward 0 by the budget, not by the grader).
CUT_REASONS = frozenset({StopReason.LENGTH.value, StopReason.CONTEXT_OVERFLOW.value})


def _samples_per_task(run_dir: str | Path) -> int | None:
    value = resolved_run_config(run_dir).get("samples_per_task")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise OutputError(f"{Path(run_dir) / RESOLVED_CONFIG}: samples_per_task: not a positive integer "
                          f"(got {value!r:.40})")
    return value


def _cell_by(run_dir: str | Path, table: pa.Table, by: Sequence[str]) -> tuple[str, ...]:
    """The default cell of `collector stats` (provider when several, reasoning when swept)."""
    if by:
        return tuple(by)
    cells: tuple[str, ...] = ("model", "budget")
    if pc.count_distinct(table.column("provider")).as_py() > 1:
        cells = ("provider", *cells)
    # As `compute_stats`: a reasoning axis only when some episode has a setting (not all null).
    if "reasoning" in table.column_names and pc.count_distinct(table.column("reasoning")).as_py() >= 1:
        cells = (*cells, "reasoning")
    return cells


def _reward_table(run_dir: str | Path, columns: list[str], annotation: str | None) -> pa.Table:
    """The committed episodes' `columns`, with `reward` replaced by an annotation's when named."""
    return Source(Path(run_dir), None, annotation).read(sorted(set(columns)))


@dataclass(slots=True)
class CellHealth:
    """One cell's group statistics (see the module docstring for each count)."""

    key: dict[str, Any]
    samples_per_task: int | None = None
    groups: int = 0
    complete: int = 0
    graded_groups: int = 0
    graded_episodes: int = 0
    zero_variance: int = 0
    zero_variance_episodes: int = 0
    zero_variance_cut: int = 0
    infra_failures: int = 0
    failed_groups: int = 0

    @property
    def zero_variance_share(self) -> float:
        return self.zero_variance_episodes / self.graded_episodes if self.graded_episodes else math.nan

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.key,
            "samples_per_task": self.samples_per_task,
            "groups": self.groups,
            "complete": self.complete,
            "graded_groups": self.graded_groups,
            "graded_episodes": self.graded_episodes,
            "zero_variance": self.zero_variance,
            "zero_variance_share": self.zero_variance_share,
            "zero_variance_cut": self.zero_variance_cut,
            "infra_failures": self.infra_failures,
            "failed_groups": self.failed_groups,
        }


@dataclass(slots=True)
class GroupHealthResult:
    by: tuple[str, ...]
    cells: list[CellHealth]
    samples_per_task: int | None
    annotation: str | None = None

    def rows(self) -> list[dict[str, Any]]:
        return [c.as_dict() for c in self.cells]

    def columns(self) -> list[str]:
        return [*self.by, *CellHealth(key={}).as_dict()]


def compute_group_health(run_dir: str | Path, by: Sequence[str] = (), annotation: str | None = None
                         ) -> GroupHealthResult:
    """Per cell: groups, complete groups, zero-variance groups and why (module docstring).

    `annotation` names a regrade (`collector regrade --out NAME`) whose rewards replace the
    stored ones. Raises ConfigError for a `by` column that is not a scalar shard column.
    """
    allowed = groupable_columns()
    for c in by:
        if c not in allowed:
            raise ConfigError(f"cannot group by {c!r}; choose from {', '.join(allowed)}")
    spt = _samples_per_task(run_dir)
    extra = stored_columns(run_dir, "reasoning") if not by else []
    table = _reward_table(run_dir, ["provider", "model", "budget", "task_id", "sample", "stop_reason",
                                    "reward", "episode_id", *by, *extra], annotation)
    cells_by = _cell_by(run_dir, table, by)
    reasons = table.column("stop_reason").cast(pa.string())
    infra = pc.is_in(reasons, value_set=pa.array(sorted(INFRA_REASONS)))
    cut = pc.is_in(reasons, value_set=pa.array(sorted(CUT_REASONS)))
    graded = pc.invert(infra)
    # The graded reward only (null for an infrastructure failure), so min/max skip failures.
    reward = pc.if_else(graded, table.column("reward"), pa.scalar(None, pa.float64()))
    work = pa.table({
        **{c: table.column(c) for c in cells_by if c != "task_id"},
        "task_id": table.column("task_id"),
        "sample": table.column("sample"),
        "infra": pc.cast(infra, pa.int64()),
        "graded": pc.cast(graded, pa.int64()),
        "cut_graded": pc.cast(pc.and_(cut, graded), pa.int64()),
        "graded_reward": reward,
    })
    keys = [*(c for c in cells_by if c != "task_id"), "task_id"]
    counted = work.group_by(keys, use_threads=False).aggregate([
        ("sample", "count_distinct"), ("infra", "sum"), ("graded", "sum"), ("cut_graded", "sum"),
        ("graded_reward", "min"), ("graded_reward", "max"),
    ])
    cells: dict[tuple[Any, ...], CellHealth] = {}
    for row in counted.to_pylist():
        key = tuple(row[c] for c in cells_by)
        cell = cells.get(key)
        if cell is None:
            cell = cells[key] = CellHealth(key=dict(zip(cells_by, key, strict=True)), samples_per_task=spt)
        cell.groups += 1
        if spt is not None and row["sample_count_distinct"] >= spt:
            cell.complete += 1
        cell.infra_failures += row["infra_sum"]
        n = row["graded_sum"]
        if n == 0:
            cell.failed_groups += 1
            continue
        cell.graded_groups += 1
        cell.graded_episodes += n
        if row["graded_reward_min"] == row["graded_reward_max"]:
            cell.zero_variance += 1
            cell.zero_variance_episodes += n
            if row["cut_graded_sum"] == n:
                cell.zero_variance_cut += 1
    ordered = sorted(cells.values(), key=lambda c: tuple(sort_key(c.key[k]) for k in cells_by))
    return GroupHealthResult(by=cells_by, cells=ordered, samples_per_task=spt, annotation=annotation)


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:.1f}%"


def format_group_health(result: GroupHealthResult, fmt: StatsFormat = "table") -> str:
    """The group-health table as aligned text, CSV or JSON."""
    if fmt != "table":
        head = {"by": list(result.by), "samples_per_task": result.samples_per_task,
                "annotation": result.annotation}
        return format_rows(result.rows(), result.columns(), fmt, head, None, [])
    headers = [*result.by, "groups", "complete", "zero var", "zero-var share", "all cut", "infra fail",
               "failed groups"]
    lines = [[*(str(c.key[k]) for k in result.by), str(c.groups),
              str(c.complete) if c.samples_per_task is not None else "-",
              str(c.zero_variance), _pct(c.zero_variance_share), str(c.zero_variance_cut),
              str(c.infra_failures), str(c.failed_groups)] for c in result.cells]
    widths = [max(len(h), *(len(r[i]) for r in lines)) if lines else len(h) for i, h in enumerate(headers)]
    nkeys = len(result.by)

    def fmt_line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i < nkeys else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    spt = result.samples_per_task
    out = [fmt_line(headers), fmt_line(["-" * w for w in widths]), *(fmt_line(r) for r in lines)]
    out.append(f"groups: task x {' x '.join(result.by)}; {spt if spt is not None else 'unknown'} samples per "
               "task; zero var: every graded sample has the same reward (no group-relative signal); all cut: "
               "of those, every sample ended cut; error and timeout episodes are infra failures, "
               "kept out of the rewards"
               + (f"; rewards from annotation {result.annotation}" if result.annotation else ""))
    return "\n".join(out)


# --- collector check --health ---------------------------------------------------------------


@dataclass(slots=True)
class Finding:
    """One health finding: what, and the episodes that show it."""

    kind: str
    message: str
    episode_ids: list[str] = field(default_factory=list)

    #: Ids printed per finding; the rest are counted (the whole list is in `episode_ids`).
    SHOWN = 50

    def line(self) -> str:
        ids = self.episode_ids[: self.SHOWN]
        more = len(self.episode_ids) - len(ids)
        shown = ", ".join(ids) + (f" (+{more} more)" if more else "")
        return f"{self.kind}: {self.message}" + (f": {shown}" if shown else "")


#: Stop reasons of episodes whose every output is stored, so two samples can be compared.
_COMPARABLE = frozenset({StopReason.DONE.value, StopReason.MAX_STEPS.value})
#: Default `--max-failure-share`: above this share of error + timeout episodes, a cell is named.
MAX_FAILURE_SHARE = 0.05
#: A task's cut rate is an outlier when its Wilson lower bound exceeds the rest's rate by this.
OUTLIER_MARGIN = 0.25
#: Fewest graded episodes of a task before its cut rate is judged.
OUTLIER_MIN_EPISODES = 4


def _turn_texts(messages: list[dict[str, Any]] | None) -> dict[int, tuple[str, int]]:
    """Per turn index: the assistant text and the number of tool calls it made visible."""
    out: dict[int, tuple[str, int]] = {}
    for m in messages or []:
        if m.get("role") != "assistant" or m.get("turn_index") is None:
            continue
        text, calls = out.get(m["turn_index"], ("", 0))
        out[m["turn_index"]] = (text + (m.get("text") or ""), calls + len(m.get("tool_calls") or []))
    return out


def _hollow(turn: dict[str, Any], texts: dict[int, tuple[str, int]]) -> bool:
    """Output tokens were spent and nothing is visible: no text, no call, no reasoning.

    A cut turn is truncation, not hollowness (its tokens went somewhere the cap stopped), so
    discarded turns are left to the stats table.
    """
    if turn.get("discarded") or not turn.get("output_tokens"):
        return False
    text, calls = texts.get(turn["index"], ("", 0))
    if turn.get("invisible_output") and not text.strip():
        return True  # the loop saw nothing visible either
    return (not text.strip() and not calls and not turn.get("num_tool_calls")
            and not (turn.get("reasoning_text") or "").strip() and not turn.get("reasoning_tokens"))


def _fingerprint(messages: list[dict[str, Any]] | None) -> str:
    """What the model produced in an episode: its assistant texts and tool calls, in order."""
    parts = []
    for m in messages or []:
        if m.get("role") == "assistant":
            calls = [(c.get("name"), c.get("arguments_json")) for c in m.get("tool_calls") or []]
            parts.append(json.dumps([m.get("text") or "", calls]))
    return hashlib.blake2b("\x1e".join(parts).encode(), digest_size=16).hexdigest()


def _sampled(turns: list[dict[str, Any]] | None, default: float | None) -> bool:
    """True unless every turn asked for temperature 0 (None: the config's, then the server's
    default, which is non-zero on every provider we speak to)."""
    temps = [t.get("temperature") for t in turns or []]
    temps = [default if t is None else t for t in temps] or [default]
    return any(t is None or t > 0 for t in temps)


def health_findings(run_dir: str | Path, max_failure_share: float = MAX_FAILURE_SHARE) -> list[Finding]:
    """The health findings of a run's committed episodes (empty on a healthy run).

    Raises ConfigError when `max_failure_share` is outside [0, 1].
    """
    if not 0.0 <= max_failure_share <= 1.0:
        raise ConfigError(f"--max-failure-share must be between 0 and 1 (got {max_failure_share})")
    config = resolved_run_config(run_dir)
    default_temp = (config.get("sampling") or {}).get("temperature")
    cols = ["episode_id", "provider", "model", "budget", "task_id", "sample", "stop_reason",
            "is_truncated", "turns", "messages", *stored_columns(run_dir, "reasoning")]
    rows = read_committed(run_dir, cols).to_pylist()
    swept = "reasoning" in cols and any(r["reasoning"] is not None for r in rows)
    cell_cols = ["provider", "model", "budget", *(["reasoning"] if swept else [])]
    findings: list[Finding] = []

    hollow = [(r["episode_id"], t["index"]) for r in rows for t in (r["turns"] or [])
              if _hollow(t, _turn_texts(r["messages"]))]
    if hollow:
        ids = sorted({e for e, _ in hollow})
        findings.append(Finding("hollow turns", f"{len(hollow)} turn(s) in {len(ids)} episode(s) spent "
                                "output "
                                "tokens with nothing visible (no text, no tool call, no reasoning)", ids))

    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((*(r[c] for c in cell_cols), r["task_id"]), []).append(r)
    same: list[str] = []
    n_same = 0
    for members in groups.values():
        # Only episodes whose whole output is stored: a cut or malformed turn keeps no text
        # or arguments (only their length), so two cut samples would look alike falsely.
        graded = [r for r in members
                  if r["stop_reason"] in _COMPARABLE and _sampled(r["turns"], default_temp)]
        seen: dict[str, list[str]] = {}
        for r in graded:
            seen.setdefault(_fingerprint(r["messages"]), []).append(r["episode_id"])
        for ids in seen.values():
            if len(ids) > 1:
                n_same += 1
                same.extend(sorted(ids))
    if same:
        findings.append(Finding("identical samples", f"{n_same} set(s) of samples of one group produced the "
                                "same output at a non-zero temperature (a seed or cache ignoring the sample)",
                                same))

    per_task: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        per_task.setdefault(r["task_id"], []).append(r)
    for task, members in sorted(per_task.items()):
        if all(r["stop_reason"] in INFRA_REASONS for r in members):
            findings.append(Finding("all samples failed", f"task {task}: every one of its {len(members)} "
                                    "episode(s) ended as error or timeout",
                                    sorted(r["episode_id"] for r in members)))

    graded_rows = [r for r in rows if r["stop_reason"] not in INFRA_REASONS]
    total_cut = sum(1 for r in graded_rows if r["is_truncated"])
    for task, members in sorted(per_task.items()):
        mine = [r for r in members if r["stop_reason"] not in INFRA_REASONS]
        n = len(mine)
        others = len(graded_rows) - n
        if n < OUTLIER_MIN_EPISODES or not others:
            continue
        k = sum(1 for r in mine if r["is_truncated"])
        rest = (total_cut - k) / others
        low, _ = wilson_interval(k, n)
        if low - rest >= OUTLIER_MARGIN:
            findings.append(Finding("cut-rate outlier", f"task {task}: {k} of {n} episodes cut "
                                    f"({100 * k / n:.0f}%, 95% lower bound {100 * low:.0f}%) against "
                                    f"{100 * rest:.0f}% for the other tasks",
                                    sorted(r["episode_id"] for r in mine if r["is_truncated"])))

    cells: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        cells.setdefault(tuple(r[c] for c in cell_cols), []).append(r)
    for key in sorted(cells, key=lambda k: tuple(sort_key(v) for v in k)):
        members = cells[key]
        failed = [r for r in members if r["stop_reason"] in INFRA_REASONS]
        if failed and len(failed) / len(members) > max_failure_share:
            errors = sum(1 for r in failed if r["stop_reason"] == StopReason.ERROR.value)
            name = ", ".join(f"{c}={v}" for c, v in zip(cell_cols, key, strict=True))
            findings.append(Finding("failure share", f"{name}: {len(failed)} of {len(members)} episodes "
                                    f"({100 * len(failed) / len(members):.1f}%) are infrastructure failures "
                                    f"({errors} error, {len(failed) - errors} timeout), above "
                                    f"{100 * max_failure_share:g}%", sorted(r["episode_id"] for r in failed)))
    return findings


def failure_counts(run_dir: str | Path) -> str:
    """One line: infrastructure failures (error, timeout) apart from model failures (cut, malformed)."""
    reasons = read_columns(run_dir, ["stop_reason"]).column("stop_reason").cast(pa.string())
    counts = {r["values"]: r["counts"] for r in pc.value_counts(reasons).to_pylist()}
    infra = {r: counts.get(r, 0) for r in sorted(INFRA_REASONS)}
    model = {r: counts.get(r, 0) for r in (StopReason.LENGTH.value, StopReason.CONTEXT_OVERFLOW.value,
                                           StopReason.MALFORMED_TOOL_CALL.value)}
    return (f"infrastructure failures: {sum(infra.values())} ("
            + ", ".join(f"{k} {v}" for k, v in infra.items()) + "); model failures: "
            + f"{sum(model.values())} (" + ", ".join(f"{k} {v}" for k, v in model.items()) + ")")


def add_health(report: Any, run_dir: str | Path, max_failure_share: float = MAX_FAILURE_SHARE) -> None:
    """`collector check --health`: each finding a problem of `report` (a `CheckReport`), and the
    failure counts (infrastructure apart from the model's) a note."""
    if not report.ok:
        return  # damaged shards first: health over data that does not read would mislead
    for finding in health_findings(run_dir, max_failure_share):
        report.add(finding.line())
    report.notes.append(failure_counts(run_dir))


def stats_command(args: Any) -> int:
    """`collector stats --groups` and `collector stats --annotation NAME` (parsed `args`)."""
    from collector.analysis.stats import aggregate, compute_stats, format_stats

    by = tuple(dict.fromkeys(c.strip() for v in args.by or [] for c in v.split(",") if c.strip()))
    if args.groups:
        print(format_group_health(compute_group_health(args.run, by, args.annotation), args.format))
        return 0
    if args.per == "turn":
        raise ConfigError("--annotation: the per-turn table has no reward; use --per episode")
    plain = compute_stats(args.run, by=by, target=args.target)  # the default grouping, decided once
    table = annotated_table(args.run, args.annotation, plain.by)
    print(format_stats(aggregate(table, plain.by, args.target), args.format))
    return 0

"""A run from Python: load the committed episodes and compute the tables `collector stats` prints.

The shards are standard Arrow IPC (file format) or Parquet files, and the run dir holds
nothing else a reader could mistake for data (`collector.storage.manifest`), so any reader
opens the run dir itself (README, "Loading shards into a trainer"):

    pd.read_parquet(run)                                   # Parquet runs
    pl.scan_ipc(f"{run}/**/*.arrow", hive_partitioning=True)
    ds.dataset(run, format="ipc", partitioning="hive")     # format="parquet" (the default) for Parquet
    datasets.load_dataset("arrow", data_dir=run)           # "parquet" for Parquet

This module reads through the manifest instead, which adds what a glob cannot know (a
committed shard a crash left in ``.collector/tmp/`` until the next open moves it), and
the statistics exactly as `collector stats` computes them (`collector.analysis.stats`).

    from collector.analysis.tables import load_run, truncation_table
    table = load_run("runs/demo", columns=["model", "budget", "stop_reason", "reward"])
    df = truncation_table("runs/demo", target=0.05).to_pandas()
    tools = tool_truncation_table("runs/demo", target=0.05)   # per tool: cuts, call sizes, budgets
    tasks = task_truncation_table("runs/demo")                 # per task: rate, interval, clustered

A sweep over reasoning settings (`sweep.reasoning`) is split by the setting, never pooled:
`reasoning_grouping(episodes)` is ``("model", "budget", "reasoning")`` for a run with more
than one setting, ``("model", "budget")`` otherwise (what the notebook groups by).

Tests: tests/analysis/test_stats_tables.py, tests/analysis/test_analysis.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TypeAlias

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from collector.analysis.stats import aggregate, read_committed, run_dataset
from collector.analysis.turnstats import aggregate_turns
from collector.storage.manifest import committed_shard_paths
from collector.storage.mirror import resolve_run

__all__ = [
    "PARTITIONING",
    "committed_shard_paths",
    "load_analysis",
    "load_run",
    "reasoning_grouping",
    "run_dataset",
    "stop_reason_mix",
    "task_truncation_table",
    "tool_truncation_table",
    "truncation_table",
    "turn_truncation_table",
]

#: model: string, budget: int64, Hive flavour: the columns' types, for run dirs of the earlier
#: layout (``model=…/budget=…/`` directories); the current layout has no partition directories.
PARTITIONING = ds.partitioning(pa.schema([("model", pa.string()), ("budget", pa.int64())]), flavor="hive")

RunOrTable: TypeAlias = "str | Path | pa.Table"


def load_run(
    run_dir: str | Path, columns: Sequence[str] | None = None, filter: ds.Expression | None = None
) -> pa.Table:
    """The committed episodes of a run as one Arrow table (optionally some columns, a filter).

    `run_dir` is a run directory or ``s3://bucket/prefix`` (read through its synced local
    mirror, `collector.storage.mirror`). OutputError (one line naming the file) when a
    committed shard cannot be read.
    """
    return read_committed(resolve_run(run_dir), columns, filter)


#: The columns the truncation tables and the notebook's figures read.
ANALYSIS_COLUMNS = ("model", "budget", "stop_reason", "is_truncated", "reward", "wasted_output_tokens",
                    "output_tokens", "turns")
#: Columns newer shards add (issue 16's reasoning axis and thinking cut, the retry causes):
#: read where the run's shards hold them.
_NEWER_COLUMNS = ("reasoning", "thinking_cut", "retries")


def load_analysis(run_dir: str | Path) -> pa.Table:
    """The committed episodes with the columns the truncation tables and figures read
    (`ANALYSIS_COLUMNS`, and `reasoning`, `thinking_cut`, `retries` where the shards hold them)."""
    run_dir = resolve_run(run_dir)  # once, for the schema probe and the read below
    stored = set(run_dataset(run_dir).schema.names)
    return load_run(run_dir, columns=[*ANALYSIS_COLUMNS, *(c for c in _NEWER_COLUMNS if c in stored)])


def reasoning_grouping(source: RunOrTable, by: Sequence[str] = ("model", "budget")) -> tuple[str, ...]:
    """`by`, with ``reasoning`` added when the episodes hold more than one reasoning setting.

    Settings of one sweep cell are different experiments (the thinking shares the cap), so a
    table over them is split by the setting; a run with one setting or none keeps `by`.
    """
    if isinstance(source, pa.Table):
        if "reasoning" not in source.column_names:
            return tuple(by)
        column = source.column("reasoning")
    else:
        source = resolve_run(source)
        if "reasoning" not in run_dataset(source).schema.names:
            return tuple(by)
        column = load_run(source, columns=["reasoning"]).column("reasoning")
    settings = pc.count_distinct(column, mode="all").as_py()
    return (*by, "reasoning") if settings > 1 and "reasoning" not in by else tuple(by)


#: Episode columns added after runs existed: `collector stats` reads them where stored
#: (`collector.analysis.committed.stored_columns`), and so does every table here.
_LATER_COLUMNS = ("retries", "thinking_cut", "duration_s", "timing", "error")


def _table(source: RunOrTable, columns: Sequence[str]) -> pa.Table:
    if isinstance(source, pa.Table):
        return source
    source = resolve_run(source)  # once, for the schema probe and the read below
    # Columns a newer schema added are read only where the shards hold them.
    stored = run_dataset(source).schema.names
    columns = [c for c in columns if c not in _LATER_COLUMNS or c in stored]
    return load_run(source, columns=sorted(set(columns)))


def truncation_table(
    source: RunOrTable, by: Sequence[str] = ("model", "budget"), target: float | None = None
) -> pa.Table:
    """The `collector stats` table as Arrow: one row per `by` group, rates with Wilson 95% bounds.

    `source` is a run dir or an already loaded (and perhaps filtered) episode table.
    """
    needed = [*by, "stop_reason", "is_truncated", "reward", "wasted_output_tokens", "output_tokens",
              *_LATER_COLUMNS]
    return aggregate(_table(source, needed), by, target).to_arrow()


def turn_truncation_table(
    source: RunOrTable, by: Sequence[str] = ("model", "budget"), target: float | None = None
) -> pa.Table:
    """`collector stats --per turn` as Arrow: turns cut / turns per `by` group, by turn index
    (``turn_index``) and by kind (``turn_kind``: call or answer), with Wilson 95% bounds."""
    needed = [*by, "turns", *(("budget",) if target is not None else ())]
    return aggregate_turns(_table(source, needed), by, target).to_arrow()


def tool_truncation_table(
    source: RunOrTable, by: Sequence[str] = ("model", "budget"), target: float | None = None
) -> pa.Table:
    """`collector stats --per tool` as Arrow: per `by` group and tool, calls, cut calls (Wilson
    95% bounds), malformed calls, the complete calls' size quantiles; with a target, each row
    carries its tool's budget answer (`collector.analysis.toolstats`). `by` must hold budget
    for a target (the answer is read off the sweep's cells)."""
    from collector.analysis.toolstats import aggregate_tools

    return aggregate_tools(_table(source, [*by, "turns", "messages"]), by, target).to_arrow()


def task_truncation_table(source: RunOrTable, by: Sequence[str] = ("model", "budget")) -> pa.Table:
    """`collector stats --per task` as Arrow: every task's truncation rate per `by` group, with
    Wilson 95% bounds, its cell's rate and `clustered` (`collector.analysis.taskstats`)."""
    from collector.analysis.taskstats import aggregate_tasks

    return aggregate_tasks(_table(source, [*by, "task_id", "stop_reason", "is_truncated"]), by).to_arrow()


def stop_reason_mix(source: RunOrTable, by: Sequence[str] = ("model", "budget")) -> pa.Table:
    """Episodes per `by` group and stop reason, with each reason's share of its group."""
    table = _table(source, [*by, "stop_reason"])
    reasons = table.column("stop_reason")
    if pa.types.is_dictionary(reasons.type):
        table = table.set_column(table.schema.get_field_index("stop_reason"), "stop_reason",
                                 reasons.cast(pa.string()))
    # Single-threaded for the reason in collector.analysis.stats.aggregate.
    counts = table.group_by([*by, "stop_reason"], use_threads=False).aggregate([([], "count_all")])
    totals = counts.group_by(list(by), use_threads=False).aggregate([("count_all", "sum")])
    joined = counts.join(totals, keys=list(by))
    share = pc.divide(pc.cast(joined.column("count_all"), pa.float64()), joined.column("count_all_sum"))
    joined = joined.append_column("share", share).drop_columns(["count_all_sum"])
    joined = joined.rename_columns([*joined.column_names[:-2], "episodes", "share"])
    return joined.sort_by([(c, "ascending") for c in [*by, "stop_reason"]])

"""What the report shows, read from a run before any HTML is written (`collect`).

The statistics exactly as `collector stats --format json` computes them, the per-turn
statistics, the run's identity (manifest, resolved config, timing), `collector check`'s
verdict, errors by type per cell, and a sample of episodes per cell (cut ones first), read
column by column so a 100,000-episode run is read in seconds (bench/report.py).
`collector.analysis.report` draws the page from it.

Tests: tests/analysis/test_report.py.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from collector import __version__
from collector.analysis.check import check_run
from collector.analysis.committed import read_columns, stored_columns
from collector.analysis.report_tools import ToolReport, collect_tools
from collector.analysis.stats import StatsResult, compute_stats, format_stats, sort_key
from collector.analysis.turnstats import TurnStatsResult, compute_turn_stats
from collector.record.episode import Episode
from collector.record.shards import episode_from_row, read_shard
from collector.stop import StopReason
from collector.storage.manifest import RESOLVED_CONFIG, committed_shard_paths, read_manifest
from collector.storage.mirror import resolve_run

__all__ = ["DEFAULT_TARGET", "MAX_TEXT", "PER_CELL", "ReportData", "clip_strings", "collect"]

#: The target of the pick when none is given: the report is about choosing a budget.
DEFAULT_TARGET = 0.05
#: Episodes shown per cell (model x budget x setting): cut ones first.
PER_CELL = 4
#: At most this many transcripts in all, so a sweep of many cells stays a few MB.
MAX_TRANSCRIPTS = 400
#: Characters of one stored string a sampled episode keeps (a message, a call's arguments,
#: an error, a replayed call): the page shows no more of any, so no more is held in memory.
MAX_TEXT = 4000
_NOTE_ROOM = 64
"""Room for the note a clipped string ends with (so clipping twice changes nothing)."""

@dataclass(slots=True)
class ReportData:
    """What the page is drawn from (all of it read before any HTML is written)."""

    source: str
    stats: StatsResult
    stats_json: dict[str, Any]
    turns: TurnStatsResult
    identity: list[tuple[str, str]]
    check_ok: bool
    check_problems: int
    check_lines: list[str]
    errors: dict[tuple[Any, ...], dict[str, int]]
    """Per (model, budget) cell: error episodes by exception type."""
    sample: list[Episode]
    tools: ToolReport | None = None
    """The per-tool and per-task tables and the call-size curves (`collector.analysis.report_tools`)."""


def _cell(row: dict[str, Any], by: Sequence[str]) -> tuple[Any, ...]:
    return tuple(row.get(c) for c in by)


def _identity(root: Path, source: str, stats: StatsResult, base: pa.Table) -> list[tuple[str, str]]:
    manifest = read_manifest(root)
    try:
        resolved = json.loads((root / RESOLVED_CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        resolved = {}
    config = resolved.get("config") or {}
    models = sorted({str(m) for m in pc.unique(base.column("model")).to_pylist()})
    budgets = sorted({int(b) for b in pc.unique(base.column("budget")).to_pylist()})
    providers = sorted({str(p) for p in pc.unique(base.column("provider")).to_pylist()})
    seconds = float(pc.sum(base.column("duration_s")).as_py() or 0.0) if base.num_rows else 0.0
    created, updated = manifest.get("created"), manifest.get("updated")
    wall = "-"
    try:
        span = dt.datetime.fromisoformat(str(updated)) - dt.datetime.fromisoformat(str(created))
        wall = f"{span.total_seconds():.0f} s first open to last commit"
    except ValueError:
        pass
    rows = [
        ("run", source),
        ("name", str(config.get("name", "-"))),
        ("config fingerprint", str(manifest.get("fingerprint") or resolved.get("fingerprint") or "-")),
        ("models", ", ".join(models) or "-"),
        ("budgets", ", ".join(map(str, budgets)) or "-"),
        ("providers", ", ".join(providers) or "-"),
        ("created", str(created or "-")),
        ("last commit", str(updated or "-")),
        ("how long", f"{wall}; {seconds:.0f} s of episode time"),
        ("episodes", f"{stats.episodes}"),
        ("commits", str(manifest.get("log_through", "-"))),
        ("shards", f"{len(manifest.get('shards', []))} ({manifest.get('format', '?')})"),
        ("report", f"collector {__version__}"),
    ]
    if "reasoning" in stats.by:
        settings = sorted({str(g.key["reasoning"]) for g in stats.groups})
        rows.insert(6, ("reasoning settings", ", ".join(settings)))
    return rows


def _errors_by_type(base: pa.Table) -> dict[tuple[Any, ...], dict[str, int]]:
    if "error" not in base.column_names or not base.num_rows:
        return {}
    failed = base.filter(pc.equal(base.column("stop_reason").cast(pa.string()), StopReason.ERROR.value))
    out: dict[tuple[Any, ...], dict[str, int]] = defaultdict(dict)
    if not failed.num_rows:
        return out
    kinds = pc.fill_null(pc.struct_field(failed.column("error"), "type"), "unknown")
    table = pa.table({"model": failed.column("model"), "budget": failed.column("budget"), "kind": kinds})
    for row in table.group_by(["model", "budget", "kind"], use_threads=False).aggregate(
            [([], "count_all")]).to_pylist():
        out[(row["model"], row["budget"])][str(row["kind"])] = row["count_all"]
    return out


def _sample_ids(base: pa.Table, by: Sequence[str], per_cell: int) -> list[str]:
    """Per cell, `per_cell` episode ids: cut ones first, then other non-done endings, then done."""
    cols = {c: base.column(c).to_pylist() for c in {*by, "episode_id", "stop_reason", "is_truncated"}}
    cells: dict[tuple[Any, ...], list[tuple[int, str]]] = defaultdict(list)
    for i, eid in enumerate(cols["episode_id"]):
        key = tuple(cols[c][i] for c in by)
        reason = str(cols["stop_reason"][i])
        rank = 0 if cols["is_truncated"][i] else 2 if reason == StopReason.DONE.value else 1
        cells[key].append((rank, eid))
    chosen: list[str] = []
    for key in sorted(cells, key=lambda k: tuple(sort_key(v) for v in k)):
        ranked = sorted(cells[key])
        # Cut ones first, but keep one of another kind when there is one, for comparison.
        picks = ranked[:per_cell]
        if per_cell > 1 and all(r == 0 for r, _ in picks):
            other = next((p for p in ranked if p[0] != 0), None)
            if other is not None:
                picks = [*picks[:-1], other]
        chosen.extend(eid for _, eid in picks)
    return chosen[:MAX_TRANSCRIPTS]


def clip_strings(value: Any) -> Any:
    """`value` (a shard row as Python data) with every string over `MAX_TEXT` characters cut
    to `MAX_TEXT`, followed by a note of how many more there were."""
    if isinstance(value, str):
        if len(value) <= MAX_TEXT + _NOTE_ROOM:  # a clipped string is not clipped again
            return value
        return f"{value[:MAX_TEXT]} ... [{len(value) - MAX_TEXT} more chars not shown]"
    if isinstance(value, dict):
        return {k: clip_strings(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clip_strings(v) for v in value]
    return value


def _load_sample(root: Path, ids: Sequence[str]) -> list[Episode]:
    """The sampled episodes, reading in full only the shards that hold one.

    A shard's sampled rows are made Python one at a time and clipped at once
    (`clip_strings`), and the shard is let go before the next is read: a sample of episodes
    holding 900 KB tool-call arguments costs one shard and one episode's strings at a time,
    not the whole sample's (584 MB for 120 of them)."""
    wanted = set(ids)
    episodes: dict[str, Episode] = {}
    for path in committed_shard_paths(root):
        if not wanted:
            break
        column = read_shard(path, ["episode_id"]).column("episode_id")
        hits = pc.is_in(column, value_set=pa.array(sorted(wanted), column.type))
        if not pc.any(hits).as_py():
            continue
        rows = read_shard(path).filter(hits)
        for i in range(rows.num_rows):
            ep = episode_from_row(clip_strings(rows.slice(i, 1).to_pylist()[0]))
            episodes[ep.episode_id] = ep
            wanted.discard(ep.episode_id)
        del rows
    return [episodes[i] for i in ids if i in episodes]


def collect(run: str | Path, target: float | None = DEFAULT_TARGET, per_cell: int = PER_CELL,
            source: str | None = None) -> ReportData:
    """Read everything the page shows (`run`: a run dir or ``s3://bucket/prefix``)."""
    root = Path(resolve_run(run))
    stats = compute_stats(root, target=target)
    turns = compute_turn_stats(root)
    wanted = ["episode_id", "model", "budget", "provider", "stop_reason", "is_truncated", "duration_s",
              "error", *stored_columns(root, "reasoning")]
    base = read_columns(root, sorted(set(wanted)))
    report = check_run(root)
    lines = [*report.problems[:20], *(f"note: {n}" for n in report.notes[:10])]
    if len(report.problems) > 20:
        lines.append(f"... and {len(report.problems) - 20} more problems (run `collector check`)")
    sample_by = [c for c in stats.by if c in base.column_names]
    sample = _load_sample(root, _sample_ids(base, sample_by, per_cell))
    return ReportData(
        source=str(source if source is not None else run), stats=stats,
        stats_json=json.loads(format_stats(stats, "json")), turns=turns,
        identity=_identity(root, str(source if source is not None else run), stats, base),
        check_ok=report.ok, check_problems=len(report.problems), check_lines=lines,
        errors=_errors_by_type(base), sample=sample, tools=collect_tools(root, stats.by, target),
    )

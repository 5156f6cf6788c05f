"""What a tracker logs: the progress points during the run and the summary at its end.

Part of `collector.tracking` (tests: tests/system/tracking/test_end_to_end.py, which reads these
names back from both trackers).

Progress (`LiveFeed`, fed by the driver after each commit, so a point counts committed
episodes only, never one a rerun would run again). Metric names, the same in every tracker:

- `episodes/committed`: episodes in the run directory (earlier runs of the config included),
  also the step of every point; `episodes/planned`; `episodes/fraction` (committed / planned);
- `episodes/per_s`: episodes this run committed per second since it started;
- `stop_reason/<reason>`: episodes this run committed, per stop reason (`done`, `length`, ...);
- `cell/<model>/<budget>/episodes` and `cell/<model>/<budget>/truncation_rate`: per sweep cell,
  episodes committed by this run and the share of them (errors left out, as in `collector
  stats`) with a turn cut by the cap. A cell's rate firms up as its episodes land; with a
  provider or reasoning axis the cell is `cell/<provider>/<model>/<budget>/...` (the table at
  the end splits by every axis). Names keep letters, digits, `_ - . /`; anything else is `_`.

A point is logged on a commit at most every `tracking.log_interval_s`, and once at the end.

The summary (`build_summary`, at the end of the run, read back from the run directory like
`collector report` reads it: `collector.analysis.report_data.collect`): the truncation table
(`truncation_table`, exactly the rows of `collector stats --format json`, at the report's
target), a transcript sample (`transcripts`: cut episodes first, then other endings, up to
`tracking.transcripts` rows, each message cut to `TRANSCRIPT_CHARS`), the figures
(`figures/truncation_<model>.svg` and the whole report page `report.html`, every figure of
`collector report` in it), the final metrics (the last point and, per cell,
`final/<cell>/truncation_rate`, `trunc_low`, `trunc_high`) and the run directory.
"""

from __future__ import annotations

import math
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

from collector.analysis.report import render
from collector.analysis.report_data import DEFAULT_TARGET, ReportData, collect
from collector.analysis.svgplot import MODEL_COLOURS, Line, line_chart
from collector.record.episode import Episode
from collector.tracking.base import ProgressPoint, Summary, Table

__all__ = ["TRANSCRIPT_CHARS", "LiveFeed", "build_summary", "metric_name"]

#: Characters of one message kept in the transcript table (the report keeps 4,000 too).
TRANSCRIPT_CHARS = 4000
_UNSAFE = re.compile(r"[^A-Za-z0-9_\-. /]")


def metric_name(*parts: object) -> str:
    """A metric name both W&B and MLflow accept (MLflow allows only `[A-Za-z0-9_\\-. /]`)."""
    return "/".join(_UNSAFE.sub("_", str(p)) for p in parts)


class Committed(Protocol):
    """What the feed reads of a committed episode (an `Episode`, or a worker-written `Outcome`)."""

    @property
    def model(self) -> str: ...
    @property
    def budget(self) -> int: ...
    @property
    def provider(self) -> str: ...
    @property
    def stop_reason(self) -> Any: ...


class LiveFeed:
    """Counts committed episodes per stop reason and per cell; says when a point is due."""

    def __init__(self, planned: int, already: int, *, interval_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.planned = planned
        self.already = already
        self.committed = 0
        self.reasons: Counter[str] = Counter()
        self.cells: dict[tuple[str, ...], list[int]] = {}
        """Per cell: [episodes, valid (not error), truncated]."""
        self.axes: set[str] = set()
        self._interval = interval_s
        self._clock = clock
        self._start = clock()
        self._last = float("-inf")

    def add(self, episodes: Iterable[Committed]) -> None:
        for e in episodes:
            reason = str(e.stop_reason)
            self.committed += 1
            self.reasons[reason] += 1
            reasoning = getattr(e, "reasoning", None)
            key = (e.provider, e.model, str(e.budget), "" if reasoning is None else str(reasoning))
            cell = self.cells.setdefault(key, [0, 0, 0])
            cell[0] += 1
            if reason != "error":
                cell[1] += 1
                # An `Outcome` (worker-side writes) carries no turns: its stop reason says it.
                cut = getattr(e, "is_truncated", None)
                cell[2] += int(cut if cut is not None else reason == "length")

    def due(self) -> bool:
        """Whether a point should be logged now (at most one per interval)."""
        now = self._clock()
        if now - self._last < self._interval:
            return False
        self._last = now
        return True

    def _cell_name(self, key: tuple[str, ...]) -> list[str]:
        provider, model, budget, reasoning = key
        providers = {k[0] for k in self.cells}
        name = [provider] if len(providers) > 1 else []
        return [*name, model, budget, *([reasoning] if reasoning else [])]

    def point(self) -> ProgressPoint:
        total = self.already + self.committed
        elapsed = self._clock() - self._start
        metrics: dict[str, float] = {
            "episodes/committed": float(total),
            "episodes/planned": float(self.planned),
            "episodes/fraction": total / self.planned if self.planned else 1.0,
            "episodes/per_s": self.committed / elapsed if elapsed > 0 else 0.0,
        }
        for reason, n in sorted(self.reasons.items()):
            metrics[metric_name("stop_reason", reason)] = float(n)
        for key, (episodes, valid, cut) in sorted(self.cells.items()):
            name = self._cell_name(key)
            metrics[metric_name("cell", *name, "episodes")] = float(episodes)
            if valid:
                metrics[metric_name("cell", *name, "truncation_rate")] = cut / valid
        return ProgressPoint(total, metrics)


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and not (isinstance(x, float) and (math.isnan(x) or math.isinf(x)))


def _truncation_table(data: ReportData) -> Table:
    rows = data.stats_json.get("rows", [])
    columns = list(rows[0]) if rows else ["model", "budget"]
    return Table(columns, [[_cell(r.get(c)) for c in columns] for r in rows])


def _cell(value: Any) -> Any:
    """A table cell every tracker takes: scalars kept, NaN as None, anything else as JSON-ish text."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int | float):
        return value if _finite(value) else None
    return str(value)


def _transcript(ep: Episode) -> str:
    lines = []
    for m in ep.messages:
        text = m.text if len(m.text) <= TRANSCRIPT_CHARS else m.text[:TRANSCRIPT_CHARS] + " [...]"
        calls = "".join(f" -> {c.name}({(c.arguments_json or '')[:TRANSCRIPT_CHARS]})" for c in m.tool_calls)
        lines.append(f"{m.role}: {text}{calls}")
    return "\n".join(lines)


def _transcripts(sample: list[Episode], limit: int) -> Table:
    columns = ["episode_id", "provider", "model", "budget", "stop_reason", "reward", "turns", "transcript"]
    rows = [[e.episode_id, e.provider, e.model, e.budget, str(e.stop_reason), e.reward, len(e.turns),
             _transcript(e)] for e in sample[:limit]]
    return Table(columns, rows)


def _figures(data: ReportData) -> dict[str, str]:
    """Per model, the truncation rate with its Wilson band against the budget (as in the report)."""
    files: dict[str, str] = {}
    models = sorted({str(g.key.get("model")) for g in data.stats.groups})
    for i, model in enumerate(models):
        groups = sorted((g for g in data.stats.groups if str(g.key.get("model")) == model),
                        key=lambda g: int(g.key["budget"]))
        series: dict[str, list[Any]] = {}
        for g in groups:
            label = ", ".join(str(v) for k, v in g.key.items() if k not in ("model", "budget"))
            series.setdefault(label, []).append(g)
        budgets = sorted({int(g.key["budget"]) for g in groups})
        lines = [Line(f"{model} [{label}]" if label else model, MODEL_COLOURS[i % len(MODEL_COLOURS)],
                      [(g.key["budget"], g.truncation_rate) for g in gs], [g.truncation_interval for g in gs])
                 for label, gs in series.items()]
        svg = line_chart(f"Truncation rate, Wilson 95%: {model}", "share of episodes cut", budgets, lines,
                         top=1.0, hline=data.stats.target)
        files[f"figures/truncation_{metric_name(model).replace('/', '_')}.svg"] = svg
    return files


def build_summary(root: Path, run_dir: str, last: ProgressPoint, *, transcripts: int, status: str,
                  target: float = DEFAULT_TARGET) -> Summary:
    """The end-of-run summary of the run in `root` (a local directory or a synced mirror)."""
    data = collect(root, target, source=run_dir)
    metrics = dict(last.metrics)
    for row in data.stats_json.get("rows", []):
        key = [row[c] for c in ("provider", "model", "budget", "reasoning") if c in row]
        for column in ("truncation_rate", "trunc_low", "trunc_high"):
            if _finite(row.get(column)):
                metrics[metric_name("final", *key, column)] = float(row[column])
    files = {"report.html": render(data), **_figures(data)}
    tables = {"truncation_table": _truncation_table(data),
              "transcripts": _transcripts(data.sample, transcripts)}
    return Summary(metrics, tables, files, run_dir, status)

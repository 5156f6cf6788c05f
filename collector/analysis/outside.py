"""Per cell: the time episodes spend outside the model, and what their `error` episodes died of.

Time. Each episode records where its wall time (`duration_s`) went (`Episode.timing`): the
model's turns, the tools' execution, and for a sandboxed environment (`harbor`) the image
build (or the look-up of a cached image), the sandbox's start and stop, and the verifier.
Per cell the sums give shares of the wall time (`model_share`, `tools_share`,
`sandbox_share` = build + start + stop, `verifier_share`; the rest is the loop's own work),
the mean wall time of an episode, and `worker_hours_per_million`: the hours one worker
running one episode at a time would need for a million episodes at the measured mean
(divide by `ray.episodes_in_flight` for a worker that overlaps them). Images are counted as
built or cached. Shards written before the timing column hold none: their cells show no time. The table of
`collector stats` prints the time block for runs with a sandbox; csv, json and the report
carry the columns for every run.

Causes. An `error` episode's `error.type` is its cause: a provider's failure class
(`ProviderUnavailable`, ...), `EnvironmentFailure`, or a sandbox's typed cause
(`VerifierTimeout`, `ImageBuildFailed`, `SandboxStartFailed`, ...): `error_causes` counts them,
so infrastructure failures are told apart from one another and from the model.

Tests: tests/analysis/test_outside.py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

SECONDS_PER_HOUR = 3600.0


@dataclass(slots=True)
class CellTiming:
    """The summed time of a cell's episodes that recorded one."""

    episodes: int = 0
    wall_s: float = 0.0
    model_s: float = 0.0
    tools_s: float = 0.0
    sandbox_s: float = 0.0
    verifier_s: float = 0.0
    images_built: int = 0
    images_cached: int = 0

    def share(self, part: float) -> float:
        return part / self.wall_s if self.wall_s > 0 else math.nan

    @property
    def mean_episode_s(self) -> float:
        return self.wall_s / self.episodes if self.episodes else math.nan

    @property
    def worker_hours_per_million(self) -> float:
        return self.mean_episode_s * 1_000_000 / SECONDS_PER_HOUR

    def as_dict(self) -> dict[str, float | None]:
        """The cell's columns; None where no episode recorded its time (a run without a sandbox:
        unknown, not a number, so the table, JSON and equality comparisons treat it alike)."""
        values: dict[str, float] = {
            "mean_episode_s": self.mean_episode_s,
            "model_share": self.share(self.model_s),
            "tools_share": self.share(self.tools_s),
            "sandbox_share": self.share(self.sandbox_s),
            "verifier_share": self.share(self.verifier_s),
            "worker_hours_per_million": self.worker_hours_per_million,
        }
        known: dict[str, float | None] = {k: None if math.isnan(v) else v for k, v in values.items()}
        return {**known, "images_built": self.images_built, "images_cached": self.images_cached}


@dataclass(slots=True)
class Outside:
    """One cell's time outside the model and its error causes."""

    timing: CellTiming = field(default_factory=CellTiming)
    error_causes: dict[str, int] = field(default_factory=dict)


def outside_by_cell(table: pa.Table, by: Sequence[str]) -> dict[tuple[Any, ...], Outside]:
    """Per `by` key: the summed timing (rows with `timing`) and the error causes (`error.type`)."""
    cells: dict[tuple[Any, ...], Outside] = {}
    names = set(table.column_names)
    columns = [c for c in (*by, "stop_reason", "duration_s", "timing", "error") if c in names]
    for row in table.select(columns).to_pylist():
        cell = cells.setdefault(tuple(row.get(c) for c in by), Outside())
        error = row.get("error")
        if row.get("stop_reason") == "error" and error:
            cause = str(error.get("type") or "unknown")
            cell.error_causes[cause] = cell.error_causes.get(cause, 0) + 1
        timing = row.get("timing")
        if timing and row.get("duration_s") is not None:
            _add(cell.timing, row["duration_s"], timing)
    return cells


def _add(cell: CellTiming, wall_s: float, timing: Mapping[str, Any]) -> None:
    cell.episodes += 1
    cell.wall_s += wall_s
    cell.model_s += timing.get("model_s") or 0.0
    cell.tools_s += timing.get("tools_s") or 0.0
    sandbox = ("image_build_s", "sandbox_start_s", "sandbox_stop_s")
    cell.sandbox_s += sum(timing.get(k) or 0.0 for k in sandbox)
    cell.verifier_s += timing.get("verifier_s") or 0.0
    cached = timing.get("image_cached")
    if cached is True:
        cell.images_cached += 1
    elif cached is False:
        cell.images_built += 1


def causes_text(causes: Mapping[str, int]) -> str:
    """`VerifierTimeout 2, ImageBuildFailed 1`: most frequent first."""
    return ", ".join(f"{c} {n}" for c, n in sorted(causes.items(), key=lambda kv: (-kv[1], kv[0])))


def timing_text(t: CellTiming) -> str:
    """One cell's time in words, for the table's footer."""

    def pct(x: float) -> str:
        return "-" if math.isnan(x) else f"{100 * x:.1f}%"

    images = ""
    if t.images_built or t.images_cached:
        images = f" (images: {t.images_built} built, {t.images_cached} cached)"
    return (f"{t.mean_episode_s:.2f} s/episode: model {pct(t.share(t.model_s))}, "
            f"tools {pct(t.share(t.tools_s))}, "
            f"sandbox {pct(t.share(t.sandbox_s))}{images}, verifier {pct(t.share(t.verifier_s))}; "
            f"{t.worker_hours_per_million:,.1f} worker-hours per million episodes")

"""Experiment trackers: a run logged to Weights & Biases and/or MLflow as it is collected.

Opt-in (`[tracking.wandb]`, `[tracking.mlflow]` in the run config, or `--set
tracking.wandb.project=...`), each an extra (`pip install 'collector[wandb]'`,
`'collector[mlflow]'`, both: `'collector[tracking]'`). docs/tracking.md says what is logged.
Tests: tests/tracking (the fail-soft wrapper and the feed with fakes; one end-to-end run
through `collector run` into an offline W&B run and an MLflow file store, with planted
secrets searched for in every byte both wrote).

The job sees one object, `Tracking`: `check_tracking(cfg)` before any work (a configured
tracker whose package is missing is a config error naming the extra, not a tracker
failure), `start_tracking` once the run directory is open, `Tracking.committed` from the
driver after each commit (cheap: counting, and an enqueue when a point is due), and
`Tracking.finish` when the run ends, however it ends. Nothing of a tracker can fail the run
or make the driver wait (`collector.tracking.base.SoftTracker`); nothing secret reaches one
(`collector.tracking.scrub`). The trackers' modules (and their SDKs) are imported only when
configured: `import wandb` alone takes about a second.

Layout: `base` (the `Tracker` protocol, its payloads, the fail-soft wrapper), `scrub`,
`summary` (the metric names, the progress feed, the end-of-run summary), `wandb_tracker`,
`mlflow_tracker`.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from collector.config import RunConfig, resolved_config
from collector.errors import ConfigError
from collector.tracking.base import ProgressPoint, RunInfo, SoftTracker, Summary, Tracker
from collector.tracking.scrub import Scrubber, run_credentials
from collector.tracking.summary import Committed, LiveFeed, build_summary

__all__ = ["Tracking", "check_tracking", "configured_trackers", "start_tracking"]

#: Per tracker: the package it needs and the extra that installs it.
_PACKAGES = {"wandb": ("wandb", "wandb"), "mlflow": ("mlflow", "mlflow")}


def check_tracking(cfg: RunConfig) -> None:
    """A one-line ConfigError when a configured tracker's package is not installed."""
    for name in _configured(cfg):
        package, extra = _PACKAGES[name]
        if importlib.util.find_spec(package) is None:
            raise ConfigError(
                f"tracking.{name}: the {package!r} package is not installed; "
                f"pip install 'collector[{extra}]' (or remove [tracking.{name}] from the config)"
            )


def _configured(cfg: RunConfig) -> list[str]:
    return [name for name in ("wandb", "mlflow") if getattr(cfg.tracking, name) is not None]


def configured_trackers(cfg: RunConfig) -> list[Tracker]:
    """The trackers `cfg` asks for, not started (their SDKs are imported in `start`)."""
    trackers: list[Tracker] = []
    if cfg.tracking.wandb is not None:
        from collector.tracking.wandb_tracker import WandbTracker

        trackers.append(WandbTracker(cfg.tracking.wandb))
    if cfg.tracking.mlflow is not None:
        from collector.tracking.mlflow_tracker import MlflowTracker

        trackers.append(MlflowTracker(cfg.tracking.mlflow))
    return trackers


def _stderr_warning(line: str) -> None:
    print(f"warning: {line}", file=sys.stderr, flush=True)


class _OnceSummary:
    """The summary, built once by whichever tracker thread asks first (it reads the run)."""

    def __init__(self, build: Callable[[], Summary]) -> None:
        self._build = build
        self._lock = threading.Lock()
        self._done: Summary | BaseException | None = None

    def get(self) -> Summary:
        with self._lock:
            if self._done is None:
                try:
                    self._done = self._build()
                except BaseException as exc:  # noqa: BLE001 - every tracker waiting on it reports it
                    self._done = exc
        if isinstance(self._done, BaseException):
            raise self._done
        return self._done


class Tracking:
    """The run's trackers behind one interface for the job and the driver."""

    def __init__(self, cfg: RunConfig, trackers: Sequence[Tracker], *, run_id: str, run_dir: str,
                 planned: int, already: int, warn: Callable[[str], None] = _stderr_warning,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.scrub = Scrubber(run_credentials(cfg))
        self.warnings: list[str] = []
        self._warn = warn
        self.feed = LiveFeed(planned, already, interval_s=cfg.tracking.log_interval_s, clock=clock)
        self.trackers = [SoftTracker(t, call_timeout_s=cfg.tracking.call_timeout_s, warn=self._warning,
                                     clock=clock) for t in trackers]
        info = RunInfo(run_id, self.scrub.text(run_dir), self.scrub.value(resolved_config(cfg)))
        for soft in self.trackers:
            soft.submit(_start_call(info))

    def _warning(self, line: str) -> None:
        line = self.scrub.text(line)  # an SDK's message may name a URL with its credentials
        self.warnings.append(line)
        self._warn(line)

    def _point(self) -> ProgressPoint:
        point = self.feed.point()
        return ProgressPoint(point.step, self.scrub.value(point.metrics))

    def committed(self, episodes: Iterable[Committed]) -> None:
        """Count a commit's episodes; log a progress point when one is due."""
        self.feed.add(episodes)
        if self.feed.due():
            point = self._point()
            for soft in self.trackers:
                soft.submit(_progress_call(point))

    def finish(self, status: str = "finished") -> None:
        """Log the last point and the summary; wait at most `tracking.finish_timeout_s` in all."""
        point = self._point()
        once = _OnceSummary(lambda: self._summary(point, status))
        for soft in self.trackers:
            soft.submit(_progress_call(point))
        # Each tracker closes on its own thread; the wait is shared, not one timeout per tracker.
        def finish_call(t: Tracker) -> None:
            t.finish(once.get())

        closers = [threading.Thread(target=soft.close, args=(finish_call, self.cfg.tracking.finish_timeout_s),
                                    daemon=True)
                   for soft in self.trackers]
        for closer in closers:
            closer.start()
        for closer in closers:
            closer.join()

    def __enter__(self) -> Tracking:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        # The run's own exception (an error, Ctrl-C) goes on; the trackers log it as failed.
        self.finish("finished" if kind is None else "failed")

    def _summary(self, last: ProgressPoint, status: str) -> Summary:
        from collector.storage.mirror import resolve_run

        root = Path(resolve_run(self.run_dir))
        summary = build_summary(root, self.run_dir, last, transcripts=self.cfg.tracking.transcripts,
                                status=status)
        return Summary(self.scrub.value(summary.metrics),
                       {k: type(t)(self.scrub.value(t.columns), self.scrub.value(t.rows))
                        for k, t in summary.tables.items()},
                       {self.scrub.text(k): self.scrub.text(v) for k, v in summary.files.items()},
                       self.scrub.text(summary.run_dir), status)


def _start_call(info: RunInfo) -> Callable[[Tracker], None]:
    def call(t: Tracker) -> None:
        t.start(info)

    return call


def _progress_call(point: ProgressPoint) -> Callable[[Tracker], None]:
    def call(t: Tracker) -> None:
        t.progress(point)

    return call


def start_tracking(cfg: RunConfig, *, run_id: str, run_dir: str, planned: int,
                   already: int) -> Tracking | None:
    """The configured trackers, started in the background; None when the config names none."""
    trackers = configured_trackers(cfg)
    if not trackers:
        return None
    return Tracking(cfg, trackers, run_id=run_id, run_dir=run_dir, planned=planned, already=already)

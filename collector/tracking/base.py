"""What a tracker is, what it is handed, and the fail-soft wrapper every tracker runs behind.

Part of `collector.tracking` (tests: tests/tracking/test_softtracker.py).

A `Tracker` is a sink with three calls: `start` (the run's identity and resolved config),
`progress` (a `ProgressPoint` now and then during the run) and `finish` (the end-of-run
`Summary`: tables, figures, the run directory). Everything it is handed is plain data,
already scrubbed of secrets (`collector.tracking.scrub`), so a tracker is only a translation
into one service's API (`collector.tracking.wandb_tracker`, `collector.tracking.mlflow_tracker`).

Fail-soft (`SoftTracker`). A tracker is a guest in the run: the episodes are the point, and
an unreachable server, a full disk under the tracker's own files or a bug in a tracker's SDK
must not cost one. So each tracker runs on its own daemon thread behind a bounded queue:
the driver only enqueues (never waits on a tracker in its commit path), a full queue drops
the point (progress points are cumulative snapshots: a dropped one loses resolution, not
counts), and the first exception a tracker raises, or a call still running after
`tracking.call_timeout_s`, prints one warning and disables that tracker for the rest of the
run. The end of a run waits for the summary at most `tracking.finish_timeout_s`. A hung
tracker's thread is abandoned (a daemon: it never holds the process open).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["QUEUE_SIZE", "ProgressPoint", "RunInfo", "SoftTracker", "Summary", "Table", "Tracker"]

#: Calls queued per tracker before new progress points are dropped: a tracker this far behind
#: is slow, and the driver must not wait for it.
QUEUE_SIZE = 32


@dataclass(frozen=True, slots=True)
class RunInfo:
    """Who the run is: handed to `Tracker.start`."""

    run_id: str
    """The collector's run id (`name-fingerprint`): the tracker run's default name."""
    run_dir: str
    """The run directory, or its ``s3://`` URI: where the episodes are."""
    config: dict[str, Any]
    """The resolved config, as `config.resolved.json` stores it (no key, no URL credentials)."""


@dataclass(frozen=True, slots=True)
class ProgressPoint:
    """Where the run is: every value cumulative, so any point may be dropped."""

    step: int
    """Episodes committed so far, earlier runs of the same config included (the x axis)."""
    metrics: dict[str, float]
    """`collector.tracking.summary` documents the names."""


@dataclass(frozen=True, slots=True)
class Table:
    """A table as columns and rows (what every tracker's table type is built from)."""

    columns: list[str]
    rows: list[list[Any]]


@dataclass(frozen=True, slots=True)
class Summary:
    """The end of a run: what `Tracker.finish` logs."""

    metrics: dict[str, float]
    """The last progress point's values and the final per-cell rates."""
    tables: dict[str, Table]
    """`truncation_table` (as `collector stats --format json`) and `transcripts` (a sample)."""
    files: dict[str, str] = field(default_factory=dict)
    """Text artifacts by relative path: `report.html` and the figures (`figures/*.svg`)."""
    run_dir: str = ""
    status: str = "finished"
    """`finished`, or `failed` when the run ended on an error or a signal."""


class Tracker(Protocol):
    """One experiment tracker. Calls arrive in order on one thread: start, progress..., finish."""

    name: str

    def start(self, run: RunInfo) -> None: ...
    def progress(self, point: ProgressPoint) -> None: ...
    def finish(self, summary: Summary) -> None: ...


Call = Callable[[Tracker], None]
_STOP = object()


class SoftTracker:
    """A tracker on its own thread: `submit` never blocks, a failure disables it with one warning.

    `warn` receives the one line (already prefixed with the tracker's name); `clock` is
    injectable so the hang test needs no sleep.
    """

    def __init__(self, tracker: Tracker, *, call_timeout_s: float, warn: Callable[[str], None],
                 clock: Callable[[], float] = time.monotonic, queue_size: int = QUEUE_SIZE) -> None:
        self.tracker = tracker
        self.name = tracker.name
        self._timeout = call_timeout_s
        self._warn = warn
        self._clock = clock
        self._queue: queue.Queue[object] = queue.Queue(maxsize=queue_size)
        self._lock = threading.Lock()
        self._busy_since: float | None = None
        self.failed: str | None = None
        """Why the tracker was disabled (the warning's reason), or None while it works."""
        self.dropped = 0
        """Calls dropped because the queue was full."""
        self._thread = threading.Thread(target=self._work, name=f"tracker-{self.name}", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while True:
            call = self._queue.get()
            if call is _STOP or self.failed is not None:
                return
            assert callable(call)
            self._busy_since = self._clock()
            try:
                call(self.tracker)
            except BaseException as exc:  # noqa: BLE001 - any failure of a guest disables it, never the run
                reason = str(exc).splitlines()[0] if str(exc) else ""
                self.fail(f"{type(exc).__name__}: {reason}" if reason else type(exc).__name__)
                return
            finally:
                self._busy_since = None

    def fail(self, reason: str) -> None:
        """Disable the tracker with one warning (later failures are not reported again)."""
        with self._lock:
            if self.failed is not None:
                return
            self.failed = reason
        self._warn(f"tracker {self.name}: {reason}; the run goes on without it")

    def _check_hung(self) -> None:
        since = self._busy_since
        if since is not None and self._clock() - since > self._timeout:
            self.fail(f"a call took longer than tracking.call_timeout_s = {self._timeout:g}s")

    def submit(self, call: Call) -> None:
        """Queue `call` for the tracker's thread; dropped when the queue is full or the tracker is off."""
        self._check_hung()
        if self.failed is not None:
            return
        try:
            self._queue.put_nowait(call)
        except queue.Full:
            self.dropped += 1

    def close(self, call: Call | None, timeout_s: float) -> None:
        """Queue `call` (the summary) and wait at most `timeout_s` for everything queued to be done."""
        self._check_hung()
        if self.failed is not None:
            return
        deadline = self._clock() + timeout_s
        for item in ((call, _STOP) if call is not None else (_STOP,)):
            try:
                self._queue.put(item, timeout=max(0.0, deadline - self._clock()))
            except queue.Full:
                break
        self._thread.join(max(0.0, deadline - self._clock()))
        if self._thread.is_alive():
            self.fail(f"it did not finish within tracking.finish_timeout_s = {timeout_s:g}s")

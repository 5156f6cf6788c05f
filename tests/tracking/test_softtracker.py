"""The fail-soft wrapper: a tracker that raises or hangs warns once, is disabled, and never blocks the caller.

Tests for `collector.tracking.base.SoftTracker`, with fake trackers (no W&B or MLflow import).
A hang is a call blocked on a `threading.Event`; time passing is an injected clock, never a
sleep, and the test waits only on events the tracker's thread sets.
"""

from __future__ import annotations

import threading

from collector.tracking.base import ProgressPoint, RunInfo, SoftTracker, Summary, Tracker

WAIT_S = 10.0  # an upper bound on waits for another thread's event, never reached when it works
INFO = RunInfo("run-abc", "/runs/run-abc", {"name": "run"})


def _point(step: int) -> ProgressPoint:
    return ProgressPoint(step, {"episodes/committed": float(step)})


def _progress(point: ProgressPoint):  # type: ignore[no-untyped-def]
    return lambda t: t.progress(point)


class Raising:
    """Raises on every call; counts how many calls reached it."""

    name = "raising"

    def __init__(self) -> None:
        self.calls = 0
        self.raised = threading.Event()

    def _boom(self) -> None:
        self.calls += 1
        self.raised.set()
        raise RuntimeError("server unreachable\nsecond line of the SDK's traceback text")

    def start(self, run: RunInfo) -> None:
        self._boom()

    def progress(self, point: ProgressPoint) -> None:
        self._boom()

    def finish(self, summary: Summary) -> None:
        self._boom()


class Blocking:
    """`progress` blocks until released (a hung SDK call); records what reached it."""

    name = "blocking"

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.points: list[int] = []

    def start(self, run: RunInfo) -> None:
        pass

    def progress(self, point: ProgressPoint) -> None:
        self.points.append(point.step)
        self.entered.set()
        self.release.wait(WAIT_S)

    def finish(self, summary: Summary) -> None:
        pass


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _soft(tracker: Tracker, warnings: list[str], clock: Clock | None = None, **kw: object) -> SoftTracker:
    return SoftTracker(tracker, call_timeout_s=5.0, warn=warnings.append, clock=clock or Clock(), **kw)  # type: ignore[arg-type]


def test_a_raising_tracker_warns_once_and_is_disabled() -> None:
    tracker, warnings = Raising(), []
    soft = _soft(tracker, warnings)
    soft.submit(lambda t: t.start(INFO))
    assert tracker.raised.wait(WAIT_S)
    soft._thread.join(WAIT_S)  # the worker stops after the failure
    assert not soft._thread.is_alive()
    for step in range(1, 50):
        soft.submit(_progress(_point(step)))  # returns at once: nothing is queued any more
    soft.close(lambda t: t.finish(Summary({}, {})), timeout_s=1.0)
    assert tracker.calls == 1
    assert warnings == ["tracker raising: RuntimeError: server unreachable; the run goes on without it"]
    assert soft.failed == "RuntimeError: server unreachable"
    assert soft._queue.empty()


def test_a_hung_call_is_abandoned_after_call_timeout_and_the_caller_never_blocks() -> None:
    tracker, warnings, clock = Blocking(), [], Clock()
    soft = _soft(tracker, warnings, clock, queue_size=2)
    try:
        soft.submit(_progress(_point(1)))
        assert tracker.entered.wait(WAIT_S)  # the call is in flight, and hangs
        clock.now = 4.0  # within call_timeout_s = 5: still trusted; the queue takes two more
        soft.submit(_progress(_point(2)))
        soft.submit(_progress(_point(3)))
        soft.submit(_progress(_point(4)))  # full: dropped, not waited for
        assert warnings == []
        assert soft.dropped == 1
        clock.now = 5.5  # past call_timeout_s: the next submit finds it hung
        soft.submit(_progress(_point(5)))
        soft.submit(_progress(_point(6)))
        soft.close(lambda t: t.finish(Summary({}, {})), timeout_s=WAIT_S)  # returns at once: disabled
        assert warnings == ["tracker blocking: a call took longer than tracking.call_timeout_s = 5s; "
                            "the run goes on without it"]
        assert soft.dropped == 1  # after the warning nothing is even queued
        assert tracker.release.is_set() is False  # everything above ran while the call still hung
    finally:
        tracker.release.set()
    soft._thread.join(WAIT_S)
    assert tracker.points == [1]  # the queued points were never delivered to a disabled tracker


def test_a_full_queue_drops_progress_points_without_blocking() -> None:
    tracker, warnings = Blocking(), []
    soft = _soft(tracker, warnings, queue_size=3)
    try:
        soft.submit(_progress(_point(0)))
        assert tracker.entered.wait(WAIT_S)
        for step in range(1, 11):
            soft.submit(_progress(_point(step)))  # 3 queued, 7 dropped; none waits
        assert soft.dropped == 7
        assert soft._queue.qsize() == 3
        assert warnings == []
        assert soft.failed is None
    finally:
        tracker.release.set()
    soft.close(None, timeout_s=WAIT_S)
    assert tracker.points == [0, 1, 2, 3]
    assert warnings == []

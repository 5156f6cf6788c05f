"""The worker pool as the driver loop sees it: a small interface, so the loop is plain code.

`collector.run.cluster.RayPool` is the real one (Ray actors around `EpisodeWorker`); the
driver's tests use a fake (tests/run/fakepool.py: tests/run/test_driver_loop.py,
test_driver_buffer.py, test_driver_written.py) that needs no Ray and no patching. Actors
and calls are opaque to the driver: it only keeps them, compares them and hands them back.

A call's `result` either returns what the worker returned, or raises one of two errors
that the driver treats differently: `WorkerFailed` (our own code raised inside the worker:
a bug or a config problem, the run stops) and `WorkerLost` (the actor or its node died:
its batch is run again on a replacement).

Tests: tests/run/test_driver_loop.py (the fake pool of tests/run/fakepool.py).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Protocol

from collector.run.encoded import EncodedBatch
from collector.run.plan import WorkItem
from collector.run.worker import WorkerSetup
from collector.run.worker_writes import WrittenBatch

__all__ = ["Actor", "Call", "WorkerFailed", "WorkerLost", "WorkerPool"]

#: A worker actor's handle, as the pool gives it out.
Actor = Hashable
#: An outstanding call on an actor (its result is read once, by `WorkerPool.result`).
Call = Hashable


class WorkerFailed(Exception):
    """Our own code raised inside the worker; `cause` is what it raised."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.cause = cause


class WorkerLost(Exception):
    """The worker (or its node) is gone; `kind` names how the pool learned it."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


class WorkerPool(Protocol):
    """What the driver loop asks of the workers."""

    def cpus(self) -> tuple[float, float]:
        """The cluster's CPUs, and those of its largest live node (for the fit check)."""
        ...

    def alive_nodes(self) -> set[str]:
        """Ids of the nodes alive now (empty when it cannot be told)."""
        ...

    def start(self, setup: WorkerSetup, num_cpus: float) -> tuple[Actor, Call]:
        """Create a worker; return it and its pending `ready()` call."""
        ...

    def run(self, actor: Actor, items: list[WorkItem], write: bool) -> Call:
        """Hand the worker a batch: it returns an `EncodedBatch`, or with `write` a `WrittenBatch`."""
        ...

    def poll(self, actor: Actor) -> Call:
        """Ask the worker how many episodes it has finished, per stop reason."""
        ...

    def wait(self, calls: Sequence[Call], timeout_s: float) -> list[Call]:
        """The calls that are done: block until the first is (at most `timeout_s`), then take
        every other one that is done already."""
        ...

    def result(self, call: Call) -> object:
        """What a done call returned; raises `WorkerFailed` or `WorkerLost`."""
        ...

    def kill(self, actor: Actor) -> None:
        """End the actor now (best effort: it may be gone already)."""
        ...

    def close(self, actor: Actor, started: bool) -> None:
        """End the actor at the end of the run: let a started one close its clients first."""
        ...

    def with_logs(self, message: str) -> str:
        """`message` with a hint where the workers' logs are."""
        ...


def batch_of(reply: object) -> EncodedBatch | WrittenBatch:
    """A `run` call's result, checked to be what a worker returns."""
    assert isinstance(reply, EncodedBatch | WrittenBatch), f"a worker returned {type(reply).__name__}"
    return reply

"""The worker pool as the job and the driver loop see it: a small interface, so both are plain code.

Two ship with the package: `collector.run.cluster.RayPool` (Ray actors around `EpisodeWorker`,
the default) and `collector.run.inprocess.InProcessPool` (the same workers on event-loop
threads of the driver's process, no Ray: `ray.pool = "in_process"`, and the suite's default
tier). The driver's unit tests use a fake (tests/run/fakepool.py) whose calls are scripted.
A pool opens what its workers need for the run itself (`session`: Ray's connection or
embedded cluster), so the job runs whichever pool it is given. Actors and calls are opaque
to the driver: it only keeps them, compares them and hands them back.

A call's `result` either returns what the worker returned, or raises one of two errors
that the driver treats differently: `WorkerFailed` (our own code raised inside the worker:
a bug or a config problem, the run stops) and `WorkerLost` (the actor or its node died:
its batch is run again on a replacement).

Tests: tests/run/test_driver_loop.py (the fake pool of tests/run/fakepool.py).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

from collector.config import RunConfig
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
    """What the job and the driver loop ask of the workers."""

    def address(self, cli_address: str | None, cfg: RunConfig) -> str | None:
        """The cluster the run's workers join (`--address` given as `cli_address`, else the
        config's), or None when they run on this machine. A one-line ConfigError for an address
        or setting this pool cannot use. Called before anything is opened."""
        ...

    def session(self, cfg: RunConfig, address: str | None) -> AbstractContextManager[None]:
        """Open what the workers need (Ray: join `address` or start an embedded cluster) for
        the life of the run, and close what it opened."""
        ...

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

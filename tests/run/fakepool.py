"""A `WorkerPool` without Ray, for the driver loop's tests: the seam `collector.run.pool` defines.

Every call is done at once unless a test holds it (`hold`); a batch's reply is the episodes
of its items (built with `tests.record.factory`, carrying the items' ids), or what the test
scripted for its first item (`script`): a `WrittenBatch`, a list of episodes (encoded as a
real worker returns them: `collector.run.encoded`), or an
exception (`WorkerLost`, `WorkerFailed`) raised when the driver reads the result.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Hashable, Iterable, Sequence
from pathlib import Path
from typing import Any

from collector.config import RunConfig
from collector.record.episode import Episode
from collector.run.commits import CommitTarget
from collector.run.driver import Driver, JobResult
from collector.run.encoded import encode_batch
from collector.run.plan import WorkItem
from collector.run.worker import WorkerSetup
from collector.storage.pending import ShardSink
from tests.record.factory import make_episode


def item(episode_id: str, model: str = "m", budget: int = 64, sample: int = 0) -> WorkItem:
    return WorkItem(episode_id, model, budget, 0, "t0", sample, 0)


def episode_of(work: WorkItem) -> Episode:
    """The episode a healthy worker returns for `work` (its id, model and budget)."""
    return dataclasses.replace(make_episode(model=work.model, budget=work.budget, sample=work.sample),
                               episode_id=work.episode_id)


class FakePool:
    """Workers are numbers; calls are numbers whose results are computed when made."""

    def __init__(self, cpus: tuple[float, float] = (2.0, 2.0)) -> None:
        self._cpus = cpus
        self._next = 0
        self._results: dict[Hashable, object] = {}
        self.script: dict[str, object] = {}
        """Reply (or exception) for the next batch whose first item has this episode id."""
        self.held: set[Hashable] = set()
        """Calls not done yet (released by removing them)."""
        self.hold = False
        """While true, new batch calls are held."""
        self.batches: list[tuple[Hashable, list[WorkItem]]] = []
        """(actor, items) of every batch handed out, in order."""
        self.killed: list[Hashable] = []
        self.closed: list[Hashable] = []
        self.finished: Counter[Hashable] = Counter()
        self.polls = 0
        """`poll` calls made (the progress line's Ray calls)."""

    def _call(self, result: object) -> int:
        self._next += 1
        self._results[self._next] = result
        return self._next

    def cpus(self) -> tuple[float, float]:
        return self._cpus

    def alive_nodes(self) -> set[str]:
        return {"node"}

    def start(self, setup: WorkerSetup, num_cpus: float) -> tuple[Hashable, Hashable]:
        self._next += 1
        actor = f"actor{self._next}"
        return actor, self._call(setup.name)

    def run(self, actor: Hashable, items: list[WorkItem], write: bool) -> Hashable:
        self.batches.append((actor, items))
        scripted = self.script.pop(items[0].episode_id, None)  # once: a re-run goes normally
        reply = scripted if scripted is not None else [episode_of(i) for i in items]
        if isinstance(reply, list):
            # Episodes come back as a real worker returns them: encoded rows.
            self.finished[actor] += len(reply)
            reply = encode_batch(reply)
        call = self._call(reply)
        if self.hold:
            self.held.add(call)
        return call

    def poll(self, actor: Hashable) -> Hashable:
        self.polls += 1
        return self._call({"done": self.finished[actor]})

    def wait(self, calls: Sequence[Hashable], timeout_s: float) -> list[Hashable]:
        return [c for c in calls if c not in self.held]

    def result(self, call: Hashable) -> object:
        reply = self._results.pop(call)
        if isinstance(reply, BaseException):
            raise reply
        return reply

    def kill(self, actor: Hashable) -> None:
        self.killed.append(actor)

    def close(self, actor: Hashable, started: bool) -> None:
        self.closed.append(actor)

    def with_logs(self, message: str) -> str:
        return f"{message} (fake logs)"


def fake_driver(cfg: RunConfig, store: CommitTarget, pool: FakePool, todo: Iterable[WorkItem] = (),
                sink: ShardSink | None = None, planned: int = 100, **kwargs: Any) -> Driver:
    """A driver over `pool` with its workers started (every `ready()` answered at once)."""
    result = JobResult(Path(cfg.output.path), "r", planned, 0)
    driver = Driver(cfg, result, pool, store, todo, setup=WorkerSetup(cfg, "r", (), sink=sink), **kwargs)
    driver.start_workers()
    return driver


def deliver(driver: Driver, pool: FakePool, replies: Sequence[object]) -> None:
    """Hand the driver `replies` as the results of batches just come back, collected in order."""
    items = []
    for reply in replies:
        work = item(f"call-{pool._next}-{len(items)}")
        pool.script[work.episode_id] = reply
        items.append(work)
    driver.queue.put_back(items)
    driver.fill()
    for call in pool.wait(list(driver.inflight), 0):
        driver.collect(call)

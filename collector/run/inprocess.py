"""A worker pool without Ray: real `EpisodeWorker`s, each on an event-loop thread of this process.

The same seam as `collector.run.cluster.RayPool` (`collector.run.pool.WorkerPool`), so a run
through it takes the same path from plan to commit: the driver loop, its commit policy,
resume by set difference, duplicate drops, batch deadlines and worker replacement. Only
where the workers live differs. What it is for:

- small sweeps, notebooks and checking a new environment (`ray.pool = "in_process"`, or
  `collector run --in-process`): no cluster to start, so a run of a few episodes takes the
  time of its episodes, not Ray's start-up (BENCHMARKS.md section p);
- the suite's default tier: job and driver tests whose subject is the job's logic, not a
  process, run here in one process, as httpx ships `MockTransport`.

A run directory written through either pool is the same (`ray.*` is not part of the run's
identity) and resumes through either.

What a thread is not. Every worker shares this process's GIL, so the workers' CPU adds up to
at most one core: for throughput, use Ray. A worker that is killed (`kill`, or a batch past
its deadline) has its tasks cancelled and its clients closed, but a synchronous tool already
running on a thread cannot be stopped from outside: it runs to its end, its result unused.

Fault hooks, for tests of the guarantees (a worker's death, a frozen worker), each landing on
an event, never on a delay: `on_batch` sees every batch as it is handed out; `kill` ends a
worker as a lost actor (its pending calls raise `WorkerLost`); `freeze` blocks a worker's
event loop, as SIGSTOP does a process, until `thaw` or `kill`.

Tests: tests/run/test_inprocess_pool.py (and every job test of the default tier).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import math
import pickle
import threading
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import Any

from collector.config import RunConfig
from collector.errors import ConfigError
from collector.run.plan import WorkItem
from collector.run.pool import Actor, Call, WorkerFailed, WorkerLost
from collector.run.worker import EpisodeWorker, WorkerSetup

__all__ = ["InProcessPool", "InProcessWorker"]

#: How long a worker may take to close its clients at the end of the run (as on Ray).
CLOSE_TIMEOUT_S = 5.0
#: How long `kill` waits for a worker's thread to finish cancelling its tasks.
STOP_TIMEOUT_S = 5.0
#: The one node every in-process worker runs on (the driver's node-loss check sees it stay).
NODE = "in-process"


class InProcessWorker:
    """One worker: an `EpisodeWorker` built and run on its own event loop, on its own thread."""

    _numbers = itertools.count(1)

    def __init__(self, setup: WorkerSetup) -> None:
        # A copy through pickle, as Ray hands an actor its arguments: the worker owns its
        # setup, and a setup that could not cross to a Ray worker fails here too.
        self.setup: WorkerSetup = pickle.loads(pickle.dumps(setup))
        self.name = setup.name
        self.worker: EpisodeWorker | None = None
        self.dead = False
        self._calls: set[concurrent.futures.Future[Any]] = set()
        self._thawed = threading.Event()
        self._thawed.set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._serve, name=f"collector-worker-{setup.name}-{next(self._numbers)}", daemon=True
        )
        self._thread.start()

    def __repr__(self) -> str:
        return f"InProcessWorker({self.name!r}{', dead' if self.dead else ''})"

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    def submit(self, work: Callable[[], Coroutine[Any, Any, Any]]) -> concurrent.futures.Future[Any]:
        """Run `work()` on the worker's loop; its future is a call of the pool."""
        if self.dead:
            lost: concurrent.futures.Future[Any] = concurrent.futures.Future()
            lost.set_exception(WorkerLost("worker killed"))
            return lost
        future = asyncio.run_coroutine_threadsafe(work(), self._loop)
        self._calls.add(future)
        future.add_done_callback(self._calls.discard)
        return future

    async def ready(self) -> str:
        # Built on its own loop, as a Ray actor is built in its own process.
        if self.worker is None:
            self.worker = EpisodeWorker(self.setup)
        return await self.worker.ready()

    def freeze(self) -> None:
        """Block the worker's event loop (no episode of it moves) until `thaw` or `kill`."""
        if self.dead or not self._thawed.is_set():
            return
        self._thawed.clear()
        self._loop.call_soon_threadsafe(self._thawed.wait)

    def thaw(self) -> None:
        self._thawed.set()

    def stop(self, close_timeout_s: float | None) -> None:
        """End the worker: cancel its pending calls (they raise `WorkerLost`), close its
        clients (within `close_timeout_s`, unless None), stop its loop, join its thread."""
        if self.dead:
            return
        self.dead = True
        self._thawed.set()
        for call in list(self._calls):
            call.cancel()
        if close_timeout_s is not None and self.worker is not None:
            closing = asyncio.run_coroutine_threadsafe(self._close_all(), self._loop)
            with contextlib.suppress(Exception):  # best effort, as a dying actor's sockets close with it
                closing.result(timeout=close_timeout_s)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=STOP_TIMEOUT_S)

    async def _close_all(self) -> None:
        current = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert self.worker is not None
        await self.worker.close()


class InProcessPool:
    """`collector.run.pool.WorkerPool` over `InProcessWorker`s (module docstring)."""

    def __init__(self, on_batch: Callable[[InProcessWorker, list[WorkItem]], None] | None = None) -> None:
        self.on_batch = on_batch
        """Called in the driver's thread with every batch as it is handed to a worker."""
        self.workers: list[InProcessWorker] = []
        """Every worker started, in order, replacements included."""

    # --- the run's session -------------------------------------------------------------

    def address(self, cli_address: str | None, cfg: RunConfig) -> str | None:
        """None: the workers are on this machine. A cluster address cannot apply here, and one
        given on purpose (`--address`, `ray.address`) is refused rather than ignored;
        `RAY_ADDRESS` in the environment is for Ray runs and is left alone."""
        given = cli_address or cfg.ray.address
        if given:
            where = "--address" if cli_address else "ray.address"
            raise ConfigError(
                f"{where} = {given}: ray.pool = \"in_process\" runs every worker in this process and "
                "joins no cluster; drop the address or use ray.pool = \"ray\""
            )
        return None

    @contextlib.contextmanager
    def session(self, cfg: RunConfig, address: str | None) -> Iterator[None]:
        """Nothing to connect to; every worker left is stopped, its clients closed, when it ends."""
        try:
            yield
        finally:
            for worker in self.workers:
                worker.stop(close_timeout_s=STOP_TIMEOUT_S)

    # --- the WorkerPool protocol ---------------------------------------------------------

    def cpus(self) -> tuple[float, float]:
        # Threads reserve no CPUs: any number of workers fits (they share one core's worth).
        return math.inf, math.inf

    def alive_nodes(self) -> set[str]:
        return {NODE}

    def start(self, setup: WorkerSetup, num_cpus: float) -> tuple[Actor, Call]:
        worker = InProcessWorker(setup)
        self.workers.append(worker)
        return worker, worker.submit(worker.ready)

    def run(self, actor: Actor, items: list[WorkItem], write: bool) -> Call:
        worker = _worker(actor)
        if self.on_batch is not None:
            self.on_batch(worker, items)

        async def batch() -> object:
            assert worker.worker is not None, "a batch was sent before the worker was ready"
            if write:
                return await worker.worker.write_batch(items)
            return await worker.worker.encode_batch(items)

        return worker.submit(batch)

    def poll(self, actor: Actor) -> Call:
        worker = _worker(actor)

        async def finished() -> dict[str, int]:
            return dict(worker.worker.finished) if worker.worker is not None else {}

        return worker.submit(finished)

    def wait(self, calls: Sequence[Call], timeout_s: float) -> list[Call]:
        futures = [_future(call) for call in calls]
        if not futures:
            return []
        concurrent.futures.wait(futures, timeout=timeout_s, return_when=concurrent.futures.FIRST_COMPLETED)
        return [call for call, future in zip(calls, futures, strict=True) if future.done()]

    def result(self, call: Call) -> object:
        future = _future(call)
        try:
            return future.result(timeout=0)
        except concurrent.futures.CancelledError:
            raise WorkerLost("worker killed") from None
        except WorkerLost:
            raise
        except Exception as exc:  # noqa: BLE001 - whatever the worker's code raised is its failure
            raise WorkerFailed(exc) from None

    def kill(self, actor: Actor) -> None:
        _worker(actor).stop(close_timeout_s=STOP_TIMEOUT_S)

    def close(self, actor: Actor, started: bool) -> None:
        worker = _worker(actor)
        if started and not worker.dead and worker.worker is not None:
            closing = worker.submit(worker.worker.close)
            with contextlib.suppress(Exception):  # best effort: the run's result is already safe
                closing.result(timeout=CLOSE_TIMEOUT_S)
        worker.stop(close_timeout_s=CLOSE_TIMEOUT_S)

    def with_logs(self, message: str) -> str:
        return message  # the workers log to this process's stderr

    # --- fault hooks ---------------------------------------------------------------------

    def freeze(self, actor: Actor) -> None:
        """Block a worker's event loop (a SIGSTOPped worker) until `thaw` or `kill`."""
        _worker(actor).freeze()

    def thaw(self, actor: Actor) -> None:
        _worker(actor).thaw()


def _worker(actor: Actor) -> InProcessWorker:
    assert isinstance(actor, InProcessWorker), f"not an in-process worker: {actor!r}"
    return actor


def _future(call: Call) -> concurrent.futures.Future[Any]:
    assert isinstance(call, concurrent.futures.Future), f"not an in-process call: {call!r}"
    return call

"""The collection job: the driver, and the Ray actor around `EpisodeWorker`.

This is the only module that imports `ray`. The episode loop stays plain asyncio; Ray only
carries batches of small `WorkItem`s out and lists of `Episode`s back (one actor call per
batch, never per model call: runtime-notes measured 2-2.5 ms of CPU per Ray call).

The driver, in order:
1. plans the run (`collector.run.plan`): every work item with its deterministic episode id;
2. opens the run directory (`collector.storage.local.RunStore`), which refuses a directory written
   by another config, and subtracts the ids already committed (resume). A run with nothing
   left to do ends here, without starting Ray;
3. starts the simulator if the provider is "sim", connects to Ray (embedded local cluster
   unless an address is given), checks that the cluster has CPUs for `workers x
   cpus_per_worker` (Ray would otherwise wait forever to place an actor), creates the
   worker actors and waits, at most `ray.start_timeout_s`, until each is ready: keys
   present, base URL reachable, environment built. A problem there is one line, before any
   episode runs;
4. keeps every ready worker busy: each has a few batches outstanding, refilled as batches
   return. A worker still starting (a replacement) gets no batch until it is ready;
5. buffers returned episodes per (model, budget) cell, the store's partition, and commits
   a cell (`RunStore.commit`) once it holds `rows_per_shard` episodes, so shards are full;
   every `output.commit_interval_s` and at the end (also on Ctrl-C) it commits everything
   buffered; past `output.max_buffered_rows` across cells, the largest cells at once. With
   worker-side writes (`output.worker_writes`, `collector.run.written`) workers write the
   shards and return small `WrittenBatch`es: the driver buffers their pending shards per
   cell on the same cadence and commits names, sizes and checksums (`commit_pending`);
6. when an actor dies (a `RayError` that is not an exception raised by our code), puts that
   actor's outstanding items back at the front of the queue and replaces the actor; a
   replacement that cannot be placed within `ray.start_timeout_s` stops the run. An actor
   holding a batch past its deadline (frozen: SIGSTOP, a hung node, an inline tool blocking
   its loop) is treated the same way, since Ray never reports it dead. The deadline is
   `ray.batch_timeout_s`, or by default `loop.episode_timeout_s x (waves + 1) + 60 s` from
   dispatch, where waves = ceil(items a worker holds at once / episodes_in_flight): a
   healthy worker finishes every batch it holds within that many episode timeouts. A late
   reply of the abandoned actor is never read (its call is forgotten), and any id that
   still reached the driver twice would be dropped before commit.

Exactly once. Only the driver writes, and a commit is atomic (the store's manifest). A
driver killed at any moment loses only uncommitted episodes, which the rerun's set
difference runs again; an episode a dead worker was running is re-dispatched; an id that
reaches the driver twice is dropped before commit, and the store drops any id it already
holds. Nodes need not share a disk: episodes travel back to the driver by Ray. With
worker-side writes the same holds: a worker's shard is invisible until the driver's commit
record names it, and a worker that dies mid-write leaves only an orphan that the next open
deletes, while its batch is re-dispatched like any dead worker's.

A `QuotaExhausted` episode is never committed (the run did not fail the episode, the
account did): the driver stops handing out work, commits what finished and raises, so a
rerun after the quota resets picks up exactly the missing episodes. A `RequestRejected`
with HTTP 401, 403 or 404 is treated the same way: a refused key or an unknown model name
fails every episode alike, so recording them as `error` rows would fill the run with rows
a rerun (after fixing the config) never retries. Other 4xx stay per-episode errors.

Address resolution: `--address`, else `ray.address` in the config, else `RAY_ADDRESS`,
else an embedded local cluster. If Ray is already initialised in this process (a test
session, a notebook) that connection is used and left open.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import signal
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import ray
import ray.exceptions

from collector.config import RunConfig, check_run_config, resolved_config, with_absolute_paths
from collector.errors import CollectorError, ConfigError, OutputError, QuotaExhausted, RequestRejected
from collector.providers.http import PATH_MARK
from collector.record.episode import Episode
from collector.run.clusterprobe import probe_cluster
from collector.run.modelcheck import check_models
from collector.run.plan import Plan, WorkItem, plan_work
from collector.run.progress import LiveCounts, Progress
from collector.run.simlaunch import provider_urls
from collector.run.worker import EpisodeWorker, WorkerSetup, probe, read_api_key, url_credentials
from collector.run.written import (
    FATAL_REJECTIONS,
    Outcome,
    WrittenBatch,
    rejection_status,
    without_seen,
    writes_on_workers,
)
from collector.stop import StopReason
from collector.storage.local import CommitIncomplete, RunStore
from collector.storage.location import ObjectLocation, parse_location
from collector.storage.pending import PendingShard
from collector.storage.runstore import open_run_store
from collector.storage.s3store import ObjectRunStore

#: How long the driver blocks in `ray.wait` before refreshing the progress line.
WAIT_S = 0.25
#: Replacement actors allowed per configured worker before the run gives up.
RESTARTS_PER_WORKER = 3
#: Slack added to the derived batch deadline (env start and grading run outside the
#: episode timer; a busy machine schedules late).
BATCH_SLACK_S = 60.0
#: The embedded cluster's object store: episodes are small, and the machine is shared.
OBJECT_STORE_BYTES = 256 * 1024 * 1024
#: Ray's socket paths under `ray.temp_dir` (`session_<date>_<time>_<pid>/sockets/plasma_store`)
#: must fit AF_UNIX's 107 bytes: this much is left for the directory itself.
RAY_TEMP_DIR_MAX = 43


@dataclass(slots=True)
class JobResult:
    run_dir: Path | str
    """The run directory, or the ``s3://`` URI of a run in object storage."""
    run_id: str
    planned: int
    """Episodes the config describes."""
    already: int
    """Episodes committed before this run started (resume)."""
    committed: int = 0
    """Episodes this run committed."""
    duplicates_dropped: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    """Committed episodes of this run per stop reason."""
    worker_restarts: int = 0
    redispatched: int = 0
    """Work items run again because the worker holding them died."""
    elapsed_s: float = 0.0
    warnings: list[str] = field(default_factory=list)
    retried_errors: int = 0
    """`error` episodes of earlier runs forgotten to be run again (`retry_errors`)."""
    retries: Counter[str] = field(default_factory=Counter)
    """Retried requests of this run's committed episodes, per cause (`Episode.retries`)."""

    def summary(self) -> str:
        parts = [f"{self.run_dir}: {self.already + self.committed}/{self.planned} episodes committed"]
        if self.already:
            parts.append(f"{self.already} from earlier runs")
        if self.retried_errors:
            parts.append(f"{self.retried_errors} earlier error episodes run again")
        parts.append(f"{self.committed} new in {self.elapsed_s:.1f}s")
        if self.worker_restarts:
            parts.append(f"{self.worker_restarts} worker(s) replaced, {self.redispatched} episodes re-run")
        if self.duplicates_dropped:
            parts.append(f"{self.duplicates_dropped} duplicates dropped")
        if self.retries or self.counts.get(StopReason.ERROR.value):
            causes = ", ".join(f"{cause}: {n}" for cause, n in sorted(self.retries.items()))
            retried = f"{sum(self.retries.values())} requests retried" + (f" ({causes})" if causes else "")
            parts.append(f"{retried}, {self.counts.get(StopReason.ERROR.value, 0)} episodes ended as error")
        return "; ".join(parts)


@dataclass(slots=True)
class Snapshot:
    """What an `on_commit` callback sees after each commit (tests use it to inject faults)."""

    committed: int
    counts: Counter[str]
    busy_actors: list[Any]
    """Handles of actors with batches outstanding, busiest first."""


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived during a run. A KeyboardInterrupt, so it unwinds like Ctrl-C
    (the buffered episodes are committed on the way out); `signum` says which signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def signals_interrupt() -> Iterator[Callable[[], None]]:
    """While the run lasts, SIGINT and SIGTERM raise `Interrupted` in the main thread, once.

    SIGTERM (what a scheduler or `docker stop` sends) thus ends a run like Ctrl-C instead of
    going to Ray's handler (a native stack dump, exit 15 or SIGABRT, nothing committed). A
    second signal while the run unwinds is ignored, so it cannot cut the final commit short.
    `ray.init` installs its own handlers: call the yielded function right after it.
    """
    if threading.current_thread() is not threading.main_thread():
        yield lambda: None  # signal handlers can only be set from the main thread
        return
    caught: list[int] = []

    def handler(signum: int, frame: object) -> None:
        if caught:
            return  # already stopping
        caught.append(signum)
        raise Interrupted(signum)

    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}

    def install() -> None:
        for signum in previous:
            signal.signal(signum, handler)

    install()
    try:
        yield install
    except KeyboardInterrupt as exc:
        # Ray's blocking calls (ray.wait, ray.get) run the handler, then raise a plain
        # KeyboardInterrupt of their own: say which signal it was.
        if caught and not isinstance(exc, Interrupted):
            raise Interrupted(caught[0]) from None
        raise
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old if old is not None else signal.SIG_DFL)


def resolve_address(cli_address: str | None, cfg: RunConfig) -> str | None:
    """`--address`, else config, else RAY_ADDRESS; None means an embedded local cluster."""
    for candidate in (cli_address, cfg.ray.address, os.environ.get("RAY_ADDRESS")):
        if candidate:
            return candidate
    return None


#: Ray 2.60 announces on every new local cluster that it enabled token authentication by
#: default. For the embedded cluster (the collector's own processes on this machine, gone
#: when the run ends) nothing needs doing, so the notice is dropped; every other Ray
#: warning, and this one when joining a cluster, is still shown.
_TOKEN_NOTICE_LOGGER = "ray._private.authentication.authentication_token_setup"


class _LocalTokenNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Token authentication is enabled for this Ray cluster")


def ray_temp_dir(cfg: RunConfig) -> str | None:
    """`ray.temp_dir` as the absolute path Ray needs, or a one-line ConfigError if too long."""
    if cfg.ray.temp_dir is None:
        return None
    path = str(Path(cfg.ray.temp_dir).resolve())
    if len(path.encode()) > RAY_TEMP_DIR_MAX:
        raise ConfigError(
            f"ray.temp_dir: {path} is {len(path.encode())} bytes; Ray's socket paths under it allow at "
            f"most {RAY_TEMP_DIR_MAX} (choose a shorter directory)"
        )
    return path


def ray_logs_dir() -> str | None:
    """The log directory of the Ray session this process is connected to, if it can be told."""
    try:
        node = ray._private.worker._global_node  # no public API names the session's log dir
        return str(node.get_logs_dir_path()) if node is not None else None
    except Exception:  # noqa: BLE001 - only a hint for messages; never worth failing the run
        return None


def _with_logs(message: str) -> str:
    logs = ray_logs_dir()
    return f"{message} (Ray logs: {logs})" if logs else f"{message} (see Ray's logs)"


@contextlib.contextmanager
def ray_session(
    address: str | None, workers: int, start_timeout_s: float = 60.0, temp_dir: str | None = None
) -> Iterator[None]:
    """Connect to Ray for the run; shut down only what this call started."""
    if ray.is_initialized():
        yield
        return
    if address is not None:
        probe_cluster(address, start_timeout_s)
    try:
        if address is None:
            notice, quiet = logging.getLogger(_TOKEN_NOTICE_LOGGER), _LocalTokenNotice()
            notice.addFilter(quiet)
            try:
                ray.init(
                    address="local",  # a bare ray.init() silently joins any running cluster
                    num_cpus=max(workers, os.cpu_count() or 1),
                    include_dashboard=False,
                    object_store_memory=OBJECT_STORE_BYTES,
                    logging_level=logging.WARNING,  # Ray's start-up chatter would bury the progress line
                    _temp_dir=temp_dir,
                )
            finally:
                notice.removeFilter(quiet)
        else:
            ray.init(address=address, logging_level=logging.WARNING)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        # Ray's own messages are long and multi-line; the first line says what went wrong.
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"ray.address: cannot connect to {address or 'a local cluster'}: {first}") from None
    try:
        yield
    finally:
        ray.shutdown()


class _WorkerActor:
    """The Ray shell of an `EpisodeWorker`: async methods, so one actor runs many episodes."""

    def __init__(self, setup: WorkerSetup) -> None:
        self._worker = EpisodeWorker(setup)

    async def ready(self) -> str:
        return await self._worker.ready()

    async def run_batch(self, items: list[WorkItem]) -> list[Episode]:
        return await self._worker.run_batch(items)

    async def write_batch(self, items: list[WorkItem]) -> WrittenBatch:
        return await self._worker.write_batch(items)

    async def finished(self) -> dict[str, int]:
        return dict(self._worker.finished)

    async def close(self) -> None:
        await self._worker.close()


#: The actor class as Ray sees it (untyped: Ray's decorator defeats static typing).
_RemoteWorker: Any = ray.remote(_WorkerActor)


def check_cluster_fits(cfg: RunConfig) -> None:
    """Raise a one-line ConfigError unless the cluster's CPUs can hold every worker actor.

    Ray queues an actor it cannot place and waits for room forever; this turns the common
    case (too many CPUs asked per worker) into an error before any actor is created. The
    largest node must also hold one worker: CPUs are not pooled across nodes.
    """
    per_worker = cfg.ray.cpus_per_worker
    if per_worker <= 0:
        return
    need = cfg.ray.workers * per_worker
    have = float(ray.cluster_resources().get("CPU", 0.0))  # type: ignore[no-untyped-call]
    biggest = max(
        (float(n.get("Resources", {}).get("CPU", 0.0)) for n in ray.nodes() if n.get("Alive")),  # type: ignore[no-untyped-call]
        default=0.0,
    )
    if need > have + 1e-9 or per_worker > biggest + 1e-9:
        raise ConfigError(
            f"ray.workers x ray.cpus_per_worker = {cfg.ray.workers} x {per_worker:g} = {need:g} CPUs, "
            f"but the cluster has {have:g} CPUs (largest node {biggest:g}); lower ray.cpus_per_worker "
            "or ray.workers"
        )


def fatal_rejection(episode: Episode | Outcome, cfg: RunConfig) -> CollectorError | None:
    """The run-stopping error an episode's `RequestRejected` 401/403/404 stands for, else None.

    The message names the cause and the config field to fix, never the key: for 401/403 it
    names the variable the key came from, for 404 the model name.
    """
    error = episode.error
    status = rejection_status(error)
    if error is None or status not in FATAL_REJECTIONS:
        return None
    providers = cfg.sweep.providers or [cfg.provider]
    provider = next((p for p in providers if p.name == episode.provider), providers[0])
    where = f"provider {provider.name}"
    detail, _, path = error.message.partition(f" {PATH_MARK}")
    if status == 404 and path and episode.model not in detail and "model" not in detail.lower():
        # The server's 404 does not speak of a model: the URL path is what it did not know.
        path = path.split("]", 1)[0]
        message = (
            f"{where}: HTTP 404 for {path}: the URL path is wrong, not the model; check provider.base_url "
            f"({_BASE_URL_CONVENTION.get(provider.wire, 'see the README')})"
        )
    elif status == 404:
        message = (
            f"{where} does not know model {episode.model!r} (HTTP 404); check sweep.models "
            "(finished episodes are committed; rerun after fixing it)"
        )
    else:
        # Name what was sent (one source per provider: `read_api_key`), never its value.
        env = provider.api_key_env
        if env:
            sent, field = f"the key in ${env} was", "provider.api_key_env and the key's permissions"
        elif url_credentials(provider.base_url):
            sent, field = "the credentials from base_url were", "the credentials in provider.base_url"
        else:
            sent, field = "the request (no key configured) was", "provider.api_key_env"
        message = (
            f"{where}: {sent} refused (HTTP {status}); check {field} "
            "(finished episodes are committed; rerun after fixing it)"
        )
    return RequestRejected(message, None)


#: Where `base_url` ends, per wire format: the convention of each official SDK.
_BASE_URL_CONVENTION = {
    "chat": "OpenAI-compatible servers take the version prefix: http://host:8000/v1, https://api.openai.com/v1",
    "responses": "OpenAI-compatible servers take the version prefix: https://api.openai.com/v1",
    "anthropic": "the server root, without /v1: https://api.anthropic.com",
    "gemini": "the server root, without /v1beta: https://generativelanguage.googleapis.com",
}


def _worker_failure(exc: ray.exceptions.RayTaskError, what: str) -> CollectorError:
    """The error to raise when our own code raised inside the actor (a bug or a config
    problem, not a death): a CollectorError as it was raised, anything else as one line."""
    cause = getattr(exc, "cause", None)
    cause = cause if isinstance(cause, BaseException) else exc
    if isinstance(cause, CollectorError):
        return cause
    return CollectorError(_with_logs(f"{what}: {type(cause).__name__}: {cause}"))


def _alive_nodes() -> set[str]:
    """Ids of the cluster's live nodes (empty if the cluster does not answer)."""
    try:
        nodes = ray.nodes()  # type: ignore[no-untyped-call]
    except Exception:  # noqa: BLE001 - a cluster that does not answer has no node to name
        return set()
    return {str(n.get("NodeID")) for n in nodes if n.get("Alive")}


class _Slot:
    """One worker position: its current actor (replaced when it dies) and outstanding calls."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.actor: Any = None
        self.generation = 0
        self.outstanding = 0
        self.starting: Any = None
        """The pending `ready()` call of an actor not yet ready; no batches until it returns."""
        self.started_at = 0.0


class _Driver:
    def __init__(
        self,
        cfg: RunConfig,
        plan: Plan,
        result: JobResult,
        progress: Progress | None,
        on_commit: Callable[[Snapshot], None] | None,
    ) -> None:
        self.cfg = cfg
        self.plan = plan
        self.result = result
        self.progress = progress
        self.on_commit = on_commit
        self.store: Any = None
        self.queue: deque[WorkItem] = deque()
        self.inflight: dict[Any, tuple[_Slot, int, list[WorkItem]]] = {}
        self.dispatched_at: dict[Any, float] = {}
        """When each in-flight batch was handed out (its deadline counts from there)."""
        self.slots: list[_Slot] = []
        self.buffer: dict[tuple[str, int], list[Episode]] = {}
        """Finished episodes not yet committed, per (model, budget): the store's partition."""
        self.pending: dict[tuple[str, int], list[tuple[PendingShard, list[Outcome]]]] = {}
        """With worker-side writes, the shards workers wrote and the driver has not committed
        yet, per cell (instead of `buffer`)."""
        self.seen: set[str] = set()
        self.last_commit = time.monotonic()
        self.stop_reason: CollectorError | None = None
        self.setup: WorkerSetup | None = None
        self.uncommitted: CommitIncomplete | None = None
        """The last commit that left cells out; reported when the run ends (the rest goes on)."""
        self.uncommitted_count = 0
        self.address = "the embedded local cluster"
        """The cluster as the user named it (`--address`, `ray.address`), for messages."""
        self.nodes_at_start: set[str] = set()
        """Ids of the nodes alive when the workers started: a missing one later died."""
        self.live = LiveCounts()
        """Finished episodes for the progress line (display only, never for commits)."""
        self.polls: dict[Any, tuple[int, int]] = {}
        """Outstanding `finished()` calls, per worker (slot index, generation)."""

    # --- actors -------------------------------------------------------------------------

    def _spawn(self, slot: _Slot) -> None:
        assert self.setup is not None
        slot.generation += 1
        name = f"w{slot.index}.{slot.generation}"
        setup = replace(self.setup, name=name)
        # SPREAD: on a cluster, one worker per node before doubling up (scaling is per node).
        slot.actor = _RemoteWorker.options(
            num_cpus=self.cfg.ray.cpus_per_worker, scheduling_strategy="SPREAD"
        ).remote(setup)
        slot.outstanding = 0
        slot.starting = slot.actor.ready.remote()
        slot.started_at = time.monotonic()

    def _replace(self, slot: _Slot, generation: int) -> None:
        if slot.generation != generation:
            return  # another failed call of the same dead actor already replaced it
        limit = RESTARTS_PER_WORKER * len(self.slots)
        if self.result.worker_restarts >= limit:
            raise CollectorError(_with_logs(f"workers died {self.result.worker_restarts} times; giving up"))
        self.result.worker_restarts += 1
        with contextlib.suppress(Exception):  # the actor may already be gone: nothing to kill
            ray.kill(slot.actor, no_restart=True)
        self._spawn(slot)

    def start_workers(self, setup: WorkerSetup) -> None:
        self.setup = setup
        check_cluster_fits(self.cfg)
        self.slots = [_Slot(i) for i in range(self.cfg.ray.workers)]
        for slot in self.slots:
            self._spawn(slot)
        timeout = self.cfg.ray.start_timeout_s
        try:
            ray.get([slot.starting for slot in self.slots], timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise CollectorError(self._not_placed("not ready", timeout)) from None
        except ray.exceptions.RayTaskError as exc:
            raise _worker_failure(exc, "a worker failed to start") from None
        except ray.exceptions.RayError as exc:
            # The actor could not be placed or died while starting (resources, a lost node).
            raise CollectorError(_with_logs(f"a worker could not start: {type(exc).__name__}")) from None
        for slot in self.slots:
            slot.starting = None
        self.nodes_at_start = _alive_nodes()

    def _not_placed(self, what: str, timeout: float) -> str:
        cpus = self.cfg.ray.cpus_per_worker
        lost = self.nodes_at_start - _alive_nodes() if self.nodes_at_start else set()
        if lost:
            # The usual cause of a replacement with no room: its node died with the old worker.
            return (
                f"{len(lost)} of {len(self.nodes_at_start)} node(s) of the Ray cluster at {self.address} "
                f"died during the run, and no live node took a replacement worker within "
                f"ray.start_timeout_s = {timeout:g}s; committed episodes are safe, run again to resume"
            )
        return (
            f"a worker was {what} after ray.start_timeout_s = {timeout:g}s (no node with "
            f"{cpus:g} free CPUs, or a slow start); committed episodes are safe, run again to resume"
        )

    def started(self, ref: Any) -> None:
        """A replacement's `ready()` returned: hand it batches, or stop on a start failure."""
        slot = next((s for s in self.slots if s.starting == ref), None)
        if slot is None:
            return  # the ready() of an actor already replaced (it died meanwhile)
        generation = slot.generation
        slot.starting = None
        try:
            ray.get(ref)
        except ray.exceptions.RayTaskError as exc:
            raise _worker_failure(exc, "a worker failed to start") from None
        except ray.exceptions.RayError:
            self._replace(slot, generation)  # died while starting: counts as another death

    def check_starting(self) -> None:
        """Stop the run if a replacement actor has waited longer than `ray.start_timeout_s`."""
        timeout = self.cfg.ray.start_timeout_s
        now = time.monotonic()
        for slot in self.slots:
            if slot.starting is not None and now - slot.started_at > timeout:
                raise CollectorError(self._not_placed("replaced but could not be placed or started", timeout))

    def stop_workers(self) -> None:
        for slot in self.slots:
            if slot.starting is None:  # an actor never placed would only make close() wait
                with contextlib.suppress(Exception):  # best effort: the run's result is already safe
                    ray.get(slot.actor.close.remote(), timeout=5)
            with contextlib.suppress(Exception):
                ray.kill(slot.actor, no_restart=True)

    # --- dispatch -----------------------------------------------------------------------

    def _batch_size(self) -> int:
        # Small runs are spread over every worker rather than packed into one batch.
        spread = math.ceil(len(self.plan.items) / (2 * len(self.slots)))
        return max(1, min(self.cfg.ray.batch_size, spread))

    def _per_worker(self, batch: int) -> int:
        # Enough outstanding batches that the worker's slots never wait on the driver.
        return max(2, math.ceil(self.cfg.ray.episodes_in_flight / batch) + 1)

    def fill(self) -> None:
        if self.stop_reason is not None:
            return
        batch = self._batch_size()
        per_worker = self._per_worker(batch)
        for slot in self.slots:
            while slot.starting is None and self.queue and slot.outstanding < per_worker:
                items = [self.queue.popleft() for _ in range(min(batch, len(self.queue)))]
                run = slot.actor.write_batch if self.sink is not None else slot.actor.run_batch
                ref = run.remote(items)
                self.inflight[ref] = (slot, slot.generation, items)
                self.dispatched_at[ref] = time.monotonic()
                slot.outstanding += 1

    @property
    def sink(self) -> Any:
        """The run's `ShardSink` when workers write the shards, else None."""
        return self.setup.sink if self.setup is not None else None

    def batch_deadline_s(self) -> float:
        """How long a worker may hold a batch (module docstring, step 6)."""
        explicit = self.cfg.ray.batch_timeout_s
        if explicit is not None:
            return explicit
        batch = self._batch_size()
        waves = math.ceil(self._per_worker(batch) * batch / self.cfg.ray.episodes_in_flight)
        return self.cfg.loop.episode_timeout_s * (waves + 1) + BATCH_SLACK_S

    def check_batches(self) -> None:
        """Give up on every actor holding a batch past its deadline: re-run its items elsewhere."""
        limit = self.batch_deadline_s()
        now = time.monotonic()
        late = {
            (slot.index, generation): (slot, generation)
            for ref, (slot, generation, _) in self.inflight.items()
            if now - self.dispatched_at[ref] > limit
        }
        for slot, generation in late.values():
            refs = [r for r, (s, g, _) in self.inflight.items() if s is slot and g == generation]
            for ref in refs:
                _, _, items = self.inflight.pop(ref)
                del self.dispatched_at[ref]
                self.result.redispatched += len(items)
                self.queue.extendleft(reversed(items))
            self._replace(slot, generation)

    def collect(self, ref: Any) -> None:
        slot, generation, items = self.inflight.pop(ref)
        self.dispatched_at.pop(ref, None)
        if slot.generation == generation:
            slot.outstanding -= 1
        try:
            episodes: list[Episode] | WrittenBatch = ray.get(ref)
        except ray.exceptions.RayTaskError as exc:
            # Our own code raised inside the worker: a bug or a config problem, not a death.
            raise _worker_failure(exc, "a worker failed") from None
        except ray.exceptions.RayError:
            # The actor (or its node) died: run its items again on a fresh actor.
            self.result.redispatched += len(items)
            self.queue.extendleft(reversed(items))
            self._replace(slot, generation)
            return
        if isinstance(episodes, WrittenBatch):
            self._collect_written(episodes, (slot.index, generation))
        else:
            self.live.returned((slot.index, generation), (str(e.stop_reason) for e in episodes))
            for episode in episodes:
                if self._keep(episode):
                    self.buffer.setdefault((episode.model, episode.budget), []).append(episode)
        if self._buffered() > self.cfg.output.max_buffered_rows:
            self.commit()  # now, not after the other batches that returned with this one

    def _keep(self, episode: Episode | Outcome) -> bool:
        """Whether a returned episode is one to commit: not seen before, not one that stops the run."""
        if episode.episode_id in self.seen:
            self.result.duplicates_dropped += 1
            return False
        if episode.error is not None and episode.error.type == QuotaExhausted.__name__:
            if self.stop_reason is None:
                self.stop_reason = QuotaExhausted(
                    f"provider quota exhausted ({episode.error.message}); finished episodes are "
                    "committed, run again when the quota resets to resume"
                )
            return False
        fatal = fatal_rejection(episode, self.cfg)
        if fatal is not None:
            # Not committed: the episode says nothing about the model; the rerun runs it.
            if self.stop_reason is None:
                self.stop_reason = fatal
            return False
        self.seen.add(episode.episode_id)
        self.live.keep(str(episode.stop_reason))
        return True

    def _collect_written(self, batch: WrittenBatch, worker: tuple[int, int]) -> None:
        """A writing worker's batch: the same decisions per episode, its shards buffered per cell
        (a shard of ids all seen before is discarded, a partly seen one rewritten: `without_seen`)."""
        self.live.returned(worker, (o.stop_reason for o in batch.outcomes))
        kept = {o.episode_id: o for o in batch.outcomes if self._keep(o)}
        for written in batch.shards:
            shard = without_seen(self.sink, written, set(kept))
            if shard is not None:
                outcomes = [kept[i] for i in shard.episode_ids]
                self.pending.setdefault((shard.model, shard.budget), []).append((shard, outcomes))
        if batch.refused:
            # Rows that fit no shard: not committed (a rerun runs them), the run goes on.
            first = next(iter(batch.refused.values()))
            message = f"{len(batch.refused)} episode(s) could not be stored ({first})"
            self.uncommitted = CommitIncomplete(message, 0, set(batch.refused))
            self.uncommitted_count += len(batch.refused)

    def _buffered(self) -> int:
        episodes = sum(len(episodes) for episodes in self.buffer.values())
        return episodes + sum(s.rows for shards in self.pending.values() for s, _ in shards)

    def commit(self, force: bool = False) -> None:
        """Commit full cells (whole shards only); everything on the interval or when forced."""
        rows = self.cfg.output.rows_per_shard
        everything = force or time.monotonic() - self.last_commit >= self.cfg.output.commit_interval_s
        if self.sink is not None:
            self._commit_written(everything)
            return
        batch: list[Episode] = []
        for cell, episodes in list(self.buffer.items()):
            take = len(episodes) if everything else len(episodes) - len(episodes) % rows
            if take:
                batch.extend(episodes[:take])
                if take == len(episodes):
                    del self.buffer[cell]
                else:
                    self.buffer[cell] = episodes[take:]
        buffered, cap = self._buffered(), self.cfg.output.max_buffered_rows
        if buffered > cap:
            # Past the cap: the largest cells first (fewest, fullest shards), down to half of it
            # so that the next few batches do not each force a commit of their own.
            for cell in sorted(self.buffer, key=lambda c: len(self.buffer[c]), reverse=True):
                if buffered <= cap // 2:
                    break
                episodes = self.buffer.pop(cell)
                batch.extend(episodes)
                buffered -= len(episodes)
        if everything:
            # The interval restarts even when nothing was due, so a quiet period does not
            # make the next trickle of episodes a commit of its own.
            self.last_commit = time.monotonic()
        if not batch:
            return
        try:
            written = self.store.commit(batch)
        except CommitIncomplete as e:
            # Some episodes (a poisoned row, a cell that could not be written) were left out:
            # the others are committed and the run goes on; the ones left out are not
            # committed (a rerun runs them) and the run ends with one line saying so.
            written, self.uncommitted = e.committed, e
            self.uncommitted_count += len(e.uncommitted)
            batch = [ep for ep in batch if ep.episode_id not in e.uncommitted]
        self._committed(batch, written)

    def _commit_written(self, everything: bool) -> None:
        """With worker-side writes: commit the pending shards of cells holding `rows_per_shard`
        rows (everything on the interval or when forced; past `max_buffered_rows`, the largest
        cells first down to half of it), all in one `commit_pending`: a record per commit."""
        rows, cap = self.cfg.output.rows_per_shard, self.cfg.output.max_buffered_rows
        size = {cell: sum(s.rows for s, _ in shards) for cell, shards in self.pending.items()}
        due = [cell for cell, n in size.items() if everything or n >= rows]
        left = sum(size.values()) - sum(size[cell] for cell in due)
        rest = sorted((c for c in size if c not in due), key=lambda c: -size[c]) if left > cap else []
        for cell in rest:
            if left <= cap // 2:
                break
            due.append(cell)
            left -= size[cell]
        if everything:
            self.last_commit = time.monotonic()  # as in `commit`: a quiet period restarts it
        taken = [pair for cell in due for pair in self.pending.pop(cell)]
        if not taken:
            return
        try:
            written = self.store.commit_pending([shard for shard, _ in taken])
        except CommitIncomplete as e:
            written, self.uncommitted = e.committed, e
            self.uncommitted_count += len(e.uncommitted)
            taken = [(s, outcomes) for s, outcomes in taken if not set(s.episode_ids) & e.uncommitted]
        self._committed([o for _, outcomes in taken for o in outcomes], written)

    def _committed(self, batch: list[Episode] | list[Outcome], written: int) -> None:
        """Count a commit's episodes into the result and tell `on_commit`."""
        self.result.committed += written
        self.result.duplicates_dropped += len(batch) - written
        self.result.counts.update(str(e.stop_reason) for e in batch)
        self.result.retries.update(cause for e in batch for cause in e.retries)
        if self.on_commit is not None:
            busy = sorted((s for s in self.slots if s.outstanding), key=lambda s: -s.outstanding)
            self.on_commit(
                Snapshot(self.result.committed, Counter(self.result.counts), [s.actor for s in busy])
            )

    def poll_finished(self) -> None:
        """Ask each ready worker how many episodes it has finished (one call in flight per
        worker; the answers of earlier calls are read without waiting)."""
        if self.polls:
            answered, _ = ray.wait(list(self.polls), num_returns=len(self.polls), timeout=0)
            for ref in answered:
                worker = self.polls.pop(ref)
                with contextlib.suppress(ray.exceptions.RayError):  # a dead worker's count is moot
                    self.live.reported(worker, ray.get(ref))
        asked = set(self.polls.values())
        for slot in self.slots:
            if slot.starting is None and (slot.index, slot.generation) not in asked:
                self.polls[slot.actor.finished.remote()] = (slot.index, slot.generation)

    def live_counts(self) -> Counter[str]:
        return self.live.counts((s.index, s.generation) for s in self.slots)

    def show(self, force: bool = False) -> None:
        if self.progress is None:
            return
        self.poll_finished()
        notes = []
        if self.result.retried_errors:
            notes.append(f"{self.result.retried_errors} earlier errors re-run")
        if self.result.worker_restarts:
            notes.append(f"{self.result.worker_restarts} worker(s) replaced")
        note = ", ".join(notes)
        counts = self.live_counts()
        self.progress.update(self.result.committed, counts, note, force=force, finished=counts.total())

    def loop(self) -> None:
        while self.inflight or (self.queue and self.stop_reason is None):
            self.fill()
            starting = [s.starting for s in self.slots if s.starting is not None]
            waiting = list(self.inflight) + starting
            if not waiting:  # cannot happen with a ready slot and a non-empty queue; be safe
                time.sleep(WAIT_S)
                continue
            # Wake on the first batch back (not all of them: that made waves, each worker
            # draining its slots between refills), then take whatever else is already back.
            # The timeout still bounds each pass, for the deadlines and for Ctrl-C.
            ready, rest = ray.wait(waiting, num_returns=1, timeout=WAIT_S, fetch_local=True)
            if ready and rest:
                more, _ = ray.wait(rest, num_returns=len(rest), timeout=0, fetch_local=True)
                ready += more
            for ref in ready:
                if ref in self.inflight:
                    self.collect(ref)
                else:
                    self.started(ref)
            self.check_starting()
            self.check_batches()
            self.commit()
            self.show()


def committed_error_ids(store: RunStore | ObjectRunStore) -> set[str]:
    """Ids of the committed episodes whose stop_reason is `error` (reads two columns only)."""
    found: set[str] = set()
    for entry in store.shards:
        table = store.read_shard(entry, ["episode_id", "stop_reason"])
        ids = table.column("episode_id").to_pylist()
        reasons = table.column("stop_reason").to_pylist()
        found.update(i for i, r in zip(ids, reasons, strict=True) if r == StopReason.ERROR.value)
    return found


def run_job(
    cfg: RunConfig,
    *,
    address: str | None = None,
    show_progress: bool = True,
    on_commit: Callable[[Snapshot], None] | None = None,
    retry_errors: bool = False,
) -> JobResult:
    """Run (or resume) the sweep `cfg` describes; return what was committed.

    With `retry_errors`, the planned episodes committed as `error` by earlier runs (a
    provider that failed after its retries) are first forgotten by the store, so this run
    collects them again; `JobResult.retried_errors` says how many.

    Raises `ConfigError` / `OutputError` (one line) for bad input, before any episode runs
    where it can be detected: keys, reachability, a foreign run directory.
    """
    with signals_interrupt() as reinstall:
        return _run_job(cfg, address, show_progress, on_commit, retry_errors, reinstall)


def _run_job(
    cfg: RunConfig,
    address: str | None,
    show_progress: bool,
    on_commit: Callable[[Snapshot], None] | None,
    retry_errors: bool,
    reinstall_signals: Callable[[], None],
) -> JobResult:
    started = time.monotonic()
    check_run_config(cfg)
    # output.path: a local path or s3://bucket/prefix (gs://, credentials in the URI, a bad
    # bucket name: one line before any work). Checked here, not in config: it is the data layer's.
    where = parse_location(cfg.output.path)
    plan = plan_work(cfg)
    address = resolve_address(address, cfg)
    temp_dir = ray_temp_dir(cfg) if address is None else None
    if address is None:
        # Local workers share this machine and inherit this environment: check keys and
        # reachability before starting Ray (5-10 s), not after. Workers check again anyway.
        for provider in plan.providers:
            read_api_key(provider, "in this shell")
        routes = {(p.base_url, p.http_client) for p in plan.providers if p.kind != "sim" and p.base_url}
        for url, client in routes:
            asyncio.run(probe(url, http_client=client))
        # The served model is the asked one (collector.run.modelcheck), once, before Ray.
        asyncio.run(check_models(plan.providers, [p.base_url or "" for p in plan.providers],
                                 cfg.sweep.models, "in this shell"))
    with open_run_store(
        cfg.output.path, plan.fingerprint, resolved_config(cfg), cfg.output.format, cfg.output.rows_per_shard
    ) as store:
        retried = 0
        if retry_errors:
            planned_ids = {item.episode_id for item in plan.items}
            # Only ids of this plan: an error in a cell the sweep no longer selects would
            # be deleted and never collected again.
            retried = store.forget(committed_error_ids(store) & planned_ids)
        committed = store.committed_ids()
        todo = [item for item in plan.items if item.episode_id not in committed]
        result = JobResult(
            str(where) if isinstance(where, ObjectLocation) else where,
            plan.run_id,
            len(plan.items),
            len(plan.items) - len(todo),
            warnings=list(store.warnings),
            retried_errors=retried,
        )
        if not todo:
            result.elapsed_s = time.monotonic() - started
            return result
        driver = _Driver(cfg, plan, result, None, on_commit)
        driver.store = store
        driver.queue.extend(todo)
        if address is not None:
            driver.address = address
        sink = store.sink() if writes_on_workers(cfg.output) else None
        session = ray_session(address, cfg.ray.workers, cfg.ray.start_timeout_s, temp_dir)
        with provider_urls(plan.providers, cfg.seed) as urls, session:
            reinstall_signals()  # ray.init replaced them
            try:
                remote = address is not None  # there, each worker checks the served models itself
                driver.start_workers(WorkerSetup(with_absolute_paths(cfg), plan.run_id, urls,
                                                 check_models=remote, sink=sink))
                # The clock starts once workers are ready: the rate shown is collection speed.
                if show_progress:
                    driver.progress = Progress(result.planned, already=result.already)
                driver.show(force=True)
                driver.loop()
            finally:
                # Whatever ends the run (done, Ctrl-C, an error), finished episodes are kept.
                driver.commit(force=True)
                if driver.progress is not None:
                    counts = driver.live_counts()
                    driver.progress.close(result.committed, counts, finished=counts.total())
                driver.stop_workers()
        result.elapsed_s = time.monotonic() - started
        if driver.uncommitted is not None:
            raise OutputError(
                f"{driver.uncommitted_count} episode(s) were not committed (last: {driver.uncommitted}); "
                f"{result.committed} were; run again to collect the rest"
            )
        if driver.stop_reason is not None:
            raise driver.stop_reason
        return result

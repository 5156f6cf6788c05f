"""The collection job: a run's orchestration, from config to committed shards.

The steps, each in its own module:
1. plan the run (`collector.run.plan`): every work item with its deterministic episode id;
2. preflight (`collector.run.preflight`): for a local run, keys, reachability and the served
   models, before Ray starts (5-10 s); a problem there is one line, before any episode runs;
3. open the run store (`collector.storage`), which refuses a run written by another config,
   and subtract the ids already committed (resume). A run with nothing left to do ends here,
   without starting Ray;
4. start the simulator if the provider is "sim" (`collector.run.simlaunch`), open the worker
   pool's session (`collector.run.pool`: Ray's, by `collector.run.cluster`, the only module that
   imports `ray`; or none, for the in-process pool of `collector.run.inprocess`) and start the
   workers; the cluster must fit them, and each must be ready within `ray.start_timeout_s`;
5. run the driver loop (`collector.run.driver`) with its commit policy
   (`collector.run.commits`) until the queue is done or a run stopper
   (`collector.run.stoppers`) ends it; whatever ends the run, what finished is committed.
   Configured experiment trackers (`collector.tracking`) are fed after each commit and get
   the summary at the end, however the run ends; none of them can fail or stall the run.

Exactly once. Only the driver commits, and a commit is atomic (the store's manifest). A
driver killed at any moment loses only uncommitted episodes, which the rerun's set
difference runs again; an episode a dead worker was running is re-dispatched; an id that
reaches the driver twice is dropped before commit, and the store drops any id it already
holds. Nodes need not share a disk: episodes travel back to the driver by Ray. With
worker-side writes (`collector.run.worker_writes`) the same holds: a worker's shard is
invisible until the driver's commit record names it, and a worker that dies mid-write
leaves only an orphan that the next open deletes, while its batch is re-dispatched.

Signals. SIGINT and SIGTERM end a run like Ctrl-C (`collector.run.signals`): the buffered
episodes are committed on the way out (a commit under way finishes first) and the CLI exits
128 + the signal number.

Tests: tests/run/test_job.py, tests/system/run/test_cli_process.py and the driver fault tests in
tests/faults (driver SIGKILL, frozen worker, worker write kill, retry errors, run stoppers,
two nodes, bad input).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Collection, Coroutine, Sequence
from typing import Any, Protocol

import pyarrow as pa

from collector.config import RunConfig, check_run_config, resolved_config, with_absolute_paths
from collector.errors import OutputError
from collector.run.commits import CommitTarget
from collector.run.driver import Driver, JobResult, Snapshot
from collector.run.plan import load_env, plan_work
from collector.run.pool import WorkerPool
from collector.run.preflight import check_providers
from collector.run.progress import Progress
from collector.run.signals import Interrupted, RunSignals, signals_interrupt
from collector.run.simlaunch import provider_urls
from collector.run.worker import WorkerSetup
from collector.run.worker_writes import writes_on_workers
from collector.stop import StopReason
from collector.storage.location import ObjectLocation, parse_location
from collector.storage.opening import open_run_store
from collector.storage.pending import ShardSink

# JobResult and Snapshot are imported from here by benches and tests.
__all__ = ["Interrupted", "JobResult", "Snapshot", "committed_error_ids", "default_pool", "run_job",
           "signals_interrupt"]


class JobStore(CommitTarget, Protocol):
    """What the job needs of the run store, local or in object storage."""

    @property
    def warnings(self) -> list[str]: ...
    @property
    def shards(self) -> list[dict[str, Any]]: ...
    def read_shard(self, entry: dict[str, Any], columns: Sequence[str] | None = None) -> pa.Table: ...
    def committed_ids(self) -> set[str]: ...
    def forget(self, ids: Collection[str]) -> int: ...
    def sink(self) -> ShardSink: ...


def committed_error_ids(store: JobStore) -> set[str]:
    """Ids of the committed episodes whose stop_reason is `error` (reads two columns only)."""
    found: set[str] = set()
    for entry in store.shards:
        table = store.read_shard(entry, ["episode_id", "stop_reason"])
        ids = table.column("episode_id").to_pylist()
        reasons = table.column("stop_reason").to_pylist()
        found.update(i for i, r in zip(ids, reasons, strict=True) if r == StopReason.ERROR.value)
    return found


def default_pool(cfg: RunConfig) -> WorkerPool:
    """The pool `ray.pool` names. Ray is imported only for a Ray run (it takes seconds)."""
    if cfg.ray.pool == "in_process":
        from collector.run.inprocess import InProcessPool

        return InProcessPool()
    from collector.run.cluster import RayPool

    return RayPool()


def run_job(
    cfg: RunConfig,
    *,
    address: str | None = None,
    show_progress: bool = True,
    on_commit: Callable[[Snapshot], None] | None = None,
    retry_errors: bool = False,
    pool: WorkerPool | None = None,
) -> JobResult:
    """Run (or resume) the sweep `cfg` describes; return what was committed.

    With `retry_errors`, the planned episodes committed as `error` by earlier runs (a
    provider that failed after its retries) are first forgotten by the store, so this run
    collects them again; `JobResult.retried_errors` says how many. `pool` replaces the pool
    `ray.pool` names (`default_pool`); the pool opens its own session (Ray's cluster, or
    nothing in process): tests and benches place, observe or kill the workers through it.

    Raises `ConfigError` / `OutputError` (one line) for bad input, before any episode runs
    where it can be detected: keys, reachability, a foreign run directory.
    """
    with signals_interrupt() as signals:
        pool = pool or default_pool(cfg)
        return _run_job(cfg, address, show_progress, on_commit, retry_errors, pool, signals)


def _sweep(leftovers: Callable[[str], Coroutine[Any, Any, int]], run_id: str) -> list[str]:
    """Remove the run's sandboxes at its end; a sweep that fails is a warning, never the
    run's outcome (it must not hide the error that may be ending the run)."""
    try:
        asyncio.run(leftovers(run_id))
    except Exception as exc:  # noqa: BLE001 - any failure of the backend's clean-up is reported
        return [f"the run's sandboxes could not be removed at its end ({type(exc).__name__}: {exc}); "
                f"the next run of it removes them"]
    return []


def _run_job(
    cfg: RunConfig,
    address: str | None,
    show_progress: bool,
    on_commit: Callable[[Snapshot], None] | None,
    retry_errors: bool,
    pool: WorkerPool,
    signals: RunSignals,
) -> JobResult:
    started = time.monotonic()
    check_run_config(cfg)
    tracked = cfg.tracking.wandb is not None or cfg.tracking.mlflow is not None
    if tracked:
        # Imported only when asked for (a tracker's SDK is slow to import); a missing
        # package is a config error before any work.
        from collector.tracking import check_tracking

        check_tracking(cfg)
    # output.path: a local path or s3://bucket/prefix (gs://, credentials in the URI, a bad
    # bucket name: one line before any work). Checked here, not in config: it is the data layer's.
    where = parse_location(cfg.output.path)
    env = load_env(cfg)
    plan = plan_work(cfg, env)
    address = pool.address(address, cfg)
    if address is None:
        # Local workers share this machine and inherit this environment: check before
        # starting Ray, not after (a simulator is not started yet: its URL is skipped).
        known = [p.base_url or "" if p.kind != "sim" else "" for p in plan.providers]
        asyncio.run(check_providers(plan.providers, known, cfg.sweep.models, "in this shell"))
    opened = open_run_store(
        cfg.output.path, plan.fingerprint, resolved_config(cfg), cfg.output.format, cfg.output.rows_per_shard
    )
    with opened as store:
        # The run's lock is held: sandboxes still labelled with this run id are a killed
        # earlier attempt's (a SIGKILLed driver or worker never stopped them), removed now.
        leftovers = getattr(env, "remove_leftovers", None)
        if leftovers is not None:
            asyncio.run(leftovers(plan.run_id))
        retried = 0
        if retry_errors:
            errors = committed_error_ids(store)
            # Only ids of this plan: an error in a cell the sweep no longer selects would
            # be deleted and never collected again.
            retried = store.forget({i.episode_id for i in plan.iter_items() if i.episode_id in errors})
        # Resume is a set difference, read twice from the plan rather than held: once to
        # count what is done, then by the driver as it hands work out.
        already = sum(store.holds(item.episode_id) for item in plan.iter_items())
        result = JobResult(
            str(where) if isinstance(where, ObjectLocation) else where,
            plan.run_id,
            plan.size,
            already,
            warnings=list(store.warnings),
            retried_errors=retried,
        )
        todo = (item for item in plan.iter_items() if not store.holds(item.episode_id))
        if already == plan.size:
            result.elapsed_s = time.monotonic() - started
            return result
        sink = store.sink() if writes_on_workers(cfg.output) else None
        session = pool.session(cfg, address)
        tracking = None
        if tracked:
            from collector.tracking import start_tracking

            tracking = start_tracking(cfg, run_id=plan.run_id, run_dir=str(result.run_dir),
                                      planned=result.planned, already=result.already)
        # Entered first, left last: the trackers get the summary however the run ends.
        with tracking or contextlib.nullcontext(), provider_urls(plan.providers, cfg.seed) as urls, session:
            signals.install()  # ray.init replaced them (a no-op for a pool that did not)
            remote = address is not None  # there, each worker checks the served models itself
            setup = WorkerSetup(with_absolute_paths(cfg), plan.run_id, urls, check_models=remote, sink=sink)
            driver = Driver(cfg, result, pool, store, todo, setup=setup, on_commit=on_commit, address=address,
                            shield=signals.deferred)
            driver.tracking = tracking
            try:
                driver.start_workers()
                # The clock starts once workers are ready: the rate shown is collection speed.
                if show_progress:
                    driver.progress = Progress(result.planned, already=result.already)
                driver.show(force=True)
                driver.loop()
            finally:
                # Whatever ends the run (done, Ctrl-C, an error), finished episodes are kept;
                # a first signal during this commit is raised after it, the workers still stopped.
                try:
                    driver.commit(force=True)
                finally:
                    driver.close_progress()
                    try:
                        driver.stop_workers()
                    finally:
                        if leftovers is not None:
                            # Swept again once no worker of this run is left: a sandbox whose
                            # creation was still in the daemon's hands when the killed attempt
                            # died (or when an episode of this one gave up on it: a start cut by
                            # its timeout, a stop past its own) lands after the first sweep.
                            result.warnings += _sweep(leftovers, plan.run_id)
        if tracking is not None:
            result.warnings += tracking.warnings
        result.elapsed_s = time.monotonic() - started
        if driver.uncommitted is not None:
            raise OutputError(
                f"{driver.uncommitted_count} episode(s) were not committed (last: {driver.uncommitted}); "
                f"{result.committed} were; run again to collect the rest"
            )
        if driver.stop_reason is not None:
            raise driver.stop_reason
        return result

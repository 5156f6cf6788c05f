"""The Ray cluster and the worker pool: the only module of the package that imports `ray`
(tests/test_layout.py checks it; Ray-backed runs: tests/run/test_job.py, tests/faults).

The episode loop stays plain asyncio; Ray only carries batches of small `WorkItem`s out and
each batch's episodes as encoded shard rows (`EncodedBatch`, or a `WrittenBatch` of shards the
worker wrote) back: one actor call per batch, never per model
call (runtime-notes measured 2-2.5 ms of CPU per Ray call).

Address resolution: `--address`, else `ray.address` in the config, else `RAY_ADDRESS`,
else an embedded local cluster. If Ray is already initialised in this process (a test
session, a notebook) that connection is used and left open. The embedded cluster listens on
loopback only, and the driver keeps its SIGTERM handler through Ray's shutdown
(`DRIVER_INIT`, `EMBEDDED_INIT`).

Tests: tests/system/run/test_loopback_cluster.py, tests/system/run/test_embedded_cluster.py,
tests/system/run/test_ray_job.py, tests/system/run/test_ray_address.py (the system tier: they start Ray).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import ray
import ray.actor
import ray.exceptions

from collector.config import RunConfig
from collector.errors import ConfigError
from collector.run.clusterprobe import probe_cluster, start_within
from collector.run.encoded import EncodedBatch
from collector.run.plan import WorkItem
from collector.run.pool import Actor, Call, WorkerFailed, WorkerLost
from collector.run.worker import EpisodeWorker, WorkerSetup
from collector.run.worker_writes import WrittenBatch

__all__ = [
    "DRIVER_INIT", "EMBEDDED_INIT", "EMBEDDED_SYSTEM_CONFIG", "LOOPBACK", "OBJECT_STORE_BYTES", "RayPool",
    "check_cluster", "ray_constants", "ray_session", "ray_temp_dir", "resolve_address",
]

#: The embedded cluster's object store: episodes are small, and the machine is shared.
OBJECT_STORE_BYTES = 256 * 1024 * 1024
#: Ray's socket paths under `ray.temp_dir` (`session_<date>_<time>_<pid>/sockets/plasma_store`)
#: must fit AF_UNIX's 107 bytes: this much is left for the directory itself.
RAY_TEMP_DIR_MAX = 43
#: How long a worker may take to close its clients at the end of the run.
CLOSE_TIMEOUT_S = 5.0


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


class _OffMainThreadNotice(logging.Filter):
    """`ray.init` runs on a thread of its own (so that it can be bounded: `start_within`) and
    says it set no SIGTERM handler: on purpose, the run's own handler (`collector.run.signals`)
    stays in place."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("SIGTERM handler is not set")


_OFF_MAIN_THREAD = _OffMainThreadNotice()


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


def with_logs(message: str) -> str:
    logs = ray_logs_dir()
    return f"{message} (Ray logs: {logs})" if logs else f"{message} (see Ray's logs)"


#: The embedded cluster's address: every one of its servers listens on loopback only.
LOOPBACK = "127.0.0.1"


@contextlib.contextmanager
def ray_constants(**values: object) -> Iterator[None]:
    """Ray's module constants set to `values` while `ray.init` reads them (there is no public
    switch for either; an environment variable would reach every process Ray starts)."""
    constants: Any = ray._private.ray_constants
    before = {name: getattr(constants, name) for name in values}
    for name, value in values.items():
        setattr(constants, name, value)
    try:
        yield
    finally:
        for name, value in before.items():
            setattr(constants, name, value)


#: Set while `ray.init` runs, in the driver's process only: no native failure-signal handler
#: in the driver. That handler takes SIGTERM (a stack dump, then exit), and `ray.shutdown`
#: uninstalls it by setting SIGTERM's OS-level action to the default, 0.1-0.4 s into a
#: shutdown lasting 1-1.5 s more: a SIGTERM then killed the driver (exit -15, no line, an S3
#: lock left for its lease) whatever Python handler was installed. Measured here: with it
#: disabled the action stays Python's through the whole shutdown (60 SIGTERMs 20 ms apart,
#: all handled); blocking SIGTERM in the main thread is not enough (Ray's threads take it with
#: the default action), and blocking it before `ray.init` is inherited by the cluster's
#: processes (shutdown then took 6 s instead of 1.4 s). The workers keep their handler.
DRIVER_INIT = {"RAY_DISABLE_FAILURE_SIGNAL_HANDLER": True}
#: For the embedded cluster, also `ENABLE_RAY_CLUSTER` off: with it on (Linux's default) Ray
#: rewrites a loopback node address to the machine's own, and its GCS, raylet, agents and
#: workers listened on `*` and that address (10-12 sockets, none on loopback). With it off
#: and the node address 127.0.0.1, every server of the tree listens on loopback (measured
#: with psutil over the process tree; tests/system/run/test_loopback_cluster.py checks it).
EMBEDDED_INIT = {**DRIVER_INIT, "ENABLE_RAY_CLUSTER": False}


#: The embedded cluster's Ray settings (`_system_config`, read by every process of the tree):
#: what only Ray's observability reads is off, since nothing of the collector reads it and it
#: costs CPU on the run's own core(s) while episodes run (BENCHMARKS.md section n):
#: - no worker prestarted for the first driver: the collector starts its actors itself, and
#:   the prestarted `ray::IDLE` process only polled (~10-15 µs of CPU per turn at 64 in flight);
#: - no metrics collection (Ray's Prometheus metrics, exported by the dashboard agent);
#: - no task events (the state API's and the dashboard's task list: a report per actor call).
#: Worker logs still reach the driver's stderr (the log monitor), and errors still come back
#: with each call's result.
EMBEDDED_SYSTEM_CONFIG: dict[str, object] = {
    "prestart_worker_first_driver": False,
    "enable_metrics_collection": False,
    "task_events_report_interval_ms": 0,
}


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
            # On this thread: the processes of the embedded cluster are tied to the thread that
            # starts them (they die with it), and Ray bounds its own local start-up (an
            # `Exception`, below).
            _init(None, workers, temp_dir)
        else:
            start_within(lambda: _init(address, workers, temp_dir), start_timeout_s, address)
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - Ray raises plain `Exception` too (a start-up timeout)
        # Ray's own messages are long and multi-line; the first line says what went wrong.
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        where = (f"ray.address: cannot connect to {address}" if address
                 else "ray: the embedded local cluster failed to start")
        raise ConfigError(f"{where}: {first}") from None
    try:
        yield
    finally:
        ray.shutdown()


def _init(address: str | None, workers: int, temp_dir: str | None) -> None:
    logging.getLogger("ray._private.worker").addFilter(_OFF_MAIN_THREAD)  # once: the same filter
    if address is not None:
        with ray_constants(**DRIVER_INIT):
            ray.init(address=address, logging_level=logging.WARNING)
        return
    notice, quiet = logging.getLogger(_TOKEN_NOTICE_LOGGER), _LocalTokenNotice()
    notice.addFilter(quiet)
    try:
        with ray_constants(**EMBEDDED_INIT):
            ray.init(
                address="local",  # a bare ray.init() silently joins any running cluster
                num_cpus=max(workers, os.cpu_count() or 1),
                include_dashboard=False,
                object_store_memory=OBJECT_STORE_BYTES,
                logging_level=logging.WARNING,  # Ray's start-up chatter would bury the progress line
                _temp_dir=temp_dir,
                _node_ip_address=LOOPBACK,  # the collector's own processes: nothing listens outside
                _system_config=EMBEDDED_SYSTEM_CONFIG,
            )
    finally:
        notice.removeFilter(quiet)


def _node_report() -> tuple[str, str, str]:
    """Run on a node by `check_cluster`: what a worker placed there would have (its host, its
    collector: version and shard schema, and its Python)."""
    import sys

    return socket.gethostname(), _collector_build(), sys.version.split()[0]


def _collector_build() -> str:
    """The collector version with a digest of the shard schema: two checkouts of one version
    that write different columns cannot share a run (a worker's rows would be refused)."""
    import hashlib

    import collector
    from collector.record.shards import SCHEMA

    digest = hashlib.blake2b(str(SCHEMA).encode(), digest_size=4).hexdigest()
    return f"{collector.__version__} (schema {digest})"


def check_cluster(address: str, timeout_s: float, cpus_per_worker: float) -> tuple[bool, list[str]]:
    """`collector cluster-check ADDRESS`: whether a run can use the cluster, in a few lines.

    Joins it as a run's driver would (the same probe, the same bounded `ray.init`: a
    ConfigError in one line when it cannot), lists the alive nodes and their CPUs, runs a
    zero-CPU task on every node that imports the collector there (the version a worker would
    run, or why it cannot), and says how many workers of `cpus_per_worker` the CPUs hold.
    (ok, lines); ok is false when a node cannot run a worker or no worker fits.
    """
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    mine = _collector_build()
    with ray_session(address, 1, timeout_s):
        nodes = [n for n in ray.nodes() if n.get("Alive")]  # type: ignore[no-untyped-call]
        report = ray.remote(num_cpus=0)(_node_report)
        calls = [report.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                 .remote() for n in nodes]
        ok, lines = True, []
        total = 0.0
        for node, call in zip(nodes, calls, strict=True):
            cpus = float(node.get("Resources", {}).get("CPU", 0.0))
            total += cpus
            where = f"{node.get('NodeManagerAddress')} (node {str(node['NodeID'])[:12]}, {cpus:g} CPU)"
            try:
                host, version, python = ray.get(call, timeout=timeout_s)
            except Exception as exc:  # noqa: BLE001 - any failure there is the node's answer, shown in one line
                ok = False
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
                lines.append(f"  {where}: cannot run a worker: {first}")
                continue
            same = "" if version == mine else f" (the driver has {mine}: install the same on every node)"
            ok = ok and not same
            lines.append(f"  {where}: host {host}, collector {version}{same}, Python {python}")
        fits = int(total // cpus_per_worker) if cpus_per_worker > 0 else len(nodes)
        ok = ok and fits > 0
        head = (f"{address}: {'usable' if ok else 'NOT usable'}: {len(nodes)} node(s) alive, "
                f"{total:g} CPU(s): room for {fits} worker(s) at ray.cpus_per_worker = {cpus_per_worker:g}")
        return ok, [head, *lines]


class _WorkerActor:
    """The Ray shell of an `EpisodeWorker`: async methods, so one actor runs many episodes.
    (Its class name is what `ps` shows for the worker process: `ray::_WorkerActor`.)"""

    def __init__(self, setup: WorkerSetup) -> None:
        self._worker = EpisodeWorker(setup)
        # Every episode's `node`: the host and Ray's id of the node this actor was placed on.
        self._worker.node = f"{socket.gethostname()}:{ray.get_runtime_context().get_node_id()}"

    async def ready(self) -> str:
        return await self._worker.ready()

    async def encode_batch(self, items: list[WorkItem]) -> EncodedBatch:
        return await self._worker.encode_batch(items)

    async def write_batch(self, items: list[WorkItem]) -> WrittenBatch:
        return await self._worker.write_batch(items)

    async def finished(self) -> dict[str, int]:
        return dict(self._worker.finished)

    async def close(self) -> None:
        await self._worker.close()


#: The actor class as Ray sees it (untyped: Ray's decorator defeats static typing).
_RemoteWorker: Any = ray.remote(_WorkerActor)


class RayPool:
    """`collector.run.pool.WorkerPool` over Ray actors, in the session `ray_session` opens."""

    def address(self, cli_address: str | None, cfg: RunConfig) -> str | None:
        address = resolve_address(cli_address, cfg)
        if address is None:
            ray_temp_dir(cfg)  # a temp dir too long for Ray's sockets: one line, before any work
        return address

    def session(self, cfg: RunConfig, address: str | None) -> contextlib.AbstractContextManager[None]:
        temp_dir = ray_temp_dir(cfg) if address is None else None
        return ray_session(address, cfg.ray.workers, cfg.ray.start_timeout_s, temp_dir)

    def actor_options(self, num_cpus: float) -> dict[str, Any]:
        """How each worker actor is placed. SPREAD: on a cluster, one worker per node before
        doubling up (scaling is per node)."""
        return {"num_cpus": num_cpus, "scheduling_strategy": "SPREAD"}

    def cpus(self) -> tuple[float, float]:
        total = float(ray.cluster_resources().get("CPU", 0.0))  # type: ignore[no-untyped-call]
        largest = max(
            (float(n.get("Resources", {}).get("CPU", 0.0)) for n in ray.nodes() if n.get("Alive")),  # type: ignore[no-untyped-call]
            default=0.0,
        )
        return total, largest

    def alive_nodes(self) -> set[str]:
        try:
            nodes = ray.nodes()  # type: ignore[no-untyped-call]
        except Exception:  # noqa: BLE001 - a cluster that does not answer has no node to name
            return set()
        return {str(n.get("NodeID")) for n in nodes if n.get("Alive")}

    def start(self, setup: WorkerSetup, num_cpus: float) -> tuple[Actor, Call]:
        actor = _RemoteWorker.options(**self.actor_options(num_cpus)).remote(setup)
        return actor, actor.ready.remote()

    def run(self, actor: Actor, items: list[WorkItem], write: bool) -> Call:
        handle: Any = actor
        return (handle.write_batch if write else handle.encode_batch).remote(items)  # type: ignore[no-any-return]

    def poll(self, actor: Actor) -> Call:
        handle: Any = actor
        return handle.finished.remote()  # type: ignore[no-any-return]

    def wait(self, calls: Sequence[Call], timeout_s: float) -> list[Call]:
        calls = list(calls)
        if not calls:
            return []
        ready, rest = ray.wait(calls, num_returns=1, timeout=timeout_s, fetch_local=True)
        if ready and rest:
            more, _ = ray.wait(rest, num_returns=len(rest), timeout=0, fetch_local=True)
            ready += more
        return list(ready)

    def result(self, call: Call) -> object:
        try:
            return ray.get(cast("ray.ObjectRef[Any]", call))
        except ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            raise WorkerFailed(cause if isinstance(cause, BaseException) else exc) from None
        except ray.exceptions.RayError as exc:
            raise WorkerLost(type(exc).__name__) from None

    def kill(self, actor: Actor) -> None:
        with contextlib.suppress(Exception):  # the actor may already be gone: nothing to kill
            ray.kill(cast("ray.actor.ActorHandle[Any]", actor), no_restart=True)

    def close(self, actor: Actor, started: bool) -> None:
        if started:
            handle: Any = actor
            with contextlib.suppress(Exception):  # best effort: the run's result is already safe
                ray.get(handle.close.remote(), timeout=CLOSE_TIMEOUT_S)
        self.kill(actor)

    def with_logs(self, message: str) -> str:
        return with_logs(message)

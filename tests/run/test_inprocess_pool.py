"""The in-process pool (`collector.run.inprocess`) as the driver relies on it: real workers on
threads, failures told apart as on Ray, a worker that is killed or frozen, nothing left running.

The job through it end to end (run, resume, a killed and a frozen worker): tests/run/test_job.py.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pyarrow as pa
import pytest

from collector.envs.arithmetic import ArithmeticEnv
from collector.envs.base import Task
from collector.errors import ConfigError
from collector.run.encoded import EncodedBatch
from collector.run.inprocess import InProcessPool, InProcessWorker
from collector.run.job import default_pool
from collector.run.plan import plan_work
from collector.run.pool import WorkerFailed, WorkerLost
from collector.run.worker import WorkerSetup
from tests.run.helpers import small_config


class TasksFailOnTheWorker(ArithmeticEnv):
    """A bug in the worker's own code: listing the tasks raises."""

    def tasks(self) -> Sequence[Task]:
        raise RuntimeError("tasks cannot be listed on this worker")


@pytest.fixture
def sim_url() -> Iterator[str]:
    from collector.sim.server import SimServer

    with SimServer(seed=0) as server:
        yield server.base_url + "/v1"


def _setup(tmp_path: Path, sim_url: str, **overrides: object) -> WorkerSetup:
    cfg = small_config(tmp_path / "run", **overrides)
    return WorkerSetup(cfg, "a-run-id", (sim_url,))


def _worker_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("collector-worker-")]


def test_a_batch_runs_on_a_real_worker_and_the_session_leaves_no_thread(
    tmp_path: Path, sim_url: str
) -> None:
    """A started worker becomes ready, runs a batch into encoded rows whose ids are the items', and
    leaving the pool's session stops every worker thread."""
    setup = _setup(tmp_path, sim_url)
    items = list(plan_work(setup.cfg).items)[:4]
    pool = InProcessPool()
    with pool.session(setup.cfg, None):
        actor, ready = pool.start(setup, 1.0)
        assert pool.wait([ready], 30.0) == [ready]
        assert pool.result(ready) == "worker"
        call = pool.run(actor, items, write=False)
        assert pool.wait([call], 60.0) == [call]
        batch = pool.result(call)
        assert isinstance(batch, EncodedBatch)
        ids = pa.ipc.open_stream(batch.rows).read_all().column("episode_id").to_pylist()
        assert sorted(ids) == sorted(i.episode_id for i in items)
        poll = pool.poll(actor)
        pool.wait([poll], 10.0)
        assert sum(pool.result(poll).values()) == 4  # type: ignore[attr-defined]
        assert _worker_threads()
    assert not _worker_threads()


def test_a_worker_s_own_failure_is_worker_failed_and_a_killed_one_is_worker_lost(
    tmp_path: Path, sim_url: str
) -> None:
    """What the worker's code raised comes back as `WorkerFailed` with that cause (the run stops);
    a call pending on a killed worker, and any call made after, is `WorkerLost` (it is rerun)."""
    setup = _setup(tmp_path, sim_url, env__name="tests.run.test_inprocess_pool:TasksFailOnTheWorker")
    pool = InProcessPool()
    with pool.session(setup.cfg, None):
        _, ready = pool.start(setup, 1.0)
        pool.wait([ready], 30.0)
        with pytest.raises(WorkerFailed) as failed:
            pool.result(ready)
        assert isinstance(failed.value.cause, RuntimeError)
        assert "tasks cannot be listed on this worker" in str(failed.value.cause)

        good = _setup(tmp_path / "good", sim_url, sweep__models=["sim-slow"])
        actor, ready = pool.start(good, 1.0)
        pool.wait([ready], 30.0)
        pool.result(ready)
        pool.freeze(actor)  # the batch cannot finish before the kill, whatever the machine's speed
        call = pool.run(actor, list(plan_work(good.cfg).items)[:2], write=False)
        pool.kill(actor)
        assert pool.wait([call], 10.0) == [call]
        with pytest.raises(WorkerLost):
            pool.result(call)
        after = pool.poll(actor)
        with pytest.raises(WorkerLost):
            pool.result(after)


def test_a_frozen_worker_answers_nothing_until_thawed(tmp_path: Path, sim_url: str) -> None:
    """`freeze` blocks a worker's loop as SIGSTOP blocks its process: a poll stays pending, and
    answers once the worker is thawed."""
    setup = _setup(tmp_path, sim_url)
    pool = InProcessPool()
    with pool.session(setup.cfg, None):
        actor, ready = pool.start(setup, 1.0)
        pool.wait([ready], 30.0)
        pool.freeze(actor)
        poll = pool.poll(actor)
        assert pool.wait([poll], 0.2) == []
        pool.thaw(actor)
        assert pool.wait([poll], 10.0) == [poll]
        assert pool.result(poll) == {}


def test_the_worker_gets_its_own_copy_of_the_setup(tmp_path: Path, sim_url: str) -> None:
    """As a Ray actor receives its arguments, each worker holds a copy of its setup (pickled), never
    the driver's object."""
    setup = _setup(tmp_path, sim_url)
    worker = InProcessWorker(setup)
    try:
        assert worker.setup == setup
        assert worker.setup is not setup
        assert worker.setup.cfg is not setup.cfg
    finally:
        worker.stop(close_timeout_s=None)


def test_an_address_is_refused_by_the_in_process_pool_naming_where_it_came_from(tmp_path: Path) -> None:
    """An in-process run joins no cluster: `--address` or `ray.address` is one line naming the
    setting, never silently ignored."""
    cfg = small_config(tmp_path / "run")
    pool = InProcessPool()
    with pytest.raises(ConfigError, match=r"^--address = 127\.0\.0\.1:6379: ray\.pool = \"in_process\""):
        pool.address("127.0.0.1:6379", cfg)
    with pytest.raises(ConfigError, match=r"^ray\.address = 10\.0\.0\.1:6379: "):
        pool.address(None, small_config(tmp_path / "run", ray__address="10.0.0.1:6379"))
    assert pool.address(None, cfg) is None


def test_the_config_names_the_pool(tmp_path: Path) -> None:
    """`ray.pool` picks the pool a job runs on when none is given: in process, or Ray (the default)."""
    from collector.run.cluster import RayPool

    assert isinstance(default_pool(small_config(tmp_path)), InProcessPool)
    assert isinstance(default_pool(small_config(tmp_path, ray__pool="ray")), RayPool)

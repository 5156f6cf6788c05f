"""The Ray job end to end against the simulator: run, resume, refusal, worker death."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from collector.errors import CollectorError, ConfigError, OutputError
from collector.record.shards import read_shard
from collector.run.job import Snapshot, run_job
from collector.run.plan import plan_work
from collector.storage.manifest import committed_shard_paths
from tests.run.helpers import committed_id_counts, small_config

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]


def test_run_commits_every_planned_episode_once(tmp_path: Path) -> None:
    """A run through Ray workers commits each planned episode exactly once, from both workers."""
    cfg = small_config(tmp_path / "run")
    result = run_job(cfg, show_progress=False)
    planned = {item.episode_id for item in plan_work(cfg).items}
    counts = committed_id_counts(tmp_path / "run")
    assert set(counts) == planned
    assert set(counts.values()) == {1}
    assert result.committed == len(planned) == 24
    assert sum(result.counts.values()) == 24
    workers = set()
    for path in committed_shard_paths(tmp_path / "run"):
        workers.update(read_shard(path).column("worker").to_pylist())
    assert workers == {"w0.1", "w1.1"}


def test_resume_runs_only_missing_episodes(tmp_path: Path) -> None:
    """Rerunning a finished config runs nothing; a grown sweep runs only its new episodes."""
    run_dir = tmp_path / "run"
    first = run_job(small_config(run_dir, sweep__budgets=[32]), show_progress=False)
    assert first.committed == 12
    again = run_job(small_config(run_dir, sweep__budgets=[32]), show_progress=False)
    assert (again.already, again.committed) == (12, 0)
    grown = run_job(small_config(run_dir, sweep__budgets=[32, 64]), show_progress=False)
    assert (grown.already, grown.committed) == (12, 12)
    counts = committed_id_counts(run_dir)
    assert len(counts) == 24
    assert set(counts.values()) == {1}


def test_run_dir_of_another_config_is_refused(tmp_path: Path) -> None:
    """A run directory written by a config with other data-defining fields is refused in one line."""
    run_dir = tmp_path / "run"
    run_job(small_config(run_dir, sweep__budgets=[32], env__tasks=2), show_progress=False)
    with pytest.raises(OutputError) as info:
        run_job(
            small_config(run_dir, sweep__budgets=[32], env__tasks=2, loop__max_steps=3), show_progress=False
        )
    assert "\n" not in str(info.value)


def test_external_environment_module_from_config(tmp_path: Path) -> None:
    """examples/my_env, outside the package, runs from config via env.python_path on Ray workers."""
    examples = Path(__file__).resolve().parents[2] / "examples"
    cfg = small_config(
        tmp_path / "run",
        env__name="my_env:UnitPricesEnv",
        env__python_path=[str(examples)],
        env__options={"num_tasks": 3},
        env__tasks=None,
        samples_per_task=1,
        sweep__models=["sim-perfect"],
        sweep__budgets=[512],
    )
    result = run_job(cfg, show_progress=False)
    assert result.committed == 3
    rows = [row for p in committed_shard_paths(tmp_path / "run") for row in read_shard(p).to_pylist()]
    assert {row["env"] for row in rows} == {"my_env:UnitPricesEnv"}
    assert {row["task_id"] for row in rows} == {"line-000", "line-001", "line-002"}
    assert all(row["stop_reason"] == "done" and row["num_tool_calls"] >= 1 for row in rows)


def test_killed_worker_episodes_are_rerun_and_committed_once(tmp_path: Path) -> None:
    """Killing a worker mid-run re-dispatches its in-flight episodes; each is committed once."""
    import ray

    killed: list[object] = []

    def kill_busiest(snapshot: Snapshot) -> None:
        if not killed and snapshot.busy_actors:
            killed.append(snapshot.busy_actors[0])
            ray.kill(snapshot.busy_actors[0], no_restart=True)

    # sim-slow answers after ~50 ms, so the killed worker still holds episodes in flight.
    cfg = small_config(tmp_path / "run", sweep__models=["sim-slow"], env__tasks=10)
    result = run_job(cfg, show_progress=False, on_commit=kill_busiest)
    assert killed
    assert result.worker_restarts >= 1
    assert result.redispatched >= 1
    counts = committed_id_counts(tmp_path / "run")
    assert set(counts) == {item.episode_id for item in plan_work(cfg).items}
    assert set(counts.values()) == {1}


def test_shards_are_full_per_cell(tmp_path: Path) -> None:
    """Episodes are buffered per (model, budget) cell: every shard holds exactly rows_per_shard rows."""
    cfg = small_config(tmp_path / "run", output__commit_interval_s=600.0)
    result = run_job(cfg, show_progress=False)
    assert result.committed == 24  # 2 cells x 12 episodes, 4 rows per shard
    sizes = [read_shard(p).num_rows for p in committed_shard_paths(tmp_path / "run")]
    assert sorted(sizes) == [4] * 6


@pytest.mark.timeout(60)
def test_workers_that_do_not_fit_the_cluster_are_refused(tmp_path: Path) -> None:
    """cpus_per_worker beyond the cluster's CPUs is a one-line ConfigError before any actor, not a hang."""
    cfg = small_config(tmp_path / "run", ray__cpus_per_worker=3)
    with pytest.raises(ConfigError) as info:
        run_job(cfg, show_progress=False)
    message = str(info.value)
    assert "\n" not in message
    assert "ray.cpus_per_worker" in message
    assert "ray.workers" in message
    assert "cluster has 2 CPUs" in message


@pytest.mark.timeout(60)
def test_worker_start_timeout_is_one_line(tmp_path: Path) -> None:
    """Workers not ready within ray.start_timeout_s end the run with one line naming the setting."""
    cfg = small_config(tmp_path / "run", ray__start_timeout_s=0.001)
    with pytest.raises(CollectorError) as info:
        run_job(cfg, show_progress=False)
    assert "ray.start_timeout_s" in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.timeout(120)
def test_replacement_that_cannot_be_placed_stops_the_run(tmp_path: Path) -> None:
    """The only worker killed, its replacement unplaceable: the run stops in one line; a rerun completes."""
    import ray

    from collector.run.cluster import RayPool

    class Unplaceable(RayPool):
        """The Ray pool, but every actor after the first asks for a resource no node has."""

        created = 0

        def actor_options(self, num_cpus: float) -> dict[str, Any]:
            self.created += 1
            options = super().actor_options(num_cpus)
            return {**options, "resources": {"no_such_node": 1}} if self.created > 1 else options

    killed: list[object] = []

    def kill_all(snapshot: Snapshot) -> None:
        if not killed:
            killed.extend(snapshot.busy_actors)
            for actor in snapshot.busy_actors:
                ray.kill(actor, no_restart=True)

    cfg = small_config(
        tmp_path / "run", sweep__models=["sim-slow"], env__tasks=10, ray__workers=1, ray__start_timeout_s=6.0
    )
    with pytest.raises(CollectorError) as info:
        run_job(cfg, show_progress=False, on_commit=kill_all, pool=Unplaceable())
    assert len(killed) == 1
    assert "could not be placed" in str(info.value)
    assert "\n" not in str(info.value)
    before = committed_id_counts(tmp_path / "run")
    assert before
    assert set(before.values()) == {1}

    again = run_job(cfg, show_progress=False)
    assert again.already == sum(before.values())
    counts = committed_id_counts(tmp_path / "run")
    assert set(counts) == {item.episode_id for item in plan_work(cfg).items}
    assert set(counts.values()) == {1}


def test_a_worker_failure_says_where_rays_logs_are(tmp_path: Path) -> None:
    """A worker that fails starting stops the run with one line naming the session's log
    directory, which holds the workers' logs."""
    cfg = small_config(
        tmp_path / "run",
        env__name="workerfail_env:WorkerOnlyFailure",
        env__python_path=[str(Path(__file__).parent)],
    )
    with pytest.raises(CollectorError) as info:
        run_job(cfg, show_progress=False)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("a worker failed to start: RuntimeError: tasks cannot be listed on this worker")
    logs = Path(message.rsplit("(Ray logs: ", 1)[1].rstrip(")"))
    assert logs.is_dir()
    assert any(logs.glob("worker-*.err"))


def test_ray_temp_dir_too_long_for_rays_sockets_is_one_line() -> None:
    """A `ray.temp_dir` longer than Ray's socket paths allow is refused before Ray starts."""
    from collector.run.cluster import ray_temp_dir

    cfg = small_config(Path("/tmp/x"), ray__temp_dir="/tmp/" + "d" * 60)
    with pytest.raises(ConfigError, match=r"^ray.temp_dir: /tmp/d+ is 65 bytes; Ray's socket paths"):
        ray_temp_dir(cfg)
    assert ray_temp_dir(small_config(Path("/tmp/x"), ray__temp_dir="/tmp/r")) == "/tmp/r"


def test_a_tiny_buffer_cap_still_commits_every_episode_once(tmp_path: Path) -> None:
    """With `output.max_buffered_rows` below one shard per cell, cells are committed early as
    smaller shards, and every planned episode is still committed exactly once."""
    cfg = small_config(tmp_path / "run", output__max_buffered_rows=2, output__commit_interval_s=600.0)
    result = run_job(cfg, show_progress=False)
    counts = committed_id_counts(tmp_path / "run")
    assert set(counts) == {item.episode_id for item in plan_work(cfg).items}
    assert set(counts.values()) == {1}
    assert result.committed == 24
    rows = [read_shard(p, columns=["episode_id"]).num_rows for p in committed_shard_paths(tmp_path / "run")]
    assert len(rows) > 24 // 4  # not only the six full shards: the cap flushed cells before they filled

"""The job end to end against the simulator, its workers in process: run, resume, refusal, worker death.

The same job on Ray, and what only Ray has (placement, start-up, its logs): tests/system/run/test_ray_job.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.errors import ConfigError, OutputError
from collector.record.shards import read_shard
from collector.run.job import run_job
from collector.run.plan import plan_work
from collector.storage.manifest import committed_shard_paths
from tests.run.helpers import committed_id_counts, run_killing_a_busy_worker, small_config


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


def test_shards_are_full_per_cell(tmp_path: Path) -> None:
    """Episodes are buffered per (model, budget) cell: every shard holds exactly rows_per_shard rows."""
    cfg = small_config(tmp_path / "run", output__commit_interval_s=600.0)
    result = run_job(cfg, show_progress=False)
    assert result.committed == 24  # 2 cells x 12 episodes, 4 rows per shard
    sizes = [read_shard(p).num_rows for p in committed_shard_paths(tmp_path / "run")]
    assert sorted(sizes) == [4] * 6


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


def test_a_killed_worker_s_episodes_are_rerun_and_committed_once(tmp_path: Path) -> None:
    """A worker killed while it holds episodes (the in-process pool's `kill`, as a lost Ray actor):
    its batches run on a replacement and every planned episode is committed exactly once."""
    from collector.run.inprocess import InProcessPool

    pool = InProcessPool()
    run_killing_a_busy_worker(tmp_path, pool.kill, pool)
    assert all(worker.dead for worker in pool.workers)  # none left running after the run


def test_a_frozen_worker_s_batch_runs_elsewhere_after_its_deadline(tmp_path: Path) -> None:
    """A worker frozen with a batch in hand (its event loop blocked, as SIGSTOP does): past
    `ray.batch_timeout_s` the batch runs on a replacement, every episode committed once."""
    from collector.run.inprocess import InProcessPool, InProcessWorker
    from collector.run.plan import WorkItem

    frozen: list[InProcessWorker] = []

    def freeze_first(worker: InProcessWorker, items: list[WorkItem]) -> None:
        # The batch is handed over right after: its episodes are stuck behind the frozen loop.
        if not frozen:
            frozen.append(worker)
            pool.freeze(worker)

    pool = InProcessPool(on_batch=freeze_first)
    cfg = small_config(tmp_path / "run", ray__batch_timeout_s=1.0)
    result = run_job(cfg, show_progress=False, pool=pool)
    assert frozen
    assert frozen[0].dead
    assert result.worker_restarts >= 1
    counts = committed_id_counts(tmp_path / "run")
    assert set(counts) == {item.episode_id for item in plan_work(cfg).items}
    assert set(counts.values()) == {1}

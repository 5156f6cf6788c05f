"""Helpers for the job tests: small configs and an independent read of what a run committed."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collector.config import RunConfig
from collector.record.shards import read_shard
from collector.storage.manifest import committed_shard_paths

if TYPE_CHECKING:
    from collector.run.driver import JobResult
    from collector.run.pool import WorkerPool


def small_config(run_dir: Path, **overrides: Any) -> RunConfig:
    """A few dozen simulated arithmetic episodes, two workers, small batches and shards. The
    workers run in this process (`ray.pool = "in_process"`): a system test that means Ray
    says so (`ray__pool="ray"`)."""
    data: dict[str, Any] = {
        "name": "jobtest",
        "sweep": {"models": ["sim-terse"], "budgets": [32, 128]},
        "env": {"name": "arithmetic", "tasks": 6},
        "samples_per_task": 2,
        "ray": {"pool": "in_process", "workers": 2, "episodes_in_flight": 4, "batch_size": 4,
                "cpus_per_worker": 0.5},
        "output": {"path": str(run_dir), "rows_per_shard": 4},
    }
    for key, value in overrides.items():
        node = data
        *parents, leaf = key.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return RunConfig.model_validate(data)


def committed_id_counts(run_dir: Path) -> Counter[str]:
    """How many times each episode id appears across the committed shards (read from the files)."""
    counts: Counter[str] = Counter()
    for path in committed_shard_paths(run_dir):
        counts.update(read_shard(path, columns=["episode_id"]).column("episode_id").to_pylist())
    return counts


def shards_written_by(run_dir: Path) -> set[str]:
    """Who wrote the committed shards, told by their names: "worker" (`part-<32 hex>`, random:
    `collector.storage.pending.pending_shard_name`) or "driver" (`part-<counter>-<8 hex>`)."""
    from collector.storage.manifest import read_manifest

    names = [entry["path"].rsplit("/", 1)[-1].split(".")[0] for entry in read_manifest(run_dir)["shards"]]
    return {"worker" if re.fullmatch(r"part-[0-9a-f]{32}", name) else "driver" for name in names}


def run_killing_a_busy_worker(tmp_path: Path, kill: Callable[[object], None], pool: WorkerPool | None = None,
                              **overrides: Any) -> JobResult:
    """A run whose first busy worker is killed by `kill` at the first commit (the event proving it
    holds episodes: sim-slow answers after ~50 ms); asserts that its episodes were re-run and that
    every planned one is committed exactly once."""
    from collector.run.job import Snapshot, run_job
    from collector.run.plan import plan_work

    killed: list[object] = []

    def kill_busiest(snapshot: Snapshot) -> None:
        if not killed and snapshot.busy_actors:
            killed.append(snapshot.busy_actors[0])
            kill(snapshot.busy_actors[0])

    cfg = small_config(tmp_path / "run", sweep__models=["sim-slow"], env__tasks=10, **overrides)
    result = run_job(cfg, show_progress=False, on_commit=kill_busiest, pool=pool)
    assert killed
    assert result.worker_restarts >= 1
    assert result.redispatched >= 1
    counts = committed_id_counts(tmp_path / "run")
    assert set(counts) == {item.episode_id for item in plan_work(cfg).items}
    assert set(counts.values()) == {1}
    return result

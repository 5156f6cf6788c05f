"""The one-writer guard under a deleted lock file: the run stops with one line instead of
reporting commits a second writer could drop, and a rerun completes every episode once."""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.config import RunConfig
from collector.run.job import Snapshot, run_job
from collector.run.plan import plan_work
from collector.storage.local import LockLost
from collector.storage.manifest import LOCK
from tests.checking import committed_ids


def test_a_lock_deleted_mid_run_stops_the_writer_with_one_line(tmp_path: Path) -> None:
    """The lock file deleted after the first commit (work still in flight: at most 4 of 40
    episodes are out at once): the next commit is refused, the run raises one line naming the
    lock, the manifest holds only what was committed before, and a rerun completes the rest."""
    run_dir = tmp_path / "run"
    cfg = RunConfig.model_validate({
        "name": "two-writers", "sweep": {"models": ["sim-perfect"], "budgets": [256]},
        "env": {"name": "arithmetic", "tasks": 40},
        "ray": {"pool": "in_process", "workers": 1, "episodes_in_flight": 2, "batch_size": 2,
                "cpus_per_worker": 0.5},
        "output": {"path": str(run_dir), "rows_per_shard": 2},
    })
    first_commit: list[int] = []

    def delete_lock(snapshot: Snapshot) -> None:
        if not first_commit:
            first_commit.append(snapshot.committed)
            (run_dir / LOCK).unlink()

    with pytest.raises(LockLost) as info:
        run_job(cfg, show_progress=False, on_commit=delete_lock)
    message = str(info.value)
    assert "\n" not in message
    assert str(run_dir / LOCK) in message
    assert "deleted or replaced" in message
    assert first_commit
    assert first_commit[0] < 40  # the fault landed while work was still in flight
    assert len(committed_ids(run_dir)) == first_commit[0]

    again = run_job(cfg, show_progress=False)
    assert again.already == first_commit[0]
    counts = committed_ids(run_dir)
    assert set(counts) == {item.episode_id for item in plan_work(cfg).items}
    assert set(counts.values()) == {1}

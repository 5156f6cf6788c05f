"""Killing the driver process at an arbitrary point, then rerunning, commits every episode once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from collector.config import load_config
from collector.run.job import run_job
from collector.run.plan import plan_work
from collector.storage.manifest import MANIFEST, read_manifest
from tests.run.helpers import committed_id_counts, shards_written_by

pytestmark = pytest.mark.ray

CONFIG = """
name = "killtest"
samples_per_task = 2

[sweep]
models = ["sim-slow"]   # ~50 ms per model call: the run lasts long enough to be interrupted
budgets = [32, 128]

[env]
name = "arithmetic"
tasks = 30

[ray]
workers = 2
episodes_in_flight = 2
batch_size = 2
cpus_per_worker = 0.5

[output]
path = "{run_dir}"
rows_per_shard = 2
worker_writes = {worker_writes}
"""


def wait_for_first_commit(proc: subprocess.Popen[bytes], run_dir: Path, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the driver exited before it could be killed"
        if (run_dir / MANIFEST).exists() and read_manifest(run_dir)["shards"]:
            return
        time.sleep(0.05)
    raise AssertionError("no commit within the timeout")


@pytest.mark.parametrize("worker_writes", [False, True], ids=["driver-writes", "worker-writes"])
def test_sigkilled_driver_then_rerun_commits_each_episode_once(
    tmp_path: Path, ray_cluster: str, worker_writes: bool
) -> None:
    """SIGKILL of `collector run` mid-run loses nothing committed; the rerun completes without duplicates
    (driver-side or worker-side writes)."""
    run_dir = tmp_path / "run"
    config = tmp_path / "kill.toml"
    config.write_text(CONFIG.format(run_dir=run_dir, worker_writes=str(worker_writes).lower()))
    proc = subprocess.Popen(
        [sys.executable, "-m", "collector.cli", "run", str(config), "--address", ray_cluster, "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "RAY_AUTH_MODE": "disabled"},
    )
    try:
        wait_for_first_commit(proc, run_dir)
        time.sleep(0.3)  # land somewhere between commits, with episodes in flight
        assert proc.poll() is None, "the driver finished before it was killed"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.communicate()
    before = committed_id_counts(run_dir)
    cfg = load_config(config)
    planned = {item.episode_id for item in plan_work(cfg).items}
    assert 0 < len(before) < len(planned)

    result = run_job(cfg, show_progress=False)
    assert result.already == len(before)
    assert result.committed == len(planned) - len(before)
    after = committed_id_counts(run_dir)
    assert set(after) == planned
    assert set(after.values()) == {1}
    assert shards_written_by(run_dir) == {"worker" if worker_writes else "driver"}

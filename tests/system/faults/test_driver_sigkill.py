"""The driver SIGKILLed at several random moments, then run again: every episode exactly once.

`collector run` attaches (`--address`) to the session's Ray cluster in a subprocess and is
killed with SIGKILL at moments drawn from a seeded generator: during start-up, right after
a commit, between commits. After every kill the run directory must be consistent on its
own: `collector check` passes, the manifest names only complete, readable shards, nothing
committed before is lost, no id appears twice, and a plain pyarrow dataset over the tree
(no manifest) sees committed episodes only, each once. A last, uninterrupted run then
completes exactly the missing episodes and leaves no stray file behind.

The same with the run in a bucket (`s3://`, the session's moto server; workers write its
shards): every check then reads the bucket's state through the readers' synced mirror
(`collector.storage.mirror`), which holds exactly the bucket's keys, strays included.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from collector.config import load_config
from collector.run.job import run_job
from collector.run.plan import plan_work
from collector.storage.manifest import MANIFEST, NotARunDirectory, read_manifest
from collector.storage.mirror import resolve_run
from tests.checking import assert_run_checked, committed_ids
from tests.run.helpers import shards_written_by

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[3]
SEED = 20240607

CONFIG = """
name = "sigkill"
samples_per_task = 2

[sweep]
models = ["sim-slow"]   # ~50 ms per model call: commits are spread over a few seconds
budgets = [32, 128]

[env]
name = "arithmetic"
tasks = 12   # 48 episodes: the three kills leave ~16 committed, the rerun needs only the rest

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


def view(run: Path | str) -> Path:
    """The run's files: the directory, or a bucket's mirror synced now (an empty dir before
    the first open created the run)."""
    try:
        return resolve_run(run)
    except NotARunDirectory:
        return Path("/nonexistent-run")


def shard_count(run: Path | str) -> int:
    run_dir = view(run)
    if not (run_dir / MANIFEST).exists():
        return 0
    return len(read_manifest(run_dir)["shards"])


def kill_at(argv: list[str], run_dir: Path | str, after_commits: int, extra_delay_s: float) -> None:
    """Start the driver; SIGKILL it once `after_commits` new shards are in, plus a delay."""
    start_shards = shard_count(run_dir)
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "RAY_AUTH_MODE": "disabled"},
        cwd=REPO,
    )
    try:
        deadline = time.monotonic() + 120
        while shard_count(run_dir) < start_shards + after_commits:
            assert proc.poll() is None, "the driver finished before it was killed"
            assert time.monotonic() < deadline, "no commit within two minutes"
            time.sleep(0.02)
        time.sleep(extra_delay_s)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL


def assert_consistent(run: Path | str, before: Counter[str]) -> Counter[str]:
    """Check passes, ids are unique, everything committed before is still there, a glob sees no more."""
    run_dir = view(run)
    if (run_dir / MANIFEST).exists():
        assert_run_checked(run_dir)
    now = committed_ids(run_dir)
    assert set(now.values()) <= {1}
    assert set(before) <= set(now)
    # A plain reader of the tree (no manifest) sees committed episodes only, each once.
    tree = ds.dataset(run_dir, format="ipc") if run_dir.exists() else None
    seen: list[str] = []
    if tree is not None and tree.files:
        seen = tree.to_table(columns=["episode_id"]).column("episode_id").to_pylist()
    assert len(seen) == len(set(seen))
    assert set(seen) <= set(now)
    return now


@pytest.mark.parametrize(("where", "worker_writes"), [("dir", False), ("dir", True), ("s3", "auto")],
                         ids=["driver-writes", "worker-writes", "s3-worker-writes"])
def test_driver_sigkilled_at_random_moments_then_rerun(
    tmp_path: Path, ray_cluster: str, where: str, worker_writes: bool | str,
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three SIGKILLs at seeded random moments, then a rerun: each planned episode committed exactly once
    (with worker-side writes too: a kill then also lands between a worker's write and its commit; and
    in a bucket, where the commit point is a create-only record instead of a rename)."""
    rng = random.Random(SEED)
    run: Path | str = tmp_path / "run"
    if where == "s3":
        run = request.getfixturevalue("s3_bucket").uri("run")
        monkeypatch.setenv("COLLECTOR_CACHE_DIR", str(tmp_path / "cache"))
    config = tmp_path / "kill.toml"
    writes = f'"{worker_writes}"' if isinstance(worker_writes, str) else str(worker_writes).lower()
    config.write_text(CONFIG.format(run_dir=run, worker_writes=writes))
    argv = [sys.executable, "-m", "collector.cli", "run", str(config), "--address", ray_cluster, "--quiet"]
    planned = {item.episode_id for item in plan_work(load_config(config)).items}

    # Moments: while starting up (no commit yet), just after a commit, between commits.
    moments = [(0, rng.uniform(0.0, 1.5)), (1, 0.0), (rng.randint(1, 3), rng.uniform(0.05, 0.4))]
    committed: Counter[str] = Counter()
    for after_commits, delay in moments:
        kill_at(argv, run, after_commits, delay)
        committed = assert_consistent(run, committed)
    assert 0 < len(committed) < len(planned)

    result = run_job(load_config(config), show_progress=False)
    assert result.already == len(committed)
    assert result.committed == len(planned) - len(committed)
    run_dir = resolve_run(run)
    final = committed_ids(run_dir)
    assert set(final) == planned
    assert set(final.values()) == {1}
    assert shards_written_by(run_dir) == {"driver" if worker_writes is False else "worker"}
    # The rerun removed the temporary and uncommitted files the kills left behind.
    assert_run_checked(run_dir, allow_notes=False)

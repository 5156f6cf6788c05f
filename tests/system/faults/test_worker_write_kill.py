"""A worker SIGKILLed in the middle of writing its shard (`output.worker_writes = true`).

The fault lands on an event, not a guess: `tests.faults.gated_sink.GatedSink` makes the first
write of the run stop half-way through its pending file and announce its pid; the test then
SIGKILLs that process. Nothing of the half-written file may ever be visible, and the batch
the worker held runs again on its replacement: every episode committed exactly once.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow.dataset as ds
import pyarrow.fs
import pytest

from collector.config import RunConfig
from collector.run.job import JobResult, run_job
from collector.run.plan import plan_work
from collector.storage.local import LocalRunStore
from collector.storage.manifest import TMP_DIR
from collector.storage.mirror import resolve_run
from collector.storage.s3store import S3RunStore
from tests.checking import assert_run_checked
from tests.faults.gated_sink import GatedS3Sink, GatedSink, pid_at_gate
from tests.run.helpers import committed_id_counts, shards_written_by, small_config
from tests.s3server import S3Bucket

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_cluster"), pytest.mark.timeout(240)]


class Killer(threading.Thread):
    """SIGKILLs the process that holds a half-written shard, as soon as one does."""

    def __init__(self, gate_dir: Path) -> None:
        super().__init__(daemon=True)
        self.gate_dir = gate_dir
        self.killed: int | None = None
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            pid = pid_at_gate(self.gate_dir)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                self.killed = pid
                return
            time.sleep(0.01)


def run_killing_the_gated_writer(cfg: RunConfig, gate: Path, run_files: Callable[[], Path]) -> JobResult:
    """Run `cfg` while a `Killer` SIGKILLs the worker at the gate; assert what every variant
    holds: the kill landed, each planned id committed exactly once, one worker restarted, the
    shards written by the workers. `run_files` gives the run's files once the job is done."""
    killer = Killer(gate)
    killer.start()
    try:
        result = run_job(cfg, show_progress=False)
    finally:
        killer.done.set()
        killer.join(timeout=5)
    assert killer.killed is not None
    planned = {item.episode_id for item in plan_work(cfg).items}
    files = run_files()
    counts = committed_id_counts(files)
    assert set(counts) == planned
    assert set(counts.values()) == {1}
    assert result.committed == len(planned)
    assert result.worker_restarts == 1
    assert shards_written_by(files) == {"worker"}
    return result


def test_worker_killed_mid_write_leaves_nothing_visible_and_its_batch_runs_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker killed half-way through its shard: no reader sees it, its batch runs again, each id once."""
    gate = tmp_path / "gate"
    gate.mkdir()
    run_dir = tmp_path / "run"
    cfg = small_config(run_dir, ray__pool="ray", output__worker_writes=True, ray__batch_size=2,
                       ray__episodes_in_flight=2)
    gated = lambda self: GatedSink(str(self.root.absolute()), self.fmt, str(gate))  # noqa: E731
    monkeypatch.setattr(LocalRunStore, "sink", gated)
    result = run_killing_the_gated_writer(cfg, gate, lambda: run_dir)
    planned = {item.episode_id for item in plan_work(cfg).items}
    # The killed worker held its batches (at most two of two episodes here): run again once.
    assert 2 <= result.redispatched <= 4
    # A plain reader of the tree sees each committed episode once, nothing of the half file.
    seen = ds.dataset(run_dir, format="ipc").to_table(columns=["episode_id"]).column("episode_id").to_pylist()
    assert sorted(seen) == sorted(planned)
    assert list((run_dir / TMP_DIR).iterdir())  # the half-written orphan, hidden
    assert run_job(cfg, show_progress=False).committed == 0  # the next open removes it
    assert not list((run_dir / TMP_DIR).iterdir())
    assert_run_checked(run_dir, allow_notes=False)


def test_a_worker_killed_holding_its_pending_object_in_a_bucket_costs_only_a_rerun_of_its_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3_bucket: S3Bucket
) -> None:
    """In a bucket: a worker killed after its shard's PUT, before the driver heard of it. The
    object stays under .collector/tmp/, never in data/ nor the manifest; the batch runs again
    once; each id is committed once; the next open removes the orphan and `collector check`
    is clean; pyarrow reads the bucket's data/ with each episode once."""
    gate = tmp_path / "gate"
    gate.mkdir()
    monkeypatch.setenv("COLLECTOR_CACHE_DIR", str(tmp_path / "cache"))
    uri = s3_bucket.uri("run")
    cfg = small_config(uri, ray__pool="ray", ray__batch_size=2, ray__episodes_in_flight=2)  # type: ignore[arg-type]
    gated = lambda self: GatedS3Sink(self.location, self.fmt, str(gate))  # noqa: E731
    monkeypatch.setattr(S3RunStore, "sink", gated)
    run_killing_the_gated_writer(cfg, gate, lambda: resolve_run(uri))
    planned = {item.episode_id for item in plan_work(cfg).items}
    assert s3_bucket.keys("run/.collector/tmp/")  # the killed worker's orphan, hidden from readers
    s3 = pyarrow.fs.S3FileSystem(endpoint_override=os.environ["AWS_ENDPOINT_URL_S3"])
    seen = ds.dataset(f"{s3_bucket.name}/run", filesystem=s3, format="ipc").to_table(columns=["episode_id"])
    assert sorted(seen.column("episode_id").to_pylist()) == sorted(planned)
    assert run_job(cfg, show_progress=False).committed == 0  # the next open removes the orphan
    assert not s3_bucket.keys("run/.collector/tmp/")
    assert_run_checked(resolve_run(uri), allow_notes=False)

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
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from collector.data.manifest import TMP_DIR
from collector.data.store import RunStore
from collector.run.job import run_job
from collector.run.plan import plan_work
from tests.checking import assert_run_checked
from tests.faults.gated_sink import GatedSink, pid_at_gate
from tests.run.helpers import committed_id_counts, shards_written_by, small_config

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


def test_worker_killed_mid_write_leaves_nothing_visible_and_its_batch_runs_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker killed half-way through its shard: no reader sees it, its batch runs again, each id once."""
    gate = tmp_path / "gate"
    gate.mkdir()
    run_dir = tmp_path / "run"
    cfg = small_config(run_dir, output__worker_writes=True, ray__batch_size=2, ray__episodes_in_flight=2)
    gated = lambda self: GatedSink(str(self.root.absolute()), self.fmt, str(gate))  # noqa: E731
    monkeypatch.setattr(RunStore, "sink", gated)
    killer = Killer(gate)
    killer.start()
    try:
        result = run_job(cfg, show_progress=False)
    finally:
        killer.done.set()
        killer.join(timeout=5)
    assert killer.killed is not None
    planned = {item.episode_id for item in plan_work(cfg).items}
    counts = committed_id_counts(run_dir)
    assert set(counts) == planned
    assert set(counts.values()) == {1}
    assert result.committed == len(planned)
    assert result.worker_restarts == 1
    assert shards_written_by(run_dir) == {"worker"}
    # The killed worker held its batches (at most two of two episodes here): run again once.
    assert 2 <= result.redispatched <= 4
    # A plain reader of the tree sees each committed episode once, nothing of the half file.
    seen = ds.dataset(run_dir, format="ipc").to_table(columns=["episode_id"]).column("episode_id").to_pylist()
    assert sorted(seen) == sorted(planned)
    assert list((run_dir / TMP_DIR).iterdir())  # the half-written orphan, hidden
    assert run_job(cfg, show_progress=False).committed == 0  # the next open removes it
    assert not list((run_dir / TMP_DIR).iterdir())
    assert_run_checked(run_dir, allow_notes=False)

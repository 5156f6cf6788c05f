"""A frozen worker (SIGSTOP) does not stall the run: past `ray.batch_timeout_s` its batches run
elsewhere, and every episode is still committed exactly once.

The fault lands while work is provably in flight: the calculator of `tests.faults.gated_env`
records the pid of the worker process running it and holds every call at a gate; the test
SIGSTOPs the first worker seen there, then opens the gate. Ray never reports a stopped
process dead, so only the driver's batch deadline can get its episodes back.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from collector.run.job import run_job
from collector.run.plan import plan_work
from tests.checking import assert_run_checked
from tests.faults.gated_env import open_gate, pids_at_gate
from tests.run.helpers import committed_id_counts, shards_written_by, small_config

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_cluster"), pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[3]
#: Safety net only: without a batch deadline the run would wait for the frozen worker
#: forever, so the process is continued after this long and the assertions report it.
THAW_AFTER_S = 90.0


class Freezer(threading.Thread):
    """SIGSTOPs the first worker process that reaches the gate, then opens the gate."""

    def __init__(self, gate_dir: Path) -> None:
        super().__init__(daemon=True)
        self.gate_dir = gate_dir
        self.frozen: int | None = None
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            pids = pids_at_gate(self.gate_dir)
            if pids:
                self.frozen = pids[0]
                os.kill(self.frozen, signal.SIGSTOP)
                open_gate(self.gate_dir)
                break
            time.sleep(0.01)
        if self.frozen is not None and not self.done.wait(THAW_AFTER_S):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.frozen, signal.SIGCONT)

    def release(self) -> None:
        """Stop watching; continue and kill the frozen process if Ray has not (we stopped it)."""
        self.done.set()
        self.join(timeout=5)
        if self.frozen is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.frozen, signal.SIGCONT)
                os.kill(self.frozen, signal.SIGKILL)


@pytest.mark.parametrize("worker_writes", [False, True], ids=["driver-writes", "worker-writes"])
def test_sigstopped_worker_batches_rerun_elsewhere_exactly_once(tmp_path: Path, worker_writes: bool) -> None:
    """A worker SIGSTOPped mid-episode: its batches time out, run on another worker, each episode once
    (also when workers write their shards: the frozen one's never are)."""
    gate = tmp_path / "gate"
    gate.mkdir()
    cfg = small_config(
        tmp_path / "run",
        ray__pool="ray",  # the subject: a worker process SIGSTOPped
        env__name="tests.faults.gated_env:GatedArithmetic",
        env__options={"gate_dir": str(gate)},
        env__python_path=[str(REPO)],
        env__tasks=8,
        samples_per_task=1,
        loop__tool_timeout_s=150.0,
        ray__episodes_in_flight=2,
        ray__batch_size=2,
        ray__batch_timeout_s=10.0,
        output__worker_writes=worker_writes,
    )
    freezer = Freezer(gate)
    freezer.start()
    try:
        result = run_job(cfg, show_progress=False)
    finally:
        freezer.release()
    assert freezer.frozen is not None
    planned = {item.episode_id for item in plan_work(cfg).items}
    counts = committed_id_counts(tmp_path / "run")
    assert set(counts) == planned
    assert set(counts.values()) == {1}
    assert result.worker_restarts >= 1
    assert result.redispatched >= 1
    assert shards_written_by(tmp_path / "run") == {"worker" if worker_writes else "driver"}
    assert_run_checked(tmp_path / "run", allow_notes=False)

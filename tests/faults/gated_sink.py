"""Sinks whose first write stops half-way: fault tests kill a worker provably mid-write.

`GatedSink` is a `LocalSink`; `GatedS3Sink`, below, the same gate for a run in a bucket.

The first `write` of a run (claimed by an exclusive create of `gate_dir/claimed`, so exactly
one process ever takes it) writes half of the shard's bytes to its pending file, creates
`gate_dir/<pid>` (this process now holds a half-written shard) and waits to be killed. Every
other write is a plain `LocalSink.write`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pyarrow as pa
import pyarrow.ipc as ipc

from collector.storage.local import LocalSink
from collector.storage.manifest import DATA_DIR, pending_path
from collector.storage.pending import PendingShard, pending_shard_name
from collector.storage.s3objects import S3Sink

#: Safety net only: the test kills the process long before this.
HOLD_S = 120.0


def claim_the_gate(gate_dir: str) -> bool:
    """True for the one write of the run that stops (an exclusive create: one process ever)."""
    try:
        fd = os.open(Path(gate_dir) / "claimed", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def wait_at_the_gate(gate_dir: str) -> NoReturn:
    """Announce this process (it now holds an uncommitted shard) and wait to be killed."""
    (Path(gate_dir) / str(os.getpid())).touch()
    time.sleep(HOLD_S)
    raise RuntimeError("gated write was never killed")


@dataclass(frozen=True)
class GatedSink(LocalSink):
    gate_dir: str = ""

    def write(self, table: pa.Table, model: str, budget: int, episode_ids: tuple[str, ...]) -> PendingShard:
        if not claim_the_gate(self.gate_dir):
            return super().write(table, model, budget, episode_ids)
        sink = pa.BufferOutputStream()
        with ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        data = sink.getvalue().to_pybytes()
        path = pending_path(Path(self.root), f"{DATA_DIR}/{pending_shard_name(self.fmt)}")
        with open(path, "wb") as f:
            f.write(data[: len(data) // 2])
            f.flush()
            os.fsync(f.fileno())
        wait_at_the_gate(self.gate_dir)


def pid_at_gate(gate_dir: Path) -> int | None:
    """The pid of the process holding a half-written shard, once there is one."""
    pids = [int(p.name) for p in gate_dir.iterdir() if p.name.isdigit()]
    return pids[0] if pids else None


@dataclass(frozen=True)
class GatedS3Sink(S3Sink):
    """The same gate for a run in a bucket. An S3 PUT is atomic (a half-sent body is never an
    object), so the first write PUTs its pending object whole, then announces its pid and waits
    to be killed: the worker dies holding a shard nobody will commit, between its write and the
    reply that would have handed it to the driver."""

    gate_dir: str = ""

    def write(self, table: pa.Table, model: str, budget: int, episode_ids: tuple[str, ...]) -> PendingShard:
        if not claim_the_gate(self.gate_dir):
            return super().write(table, model, budget, episode_ids)
        super().write(table, model, budget, episode_ids)
        wait_at_the_gate(self.gate_dir)

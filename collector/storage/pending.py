"""Shards written where their episodes finished, not yet committed.

With worker-side writes (`output.worker_writes`), each worker writes the shards of its
batches into the run's pending area itself (``.collector/tmp/`` of a shared directory, or
the same keys in an object store) and returns a `PendingShard` to the driver: the driver
commits names, sizes and checksums, so episode bytes never cross Ray and the driver's CPU
and memory per episode stop depending on episode size.

The contract between the two sides:
- a `ShardSink` (picklable: it travels to the workers inside their setup) writes a table
  to the pending area under a fresh name and returns its `PendingShard`; the file is
  complete (fsynced, or a finished PUT) when `write` returns, and invisible to every
  reader (not under ``data/``) until a store commits it;
- the store's ``commit_pending(shards)`` names them in one commit record, then moves them
  into ``data/``, exactly as a driver-side commit does after its own writes; a crash leaves
  either the old state (the pending files are orphans, removed by the next open) or the new;
- a pending shard that is never committed (a duplicate batch, a worker presumed dead) is
  removed with ``sink.discard`` or by the next open.

Tests: tests/storage/test_pending_commit.py, tests/storage/test_objectstore.py.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa

from collector.record.shards import EXTENSIONS, ShardFormat
from collector.storage.manifest import DATA_DIR, now_iso

__all__ = ["PendingShard", "ShardSink", "pending_shard_name"]


def pending_shard_name(fmt: ShardFormat) -> str:
    """A fresh shard name for a worker-side write: no counter to share, so a random one (hex:
    no word a dataset reader takes for a split name)."""
    return f"part-{uuid.uuid4().hex}{EXTENSIONS[fmt]}"


@dataclass(frozen=True)
class PendingShard:
    """A shard in the pending area: what the driver needs to commit it, and nothing more."""

    path: str
    """The manifest path it gets once committed, ``data/<name>``; until then the file is at the
    pending place of that path (`collector.storage.manifest.pending_path` for a directory)."""
    rows: int
    model: str
    budget: int
    size: int
    checksum: str
    """``"sha256:<hex>"`` of the file as written (what open verifies later)."""
    episode_ids: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.path.startswith(f"{DATA_DIR}/") or "/" in self.path[len(DATA_DIR) + 1:]:
            raise ValueError(f"pending shard path {self.path!r} is not data/<name>")
        if self.rows != len(self.episode_ids):
            raise ValueError(f"pending shard {self.path}: {self.rows} rows but {len(self.episode_ids)} ids")

    def manifest_entry(self) -> dict[str, Any]:
        """Its entry in a commit record (the same fields a driver-side commit records)."""
        return {
            "path": self.path,
            "rows": self.rows,
            "model": self.model,
            "budget": self.budget,
            "size": self.size,
            "checksum": self.checksum,
            "committed": now_iso(),
        }


class ShardSink(Protocol):
    """Where a worker writes pending shards (see the module docstring for the contract)."""

    def write(self, table: pa.Table, model: str, budget: int, episode_ids: tuple[str, ...]) -> PendingShard:
        """Write `table` (rows of one cell) as a new pending shard; return it once it is complete."""
        ...

    def discard(self, shard: PendingShard) -> None:
        """Remove a pending shard that will not be committed (best effort)."""
        ...

    def read(self, shard: PendingShard) -> pa.Table:
        """The rows of a pending shard (the driver rewrites one that repeats committed ids)."""
        ...

    def reachable(self) -> bool:
        """Whether the run is visible from this process (a worker checks once at start-up:
        a local path declared shared that is not mounted here, a bucket it cannot read)."""
        ...

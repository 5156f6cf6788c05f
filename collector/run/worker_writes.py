"""Worker-side writes (`output.worker_writes`): shards written where the episodes finish.

Tests: tests/run/test_worker_writes.py (the worker), tests/run/test_driver_written.py (the
driver's side), tests/system/faults/test_worker_write_kill.py.

In this mode a worker runs a batch, writes its kept episodes through the run's `ShardSink`
(one pending shard per (model, budget) cell of the batch) and returns a `WrittenBatch`: per
episode only what the driver's decisions and counts read (`Outcome`), plus the
`PendingShard`s and the rows refused as unstorable. Episode bytes never cross Ray, so the
driver's CPU and memory per episode stop depending on episode size and cell count; the
driver buffers pending shards per cell and commits their names (`commit_pending`).

Which episodes a worker writes: every one the driver would keep, that is all but those
that stop the run (`collector.run.stoppers.stops_run`: QuotaExhausted, a 401/403/404
rejection), which are never committed. The driver still makes the run-level decisions from
the outcomes (it stops the run, builds the message), and still drops ids it has seen: a
shard whose ids were all seen is discarded; one that overlaps partly (a batch re-run after
its first run came back late, split differently) is read back, filtered and rewritten by the
driver (`without_seen`). That is rare: the driver never reads the reply of a worker it gave
up on.

Exactly once is the store's: a pending shard is invisible until the commit record naming it
is in place; a worker killed mid-write leaves an orphan in the pending area that no record
names (the next open deletes it), and the driver re-runs the batch as for any dead worker.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from collector.config import OutputConfig
from collector.errors import OutputError
from collector.record.episode import Episode, EpisodeError
from collector.record.shards import one_line, table_without_poison
from collector.run.stoppers import stops_run
from collector.storage.location import is_uri
from collector.storage.pending import PendingShard, ShardSink

__all__ = [
    "Outcome",
    "WrittenBatch",
    "without_seen",
    "write_kept",
    "writes_on_workers",
]


def writes_on_workers(output: OutputConfig) -> bool:
    """Whether workers write the shards: as configured, or for `"auto"` when the run is in
    object storage (a local path may be the driver's own disk, so the driver writes there)."""
    if output.worker_writes == "auto":
        return is_uri(output.path)
    return bool(output.worker_writes)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the driver needs of one episode a worker kept: its identity, what the progress line
    and `JobResult` count, and what the run stoppers read (`collector.run.stoppers`)."""

    episode_id: str
    model: str
    budget: int
    provider: str
    stop_reason: str
    retries: tuple[str, ...]
    error: EpisodeError | None

    @classmethod
    def of(cls, episode: Episode) -> Outcome:
        return cls(episode.episode_id, episode.model, episode.budget, episode.provider,
                   str(episode.stop_reason), tuple(episode.retries), episode.error)


@dataclass(frozen=True, slots=True)
class WrittenBatch:
    """A batch as a writing worker returns it: ids, names and counts, no transcript."""

    outcomes: tuple[Outcome, ...]
    """Every episode of the batch, written or not (the driver decides on all of them)."""
    shards: tuple[PendingShard, ...]
    """The pending shards holding the written ones, one per cell."""
    refused: dict[str, str] = field(default_factory=dict)
    """Ids whose row could not be stored (a value that does not fit the schema) -> why."""


def write_kept(sink: ShardSink, episodes: Sequence[Episode]) -> WrittenBatch:
    """Write the episodes that do not stop the run, one pending shard per cell; return the batch.

    A failed write discards what this batch wrote and raises a one-line OutputError: the
    storage itself failed (a full disk, a path that is not there), so the run stops, as a
    driver-side commit stops when every cell fails on I/O; committed episodes are safe.
    """
    cells: dict[tuple[str, int], list[Episode]] = {}
    for episode in episodes:
        if not stops_run(episode.error):
            cells.setdefault((episode.model, episode.budget), []).append(episode)
    shards: list[PendingShard] = []
    refused: dict[str, str] = {}
    try:
        for (model, budget), group in cells.items():
            table, good = table_without_poison(group, refused)
            if table is not None:
                shards.append(sink.write(table, model, budget, tuple(ep.episode_id for ep in good)))
    except Exception as e:  # noqa: BLE001 - any failure of the storage ends the batch the same way
        for shard in shards:
            sink.discard(shard)
        raise OutputError(f"a worker could not write its shard: {one_line(e)}") from None
    return WrittenBatch(tuple(Outcome.of(ep) for ep in episodes), tuple(shards), refused)


def without_seen(sink: ShardSink, shard: PendingShard, fresh: set[str]) -> PendingShard | None:
    """`shard` with only the ids in `fresh` (not seen before): itself when all are, None (the
    file discarded) when none is, else a rewritten shard holding only those rows."""
    keep = [i for i in shard.episode_ids if i in fresh]
    if len(keep) == len(shard.episode_ids):
        return shard
    if not keep:
        sink.discard(shard)
        return None
    table = sink.read(shard)
    kept = table.filter(pc.is_in(table.column("episode_id"), value_set=pa.array(keep)))
    rewritten = sink.write(kept, shard.model, shard.budget, tuple(kept.column("episode_id").to_pylist()))
    sink.discard(shard)
    return rewritten

"""Driver-side writes: a worker returns its batch as shard rows, encoded where it finished.

Tests: tests/run/test_encoded.py (the worker's side), tests/run/test_driver_buffer.py and
tests/run/test_driver_loop.py (the driver's, through `tests/run/fakepool.py`, which replies
as a real worker does).

The worker builds the Arrow rows of every episode of its batch once
(`collector.record.shards.episodes_to_table`), grouped by (model, budget) cell so that a
cell's rows are one slice of the batch, and returns them as one Arrow IPC stream
(`collector.record.rows`). Pickling `Episode`s through Ray and converting them in the
driver cost the driver ~190 µs of CPU per episode, more than the whole driver's other work
(BENCHMARKS.md section n). The driver reads each row's id, cell, stop reason and error off
the stream (`rows_of`) and makes the same decisions as for episodes; a commit stitches its
shards out of the rows (`gather`).

An episode whose row cannot be built (a value that does not fit the schema, an int beyond
int64 from an environment's grader, say) costs only itself: it is returned as an `Outcome`
with why, not committed (a rerun runs it), and reported when the run ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from collector.record.episode import Episode
from collector.record.rows import to_ipc
from collector.record.shards import SCHEMA, table_without_poison
from collector.run.worker_writes import Outcome

__all__ = ["EncodedBatch", "encode_batch"]


@dataclass(frozen=True, slots=True)
class EncodedBatch:
    """A batch as a worker returns it with driver-side writes."""

    rows: bytes
    """The Arrow IPC stream of every episode whose row could be built, grouped by cell."""
    refused: tuple[Outcome, ...] = ()
    """The episodes whose row could not be built (the driver decides on them too)."""
    reasons: dict[str, str] = field(default_factory=dict)
    """Why, per refused id."""


def encode_batch(episodes: Sequence[Episode]) -> EncodedBatch:
    """The rows of `episodes`, each cell's together in the order they finished."""
    cells: dict[tuple[str, int], list[Episode]] = {}
    for episode in episodes:
        cells.setdefault((episode.model, episode.budget), []).append(episode)
    ordered = [episode for group in cells.values() for episode in group]
    reasons: dict[str, str] = {}
    table, _ = table_without_poison(ordered, reasons)
    refused = tuple(Outcome.of(ep) for ep in ordered if ep.episode_id in reasons)
    return EncodedBatch(to_ipc(SCHEMA.empty_table() if table is None else table), refused, reasons)

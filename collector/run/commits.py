"""When the driver commits: the commit-buffer policy, one for both write modes (tests:
tests/run/test_driver_buffer.py, tests/run/test_driver_written.py).

Finished work is buffered per (model, budget) cell, the store's partition. A cell is
committed once it holds `rows_per_shard` rows, so shards are full; every
`output.commit_interval_s` and at the end (also on Ctrl-C) everything buffered is; past
`output.max_buffered_rows` across cells, the largest cells at once, down to half of the cap,
so that the next few batches do not each force a commit of their own.

What a cell holds depends on who writes the shards:
- driver-side writes: the episodes' rows as workers encoded them (`collector.record.rows.Row`,
  `collector.run.encoded`), one each; a full cell gives up its whole shards and keeps the
  rest (`CommitBuffer(split=True)`), committed by `RunStore.commit`;
- worker-side writes (`collector.run.worker_writes`): the `PendingShard`s workers wrote, with
  their episodes' `Outcome`s; a shard cannot be split, so a due cell is committed whole,
  all due cells in one `commit_pending` (one commit record).

A commit that leaves episodes out (`CommitIncomplete`: a poisoned row, a cell that could
not be written) commits the others; the ones left out are not committed (a rerun runs
them) and are reported when the run ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from collector.config import OutputConfig
from collector.record.rows import Row, Rows
from collector.run.worker_writes import Outcome
from collector.storage.local import CommitIncomplete
from collector.storage.pending import PendingShard

__all__ = ["CommitBuffer", "CommitTarget", "Committed", "episode_buffer", "shard_buffer"]

U = TypeVar("U")
Cell = tuple[str, int]
#: A pending shard a worker wrote, with the outcomes of the episodes it holds.
Written = tuple[PendingShard, list[Outcome]]


class CommitTarget(Protocol):
    """What the commit policy needs of the run store (local or S3)."""

    def holds(self, episode_id: str) -> bool: ...
    def commit(self, episodes: Rows) -> int: ...
    def commit_pending(self, shards: Sequence[PendingShard]) -> int: ...


@dataclass(slots=True)
class Committed:
    """One commit: the episodes it holds, how many the store added (it drops ids it already
    holds), and what it left out."""

    episodes: Sequence[Row | Outcome]
    written: int
    left_out: CommitIncomplete | None = None


class CommitBuffer(Generic[U]):
    """Buffered units per cell and the policy of when to commit them (module docstring)."""

    def __init__(
        self,
        output: OutputConfig,
        rows: Callable[[U], int],
        split: bool,
        store: Callable[[list[U]], Committed],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rows_per_shard = output.rows_per_shard
        self.max_rows = output.max_buffered_rows
        self.interval_s = output.commit_interval_s
        self._rows = rows
        self._split = split
        self._store = store
        self._clock = clock
        self.cells: dict[Cell, list[U]] = {}
        self.last_commit = clock()

    def add(self, cell: Cell, unit: U) -> None:
        self.cells.setdefault(cell, []).append(unit)

    def _size(self, cell: Cell) -> int:
        return sum(self._rows(u) for u in self.cells[cell])

    def buffered(self) -> int:
        """Rows held across cells."""
        return sum(self._size(cell) for cell in self.cells)

    def over_cap(self) -> bool:
        return self.buffered() > self.max_rows

    def take(self, force: bool = False) -> list[U]:
        """Remove and return what is due now: full shards (everything on the interval or when
        forced), then past the cap the largest cells down to half of it."""
        rows = self.rows_per_shard
        everything = force or self._clock() - self.last_commit >= self.interval_s
        taken: list[U] = []
        for cell in list(self.cells):
            units, size = self.cells[cell], self._size(cell)
            want = size if everything or (not self._split and size >= rows) else size - size % rows
            count, got = 0, 0
            while count < len(units) and got < want:
                got += self._rows(units[count])
                count += 1
            taken.extend(units[:count])
            if count == len(units):
                del self.cells[cell]
            else:
                self.cells[cell] = units[count:]
        left, cap = self.buffered(), self.max_rows
        if left > cap:
            for cell in sorted(self.cells, key=self._size, reverse=True):
                if left <= cap // 2:
                    break
                left -= self._size(cell)
                taken.extend(self.cells.pop(cell))
        if everything:
            # The interval restarts even when nothing was due, so a quiet period does not
            # make the next trickle of episodes a commit of its own.
            self.last_commit = self._clock()
        return taken

    def commit(self, force: bool = False) -> Committed | None:
        """Commit what is due (`take`); None when nothing was."""
        taken = self.take(force)
        return self._store(taken) if taken else None


def episode_buffer(store: CommitTarget, output: OutputConfig) -> CommitBuffer[Row]:
    """Driver-side writes: encoded rows, committed by `store.commit`."""

    def commit(batch: list[Row]) -> Committed:
        try:
            return Committed(batch, store.commit(batch))
        except CommitIncomplete as e:
            return Committed([row for row in batch if row.episode_id not in e.uncommitted], e.committed, e)

    return CommitBuffer(output, lambda _: 1, True, commit)


def shard_buffer(store: CommitTarget, output: OutputConfig) -> CommitBuffer[Written]:
    """Worker-side writes: pending shards, committed by name in one `store.commit_pending`."""

    def commit(taken: list[Written]) -> Committed:
        try:
            written = store.commit_pending([shard for shard, _ in taken])
            left_out = None
        except CommitIncomplete as e:
            written, left_out = e.committed, e
            taken = [(s, outcomes) for s, outcomes in taken if not set(s.episode_ids) & e.uncommitted]
        return Committed([o for _, outcomes in taken for o in outcomes], written, left_out)

    return CommitBuffer(output, lambda written: written[0].rows, False, commit)

"""The run store: its one surface (`RunStore`), and the state and errors both stores share.

The commit protocol itself is written once in `collector.storage.commit`; the local directory
(`collector.storage.local.LocalRunStore`) and S3 (`collector.storage.s3store.S3RunStore`) are
its two backends, and `collector.storage.opening.open_run_store` opens the one an
`output.path` names. This module imports neither backend (both import it).

Tests: tests/storage/test_store.py (the surface, both stores through `open_run_store` in
tests/storage/test_objectstore.py), tests/storage/test_runstore.py (`CommitIncomplete` across
pickle, the protocol names).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Collection, Iterator, Sequence
from types import TracebackType
from typing import Any, Protocol, Self

import pyarrow as pa

from collector.errors import OutputError
from collector.record.episode import SCHEMA_VERSION
from collector.record.rows import Rows
from collector.record.shards import schema_version_of
from collector.storage.committed import CommittedIds
from collector.storage.pending import PendingShard, ShardSink

__all__ = ["CommitIncomplete", "LockLost", "RunStore", "StoreState", "fresh_by_cell", "verified_ids"]

log = logging.getLogger(__name__)


class CommitIncomplete(OutputError):
    """A commit that left some episodes out (one whose row does not fit the schema, or every
    episode of a cell that could not be written): all the others are committed. `committed`
    counts the new episodes that were, `uncommitted` holds the ids left out (a rerun runs
    them), the message says why in one line.

    It crosses Ray (a worker's commit error reaches the driver): `__reduce__` rebuilds it from
    all three fields, where the default would call ``__init__`` with the message alone."""

    def __init__(self, message: str, committed: int, uncommitted: set[str]) -> None:
        super().__init__(message)
        self.committed = committed
        self.uncommitted = uncommitted

    def __reduce__(self) -> tuple[type[CommitIncomplete], tuple[str, int, set[str]]]:
        return type(self), (str(self), self.committed, set(self.uncommitted))


class LockLost(OutputError):
    """The run's lock was deleted or replaced (or taken over) while this store held it: another
    process may be writing, so this store commits nothing more."""


def fresh_by_cell(episodes: Rows, committed: Collection[str]) -> dict[tuple[str, int], list[Any]]:
    """The episodes (or rows) a commit adds, by (model, budget) cell: ids already committed,
    and repeats inside `episodes` (a late duplicate from a worker presumed dead), dropped."""
    fresh: dict[tuple[str, int], list[Any]] = {}
    seen: set[str] = set()
    for ep in episodes:
        if ep.episode_id in committed or ep.episode_id in seen:
            continue
        seen.add(ep.episode_id)
        fresh.setdefault((ep.model, ep.budget), []).append(ep)
    return fresh


def verified_ids(table: pa.Table, entry: dict[str, Any]) -> tuple[list[str], str | None]:
    """A decoded committed shard's episode ids, or why it does not match its manifest entry
    (schema version, row count): the last step of either store's verification on open."""
    version = schema_version_of(table.schema)
    if version != SCHEMA_VERSION:
        return [], f"schema version {version}, expected {SCHEMA_VERSION}"
    if table.num_rows != entry.get("rows"):
        return [], f"{table.num_rows} rows, the manifest says {entry.get('rows')}"
    return table.column("episode_id").to_pylist(), None


class RunStore(Protocol):
    """The surface of a run store, whichever storage holds the run.

    `open` -> (`commit` | `commit_pending` | `forget`)* -> `close` (or a ``with`` block); `open`
    is each backend's classmethod (a path, or an S3 location and a lease), `open_run_store` the
    one door that picks it, so it is not part of the protocol an opened store satisfies. Each
    commit is all in the manifest when it returns, or none of it (`CommitIncomplete` names
    what a partly committed one left out); `LockLost` once another writer may be writing."""

    warnings: list[str]

    def committed_ids(self) -> set[str]: ...

    def holds(self, episode_id: str) -> bool: ...

    @property
    def shards(self) -> list[dict[str, Any]]: ...

    def commit(self, episodes: Rows) -> int: ...

    def commit_pending(self, shards: Sequence[PendingShard]) -> int: ...

    def sink(self) -> ShardSink: ...

    def forget(self, ids: Collection[str]) -> int: ...

    def read_shard(self, entry: dict[str, Any], columns: Sequence[str] | None = None) -> pa.Table: ...

    def close(self) -> None: ...

    def __enter__(self) -> Self: ...

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None: ...


class StoreState:
    """What both run stores keep in memory and show the same way: the committed ids, the folded
    manifest, warnings, and the transaction mark that keeps a state cut short from being
    compacted into the base."""

    warnings: list[str]
    # The committed ids and the shard (manifest path) holding each, ~16 bytes an episode.
    _committed: CommittedIds
    _manifest: dict[str, Any]
    _clean: bool

    def committed_ids(self) -> set[str]:
        """Ids of every committed episode (a copy: the caller may subtract from it)."""
        return set(self._committed)

    def holds(self, episode_id: str) -> bool:
        """Whether `episode_id` is committed (no copy: the driver asks once per returned episode)."""
        return episode_id in self._committed

    @property
    def shards(self) -> list[dict[str, Any]]:
        """The manifest's shard entries (path relative to the run, rows, model, budget, size, checksum)."""
        return [dict(e) for e in self._manifest["shards"]]

    def _warn(self, message: str) -> None:
        self.warnings.append(message)
        log.warning("%s", message)

    def _maybe_compact(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """Marks the in-memory state unsafe to compact until the operation ends, cleanly or by
        its own abort (an OutputError leaves memory matching the store); anything else (the
        process being torn down) leaves it marked for good."""
        clean, self._clean = self._clean, False
        try:
            yield
        except OutputError:
            self._clean = clean
            raise
        self._clean = clean
        if clean:
            self._maybe_compact()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

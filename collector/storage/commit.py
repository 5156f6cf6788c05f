"""The commit protocol, written once for every storage a run can live on.

A commit (driver-side or of workers' pending shards) and a forget are one transaction each:

1. put each new shard in the pending area (``.collector/tmp/<name>.tmp``), never in ``data/``;
   for a forget, first "retire" each old shard (move or copy it out of ``data/`` into the
   pending area, so no reader sees a row being forgotten);
2. the commit point: the next commit record ``.collector/commit-<seq>.json``, created only if
   absent (locally a rename by the flock's only holder, ``If-None-Match: *`` in S3), naming
   the new shards under ``data/`` and the removed ones;
3. check the lock is still ours, then publish: move (copy) the new shards into ``data/``,
   delete the retired ones. A failure after the record is a warning: the next open finishes.

Before the record nothing is committed: a failure removes what the transaction wrote, puts
retired shards back and raises `OutputError`. A record whose outcome is unknown (a request
that may have landed, `RecordInDoubt`) keeps every file it may name and stops the store: the
next open settles it. The log is compacted into the base manifest once it holds
`_COMPACT_MIN_RECORDS` records or a quarter of the shard count (amortized, a commit costs the
same at 20,000 shards as at none), and on close.

`CommitStore` holds all of that; its backend methods (the section "the backend" below) are
the only I/O, implemented by `collector.storage.local.LocalRunStore` (a directory: flock,
fsync, rename) and `collector.storage.s3store.S3RunStore` (an S3 prefix: a lease, conditional
PUTs, server-side copies).

Tests: tests/storage/test_store.py, test_commit_faults.py, test_commit_log.py, test_forget.py,
test_pending_commit.py (the local backend); tests/storage/test_objectstore.py,
tests/storage/test_s3_retries.py, tests/system/faults/test_s3_run.py, test_s3_sigkill.py (S3).
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from collector.errors import OutputError
from collector.record.rows import Rows, shard_table
from collector.record.shards import EXTENSIONS, ShardFormat, describe_exception, one_line
from collector.storage.manifest import DATA_DIR, now_iso
from collector.storage.pending import PendingShard
from collector.storage.runstore import CommitIncomplete, LockLost, StoreState, fresh_by_cell, log

__all__ = ["CommitStore", "RecordInDoubt", "check_open_arguments"]

#: Compact the commit log (write the folded state as the new base manifest) once it holds this
#: many records, or a quarter of the shard count if more: a compaction writes every entry, so
#: the amortized cost per commit stays a few entries however big the run (no quadratic).
_COMPACT_MIN_RECORDS = 256
#: Threads verifying committed shards on open: hashing and decompressing release the GIL.
VERIFY_THREADS = 4


class RecordInDoubt(OutputError):
    """Writing a commit record failed in a way that does not say whether it landed (a timeout,
    a lost answer): every file it may name is kept and the store stops; the next open settles."""


def check_open_arguments(fmt: str, rows_per_shard: int) -> None:
    """Refuse what no store can open with, in one line."""
    if fmt not in EXTENSIONS:
        raise OutputError(f"unknown output format {fmt!r} (expected arrow or parquet)")
    if rows_per_shard <= 0:
        raise OutputError(f"rows_per_shard must be positive (got {rows_per_shard})")


def _describe(e: BaseException) -> str:
    return describe_exception(e) if isinstance(e, OSError) else str(e)


class CommitStore(StoreState, ABC):
    """The commit protocol over a storage backend (see the module docstring)."""

    root: Any
    """Where the run is (a `Path`, or an `ObjectLocation`): what every message names."""
    fmt: ShardFormat
    rows_per_shard: int
    _seq: int
    _base_through: int
    _lock_lost: str | None
    _closed: bool

    # --- the backend ---------------------------------------------------------------------

    @abstractmethod
    def _put_pending(self, rel: str, table: pa.Table) -> tuple[int, str]:
        """Write `table` to the pending place of the shard `rel` (durably); its size and checksum."""

    @abstractmethod
    def _remove_pending(self, rels: Sequence[str]) -> None:
        """Best-effort removal of the pending files of `rels` (never named by a record)."""

    @abstractmethod
    def _pending_problem(self, shard: PendingShard) -> str | None:
        """Why a worker's pending shard cannot be committed as it is, or None."""

    @abstractmethod
    def _before_record(self) -> None:
        """Make what the record will name durable and check (renew) the lock; raise if not ours."""

    @abstractmethod
    def _create_record(self, seq: int, record: dict[str, Any]) -> None:
        """Create commit record `seq`, only if absent: the commit point. Raises when it is not
        in place (`LockLost` for another writer's), `RecordInDoubt` when that is unknown."""

    @abstractmethod
    def _check_lock_after_record(self, what: str) -> None:
        """After the record: LockLost (naming `what`) when the lock is no longer ours."""

    @abstractmethod
    def _publish(self, entries: Sequence[dict[str, Any]]) -> None:
        """Move committed shards from the pending area into ``data/`` (failures: warnings)."""

    @abstractmethod
    def _retire(self, rel: str) -> None:
        """Take the committed shard `rel` out of ``data/`` into its pending place (a forget)."""

    @abstractmethod
    def _unretire(self, rel: str) -> None:
        """Put a retired shard back into ``data/`` (a forget that did not happen)."""

    @abstractmethod
    def _compact(self, what: str) -> None:
        """Write the folded state as the base manifest, then delete the records it holds."""

    @abstractmethod
    def _renew(self) -> None:
        """Extend the lock's lease before a long step (nothing where the lock needs none)."""

    @abstractmethod
    def _check_writable(self) -> None:
        """Refuse to write when closed or when the lock is lost."""

    @abstractmethod
    def _release(self) -> None:
        """Release the lock (unless another writer holds it now)."""

    @abstractmethod
    def read_shard(self, entry: dict[str, Any], columns: Sequence[str] | None = None) -> pa.Table:
        """The committed shard `entry` names (in ``data/``, or still pending after a crash)."""

    # --- writing shards and the record -------------------------------------------------------

    def _write_pending(self, table: pa.Table, model: str, budget: int, written: list[str]) -> dict[str, Any]:
        """Write `table` as the next shard, pending only, and return its manifest entry (naming
        its place in ``data/``). Its path is appended to `written` first, so the caller's abort
        can remove it; a shard reaches ``data/`` only once a record names it."""
        name = f"part-{self._manifest['next_part']:06d}-{uuid.uuid4().hex[:8]}{EXTENSIONS[self.fmt]}"
        self._manifest["next_part"] += 1
        rel = f"{DATA_DIR}/{name}"
        written.append(rel)
        size, checksum = self._put_pending(rel, table)
        return {"path": rel, "rows": table.num_rows, "model": model, "budget": budget,
                "size": size, "checksum": checksum, "committed": now_iso()}

    def _record(self, what: str, remove: list[str], add: list[dict[str, Any]]) -> None:
        """The commit point: the next record of the log (its size is the change's, not the run's),
        then the in-memory manifest changed to match. Raises when the record is not in place."""
        self._before_record()
        if what == "commit":
            # Which commit first committed each entry's rows (a forget's replacements keep their
            # original's): what lets a follower behind a compaction find the rows after its cursor.
            for entry in add:
                entry.setdefault("seq", self._seq + 1)
        self._manifest["updated"] = now_iso()
        record = {"seq": self._seq + 1, "op": what, "at": self._manifest["updated"],
                  "next_part": self._manifest["next_part"], "remove": remove, "add": add}
        self._create_record(self._seq + 1, record)
        self._seq += 1
        self._manifest["log_through"] = self._seq
        if remove:
            gone = set(remove)
            self._manifest["shards"] = [e for e in self._manifest["shards"] if e["path"] not in gone]
        self._manifest["shards"].extend(add)

    def _aborted(self, e: Exception, doing: str = "commit to") -> OutputError:
        """The one-line error of an aborted transaction (an OutputError as it was raised)."""
        if isinstance(e, OutputError):
            return e
        return OutputError(f"{doing} {self.root} failed: {type(e).__name__}: {e}")

    def _swap_in(self, entries: list[dict[str, Any]], shard_ids: Sequence[Sequence[str]],
                 written: list[str], next_part: int) -> int:
        """Commit shards already complete in the pending area: the one record naming them (the
        commit point), the lock checked again, publish. Shared by `commit` (shards the driver
        wrote) and `commit_pending` (shards workers wrote). Before the record, a failure
        removes `written` and raises OutputError; in doubt, it keeps them."""
        try:
            self._record("commit", [], entries)
        except RecordInDoubt:
            self._manifest["next_part"] = next_part
            raise
        except Exception as e:
            # Abort: whatever this call wrote is not in the manifest; remove it now rather
            # than leaving it for the next open. Broad on purpose: any failure aborts.
            self._manifest["next_part"] = next_part
            self._remove_pending(written)
            raise self._aborted(e) from e
        committed = 0
        for entry, chunk_ids in zip(entries, shard_ids, strict=True):
            self._committed.add(chunk_ids, entry["path"])
            committed += len(chunk_ids)
        self._check_lock_after_record(f"its last commit ({committed} episodes)")
        self._publish(entries)
        return committed

    def _incomplete(self, left_out: set[str], causes: list[str], committed: int) -> None:
        more = f"; and {len(causes) - 1} more cell(s)" if len(causes) > 1 else ""
        raise CommitIncomplete(
            f"{len(left_out)} episode(s) could not be committed to {self.root} ({causes[0]}{more}); "
            f"the {committed} others are committed",
            committed, left_out,
        )

    # --- commit ----------------------------------------------------------------------------

    def commit(self, episodes: Rows) -> int:
        """Durably commit the episodes not yet committed; return how many were new (see `_commit`)."""
        with self._transaction():
            return self._commit(episodes)

    def _commit(self, episodes: Rows) -> int:
        """Durably commit the episodes (or the rows workers encoded: `collector.record.rows`)
        not yet committed; return how many were new.

        Ids already committed, and repeats inside `episodes`, are dropped. The episodes
        are grouped by (model, budget) partition and split into shards of at most
        `rows_per_shard` rows; one record names them all, after every shard is in place.
        On a failure before the record the shards of this call are removed and OutputError
        raised: nothing of it is committed. Once the record is in place the commit is done,
        whatever fails after it (a warning, never a removal of files the record names).

        One poisoned value never blocks the others: an episode whose row cannot be built
        (a value that does not fit the schema) is left out, and so is every episode of a
        cell whose shards cannot be written (a directory the filesystem refuses); the rest
        is committed, and `CommitIncomplete` names what was left out.
        """
        self._check_writable()
        fresh = fresh_by_cell(episodes, self._committed)
        if not fresh:
            return 0
        written: list[str] = []
        placed: list[tuple[dict[str, Any], list[str]]] = []
        left_out: set[str] = set()
        io_failed = False  # a cell failed on I/O (a full disk, the store refusing), not on a value
        causes: list[str] = []  # one per cell that lost episodes, for the message
        next_part = self._manifest["next_part"]
        try:
            for (model, budget), group in fresh.items():
                rejected: dict[str, str] = {}
                try:
                    placed.extend(self._place_cell(model, budget, group, written, rejected))
                except LockLost:
                    raise  # not this cell's: the whole commit stops
                except Exception as e:  # noqa: BLE001 - any failure of one cell is that cell's
                    rejected = {ep.episode_id: one_line(e) for ep in group}
                    io_failed = io_failed or isinstance(e, OSError | OutputError)
                if rejected:
                    left_out.update(rejected)
                    causes.append(f"model {model!r}, budget {budget}: {next(iter(rejected.values()))}")
            if not placed and (io_failed or not left_out):  # the storage, not a value: stop
                raise OutputError(f"commit to {self.root} failed ({causes[0]})")
        except Exception as e:
            self._manifest["next_part"] = next_part
            self._remove_pending(written)
            raise self._aborted(e) from e
        # With no entry, only poisoned values (rows, or a cell that cannot become a shard)
        # were left out: a CommitIncomplete below like any other, so whether a run goes on
        # never depends on which cells a commit held.
        committed = 0
        if placed:
            committed = self._swap_in([e for e, _ in placed], [ids for _, ids in placed], written, next_part)
        if left_out:
            self._incomplete(left_out, causes, committed)
        return committed

    def _place_cell(
        self, model: str, budget: int, group: list[Any], written: list[str], rejected: dict[str, str]
    ) -> list[tuple[dict[str, Any], list[str]]]:
        """Write one cell's shards (each entry with its ids); on failure remove what this cell
        wrote and raise, leaving the other cells' files in `written` alone. Episodes whose row
        cannot be built are left out into `rejected` (id -> why)."""
        mine: list[str] = []
        placed = []
        try:
            for start in range(0, len(group), self.rows_per_shard):
                table, chunk = shard_table(group[start:start + self.rows_per_shard], rejected)
                if table is None:
                    continue
                placed.append((self._write_pending(table, model, budget, mine),
                               [ep.episode_id for ep in chunk]))
        except Exception:
            self._remove_pending(mine)
            raise
        written.extend(mine)
        return placed

    # --- commit_pending ------------------------------------------------------------------------

    def commit_pending(self, shards: Sequence[PendingShard]) -> int:
        """Commit shards workers wrote (see `_commit_pending`); return how many episodes were new."""
        with self._transaction():
            return self._commit_pending(shards)

    def _commit_pending(self, shards: Sequence[PendingShard]) -> int:
        """Name `shards` (written by this store's `sink()` into the pending area) in one commit
        record, then publish them: the same record, lock checks and crash states as `commit`.

        A shard can only be taken or left whole (its rows are in a file the store did not
        write): one whose ids are all committed already, or all held by an earlier shard of
        this call, is dropped and its file removed (a late duplicate). One that mixes
        committed and new ids, repeats an id, is not of this run's format, or whose file is
        missing or of another size than the worker reported is left out too, and its new ids
        are named in a `CommitIncomplete` (a rerun runs them); the driver filters such
        overlaps before it calls this.
        """
        self._check_writable()
        taken: list[PendingShard] = []
        dropped: list[str] = []
        left_out: set[str] = set()
        causes: list[str] = []
        seen: set[str] = set()
        for shard in shards:
            ids = set(shard.episode_ids)
            old = {i for i in ids if i in self._committed or i in seen}
            if old == ids:
                dropped.append(shard.path)
                continue
            if old:
                problem: str | None = f"{len(old)} of its {len(ids)} episodes are committed already"
            elif len(ids) != shard.rows:
                problem = "it holds an episode id twice"
            else:
                problem = self._pending_problem(shard)
            if problem is not None:
                dropped.append(shard.path)
                left_out.update(ids - old)
                causes.append(f"pending shard {shard.path}: {problem}")
                continue
            seen.update(ids)
            taken.append(shard)
        self._remove_pending(dropped)  # never committed: orphans otherwise, until the next open
        entries = [shard.manifest_entry() for shard in taken]
        written = [shard.path for shard in taken]
        committed = 0
        if entries:
            committed = self._swap_in(entries, [s.episode_ids for s in taken], written,
                                      self._manifest["next_part"])
        if left_out:
            self._incomplete(left_out, causes, committed)
        return committed

    # --- forget ----------------------------------------------------------------------------

    def forget(self, ids: Collection[str]) -> int:
        """Remove committed episodes, so that the next resume runs them again (see `_forget`)."""
        with self._transaction():
            return self._forget(ids)

    def _forget(self, ids: Collection[str]) -> int:
        """Remove committed episodes, so that the next resume runs them again; return how many.

        Used to re-collect `error` episodes once a provider is back. The same transaction
        shape as `commit`: every shard holding one of `ids` gets a replacement without
        those rows (pending, size and checksum recorded; none when no row is left); the old
        shards are retired out of ``data/`` into the pending area; one record removes the
        old entries and adds the new; the replacements are published and the old files
        deleted. A plain reader therefore never sees a forgotten row once the record can be
        written, nor an old file beside its replacement. A crash before the record leaves the
        old state (the next open puts the old files back and deletes the replacements); after
        it, the new state (the next open finishes). Ids that are not committed are ignored.
        On a failure before the record, the old files are put back, what this call wrote is
        removed and OutputError raised.
        """
        self._check_writable()
        gone = {i for i in ids if i in self._committed}
        if not gone:
            return 0
        touched = self._committed.shards_of(gone)
        old = [e for e in self._manifest["shards"] if e["path"] in touched]
        written: list[str] = []
        retired: list[str] = []
        replacements: list[tuple[dict[str, Any], list[str]]] = []
        next_part = self._manifest["next_part"]
        try:
            for entry in old:
                table = self.read_shard(entry)
                kept = table.filter(pc.invert(pc.is_in(table.column("episode_id"),
                                                       value_set=pa.array(sorted(gone)))))
                if kept.num_rows:
                    placed = self._write_pending(kept, entry["model"], entry["budget"], written)
                    if isinstance(entry.get("seq"), int):  # rows committed then, whatever they are moved to
                        placed["seq"] = entry["seq"]
                    replacements.append((placed, kept.column("episode_id").to_pylist()))
            for entry in old:  # out of every reader's sight, still committed (the next open restores)
                self._retire(entry["path"])
                retired.append(entry["path"])
            # The one atomic switch from the old state to the new.
            self._record("forget", sorted(touched), [e for e, _ in replacements])
        except RecordInDoubt:
            self._manifest["next_part"] = next_part  # the record may name every file: keep them all
            raise
        except Exception as e:
            self._manifest["next_part"] = next_part
            for rel in retired:
                try:
                    self._unretire(rel)
                except (OSError, OutputError) as why:  # the next open puts it back (named, pending)
                    log.info("retired shard %s of %s not put back yet: %s", rel, self.root, _describe(why))
            self._remove_pending(written)
            raise self._aborted(e, "forgetting episodes in") from e
        self._committed.discard(gone)
        self._check_lock_after_record("its last change")
        for entry, kept_ids in replacements:
            self._committed.add(kept_ids, entry["path"])
        self._publish([e for e, _ in replacements])
        # Committed state is already the new one; an old file left pending is deleted by the
        # next open, so a failed delete is not an error.
        self._remove_pending(retired)
        return len(gone)

    # --- verification on open -------------------------------------------------------------

    def _verify_all(self, entries: list[dict[str, Any]],
                    verify: Callable[[dict[str, Any]], tuple[list[str], str | None]],
                    quarantine: Callable[[str], str]) -> list[dict[str, Any]]:
        """Verify every committed shard in a few threads; keep the good ones' ids, quarantine
        the others (their episodes run again); return the entries kept."""
        with ThreadPoolExecutor(max_workers=VERIFY_THREADS) as pool:
            verdicts = list(pool.map(verify, entries))
        kept = []
        for entry, (ids, problem) in zip(entries, verdicts, strict=True):
            if problem is None:
                self._committed.add(ids, entry["path"])
                kept.append(entry)
                continue
            moved = quarantine(entry["path"])
            self._warn(f"corrupt shard {entry['path']}: {problem}; moved to {moved}, its episodes run again")
        return kept

    # --- compaction and close -----------------------------------------------------------------

    def _maybe_compact(self) -> None:
        """Compact once the log is long (see `_COMPACT_MIN_RECORDS`); the commit is done already,
        so a failure here is a warning (the records stay, and are the committed state)."""
        if self._seq - self._base_through < max(_COMPACT_MIN_RECORDS, len(self._manifest["shards"]) // 4):
            return
        try:
            self._check_writable()  # a base from a writer that lost the lock would clobber the new one's
            self._renew()
            self._compact("compaction")
        except LockLost as e:
            self._lock_lost = self._lock_lost or str(e)  # the next commit says so
        except (OSError, OutputError) as e:
            self._warn(f"compacting the commit log of {self.root} failed ({_describe(e)}); "
                       "its records stay the committed state")

    def close(self) -> None:
        """Release the run's lock. Committed data needs no flush: commits are durable.

        The commit log is compacted first (a finished run holds one manifest listing
        everything), unless the lock is no longer ours or an operation was cut short.
        """
        if self._closed:
            return
        if self._clean and self._lock_lost is None and self._seq > self._base_through:
            try:
                self._check_writable()
                self._renew()
                self._compact("compaction on close")
            except (OutputError, OSError) as e:
                log.info("commit log of %s left uncompacted on close: %s", self.root, _describe(e))
        self._release()
        self._closed = True

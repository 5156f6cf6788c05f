"""The run directory: where committed episodes live, exactly once.

Layout (``RUN_DIR``, names and why in `collector.storage.manifest`)::

    data/part-000042-1a2b3c4d.arrow   committed shards only (Parquet optional), flat
    .collector/manifest.json          the committed shards as of its `log_through` (the base)
    .collector/commit-000000043.json  one record per commit since (the log): base + log = the truth
    .collector/config.resolved.json   the resolved config the run was started with, and its fingerprint
    .collector/run.lock               held (flock) while a RunStore is open: one writer per run dir
    .collector/tmp/                   shards being written (and committed ones not yet moved)
    .collector/quarantine/            shards found corrupt on open, moved aside (never deleted)

Exactly once. An episode is *committed* when a shard holding it is named in the manifest
(the base manifest with the commit log applied, `collector.storage.manifest.read_manifest`).
`RunStore.commit` writes each shard to ``.collector/tmp/<name>.tmp``, fsyncs it and the
directory, writes the next commit record naming ``data/<name>`` (write temp, fsync, rename:
"the manifest swap" below; its size is the commit's, not the run's), and only then renames
the shard into ``data/``. A crash before the swap leaves the old state (the temp files are
orphans, hidden from every reader, deleted on the next open, their episodes run again);
after it, the new one, and the next open finishes the move. The log is compacted into the
base (`_compact`: new base, then the folded records deleted) on open, on close, and once
it holds 256 records or a quarter of the shard count: amortized, a commit costs the same
at 20,000 shards as at none.

Visible means committed. A plain reader (a glob over the tree, no manifest) sees only
``data/``, and a file is there only once it is named in the manifest: at every moment,
crash or not, a glob never counts an uncommitted episode nor one a resume runs again. A
committed shard may be missing from ``data/`` for the moment between the swap and its
rename (or until the next open after a crash there): readers that go through the manifest
find it in ``.collector/tmp/`` (`collector.storage.manifest.shard_location`).
Once the new manifest is renamed into place the commit is done: a failure after that (the
directory's fsync, the move into ``data/``) is a warning, never a removal of files the
manifest names. Each (model, budget) cell is written on its own: one that fails is left out
of the swap and named in a `CommitIncomplete`, the others are committed. The lock is checked
by inode before each commit and after its manifest swap.
Episode ids are deterministic (`collector.record.episode.episode_id`), so resume is a set
difference: the driver runs every id not in `committed_ids()`; an id that is already
committed, or repeated inside one commit (a late duplicate from a worker presumed dead), is
dropped at commit. Nothing is ever committed twice, and nothing committed is ever lost.

Forgetting. `RunStore.forget` takes committed episodes out again (`collector run
--retry-errors` uses it to re-collect `error` episodes): each shard holding one is
replaced by a new shard without those rows, written to ``.collector/tmp/`` as a commit
writes; the old files are then moved out of ``data/`` into ``.collector/tmp/`` (so no glob
sees a row being forgotten, or both an old file and its replacement), the manifest is
replaced once, the replacements moved into ``data/``, the old files deleted. Before the
swap the old state is committed (the next open moves the old files back), after it the new
one (the next open finishes the move and deletes the old files).

Trust. A run dir written by a different config is refused. The store does not decide what
"different" means: it compares the `config_fingerprint` its caller passes with the one in the
manifest. The job computes it with `collector.config.config_fingerprint`, over what gives the
data its meaning (provider and dialect, sampling, environment and its options, seed, loop
limits, stop_on, reward and redaction policy) and not over what only selects how much of it
to collect (models, budgets, samples, task count) or how (Ray, output, timeouts, retries):
widening a sweep continues the same run dir, changing a reward policy cannot.
`config.resolved.json` is rewritten on every open, so it shows the latest selection. The
shard format and schema version must match too. A dir that is not empty and has no manifest
is refused (it is not ours), as is one another process holds open, and one of the layout
before `.collector/` (readable, not continued: its schema version is older anyway). Each manifest entry
records the shard's size and sha256 at commit, and open verifies both for every shard:
reading only the `episode_id` column would miss damage inside any other column, which
then surfaces as a failed `collector stats` while the episodes are never run again. A shard
named in the manifest that fails this (missing, wrong size or checksum, unreadable, wrong
schema version, wrong row count) is moved to ``.collector/quarantine/``, dropped from the manifest
and reported in `RunStore.warnings` (one line naming the file): its episodes count as not
committed and run again, so a damaged file never stops a resume. Entries of older manifests
without size and checksum get a full decode and validation of the shard instead. A
manifest entry that is malformed itself (no path, a path outside the run dir) makes the
manifest untrusted: `read_manifest` refuses it in one line.

Files are written by the driver, which alone holds a RunStore: workers on other nodes
return episodes to it, so nodes need not share a disk. With worker-side writes
(`output.worker_writes` on a shared filesystem) workers write shards through `RunStore.sink`
(a `LocalSink`) into ``.collector/tmp/`` only, and the driver's `commit_pending` names them
in a commit record and moves them into ``data/``: the same record, lock checks and crash
states as `commit` (`_swap_in`), so every rule above holds. A worker's file is never visible
before its record; one never committed (a worker killed mid-write, a duplicate batch) is
an orphan of ``.collector/tmp/``, deleted by the next open.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import uuid
import weakref
from collections.abc import Collection, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

import pyarrow as pa
import pyarrow.compute as pc

from collector.errors import OutputError
from collector.record.episode import SCHEMA_VERSION, Episode
from collector.record.shards import (
    EXTENSIONS,
    ShardError,
    ShardFormat,
    describe_exception,
    one_line,
    read_shard,
    schema_version_of,
    table_without_poison,
    write_shard,
)
from collector.storage.manifest import (
    CHECKSUM_ALGORITHM,
    DATA_DIR,
    LEGACY_MANIFEST,
    LOCK,
    MANIFEST,
    MANIFEST_VERSION,
    META_DIR,
    QUARANTINE,
    QUARANTINE_SUFFIX,
    RESOLVED_CONFIG,
    TMP_DIR,
    ReplacedNotDurable,
    check_continuable,
    commit_record_path,
    commit_record_seqs,
    file_digest,
    fsync_dir,
    is_legacy,
    new_manifest,
    now_iso,
    pending_path,
    read_manifest_and_base,
    shard_location,
    unique_entries,
    write_json_atomic,
)
from collector.storage.pending import PendingShard, pending_shard_name

try:  # POSIX advisory locks; elsewhere the single-writer rule is the user's to keep
    import fcntl
except ImportError:  # pragma: no cover - not on the platforms we run on
    fcntl = None  # type: ignore[assignment]

__all__ = ["CommitIncomplete", "LocalSink", "LockLost", "RunStore"]

log = logging.getLogger(__name__)

# sha256 over blake2b: hashlib's sha256 uses the CPU's SHA extensions where present and ran
# twice as fast as blake2b here (600 vs 310 MB/s on one core); both release the GIL.
_VERIFY_THREADS = 4
#: Compact the commit log (write the folded state as the new base manifest) once it holds this
#: many records, or a quarter of the shard count if more: a compaction writes every entry, so
#: the amortized cost per commit stays a few entries however big the run (no quadratic).
_COMPACT_MIN_RECORDS = 256


class CommitIncomplete(OutputError):
    """A commit that left some episodes out (one whose row does not fit the schema, or every
    episode of a cell that could not be written): all the others are committed. `committed`
    counts the new episodes that were, `uncommitted` holds the ids left out (a rerun runs
    them), the message says why in one line."""

    def __init__(self, message: str, committed: int, uncommitted: set[str]) -> None:
        super().__init__(message)
        self.committed = committed
        self.uncommitted = uncommitted


class LockLost(OutputError):
    """The run dir's lock file was deleted or replaced while this store held it: another
    process may be writing, so this store commits nothing more."""


def fresh_by_cell(
    episodes: Sequence[Episode], committed: Collection[str]
) -> dict[tuple[str, int], list[Episode]]:
    """The episodes a commit adds, by (model, budget) cell: ids already committed, and repeats
    inside `episodes` (a late duplicate from a worker presumed dead), dropped."""
    fresh: dict[tuple[str, int], list[Episode]] = {}
    seen: set[str] = set()
    for ep in episodes:
        if ep.episode_id in committed or ep.episode_id in seen:
            continue
        seen.add(ep.episode_id)
        fresh.setdefault((ep.model, ep.budget), []).append(ep)
    return fresh


class StoreState:
    """What both run stores (this directory store and `collector.storage.s3store`'s) keep in
    memory and show the same way: the committed ids, the folded manifest, warnings, and the
    transaction mark that keeps a state cut short from being compacted into the base."""

    warnings: list[str]
    _ids: set[str]
    _manifest: dict[str, Any]
    _clean: bool

    def committed_ids(self) -> set[str]:
        """Ids of every committed episode (a copy: the caller may subtract from it)."""
        return set(self._ids)

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


def _remove(paths: Sequence[Path]) -> None:
    """Best-effort removal of what an aborted transaction wrote (never in the manifest)."""
    for path in paths:
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)


class RunStore(StoreState):
    """The single writer of one run directory. Open it, commit batches, close it.

    `open` -> (`commit`)* -> `close`. Each `commit` is its own transaction: its shards are
    all in the manifest when it returns, or none are (an exception aborts it and removes
    what it wrote). Use it as a context manager or call `close`; the lock is also released
    when the object is garbage-collected or the process dies.
    """

    def __init__(self, root: Path, manifest: dict[str, Any], fmt: ShardFormat, rows_per_shard: int,
                 lock_fd: int | None, base_through: int = 0) -> None:
        self.root = root
        self.fmt: ShardFormat = fmt
        self.rows_per_shard = rows_per_shard
        self.warnings: list[str] = []
        """One line per problem found on open (corrupt shards quarantined, orphans removed)."""
        self._manifest = manifest
        # The commit log: records base_through+1 .. seq are on disk, not yet in the base manifest.
        self._seq: int = int(manifest.get("log_through", 0))
        self._base_through = base_through
        # False while a commit or forget is under way, and for good once one was cut short by
        # something other than its own clean abort (a BaseException: Ctrl-C inside an fsync):
        # the in-memory state may then hold what never reached the disk (or miss what did), so
        # it is never compacted into the base again; the records on disk stay the truth.
        self._clean = True
        self._ids: set[str] = set()
        # Which shard (manifest path) holds each committed id: `forget` then rewrites only
        # the shards concerned instead of reading the ids of every shard again.
        self._where: dict[str, str] = {}
        self._lock_fd = lock_fd
        # The lock file this store holds, by identity: a file at the lock's path with another
        # inode (deleted and re-created, by a user or a second writer) is not our lock.
        self._lock_id = _file_id(os.fstat(lock_fd)) if lock_fd is not None else None
        self._lock_lost: str | None = None
        self._closed = False
        self._finalizer = weakref.finalize(self, _release_lock, lock_fd)

    # --- opening -----------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        run_dir: str | Path,
        config_fingerprint: str,
        resolved_config: dict[str, Any],
        fmt: Literal["arrow", "parquet"] = "arrow",
        rows_per_shard: int = 512,
    ) -> RunStore:
        """Open (creating if needed) the run dir for writing; raise OutputError (one line) if foreign.

        Refused: a dir written by a config with another fingerprint, with another shard
        format or schema version, a non-empty dir that is not a run dir, a dir another
        process has open, or a path that cannot be created or written.
        """
        if fmt not in EXTENSIONS:
            raise OutputError(f"unknown output format {fmt!r} (expected arrow or parquet)")
        if rows_per_shard <= 0:
            raise OutputError(f"rows_per_shard must be positive (got {rows_per_shard})")
        root = Path(run_dir)
        if is_legacy(root):
            raise OutputError(
                f"{root} has the earlier run-dir layout ({LEGACY_MANIFEST} at the top, "
                "shards under model=*/budget=*): collector stats/show/check/export still read it, "
                "but it cannot be continued; choose another output.path"
            )
        try:
            root.mkdir(parents=True, exist_ok=True)
            if not (root / META_DIR).is_dir() and _foreign(root):
                raise OutputError(
                    f"{root} is not empty and is not a run directory (no {MANIFEST}); "
                    "choose another output.path"
                )
            (root / TMP_DIR).mkdir(parents=True, exist_ok=True)
            lock_fd = _acquire_lock(root)
        except OSError as e:
            raise OutputError(f"cannot write run dir {root}: {e.strerror or e}") from e
        try:
            manifest, base_through = cls._load_or_create(root, config_fingerprint, fmt)
            store = cls(root, manifest, manifest["format"], rows_per_shard, lock_fd, base_through)
        except OSError as e:
            _release_lock(lock_fd)
            raise OutputError(f"cannot write run dir {root}: {e.strerror or e}") from e
        except BaseException:
            _release_lock(lock_fd)
            raise
        try:
            write_json_atomic(root / RESOLVED_CONFIG, {
                "fingerprint": config_fingerprint,
                "schema_version": SCHEMA_VERSION,
                "config": resolved_config,
            })
            store._recover()
        except OSError as e:
            store.close()
            raise OutputError(f"cannot write run dir {root}: {e.strerror or e}") from e
        except BaseException:
            store.close()
            raise
        return store

    @staticmethod
    def _load_or_create(root: Path, fingerprint: str, fmt: ShardFormat) -> tuple[dict[str, Any], int]:
        if not (root / MANIFEST).exists():
            # Only what an interrupted first open can leave behind may already be here.
            if _foreign(root):
                raise OutputError(
                    f"{root} is not empty and is not a run directory (no {MANIFEST}); "
                    "choose another output.path"
                )
            manifest = new_manifest(fingerprint, fmt)
            write_json_atomic(root / MANIFEST, manifest)
            (root / DATA_DIR).mkdir(exist_ok=True)
            return manifest, 0
        manifest, base_through = read_manifest_and_base(root)
        check_continuable(manifest, str(root), fingerprint, fmt)
        manifest["manifest_version"] = MANIFEST_VERSION  # a version 2 manifest is a log-less base
        return manifest, base_through

    def _recover(self) -> None:
        """Finish interrupted moves; read committed ids; quarantine bad shards; clear tmp/ and strays.

        We hold the lock, so nothing in ``.collector/tmp/`` belongs to a live writer: a file
        there that the manifest names (crash between the manifest swap and the rename into
        ``data/``, or a forget's old file moved aside before a swap that never happened) is
        moved into place; every other is an uncommitted temp file and is deleted.
        """
        data = self.root / DATA_DIR
        data.mkdir(exist_ok=True)
        entries, repeated = unique_entries(self._manifest["shards"])
        for rel in dict.fromkeys(repeated):
            self._warn(f"manifest named shard {rel} more than once; keeping one entry (its rows count once)")
        finished = 0
        for entry in entries:
            final, pending = self.root / entry["path"], pending_path(self.root, entry["path"])
            if not final.exists() and pending.exists():
                final.parent.mkdir(parents=True, exist_ok=True)
                os.replace(pending, final)
                finished += 1
        if finished:
            fsync_dir(data)
            self._warn(f"finished moving {finished} committed shard(s) of an interrupted commit "
                       f"into {DATA_DIR}/")
        kept = []
        known: set[str] = {entry["path"] for entry in entries}
        # Hashing and decompressing release the GIL: a few threads verify a big run faster.
        with ThreadPoolExecutor(max_workers=_VERIFY_THREADS) as pool:
            verdicts = list(pool.map(lambda e: _verify_shard(self.root / e["path"], e), entries))
        for entry, (ids, problem) in zip(entries, verdicts, strict=True):
            path = self.root / entry["path"]
            if problem is None:
                self._ids.update(ids)
                self._where.update(dict.fromkeys(ids, entry["path"]))
                kept.append(entry)
                continue
            moved = self._quarantine(path)
            self._warn(f"corrupt shard {entry['path']}: {problem}; moved to {moved}, its episodes run again")
        repaired = len(kept) != len(self._manifest["shards"])
        if repaired or self._seq > self._base_through:
            # Compacted on every open that finds records (open reads every shard anyway): a
            # run starts with an empty log, and a repair is one base, not a record.
            self._manifest["shards"] = kept
            self._compact("repaired manifest" if repaired else "compaction on open")
        else:
            self._drop_folded_records()
        for path in (self.root / TMP_DIR).iterdir():
            if path.is_file():
                path.unlink(missing_ok=True)
        for path in (self.root / META_DIR).glob(".*.tmp"):  # an interrupted JSON write or record
            path.unlink(missing_ok=True)
        for path in sorted(data.rglob("*")):
            rel = path.relative_to(self.root).as_posix()
            if path.is_file() and rel not in known:
                # Never written there by us (data/ holds committed shards only), so not ours
                # to delete either: moved aside, out of every reader's sight.
                moved = self._quarantine(path)
                self._warn(f"stray file {rel} (not in the manifest) moved to {moved}")

    def _quarantine(self, path: Path) -> str:
        target_dir = self.root / QUARANTINE
        target_dir.mkdir(parents=True, exist_ok=True)
        # A suffix no reader takes for a shard (they read .arrow/.parquet even in hidden dirs).
        flat = path.relative_to(self.root).as_posix().replace("/", "__") + QUARANTINE_SUFFIX
        target = target_dir / flat
        if path.exists():
            shutil.move(str(path), target)
        return f"{QUARANTINE}/{flat}"

    # --- the public surface ------------------------------------------------------------

    def read_shard(self, entry: dict[str, Any], columns: Sequence[str] | None = None) -> pa.Table:
        """The committed shard `entry` names (in ``data/``, or still pending after a crash)."""
        return read_shard(shard_location(self.root, entry["path"]), columns)

    def _write_pending(self, table: pa.Table, model: str, budget: int, written: list[Path]) -> dict[str, Any]:
        """Write `table` as the next shard, in ``.collector/tmp/`` only, and return its manifest
        entry (naming its place in ``data/``). The file is appended to `written` first, so the
        caller's abort can remove it; the caller fsyncs tmp/, swaps the manifest, then
        `_publish`es: a shard reaches ``data/`` only once it is committed."""
        name = f"part-{self._manifest['next_part']:06d}-{uuid.uuid4().hex[:8]}{EXTENSIONS[self.fmt]}"
        self._manifest["next_part"] += 1
        rel = f"{DATA_DIR}/{name}"
        written.append(pending_path(self.root, rel))
        size, checksum = _write_pending_file(self.root, rel, table, self.fmt)
        return {
            "path": rel,
            "rows": table.num_rows,
            "model": model,
            "budget": budget,
            "size": size,
            "checksum": checksum,
            "committed": now_iso(),
        }

    def _publish(self, entries: Sequence[dict[str, Any]]) -> None:
        """Move committed shards from ``.collector/tmp/`` into ``data/`` (after the manifest swap).

        They are committed already: a failure here is not the commit's failure. What is not
        moved stays readable through the manifest and is moved by the next open.
        """
        try:
            for entry in entries:
                os.replace(pending_path(self.root, entry["path"]), self.root / entry["path"])
            fsync_dir(self.root / DATA_DIR)
        except OSError as e:
            self._warn(f"committed shards left in {TMP_DIR} ({describe_exception(e)}); "
                       "the next open moves them")

    def commit(self, episodes: Sequence[Episode]) -> int:
        """Durably commit the episodes not yet committed; return how many were new (see `_commit`)."""
        with self._transaction():
            return self._commit(episodes)

    def _commit(self, episodes: Sequence[Episode]) -> int:
        """Durably commit the episodes not yet committed; return how many were new.

        Ids already committed, and repeats inside `episodes`, are dropped. The episodes
        are grouped by (model, budget) partition and split into shards of at most
        `rows_per_shard` rows; the manifest is replaced once, after every shard is in
        place. On a failure before that swap the shards of this call are removed and
        OutputError raised: nothing of it is committed. Once the swap has happened the
        commit is done, whatever fails after it (a failed fsync is a warning, never a
        removal of files the manifest names).

        One poisoned value never blocks the others: an episode whose row cannot be built
        (a value that does not fit the schema) is left out, and so is every episode of a
        cell whose shards cannot be written (a directory the filesystem refuses); the rest
        is committed, and `CommitIncomplete` names what was left out.
        """
        self._check_writable()
        fresh = fresh_by_cell(episodes, self._ids)
        if not fresh:
            return 0
        written: list[Path] = []
        entries: list[dict[str, Any]] = []
        shard_ids: list[list[str]] = []
        left_out: set[str] = set()
        io_failed = False  # a cell failed on I/O (a full disk), not on a value
        causes: list[str] = []  # one per cell that lost episodes, for the message
        try:
            for (model, budget), group in fresh.items():
                rejected: dict[str, str] = {}
                try:
                    placed = self._place_cell(model, budget, group, written, rejected)
                except Exception as e:  # noqa: BLE001 - any failure of one cell is that cell's
                    placed, rejected = [], {ep.episode_id: one_line(e) for ep in group}
                    io_failed = io_failed or isinstance(e, OSError)
                if rejected:
                    left_out.update(rejected)
                    causes.append(f"model {model!r}, budget {budget}: {next(iter(rejected.values()))}")
                for entry, chunk_ids in placed:
                    entries.append(entry)
                    shard_ids.append(chunk_ids)
            if not entries and (io_failed or not left_out):  # the disk, not a value: stop
                raise OutputError(f"commit to {self.root} failed ({causes[0]})")
        except Exception as e:
            _remove(written)
            raise self._aborted(e) from e
        # With no entry, only poisoned values (rows, or a cell that cannot become a shard)
        # were left out: a CommitIncomplete below like any other, so whether a run goes on
        # never depends on which cells a commit held.
        committed = self._swap_in(entries, shard_ids, written) if entries else 0
        if left_out:
            self._incomplete(left_out, causes, committed)
        return committed

    def _aborted(self, e: Exception) -> OutputError:
        """The one-line error of an aborted commit (an OutputError as it was raised)."""
        if isinstance(e, OutputError):
            return e
        return OutputError(f"commit to {self.root} failed: {type(e).__name__}: {e}")

    def _incomplete(self, left_out: set[str], causes: list[str], committed: int) -> None:
        more = f"; and {len(causes) - 1} more cell(s)" if len(causes) > 1 else ""
        raise CommitIncomplete(
            f"{len(left_out)} episode(s) could not be committed to {self.root} ({causes[0]}{more}); "
            f"the {committed} others are committed",
            committed, left_out,
        )

    def _swap_in(self, entries: list[dict[str, Any]], shard_ids: Sequence[Sequence[str]],
                 written: list[Path]) -> int:
        """Commit shards already complete in ``.collector/tmp/``: fsync it, check the lock, append
        the one commit record naming them (the commit point), check the lock again, publish.
        Shared by `commit` (shards the driver wrote) and `commit_pending` (shards workers
        wrote). Before the record, a failure removes `written` and raises OutputError."""
        before = len(self._manifest["shards"])
        try:
            fsync_dir(self.root / TMP_DIR)
            self._check_writable()  # the lock again, just before the swap (the shards took time)
            self._manifest["shards"].extend(entries)
            self._append("commit", [], entries)
        except Exception as e:
            # Abort: whatever this call wrote is not in the manifest; remove it now rather
            # than leaving it for the next open. Broad on purpose: any failure aborts.
            del self._manifest["shards"][before:]
            _remove(written)
            raise self._aborted(e) from e
        committed = 0
        for entry, chunk_ids in zip(entries, shard_ids, strict=True):
            self._where.update(dict.fromkeys(chunk_ids, entry["path"]))
            self._ids.update(chunk_ids)
            committed += len(chunk_ids)
        self._check_lock_after_swap(committed)
        self._publish(entries)
        return committed

    def sink(self) -> LocalSink:
        """Where workers write pending shards of this run (`output.worker_writes`): picklable,
        it names this run dir by its absolute path, which must be the same on every node."""
        return LocalSink(str(self.root.absolute()), self.fmt)

    def commit_pending(self, shards: Sequence[PendingShard]) -> int:
        """Commit shards workers wrote (see `_commit_pending`); return how many episodes were new."""
        with self._transaction():
            return self._commit_pending(shards)

    def _commit_pending(self, shards: Sequence[PendingShard]) -> int:
        """Name `shards` (written by a `LocalSink` into ``.collector/tmp/``) in one commit record,
        then move them into ``data/``: the same record, lock checks and crash states as `commit`.

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
        dropped: list[Path] = []
        left_out: set[str] = set()
        causes: list[str] = []
        seen: set[str] = set()
        for shard in shards:
            file = pending_path(self.root, shard.path)
            ids = set(shard.episode_ids)
            old = {i for i in ids if i in self._ids or i in seen}
            if old == ids:
                dropped.append(file)
                continue
            problem = _pending_problem(shard, file, self.fmt)
            if old:
                problem = f"{len(old)} of its {len(ids)} episodes are committed already"
            elif len(ids) != shard.rows:
                problem = "it holds an episode id twice"
            if problem is not None:
                dropped.append(file)
                left_out.update(ids - old)
                causes.append(f"pending shard {shard.path}: {problem}")
                continue
            seen.update(ids)
            taken.append(shard)
        _remove(dropped)  # never committed: orphans otherwise, until the next open
        entries = [shard.manifest_entry() for shard in taken]
        written = [pending_path(self.root, shard.path) for shard in taken]
        committed = self._swap_in(entries, [s.episode_ids for s in taken], written) if entries else 0
        if left_out:
            self._incomplete(left_out, causes, committed)
        return committed

    def _place_cell(
        self, model: str, budget: int, group: list[Episode], written: list[Path], rejected: dict[str, str]
    ) -> list[tuple[dict[str, Any], list[str]]]:
        """Write one cell's shards (each entry with its ids); on failure remove what this cell
        wrote and raise, leaving the other cells' files in `written` alone. Episodes whose row
        cannot be built are left out into `rejected` (id -> why)."""
        mine: list[Path] = []
        placed = []
        try:
            for start in range(0, len(group), self.rows_per_shard):
                table, chunk = table_without_poison(group[start:start + self.rows_per_shard], rejected)
                if table is None:
                    continue
                placed.append((self._write_pending(table, model, budget, mine),
                               [ep.episode_id for ep in chunk]))
        except Exception:
            _remove(mine)
            raise
        written.extend(mine)
        return placed

    def forget(self, ids: Collection[str]) -> int:
        """Remove committed episodes, so that the next resume runs them again (see `_forget`)."""
        with self._transaction():
            return self._forget(ids)

    def _forget(self, ids: Collection[str]) -> int:
        """Remove committed episodes, so that the next resume runs them again; return how many.

        Used to re-collect `error` episodes once a provider is back. The same transaction
        shape as `commit`: every shard holding one of `ids` gets a replacement without
        those rows (written to ``.collector/tmp/``, size and checksum recorded; none when no
        row is left); the old files are moved out of ``data/`` into ``.collector/tmp/``;
        the manifest is swapped once (old entries out, new ones in); the replacements are
        moved into ``data/`` and the old files deleted. A plain reader therefore never sees
        a forgotten row once the swap can happen, nor an old file beside its replacement. A
        crash before the swap leaves the old state (the next open moves the old files back
        and deletes the replacements); after it, the new state (the next open finishes).
        Ids that are not committed are ignored. On a failure before the swap, the old files
        are moved back, what this call wrote is removed and OutputError raised.
        """
        self._check_writable()
        gone = {i for i in ids if i in self._ids}
        if not gone:
            return 0
        touched = {self._where[i] for i in gone}
        old = [e for e in self._manifest["shards"] if e["path"] in touched]
        written: list[Path] = []
        retired: list[tuple[Path, Path]] = []
        replacements: list[tuple[dict[str, Any], list[str]]] = []
        next_part = self._manifest["next_part"]
        try:
            for entry in old:
                table = read_shard(self.root / entry["path"])
                mask = pc.invert(pc.is_in(table.column("episode_id"), value_set=pa.array(sorted(gone))))
                kept = table.filter(mask)
                if kept.num_rows == 0:
                    continue
                placed = self._write_pending(kept, entry["model"], entry["budget"], written)
                replacements.append((placed, kept.column("episode_id").to_pylist()))
            for entry in old:  # out of every reader's sight, still committed (the next open restores)
                pair = (self.root / entry["path"], pending_path(self.root, entry["path"]))
                os.replace(*pair)
                retired.append(pair)
            fsync_dir(self.root / TMP_DIR)
            fsync_dir(self.root / DATA_DIR)
            previous = self._manifest["shards"]
            self._manifest["shards"] = [e for e in previous if e["path"] not in touched]
            self._manifest["shards"].extend(entry for entry, _ in replacements)
            try:
                # The one atomic switch from the old state to the new.
                self._append("forget", sorted(touched), [entry for entry, _ in replacements])
            except BaseException:
                self._manifest["shards"] = previous
                raise
        except Exception as e:
            self._manifest["next_part"] = next_part
            for final, aside in retired:
                with contextlib.suppress(OSError):
                    os.replace(aside, final)
            _remove(written)
            if isinstance(e, OutputError):
                raise
            raise OutputError(f"forgetting episodes in {self.root} failed: {type(e).__name__}: {e}") from e
        self._ids -= gone
        for i in gone:
            del self._where[i]
        self._check_lock_after_swap(None)
        for entry, kept_ids in replacements:
            self._where.update(dict.fromkeys(kept_ids, entry["path"]))
        self._publish([entry for entry, _ in replacements])
        # Committed state is already the new one; an old file left in tmp/ is deleted by the
        # next open, so a failed delete is not an error.
        _remove([aside for _, aside in retired])
        return len(gone)

    def _append(self, what: str, remove: list[str], add: list[dict[str, Any]]) -> None:
        """Commit a change as the next record of the commit log (its size is the change's, not
        the run's). Raises only when the record is not in place: a failed fsync after its
        rename (readers see it) is a warning, so that no caller aborts, and removes the files
        of, a change that is done."""
        self._manifest["updated"] = now_iso()
        record = {"seq": self._seq + 1, "op": what, "at": self._manifest["updated"],
                  "next_part": self._manifest["next_part"], "remove": remove, "add": add}
        try:
            write_json_atomic(commit_record_path(self.root, self._seq + 1), record)
        except ReplacedNotDurable as e:
            self._warn(f"{what} to {self.root} is done, but may not survive a power loss: {e.strerror}; "
                       "check the disk")
        self._seq += 1
        self._manifest["log_through"] = self._seq

    def _maybe_compact(self) -> None:
        """Compact once the log is long (see `_COMPACT_MIN_RECORDS`); the commit is done already,
        so a failure here is a warning (the records stay, and are the committed state)."""
        if self._seq - self._base_through < max(_COMPACT_MIN_RECORDS, len(self._manifest["shards"]) // 4):
            return
        try:
            self._check_writable()  # a base from a writer that lost the lock would clobber the new one's
            self._compact("compaction")
        except OutputError:
            return  # the lock is gone: the next commit says so (LockLost)
        except OSError as e:
            self._warn(f"compacting the commit log of {self.root} failed ({describe_exception(e)}); "
                       "its records stay the committed state")

    def _compact(self, what: str) -> None:
        """Write the in-memory state (every record folded in) as the base manifest, then delete
        the records it holds. Raises OSError when the base was not replaced."""
        self._manifest["log_through"] = self._seq
        self._manifest["updated"] = now_iso()
        try:
            write_json_atomic(self.root / MANIFEST, self._manifest)
        except ReplacedNotDurable as e:
            # Readers see the new base; the records stay until an open, in case the old base
            # comes back after a power loss (with them, it still says the same).
            self._base_through = self._seq
            self._warn(f"{what} of {self.root} is done, but may not survive a power loss: {e.strerror}; "
                       "check the disk")
            return
        self._base_through = self._seq
        self._drop_folded_records()

    def _drop_folded_records(self) -> None:
        """Delete the records the base manifest already holds (a compaction's second step)."""
        dropped = False
        for seq in commit_record_seqs(self.root):
            if seq <= self._base_through:
                commit_record_path(self.root, seq).unlink(missing_ok=True)
                dropped = True
        if dropped:
            fsync_dir(self.root / META_DIR)

    # --- the one-writer guard ------------------------------------------------------------

    def _check_writable(self) -> None:
        """Refuse to write when closed, or when the lock at our path is no longer ours.

        Checked before each commit (nothing is written then) and again after its manifest
        swap: a second writer that takes the lock over reads the manifest only after it
        holds the lock, so a swap followed by a successful check is in what it read.
        """
        if self._closed:
            raise OutputError(f"run store {self.root} is closed")
        if self._lock_lost is not None:
            raise LockLost(self._lock_lost)
        if self._lock_id is None:
            return
        try:
            held = _file_id(os.stat(self.root / LOCK)) == self._lock_id
        except OSError:
            held = False
        if not held:
            self._lock_lost = (
                f"{self.root / LOCK} was deleted or replaced while this run was writing (another "
                f"process may be writing {self.root}); stopped: uncommitted episodes run again on "
                "the next run"
            )
            raise LockLost(self._lock_lost)

    def _check_lock_after_swap(self, committed: int | None) -> None:
        try:
            self._check_writable()
        except LockLost:
            what = f"its last commit ({committed} episodes)" if committed is not None else "its last change"
            self._lock_lost = (
                f"{self.root / LOCK} was deleted or replaced while this run was writing (another "
                f"process may be writing {self.root}); stopped: {what} may have been overwritten "
                "by the other writer; run `collector check`, then the same command again to resume"
            )
            raise LockLost(self._lock_lost) from None

    def close(self) -> None:
        """Release the run dir's lock. Committed data needs no flush: commits are durable.

        The commit log is compacted first (a finished run dir holds one manifest listing
        everything), unless the lock is no longer ours or an operation was cut short.
        """
        if not self._closed and self._clean and self._seq > self._base_through:
            try:
                self._check_writable()
                self._compact("compaction on close")
            except (OutputError, OSError) as e:
                log.info("commit log of %s left uncompacted on close: %s", self.root, e)
        self._finalizer()
        self._lock_fd = None
        self._closed = True


def _write_pending_file(root: Path, rel: str, table: pa.Table, fmt: ShardFormat) -> tuple[int, str]:
    """Write `table` to the pending place of `rel` (fsynced); return its size and checksum."""
    tmp = pending_path(root, rel)
    write_shard(tmp, table, fmt)
    # Hashed from the page cache right after the write: what open verifies.
    return file_digest(tmp)


def _pending_problem(shard: PendingShard, file: Path, fmt: ShardFormat) -> str | None:
    """Why a worker's pending shard cannot be committed as it is, or None (a stat, no read:
    its checksum is verified on every later open)."""
    if not shard.path.endswith(EXTENSIONS[fmt]):
        return f"not a {fmt} shard"
    try:
        size = file.stat().st_size
    except OSError as e:
        return f"its file is not in {TMP_DIR}/ ({describe_exception(e)})"
    return None if size == shard.size else f"{size} bytes, the worker wrote {shard.size}"


@dataclass(frozen=True)
class LocalSink:
    """Writes pending shards into a run dir's ``.collector/tmp/`` from a worker
    (`collector.storage.pending`): only when that dir is the same one on every node (a shared
    filesystem, `output.worker_writes = true`). Picklable: the dir's absolute path and format."""

    root: str
    fmt: ShardFormat

    def write(self, table: pa.Table, model: str, budget: int, episode_ids: tuple[str, ...]) -> PendingShard:
        """Write `table` as a new pending shard (file and tmp/ fsynced) and return it."""
        root = Path(self.root)
        rel = f"{DATA_DIR}/{pending_shard_name(self.fmt)}"
        try:
            size, checksum = _write_pending_file(root, rel, table, self.fmt)
            fsync_dir(root / TMP_DIR)  # the name too: a commit record must never name a lost file
        except BaseException:
            _remove([pending_path(root, rel)])
            raise
        return PendingShard(rel, table.num_rows, model, budget, size, checksum, tuple(episode_ids))

    def discard(self, shard: PendingShard) -> None:
        """Remove a pending shard that will not be committed (best effort: the next open would)."""
        _remove([pending_path(Path(self.root), shard.path)])

    def read(self, shard: PendingShard) -> pa.Table:
        """The table of a pending shard (the driver filters a partly duplicate one with it)."""
        return read_shard(pending_path(Path(self.root), shard.path))

    def reachable(self) -> bool:
        """Whether the run dir is visible here (a worker checks it: a path that is not shared)."""
        return (Path(self.root) / MANIFEST).is_file() and (Path(self.root) / TMP_DIR).is_dir()


def _foreign(root: Path) -> list[str]:
    """Names at the top of `root` that no interrupted first open of ours leaves behind."""
    return [p.name for p in root.iterdir()
            if p.name != META_DIR and not (p.name == DATA_DIR and p.is_dir() and not any(p.iterdir()))]


def _verify_shard(path: Path, entry: dict[str, Any]) -> tuple[list[str], str | None]:
    """A committed shard's episode ids, or why the shard cannot be trusted.

    The size and checksum recorded at commit catch damage anywhere in the file, including
    bytes inside a column that reading only `episode_id` would never touch. An entry from
    an older manifest without them gets a full decode and validation instead: slower, and
    blind to a flipped bit that still decodes, but it catches what breaks a later reader.
    """
    try:
        actual_size = path.stat().st_size
    except FileNotFoundError:
        return [], "file is missing"
    except OSError as e:
        return [], f"unreadable ({describe_exception(e)})"
    size, checksum = entry.get("size"), entry.get("checksum")
    if size is not None and actual_size != size:
        return [], f"{actual_size} bytes, the manifest says {size}"
    try:
        if checksum is not None:
            if not checksum.startswith(f"{CHECKSUM_ALGORITHM}:"):
                return [], f"unknown checksum algorithm in {checksum.split(':', 1)[0]!r}"
            if file_digest(path)[1] != checksum:
                return [], "checksum differs from the one recorded at commit (file damaged)"
            table = read_shard(path, ["episode_id"])
        else:
            table = read_shard(path)  # no checksum recorded: decode and validate every column
    except ShardError as e:
        return [], f"unreadable ({e.reason})"
    except OSError as e:
        return [], f"unreadable ({describe_exception(e)})"
    return verified_ids(table, entry)


def verified_ids(table: pa.Table, entry: dict[str, Any]) -> tuple[list[str], str | None]:
    """A decoded committed shard's episode ids, or why it does not match its manifest entry
    (schema version, row count): the last step of either store's verification on open."""
    version = schema_version_of(table.schema)
    if version != SCHEMA_VERSION:
        return [], f"schema version {version}, expected {SCHEMA_VERSION}"
    if table.num_rows != entry.get("rows"):
        return [], f"{table.num_rows} rows, the manifest says {entry.get('rows')}"
    return table.column("episode_id").to_pylist(), None


def _file_id(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _acquire_lock(root: Path) -> int | None:
    if fcntl is None:  # pragma: no cover
        return None
    for _ in range(5):
        fd = os.open(root / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise OutputError(f"run dir {root} is in use by another collector process") from None
        # The file may have been deleted (and re-created) between open and flock: a lock on an
        # unlinked inode guards nothing. Hold it only while the path still names our inode.
        try:
            if _file_id(os.stat(root / LOCK)) == _file_id(os.fstat(fd)):
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)
    raise OutputError(f"run dir {root}: its lock file {LOCK} keeps being replaced (deleted by a process?)")


def _release_lock(fd: int | None) -> None:
    if fd is None:
        return
    with contextlib.suppress(OSError):
        os.close(fd)  # closing the descriptor drops the flock

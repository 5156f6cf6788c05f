"""The run directory: where committed episodes live, exactly once.

Tests: tests/storage/test_store.py, test_commit_faults.py, test_commit_log.py, test_forget.py,
test_integrity.py, test_pending_commit.py.

Layout (``RUN_DIR``, names and why in `collector.storage.manifest`)::

    data/part-000042-1a2b3c4d.arrow   committed shards only (Parquet optional), flat
    .collector/manifest.json          the committed shards as of its `log_through` (the base)
    .collector/commit-000000043.json  one record per commit since (the log): base + log = the truth
    .collector/config.resolved.json   the resolved config the run was started with, and its fingerprint
    .collector/run.lock               held (flock) while a LocalRunStore is open: one writer per run dir
    .collector/tmp/                   shards being written (and committed ones not yet moved)
    .collector/quarantine/            shards found corrupt on open, moved aside (never deleted)

Exactly once. An episode is *committed* when a shard holding it is named in the manifest
(the base manifest with the commit log applied, `collector.storage.manifest.read_manifest`).
`LocalRunStore.commit` writes each shard to ``.collector/tmp/<name>.tmp``, fsyncs it and the
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
by inode before each commit and after its manifest swap. The transaction itself (commit,
commit_pending, forget, compaction) is `collector.storage.commit.CommitStore`, written once
for both stores; this module is its directory backend (flock, fsync, rename).
Episode ids are deterministic (`collector.record.episode.episode_id`), so resume is a set
difference: the driver runs every id not in `committed_ids()`; an id that is already
committed, or repeated inside one commit (a late duplicate from a worker presumed dead), is
dropped at commit. Nothing is ever committed twice, and nothing committed is ever lost.

Forgetting. `LocalRunStore.forget` takes committed episodes out again (`collector run
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
and reported in `LocalRunStore.warnings` (one line naming the file): its episodes count as not
committed and run again, so a damaged file never stops a resume. Entries of older manifests
without size and checksum get a full decode and validation of the shard instead. A
manifest entry that is malformed itself (no path, a path outside the run dir) makes the
manifest untrusted: `read_manifest` refuses it in one line.

Files are written by the driver, which alone holds a LocalRunStore: workers on other nodes
return episodes to it, so nodes need not share a disk. With worker-side writes
(`output.worker_writes` on a shared filesystem) workers write shards through `LocalRunStore.sink`
(a `LocalSink`) into ``.collector/tmp/`` only, and the driver's `commit_pending` names them
in a commit record and moves them into ``data/``: the same record, lock checks and crash
states as `commit` (`_swap_in`), so every rule above holds. A worker's file is never visible
before its record; one never committed (a worker killed mid-write, a duplicate batch) is
an orphan of ``.collector/tmp/``, deleted by the next open.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa

from collector.errors import OutputError
from collector.record.episode import SCHEMA_VERSION
from collector.record.shards import (
    EXTENSIONS,
    ShardError,
    ShardFormat,
    describe_exception,
    read_shard,
    write_shard,
)
from collector.storage.commit import CommitStore, check_open_arguments
from collector.storage.committed import CommittedIds
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
from collector.storage.runstore import CommitIncomplete, LockLost, StoreState, fresh_by_cell, verified_ids

try:  # POSIX advisory locks; elsewhere the single-writer rule is the user's to keep
    import fcntl
except ImportError:  # pragma: no cover - not on the platforms we run on
    fcntl = None  # type: ignore[assignment]

# CommitIncomplete, LockLost, StoreState, fresh_by_cell and verified_ids live in
# `collector.storage.runstore`; they stay importable from here for the callers that name
# them so.
__all__ = ["CommitIncomplete", "LocalRunStore", "LocalSink", "LockLost", "StoreState",
           "fresh_by_cell", "verified_ids"]


def _remove(paths: Sequence[Path]) -> None:
    """Best-effort removal of what an aborted transaction wrote (never in the manifest)."""
    for path in paths:
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)


class LocalRunStore(CommitStore):
    """The single writer of one run directory. Open it, commit batches, close it.

    `open` -> (`commit` | `commit_pending` | `forget`)* -> `close`. Each `commit` is its own
    transaction: its shards are all in the manifest when it returns, or none are (an
    exception aborts it and removes what it wrote). Use it as a context manager or call
    `close`; the lock is also released when the object is garbage-collected or the process dies.
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
        # The committed ids, each with the shard holding it: `forget` then rewrites only the
        # shards concerned instead of reading the ids of every shard again.
        self._committed = CommittedIds()
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
    ) -> LocalRunStore:
        """Open (creating if needed) the run dir for writing; raise OutputError (one line) if foreign.

        Refused: a dir written by a config with another fingerprint, with another shard
        format or schema version, a non-empty dir that is not a run dir, a dir another
        process has open, or a path that cannot be created or written.
        """
        check_open_arguments(fmt, rows_per_shard)
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
        known: set[str] = {entry["path"] for entry in entries}
        kept = self._verify_all(entries, lambda e: _verify_shard(self.root / e["path"], e),
                                lambda rel: self._quarantine(self.root / rel))
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

    # --- the backend of the commit protocol (`collector.storage.commit`) ---------------------

    def read_shard(self, entry: dict[str, Any], columns: Sequence[str] | None = None) -> pa.Table:
        """The committed shard `entry` names (in ``data/``, or still pending after a crash)."""
        return read_shard(shard_location(self.root, entry["path"]), columns)

    def _put_pending(self, rel: str, table: pa.Table) -> tuple[int, str]:
        return _write_pending_file(self.root, rel, table, self.fmt)

    def _remove_pending(self, rels: Sequence[str]) -> None:
        _remove([pending_path(self.root, rel) for rel in rels])

    def _pending_problem(self, shard: PendingShard) -> str | None:
        return _pending_problem(shard, pending_path(self.root, shard.path), self.fmt)

    def _before_record(self) -> None:
        """fsync tmp/ (the new shards' names) and data/ (a forget's moves out of it), then check
        the lock again, just before the record (the shards took time)."""
        fsync_dir(self.root / TMP_DIR)
        fsync_dir(self.root / DATA_DIR)
        self._check_writable()

    def _create_record(self, seq: int, record: dict[str, Any]) -> None:
        """Write the record (temp, fsync, rename: the flock keeps it create-only). Raises only
        when it is not in place: a failed fsync after its rename (readers see it) is a warning,
        so that no caller aborts, and removes the files of, a change that is done."""
        try:
            write_json_atomic(commit_record_path(self.root, seq), record)
        except ReplacedNotDurable as e:
            self._warn(f"{record['op']} to {self.root} is done, but may not survive a power loss: "
                       f"{e.strerror}; check the disk")

    def _publish(self, entries: Sequence[dict[str, Any]]) -> None:
        """Move committed shards from ``.collector/tmp/`` into ``data/`` (after the record).

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

    def _retire(self, rel: str) -> None:
        os.replace(self.root / rel, pending_path(self.root, rel))

    def _unretire(self, rel: str) -> None:
        os.replace(pending_path(self.root, rel), self.root / rel)

    def _renew(self) -> None:
        """A flock needs no renewal."""

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

    def sink(self) -> LocalSink:
        """Where workers write pending shards of this run (`output.worker_writes`): picklable,
        it names this run dir by its absolute path, which must be the same on every node."""
        return LocalSink(str(self.root.absolute()), self.fmt)

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

    def _check_lock_after_record(self, what: str) -> None:
        try:
            self._check_writable()
        except LockLost:
            self._lock_lost = (
                f"{self.root / LOCK} was deleted or replaced while this run was writing (another "
                f"process may be writing {self.root}); stopped: {what} may have been overwritten "
                "by the other writer; run `collector check`, then the same command again to resume"
            )
            raise LockLost(self._lock_lost) from None

    def _release(self) -> None:
        self._finalizer()
        self._lock_fd = None


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

"""A run under ``s3://bucket/prefix``: the same layout, manifest and exactly-once guarantee
as a local run directory (`collector.storage.local`), where there is no rename and no flock.
The transaction (commit, commit_pending, forget, compaction) is written once, in
`collector.storage.commit.CommitStore`; `S3RunStore` is its S3 backend.

Tests: tests/storage/test_objectstore.py, tests/storage/test_s3_retries.py,
tests/system/faults/test_s3_run.py, tests/system/faults/test_s3_sigkill.py, tests/faults/test_two_writers.py.

Keys under the prefix are the local layout's names (`collector.storage.manifest`): ``data/part-*``
(committed shards only), ``.collector/manifest.json`` (the base), ``.collector/commit-<seq>.json``
(the log, records in the local JSON format, so readers fold them the same way),
``.collector/config.resolved.json``, ``.collector/run.lock``, ``.collector/tmp/``,
``.collector/quarantine/``.

The commit point. A commit PUTs each shard to ``.collector/tmp/<name>.tmp`` (hashing the
bytes it sends), renews the lock, then creates ``commit-<seq>.json`` with ``If-None-Match: *``:
that create-only PUT is the commit. The store answers 412 when the key exists, i.e. when
another writer committed that seq: the store raises `LockLost` and commits nothing more.
After the record it checks the lock is still ours, then copies each shard server-side from
tmp to ``data/<name>`` and deletes the tmp key; a failure there is a warning, and the next
open finishes the copy (the record names ``data/<name>``; data missing and tmp present).
A plain reader listing ``data/`` therefore sees only committed shards.

One writer: ``.collector/run.lock``, a lease (`collector.storage.s3lease`): created with
``If-None-Match: *``, a second writer refused in one line naming the holder, a holder on this
very host (boot id and pid namespace, not the hostname) whose pid is dead taken over at once,
any other once its lease of `LEASE_S` has expired on the store's clock. The holder renews it
(``If-Match``) before every commit record, forget and compaction, and between the steps of a
long one (shard verifications on open, the shard PUTs of a large commit). A driver that
finishes nothing for longer than the lease (a slow model) can still have its lock taken over
by a second ``collector run``, and then stops at its next commit with `LockLost` (412 on the
renewal), having committed nothing over the other's work.

Compaction (same cadence as local): the folded state PUT as ``manifest.json`` with
``If-Match`` on the base's ETag (``If-None-Match`` on first creation), then the folded
records deleted. Readers fold base + records and read again on a gap, as locally.

Refusing a store that cannot give the guarantee. Open PUTs a probe key twice with
``If-None-Match: *``; an endpoint that accepts the second ignores conditional writes and is
refused in one line (older MinIO, some S3 gateways) rather than silently weakened.

The lock lives in `collector.storage.s3lease`, shard bytes and the workers' `S3Sink` in
`collector.storage.s3objects`, the S3 calls and their one-line errors in `collector.storage.s3client`.

Deviations from the local store, with reasons: fsync has no meaning here (a finished PUT is
durable); a forget "moves aside" an old shard by copying it to tmp and deleting it from
``data/`` (there is no rename), with the same recovery: named in the manifest, data missing,
tmp present -> copied back. Verification on open GETs every committed shard (size and
sha256 over its bytes) in a few threads.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import pyarrow as pa

from collector.errors import OutputError
from collector.record.episode import SCHEMA_VERSION
from collector.record.shards import EXTENSIONS, ShardError, ShardFormat
from collector.storage.commit import CommitStore, RecordInDoubt, check_open_arguments
from collector.storage.committed import CommittedIds
from collector.storage.location import ObjectLocation, parse_location
from collector.storage.manifest import (
    CHECKSUM_ALGORITHM,
    DATA_DIR,
    MANIFEST,
    MANIFEST_VERSION,
    META_DIR,
    QUARANTINE,
    QUARANTINE_SUFFIX,
    RESOLVED_CONFIG,
    TMP_DIR,
    check_continuable,
    entry_problem,
    fold_records,
    new_manifest,
    now_iso,
    unique_entries,
)
from collector.storage.pending import PendingShard
from collector.storage.runstore import LockLost, verified_ids
from collector.storage.s3client import PreconditionFailed, S3Bucket
from collector.storage.s3lease import LEASE_S, PROBE_PREFIX, Lease, probe_conditional_writes
from collector.storage.s3objects import S3Sink, digest, encode_shard, json_bytes, pending_rel, table_of

__all__ = ["LEASE_S", "S3RunStore", "S3Sink", "pending_rel", "record_rel"]

#: Shards copied into data/ at once after a commit record (each copy + delete is two requests).
_PUBLISH_THREADS = 8
_RECORD_NAME = re.compile(r"commit-(\d{9,})\.json")
_RECORD_PREFIX = f"{META_DIR}/commit-"


def record_rel(seq: int) -> str:
    return f"{META_DIR}/commit-{seq:09d}.json"


class S3RunStore(CommitStore):
    """The single writer of one run under an object-store prefix (see the module docstring).

    The surface of every run store (`collector.storage.runstore.RunStore`): `open` -> (`commit`
    | `commit_pending` | `forget`)* -> `close`; each commit is all in the manifest or none of it.
    """

    def __init__(self, loc: ObjectLocation, bucket: S3Bucket, lease: Lease, manifest: dict[str, Any],
                 rows_per_shard: int, base_through: int, base_etag: str) -> None:
        self.location = loc
        self.root = loc
        self.bucket = bucket
        self.fmt: ShardFormat = manifest["format"]
        self.rows_per_shard = rows_per_shard
        self.warnings: list[str] = []
        """One line per problem found on open (corrupt shards quarantined, orphans removed)."""
        self._lease = lease
        self._manifest = manifest
        self._seq: int = int(manifest.get("log_through", 0))
        self._base_through = base_through
        self._base_etag = base_etag
        self._clean = True  # as in LocalRunStore: False once an operation was cut short
        self._committed = CommittedIds()
        self._lock_lost: str | None = None
        self._closed = False

    def _key(self, rel: str) -> str:
        return self.location.key(rel)

    def _uri(self, rel: str) -> str:
        return f"s3://{self.location.bucket}/{self._key(rel)}"

    # --- opening -----------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        location: ObjectLocation | str,
        config_fingerprint: str,
        resolved_config: dict[str, Any],
        fmt: Literal["arrow", "parquet"] = "arrow",
        rows_per_shard: int = 512,
        *,
        lease_s: float = LEASE_S,
    ) -> S3RunStore:
        """Open (creating if needed) the run for writing; OutputError (one line) if refused.

        Refused as locally (another config's fingerprint, format or schema version, a prefix
        holding other objects, a run another process holds), and an endpoint that ignores
        conditional writes; every S3 failure is one line naming the bucket/key and the code.
        """
        check_open_arguments(fmt, rows_per_shard)
        loc = parse_location(location) if isinstance(location, str) else location
        if not isinstance(loc, ObjectLocation):
            raise OutputError(f"{location} is not an object-store location (s3://bucket/prefix)")
        bucket = S3Bucket(loc.bucket)
        probe_conditional_writes(bucket, loc)
        lease = Lease.acquire(bucket, loc, lease_s)
        try:
            manifest, base_through, base_etag = cls._load_or_create(bucket, loc, config_fingerprint, fmt)
            store = cls(loc, bucket, lease, manifest, rows_per_shard, base_through, base_etag)
        except BaseException:
            lease.release()
            raise
        try:
            bucket.put(loc.key(RESOLVED_CONFIG), json_bytes({
                "fingerprint": config_fingerprint,
                "schema_version": SCHEMA_VERSION,
                "config": resolved_config,
            }))
            store._recover()
        except BaseException:
            store.close()
            raise
        return store

    @staticmethod
    def _rels(bucket: S3Bucket, loc: ObjectLocation, under: str = "") -> set[str]:
        """Every key under the run's prefix (and starting with `under`), relative to the prefix."""
        base = loc.key("")
        return {key[len(base):] for key in bucket.keys(base + under)}

    @classmethod
    def _load_or_create(cls, bucket: S3Bucket, loc: ObjectLocation, fingerprint: str,
                        fmt: ShardFormat) -> tuple[dict[str, Any], int, str]:
        found = bucket.get(loc.key(MANIFEST))
        if found is None:
            foreign = sorted(r for r in cls._rels(bucket, loc) if not r.startswith(f"{META_DIR}/"))
            if foreign:
                raise OutputError(
                    f"{loc} is not empty and is not a run (no {MANIFEST}; it holds {foreign[0]}); "
                    "choose another output.path"
                )
            manifest = new_manifest(fingerprint, fmt)
            etag = bucket.put(loc.key(MANIFEST), json_bytes(manifest), create_only=True)
            return manifest, 0, etag
        body, etag, _ = found
        base = cls._parse(loc, MANIFEST, body)
        through = base.get("log_through", 0)
        if not isinstance(through, int) or isinstance(through, bool) or through < 0:
            raise OutputError(f'{loc}/{MANIFEST}: invalid "log_through": {through!r}')
        seqs = sorted(int(m.group(1)) for rel in cls._rels(bucket, loc, _RECORD_PREFIX)
                      if (m := _RECORD_NAME.fullmatch(rel.removeprefix(f"{META_DIR}/"))))
        seqs = [s for s in seqs if s > through]
        if seqs != list(range(through + 1, through + 1 + len(seqs))):
            raise OutputError(f"{loc}/{META_DIR}: the commit log has a gap after record {through} "
                              f"(records {seqs[:3]}...): a commit record was deleted; the manifest "
                              "cannot be trusted")
        records = []
        for seq in seqs:
            got = bucket.get(loc.key(record_rel(seq)))
            if got is None:
                raise OutputError(f"{loc}/{record_rel(seq)} vanished while it was read (another writer?)")
            record = cls._parse(loc, record_rel(seq), got[0], record=True)
            if record.get("seq") != seq:
                raise OutputError(f"{loc}/{record_rel(seq)} is not a collector commit record")
            records.append(record)
        manifest = fold_records(base, records)
        check_continuable(manifest, str(loc), fingerprint, fmt)
        manifest["manifest_version"] = MANIFEST_VERSION
        return manifest, through, etag

    @staticmethod
    def _parse(loc: ObjectLocation, rel: str, body: bytes, record: bool = False) -> dict[str, Any]:
        """A manifest or commit record, its entries checked as `collector.storage.manifest` does."""
        try:
            data = json.loads(body)
        except ValueError as e:
            raise OutputError(f"{loc}/{rel} is unreadable: {e}") from None
        key = "add" if record else "shards"
        if (not isinstance(data, dict) or not isinstance(data.get(key), list)
                or (record and (not isinstance(data.get("remove"), list)
                                or not all(isinstance(r, str) for r in data["remove"])
                                or not isinstance(data.get("next_part"), int)))):
            raise OutputError(f"{loc}/{rel} is not a collector {'commit record' if record else 'manifest'}")
        for i, entry in enumerate(data[key]):
            problem = entry_problem(entry)
            if problem is not None:
                raise OutputError(f"{loc}/{rel}: shard entry {i} {problem}")
        return data

    def _recover(self) -> None:
        """Finish interrupted copies; verify every committed shard; quarantine bad ones; remove
        orphan tmp keys and probes; move strays in data/ to quarantine (as LocalRunStore._recover)."""
        rels = self._rels(self.bucket, self.location)
        entries, repeated = unique_entries(self._manifest["shards"])
        for rel in dict.fromkeys(repeated):
            self._warn(f"manifest named shard {rel} more than once; keeping one entry (its rows count once)")
        finished = 0
        for entry in entries:
            final, pending = entry["path"], pending_rel(entry["path"])
            if final not in rels and pending in rels:
                self._renew_if_due()  # a crash mid-publish of many shards: as many copies now
                self.bucket.copy(self._key(pending), self._key(final))
                self.bucket.delete(self._key(pending))
                rels.add(final)
                rels.discard(pending)
                finished += 1
        if finished:
            self._warn(f"finished copying {finished} committed shard(s) of an interrupted commit "
                       f"into {DATA_DIR}/")
        kept = self._verify_all(
            entries, self._verify,
            lambda rel: self._quarantine(rel) if rel in rels else "nowhere (it is missing)")
        repaired = len(kept) != len(self._manifest["shards"])
        if repaired or self._seq > self._base_through:
            self._renew()
            self._manifest["shards"] = kept
            self._compact("compaction on open")
        else:
            self._drop_folded_records(rels)
        named = {entry["path"] for entry in entries}  # the corrupt ones are quarantined already
        for rel in sorted(rels):
            self._renew_if_due()  # thousands of orphans (workers killed mid-run) take a while too
            if rel.startswith((f"{TMP_DIR}/", PROBE_PREFIX)):
                self.bucket.delete(self._key(rel))  # uncommitted (we hold the lock: no live writer's)
            elif rel.startswith(f"{DATA_DIR}/") and rel not in named:
                moved = self._quarantine(rel)
                self._warn(f"stray object {rel} (not in the manifest) moved to {moved}")

    def _verify(self, entry: dict[str, Any]) -> tuple[list[str], str | None]:
        """A committed shard's ids, or why it cannot be trusted (size, sha256, decode, rows).

        A GET that fails (a timeout, no permission) raises: over a network that says nothing
        about the object, and quarantining a good shard would run its episodes again.
        """
        self._renew_if_due()  # thousands of shards take longer than a lease
        found = self.bucket.get(self._key(entry["path"]))
        if found is None:
            return [], "object is missing"
        data = found[0]
        size, checksum = entry.get("size"), entry.get("checksum")
        if size is not None and len(data) != size:
            return [], f"{len(data)} bytes, the manifest says {size}"
        if checksum is not None:
            if not checksum.startswith(f"{CHECKSUM_ALGORITHM}:"):
                return [], f"unknown checksum algorithm in {checksum.split(':', 1)[0]!r}"
            if digest(data) != checksum:
                return [], "checksum differs from the one recorded at commit (object damaged)"
        try:
            table = table_of(data, entry["path"].rsplit("/", 1)[-1],
                              ["episode_id"] if checksum is not None else None, self._uri(entry["path"]))
        except ShardError as e:
            return [], f"unreadable ({e.reason})"
        return verified_ids(table, entry)

    def _quarantine(self, rel: str) -> str:
        target = f"{QUARANTINE}/{rel.replace('/', '__')}{QUARANTINE_SUFFIX}"
        self.bucket.copy(self._key(rel), self._key(target))
        self.bucket.delete(self._key(rel))
        return target

    # --- the public surface ------------------------------------------------------------

    def read_shard(self, entry: dict[str, Any], columns: Sequence[str] | None = None) -> pa.Table:
        """The committed shard `entry` names (from data/, or tmp/ before its copy finished)."""
        for rel in (entry["path"], pending_rel(entry["path"])):
            found = self.bucket.get(self._key(rel))
            if found is not None:
                return table_of(found[0], rel.rsplit("/", 1)[-1], columns, self._uri(rel))
        raise ShardError(self._uri(entry["path"]), "object is missing")

    def sink(self) -> S3Sink:
        """Where workers write this run's pending shards (`commit_pending` commits them)."""
        return S3Sink(self.location, self.fmt)

    # --- the backend of the commit protocol (`collector.storage.commit`) ---------------------

    def _put_pending(self, rel: str, table: pa.Table) -> tuple[int, str]:
        """PUT `table` as the shard `rel`'s pending object (hashing the bytes sent)."""
        self._renew_if_due()  # a large commit: many shard PUTs before its record
        data = encode_shard(table, self.fmt)
        self.bucket.put(self._key(pending_rel(rel)), data)
        return len(data), digest(data)

    def _remove_pending(self, rels: Sequence[str]) -> None:
        self._delete_quietly([pending_rel(rel) for rel in rels])

    def _pending_problem(self, shard: PendingShard) -> str | None:
        """A HEAD, no GET: its size now, its sha256 on every later open. A failed HEAD raises
        (it says nothing about the object): the commit is aborted, nothing of it committed."""
        if not shard.path.endswith(EXTENSIONS[self.fmt]):
            return f"not a {self.fmt} shard"
        head = self.bucket.head(self._key(pending_rel(shard.path)))
        if head is None:
            return f"its object is not in {TMP_DIR}/"
        size = int(head.get("ContentLength", -1))
        return None if size == shard.size else f"{size} bytes, the worker wrote {shard.size}"

    def _before_record(self) -> None:
        self._check_writable()
        self._renew()

    def _renew(self, *, only_if_due: bool = False) -> None:
        try:
            if only_if_due:
                self._lease.renew_if_due()
            else:
                self._lease.renew()
        except LockLost as e:
            self._lock_lost = str(e)
            raise

    def _renew_if_due(self) -> None:
        self._renew(only_if_due=True)

    def _create_record(self, seq: int, record: dict[str, Any]) -> None:
        """Create ``commit-<seq>.json`` with ``If-None-Match: *``: the commit point."""
        try:
            self.bucket.put(self._key(record_rel(seq)), json_bytes(record), create_only=True)
        except PreconditionFailed:
            self._lock_lost = self._lease.lost_message(
                f"another writer committed record {seq}; uncommitted episodes run again on the next run")
            raise LockLost(self._lock_lost) from None
        except OutputError as e:
            self._lock_lost = (f"{self.location}: the outcome of a commit is unknown ({e}); reopen the run "
                               "(collector run again) to settle it")
            raise RecordInDoubt(str(e)) from None

    def _retire(self, rel: str) -> None:
        """No rename in S3: copied aside to tmp/, then deleted from data/."""
        self.bucket.copy(self._key(rel), self._key(pending_rel(rel)))
        self.bucket.delete(self._key(rel))

    def _unretire(self, rel: str) -> None:
        self.bucket.copy(self._key(pending_rel(rel)), self._key(rel))
        self.bucket.delete(self._key(pending_rel(rel)))

    def _compact(self, what: str) -> None:
        """PUT the folded state as the base (If-Match on the base we read), then delete the
        records it holds. A 412 means another writer replaced the base: LockLost."""
        self._manifest["log_through"] = self._seq
        self._manifest["updated"] = now_iso()
        try:
            self._base_etag = self.bucket.put(self._key(MANIFEST), json_bytes(self._manifest),
                                              if_match=self._base_etag)
        except PreconditionFailed:
            self._lock_lost = self._lease.lost_message(f"another writer replaced the manifest ({what})")
            raise LockLost(self._lock_lost) from None
        self._base_through = self._seq
        # Only the records are listed: a compaction's cost does not grow with the shards in data/.
        self._drop_folded_records(self._rels(self.bucket, self.location, _RECORD_PREFIX))

    def _delete_quietly(self, rels: Sequence[str]) -> None:
        for rel in rels:
            with contextlib.suppress(OutputError):
                self.bucket.delete(self._key(rel))

    def _publish(self, entries: Sequence[dict[str, Any]]) -> None:
        """Copy committed shards from tmp/ into data/ (after the record); failures are warnings.

        A few at a time: each is two requests (copy, delete) of S3's latency, and with
        worker-side writes a commit names many small shards; once the record exists their
        order does not matter (the next open finishes whichever did not happen)."""
        def publish(entry: dict[str, Any]) -> None:
            self.bucket.copy(self._key(pending_rel(entry["path"])), self._key(entry["path"]))
            self.bucket.delete(self._key(pending_rel(entry["path"])))

        try:
            if len(entries) == 1:
                publish(entries[0])
                return
            with ThreadPoolExecutor(max_workers=_PUBLISH_THREADS) as pool:
                list(pool.map(publish, entries))
        except OutputError as e:
            self._warn(f"committed shards left in {TMP_DIR} ({e}); the next open copies them")

    # --- compaction and the one-writer guard ----------------------------------------------

    def _drop_folded_records(self, rels: set[str]) -> None:
        for rel in sorted(rels):
            m = _RECORD_NAME.fullmatch(rel.removeprefix(f"{META_DIR}/"))
            if rel.startswith(f"{META_DIR}/") and m and int(m.group(1)) <= self._base_through:
                self.bucket.delete(self._key(rel))

    # --- the one-writer guard ------------------------------------------------------------

    def _check_writable(self) -> None:
        if self._closed:
            raise OutputError(f"run store {self.location} is closed")
        if self._lock_lost is not None:
            raise LockLost(self._lock_lost)

    def _check_lock_after_record(self, what: str) -> None:
        """After the record: is the lock still ours? (A writer that took it over read the log
        after taking it, so a record followed by a held lock is in what it read.)"""
        try:
            held = self._lease.held()
        except OutputError as e:
            self._warn(f"could not check the lock of {self.location} after a commit ({e})")
            return
        if not held:
            self._lock_lost = self._lease.lost_message(
                f"{what} may have been overwritten by the other writer; run `collector check`, then "
                "the same command again to resume")
            raise LockLost(self._lock_lost)

    def _release(self) -> None:
        if self._lock_lost is None:
            self._lease.release()

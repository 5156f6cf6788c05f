"""A run under ``s3://bucket/prefix``: the same layout, manifest and exactly-once guarantee
as a local run directory (`collector.storage.local`), where there is no rename and no flock.

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

One writer: ``.collector/run.lock`` holds an owner token (host, pid, uuid, started,
renewed), created with ``If-None-Match: *``. A second writer is refused in one line naming
the holder. A lock whose holder is on this host and whose pid is dead is taken over at once
(``If-Match`` on its ETag). Otherwise it is a lease of `LEASE_S`: the holder renews it
(``If-Match``) before every commit record, forget and compaction, and an expired lease (its
object's LastModified, the store's clock, older than the lease) may be taken over, with
``If-Match`` so that two contenders cannot both win. There is no background renewal: the
driver commits at least every ``output.commit_interval_s`` (30 s) while it has finished
episodes; a run that finishes nothing for longer than the lease (a slow model) can have
its lock taken over by a second ``collector run``, and then stops at its next commit with
`LockLost` (412 on the renewal), having committed nothing over the other's work. A writer
that lost its lock gets 412 on its next renewal or record create.

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
import logging
import re
import uuid
from collections.abc import Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc

from collector.errors import OutputError
from collector.record.episode import SCHEMA_VERSION, Episode
from collector.record.shards import (
    EXTENSIONS,
    ShardError,
    ShardFormat,
    one_line,
    table_without_poison,
)
from collector.storage.local import (
    _COMPACT_MIN_RECORDS,
    CommitIncomplete,
    LockLost,
    StoreState,
    fresh_by_cell,
    verified_ids,
)
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
from collector.storage.s3client import PreconditionFailed, S3Bucket
from collector.storage.s3lease import LEASE_S, PROBE_PREFIX, Lease, probe_conditional_writes
from collector.storage.s3objects import S3Sink, digest, encode_shard, json_bytes, pending_rel, table_of

__all__ = ["LEASE_S", "ObjectRunStore", "S3Sink", "pending_rel", "record_rel"]

log = logging.getLogger(__name__)

_VERIFY_THREADS = 4
#: Shards copied into data/ at once after a commit record (each copy + delete is two requests).
_PUBLISH_THREADS = 8
_RECORD_NAME = re.compile(r"commit-(\d{9,})\.json")
_RECORD_PREFIX = f"{META_DIR}/commit-"


def record_rel(seq: int) -> str:
    return f"{META_DIR}/commit-{seq:09d}.json"


class ObjectRunStore(StoreState):
    """The single writer of one run under an object-store prefix (see the module docstring).

    The public surface of `collector.storage.local.RunStore`: `open` -> (`commit` |
    `commit_pending` | `forget`)* -> `close`; each commit is all in the manifest or none of it.
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
        self._clean = True  # as in RunStore: False once an operation was cut short
        self._ids: set[str] = set()
        self._where: dict[str, str] = {}
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
    ) -> ObjectRunStore:
        """Open (creating if needed) the run for writing; OutputError (one line) if refused.

        Refused as locally (another config's fingerprint, format or schema version, a prefix
        holding other objects, a run another process holds), and an endpoint that ignores
        conditional writes; every S3 failure is one line naming the bucket/key and the code.
        """
        if fmt not in EXTENSIONS:
            raise OutputError(f"unknown output format {fmt!r} (expected arrow or parquet)")
        if rows_per_shard <= 0:
            raise OutputError(f"rows_per_shard must be positive (got {rows_per_shard})")
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
        orphan tmp keys and probes; move strays in data/ to quarantine (as RunStore._recover)."""
        rels = self._rels(self.bucket, self.location)
        entries, repeated = unique_entries(self._manifest["shards"])
        for rel in dict.fromkeys(repeated):
            self._warn(f"manifest named shard {rel} more than once; keeping one entry (its rows count once)")
        finished = 0
        for entry in entries:
            final, pending = entry["path"], pending_rel(entry["path"])
            if final not in rels and pending in rels:
                self.bucket.copy(self._key(pending), self._key(final))
                self.bucket.delete(self._key(pending))
                rels.add(final)
                rels.discard(pending)
                finished += 1
        if finished:
            self._warn(f"finished copying {finished} committed shard(s) of an interrupted commit "
                       f"into {DATA_DIR}/")
        with ThreadPoolExecutor(max_workers=_VERIFY_THREADS) as pool:
            verdicts = list(pool.map(self._verify, entries))
        kept = []
        for entry, (ids, problem) in zip(entries, verdicts, strict=True):
            if problem is None:
                self._ids.update(ids)
                self._where.update(dict.fromkeys(ids, entry["path"]))
                kept.append(entry)
                continue
            moved = self._quarantine(entry["path"]) if entry["path"] in rels else "nowhere (it is missing)"
            self._warn(f"corrupt shard {entry['path']}: {problem}; moved to {moved}, its episodes run again")
        repaired = len(kept) != len(self._manifest["shards"])
        if repaired or self._seq > self._base_through:
            self._lease.renew()
            self._manifest["shards"] = kept
            self._compact()
        else:
            self._drop_folded_records(rels)
        named = {entry["path"] for entry in entries}  # the corrupt ones are quarantined already
        for rel in sorted(rels):
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

    def commit(self, episodes: Sequence[Episode]) -> int:
        """Commit the episodes not yet committed; return how many were new (as RunStore.commit)."""
        with self._transaction():
            return self._commit(episodes)

    def _commit(self, episodes: Sequence[Episode]) -> int:
        self._check_writable()
        fresh = fresh_by_cell(episodes, self._ids)
        if not fresh:
            return 0
        written: list[str] = []
        placed: list[tuple[dict[str, Any], list[str]]] = []
        left_out: set[str] = set()
        io_failed = False
        causes: list[str] = []
        next_part = self._manifest["next_part"]
        for (model, budget), group in fresh.items():
            rejected: dict[str, str] = {}
            mine: list[str] = []
            try:
                cell = []
                for start in range(0, len(group), self.rows_per_shard):
                    table, chunk = table_without_poison(group[start:start + self.rows_per_shard], rejected)
                    if table is not None:
                        entry = self._put_pending(table, model, budget, mine)
                        cell.append((entry, [e.episode_id for e in chunk]))
                placed.extend(cell)
                written.extend(mine)
            except Exception as e:  # noqa: BLE001 - any failure of one cell is that cell's
                self._delete_quietly(mine)
                rejected = {ep.episode_id: one_line(e) for ep in group}
                io_failed = io_failed or isinstance(e, OutputError)
            if rejected:
                left_out.update(rejected)
                causes.append(f"model {model!r}, budget {budget}: {next(iter(rejected.values()))}")
        if not placed and (io_failed or not left_out):
            self._manifest["next_part"] = next_part
            raise OutputError(f"commit to {self.location} failed ({causes[0]})")
        committed = 0
        if placed:
            entries = [entry for entry, _ in placed]
            self._record("commit", [], entries, written, next_part)
            for entry, ids in placed:
                self._where.update(dict.fromkeys(ids, entry["path"]))
                self._ids.update(ids)
                committed += len(ids)
            self._check_lock_after_record(f"its last commit ({committed} episodes)")
            self._publish(entries)
        if left_out:
            more = f"; and {len(causes) - 1} more cell(s)" if len(causes) > 1 else ""
            raise CommitIncomplete(
                f"{len(left_out)} episode(s) could not be committed to {self.location} ({causes[0]}{more}); "
                f"the {committed} others are committed",
                committed, left_out,
            )
        return committed

    def commit_pending(self, shards: Sequence[PendingShard]) -> int:
        """Commit shards workers wrote with `sink()`; return the new episodes committed.

        A shard holding an id already committed (or in an earlier shard of this call: a late
        duplicate batch) is discarded whole; its other ids, if any, are left out in a
        `CommitIncomplete` so that they run again. A shard whose object is missing or of
        another size than announced fails the commit (nothing of it is committed).
        """
        with self._transaction():
            self._check_writable()
            seen: set[str] = set()
            take: list[PendingShard] = []
            left_out: set[str] = set()
            for shard in shards:
                ids = set(shard.episode_ids)
                if ids & (self._ids | seen):
                    left_out |= ids - self._ids - seen
                    self.sink().discard(shard)
                    continue
                seen |= ids
                take.append(shard)
            for shard in take:
                head = self.bucket.head(self._key(pending_rel(shard.path)))
                if head is None or int(head.get("ContentLength", -1)) != shard.size:
                    raise OutputError(f"pending shard {self._uri(pending_rel(shard.path))} is missing or "
                                      f"not {shard.size} bytes; nothing of this commit is committed")
            committed = 0
            if take:
                entries = [shard.manifest_entry() for shard in take]
                self._record("commit", [], entries, [], self._manifest["next_part"])
                for shard in take:
                    self._where.update(dict.fromkeys(shard.episode_ids, shard.path))
                    self._ids.update(shard.episode_ids)
                    committed += shard.rows
                self._check_lock_after_record(f"its last commit ({committed} episodes)")
                self._publish(entries)
            if left_out:
                raise CommitIncomplete(
                    f"{len(left_out)} episode(s) of pending shards holding already committed ones were "
                    f"not committed to {self.location}; the {committed} others are committed",
                    committed, left_out,
                )
            return committed

    def _put_pending(self, table: pa.Table, model: str, budget: int, written: list[str]) -> dict[str, Any]:
        """PUT `table` as the next shard under tmp/ only; its manifest entry (naming data/<name>)."""
        name = f"part-{self._manifest['next_part']:06d}-{uuid.uuid4().hex[:8]}{EXTENSIONS[self.fmt]}"
        self._manifest["next_part"] += 1
        rel = f"{DATA_DIR}/{name}"
        data = encode_shard(table, self.fmt)
        written.append(pending_rel(rel))
        self.bucket.put(self._key(pending_rel(rel)), data)
        return {"path": rel, "rows": table.num_rows, "model": model, "budget": budget,
                "size": len(data), "checksum": digest(data), "committed": now_iso()}

    def _record(self, what: str, remove: list[str], add: list[dict[str, Any]], written: list[str],
                next_part: int) -> None:
        """The commit point: renew the lease, then create the next record (create-only).

        Before the record exists nothing is committed: on a refusal the keys in `written` are
        deleted and the error raised. A failure whose outcome is unknown (a timeout: the record
        may exist) keeps them, for the next open to settle, and stops this store.
        """
        try:
            self._lease.renew()
        except LockLost as e:
            self._lock_lost = str(e)
            self._abort(written, next_part)
            raise
        except OutputError:
            self._abort(written, next_part)
            raise
        self._manifest["updated"] = now_iso()
        record = {"seq": self._seq + 1, "op": what, "at": self._manifest["updated"],
                  "next_part": self._manifest["next_part"], "remove": remove, "add": add}
        try:
            self.bucket.put(self._key(record_rel(self._seq + 1)), json_bytes(record), create_only=True)
        except PreconditionFailed:
            self._lock_lost = self._lease.lost_message(
                f"another writer committed record {self._seq + 1}; uncommitted episodes run again on "
                "the next run")
            self._abort(written, next_part)
            raise LockLost(self._lock_lost) from None
        except OutputError as e:
            self._lock_lost = (f"{self.location}: the outcome of a commit is unknown ({e}); reopen the run "
                               "(collector run again) to settle it")
            self._manifest["next_part"] = next_part
            raise
        self._seq += 1
        self._manifest["log_through"] = self._seq
        if remove:
            gone = set(remove)
            self._manifest["shards"] = [e for e in self._manifest["shards"] if e["path"] not in gone]
        self._manifest["shards"].extend(add)

    def _abort(self, written: list[str], next_part: int) -> None:
        self._manifest["next_part"] = next_part
        self._delete_quietly(written)

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

    def forget(self, ids: Collection[str]) -> int:
        """Remove committed episodes so that the next resume runs them again (as RunStore.forget):
        replacements to tmp/, old objects copied aside to tmp/ and deleted from data/, one record,
        replacements copied into data/, the old copies deleted."""
        with self._transaction():
            self._check_writable()
            gone = {i for i in ids if i in self._ids}
            if not gone:
                return 0
            touched = {self._where[i] for i in gone}
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
                        placed = self._put_pending(kept, entry["model"], entry["budget"], written)
                        replacements.append((placed, kept.column("episode_id").to_pylist()))
                for entry in old:  # out of every reader's sight, still committed (the next open restores)
                    self.bucket.copy(self._key(entry["path"]), self._key(pending_rel(entry["path"])))
                    retired.append(entry["path"])
                    self.bucket.delete(self._key(entry["path"]))
                self._record("forget", sorted(touched), [e for e, _ in replacements], written, next_part)
            except OutputError:
                if self._lock_lost is None or "outcome" not in self._lock_lost:
                    for rel in retired:
                        with contextlib.suppress(OutputError):
                            self.bucket.copy(self._key(pending_rel(rel)), self._key(rel))
                            self.bucket.delete(self._key(pending_rel(rel)))
                    self._abort(written, next_part)
                raise
            self._ids -= gone
            for i in gone:
                del self._where[i]
            self._check_lock_after_record("its last change")
            for entry, kept_ids in replacements:
                self._where.update(dict.fromkeys(kept_ids, entry["path"]))
            self._publish([e for e, _ in replacements])
            self._delete_quietly([pending_rel(rel) for rel in retired])
            return len(gone)

    # --- compaction ------------------------------------------------------------------------

    def _maybe_compact(self) -> None:
        if self._seq - self._base_through < max(_COMPACT_MIN_RECORDS, len(self._manifest["shards"]) // 4):
            return
        try:
            self._check_writable()
            self._lease.renew()
            self._compact()
        except LockLost as e:
            self._lock_lost = str(e)  # the next commit says so
        except OutputError as e:
            self._warn(f"compacting the commit log of {self.location} failed ({e}); its records stay "
                       "the committed state")

    def _compact(self) -> None:
        """PUT the folded state as the base (If-Match on the base we read), then delete the
        records it holds. A 412 means another writer replaced the base: LockLost."""
        self._manifest["log_through"] = self._seq
        self._manifest["updated"] = now_iso()
        try:
            self._base_etag = self.bucket.put(self._key(MANIFEST), json_bytes(self._manifest),
                                              if_match=self._base_etag)
        except PreconditionFailed:
            self._lock_lost = self._lease.lost_message("another writer replaced the manifest")
            raise LockLost(self._lock_lost) from None
        self._base_through = self._seq
        # Only the records are listed: a compaction's cost does not grow with the shards in data/.
        self._drop_folded_records(self._rels(self.bucket, self.location, _RECORD_PREFIX))

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

    def close(self) -> None:
        """Compact the log (unless the lock is lost or an operation was cut short), release the lock."""
        if self._closed:
            return
        if self._clean and self._lock_lost is None and self._seq > self._base_through:
            try:
                self._lease.renew()
                self._compact()
            except OutputError as e:
                log.info("commit log of %s left uncompacted on close: %s", self.location, e)
        if self._lock_lost is None:
            self._lease.release()
        self._closed = True

"""Shard bytes for an object store, and the sink workers write pending shards with.

A shard object holds exactly the bytes a local shard file holds (`encode_shard` writes what
`collector.record.shards.write_shard` writes), so its size and sha256 mean the same, and it is
decoded by the local reader (`table_of`): one validation code path for both stores. `S3Sink`
is the `collector.storage.pending.ShardSink` of a run in S3: picklable (no client inside; each
process makes its own), it PUTs a shard create-only under ``.collector/tmp/`` and returns its
`PendingShard` (size and checksum of the bytes it sent) for the driver to commit by name.

Tests: tests/storage/test_objectstore.py, tests/system/faults/test_s3_run.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from collector.errors import OutputError
from collector.record.shards import ShardError, ShardFormat, read_shard
from collector.storage.location import ObjectLocation
from collector.storage.manifest import CHECKSUM_ALGORITHM, DATA_DIR, MANIFEST, TMP_DIR, TMP_SUFFIX
from collector.storage.pending import PendingShard, pending_shard_name
from collector.storage.s3client import S3Bucket

__all__ = ["S3Sink", "bucket_of", "digest", "encode_shard", "json_bytes", "pending_rel", "table_of"]


def encode_shard(table: pa.Table, fmt: ShardFormat) -> bytes:
    """The bytes of a shard file of `table` (zstd), as `collector.record.shards.write_shard` writes it."""
    sink = pa.BufferOutputStream()
    if fmt == "arrow":
        with ipc.new_file(sink, table.schema, options=ipc.IpcWriteOptions(compression="zstd")) as w:
            w.write_table(table)
    elif fmt == "parquet":
        pq.write_table(table, sink, compression="zstd")
    else:
        raise ValueError(f"unknown shard format {fmt!r}")
    return bytes(sink.getvalue().to_pybytes())


def digest(data: bytes) -> str:
    return f"{CHECKSUM_ALGORITHM}:{hashlib.new(CHECKSUM_ALGORITHM, data).hexdigest()}"


def pending_rel(rel: str) -> str:
    """The run-relative key where the committed shard `rel` waits before its copy into data/."""
    return f"{TMP_DIR}/{rel.rsplit('/', 1)[-1]}{TMP_SUFFIX}"


def json_bytes(payload: Any) -> bytes:
    """A manifest, record or lock body as the local store writes its JSON."""
    return json.dumps(payload, indent=1, default=str).encode()


def table_of(data: bytes, name: str, columns: Sequence[str] | None, where: str) -> pa.Table:
    """Decode and validate shard bytes with the local reader (one code path for both stores)."""
    with tempfile.TemporaryDirectory(prefix="collector-shard-") as tmp:
        path = Path(tmp) / name.removesuffix(TMP_SUFFIX)
        path.write_bytes(data)
        try:
            return read_shard(path, columns)
        except ShardError as e:
            raise ShardError(where, e.reason) from None


_buckets: dict[tuple[int, str], S3Bucket] = {}
_buckets_lock = threading.Lock()


def bucket_of(name: str) -> S3Bucket:
    """One client per process and bucket (a worker's sink writes many shards)."""
    with _buckets_lock:
        key = (os.getpid(), name)
        if key not in _buckets:
            _buckets[key] = S3Bucket(name)
        return _buckets[key]


@dataclass(frozen=True)
class S3Sink:
    """Writes pending shards of a run under `location` (picklable: no client inside it)."""

    location: ObjectLocation
    fmt: ShardFormat

    def write(self, table: pa.Table, model: str, budget: int, episode_ids: tuple[str, ...]) -> PendingShard:
        data = encode_shard(table, self.fmt)
        rel = f"{DATA_DIR}/{pending_shard_name(self.fmt)}"
        bucket_of(self.location.bucket).put(self.location.key(pending_rel(rel)), data, create_only=True)
        return PendingShard(rel, table.num_rows, model, budget, len(data), digest(data), episode_ids)

    def discard(self, shard: PendingShard) -> None:
        with contextlib.suppress(OutputError):
            bucket_of(self.location.bucket).delete(self.location.key(pending_rel(shard.path)))

    def read(self, shard: PendingShard) -> pa.Table:
        """The pending shard's rows (the driver rewrites a shard that repeats committed ids)."""
        rel = pending_rel(shard.path)
        found = bucket_of(self.location.bucket).get(self.location.key(rel))
        if found is None:
            raise ShardError(f"{self.location}/{rel}", "object is missing")
        return table_of(found[0], rel.rsplit("/", 1)[-1], None, f"{self.location}/{rel}")

    def reachable(self) -> bool:
        """Whether this process sees the run (its base manifest), checked once by each worker."""
        return bucket_of(self.location.bucket).head(self.location.key(MANIFEST)) is not None

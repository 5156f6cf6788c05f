"""Search a directory for planted secrets in what its files *say*, not only in their bytes.

Shards are zstd-compressed Arrow IPC or Parquet, so a secret inside one is not in the file's
raw bytes: a byte grep over a run directory cannot fail for a shard. Here every file that is
an Arrow IPC file or stream or a Parquet file (recognised by its magic bytes, whatever its
name: temporary and quarantined shards too) is decoded, and every value of every column,
nested lists and structs included, and the file's metadata are searched; every JSON file is
parsed and its strings searched (a JSON escape would hide a secret from a byte grep); every
other file (logs, the manifest, Ray's files) is searched as bytes and as text.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq


def strings_in(value: Any) -> Iterator[str]:
    """Every string in a decoded value (dict keys included), at any depth."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, bytes):
        yield value.decode("utf-8", errors="replace")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from strings_in(key)
            yield from strings_in(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from strings_in(item)


def _table_strings(table: pa.Table) -> Iterator[str]:
    metadata = table.schema.metadata or {}
    for key, item in metadata.items():
        yield key.decode("utf-8", errors="replace")
        yield item.decode("utf-8", errors="replace")
    yield from strings_in(table.to_pylist())


def decoded_strings(path: Path) -> tuple[str, Iterator[str]]:
    """(what kind of file `path` is, the strings it holds once decoded)."""
    data = path.read_bytes()
    if data.startswith(b"ARROW1"):
        return "arrow", _table_strings(ipc.open_file(pa.BufferReader(data)).read_all())
    if data.startswith(b"PAR1"):
        return "parquet", _table_strings(pq.read_table(pa.BufferReader(data)))
    if data[:4] == b"\xff\xff\xff\xff":
        try:  # an Arrow IPC stream (no file magic): continuation marker, then the schema
            return "arrow-stream", _table_strings(ipc.open_stream(pa.BufferReader(data)).read_all())
        except pa.ArrowInvalid:
            pass
    text = data.decode("utf-8", errors="replace")
    if path.suffix == ".json":
        try:
            return "json", iter([text, *strings_in(json.loads(text))])
        except ValueError:
            pass
    return "bytes", iter([text, data.decode("latin-1")])


def leaks_in(root: Path, secrets: Iterable[str]) -> list[str]:
    """"path (kind): secret" for every secret found anywhere under `root`, decoded or raw."""
    wanted = [s for s in secrets if s]
    found = []
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.is_symlink():
            continue
        raw = path.read_bytes()
        kind, strings = decoded_strings(path)
        seen = {s for s in wanted if s.encode() in raw}
        for text in strings:
            seen.update(s for s in wanted if s in text)
        found += [f"{path} ({kind}): {s}" for s in wanted if s in seen]
    return found

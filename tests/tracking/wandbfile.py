"""Read a W&B run's `.wandb` file back: the records its service wrote, as wandb's protobufs.

wandb 0.31 ships no Python reader (its service, in Go, writes the file), so this follows the
format: a 7-byte header (`:W&B`, a 2-byte magic, a version byte), then LevelDB's log format
(32 KiB blocks; each chunk a 7-byte header, CRC-32 4, length 2, type 1 (full, first, middle,
last), then its bytes; a block's last < 7 bytes are padding). A record split over two blocks
has a chunk header in the middle of it, so a byte grep of the file could miss a string
that straddles a block boundary: `records` reassembles them, and the secret scan searches
the reassembled bytes too.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from wandb.proto import wandb_internal_pb2 as pb

BLOCK = 32 * 1024
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def raw_records(path: Path) -> Iterator[bytes]:
    """Every record's bytes, reassembled from its chunks."""
    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    pos, pending = HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        chunk = data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            yield pending + chunk
            pending = b""
        elif kind == 0 and length == 0:
            pos += BLOCK - pos % BLOCK if pos % BLOCK else 0  # zero padding to the block end
        else:
            raise AssertionError(f"unknown chunk type {kind} at {pos}")


def records(path: Path) -> list[pb.Record]:
    out = []
    for raw in raw_records(path):
        record = pb.Record()
        record.ParseFromString(raw)
        out.append(record)
    return out


def _key(item: Any) -> str:
    return "/".join(item.nested_key) if item.nested_key else str(item.key)


def history(path: Path) -> list[dict[str, Any]]:
    """Every `run.log` row: key -> decoded value (`_step` included)."""
    return [{_key(i): json.loads(i.value_json) for i in r.history.item} for r in records(path)
            if r.WhichOneof("record_type") == "history"]


def summary(path: Path) -> dict[str, Any]:
    """The run summary as the last summary records left it."""
    out: dict[str, Any] = {}
    for r in records(path):
        if r.WhichOneof("record_type") == "summary":
            for item in r.summary.update:
                out[_key(item)] = json.loads(item.value_json)
    return out


def config(path: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for r in records(path):
        if r.WhichOneof("record_type") == "config":
            for item in r.config.update:
                out[_key(item)] = json.loads(item.value_json)
    return out

"""Open the run store of an `output.path`: a local directory or an object-store prefix.

Both stores have one surface (`open`, `committed_ids`, `shards`, `commit`, `forget`,
`read_shard`, `warnings`, `close`); boto3 is imported only once an ``s3://`` run is opened.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from collector.storage.local import RunStore
from collector.storage.location import ObjectLocation, parse_location
from collector.storage.s3store import ObjectRunStore

__all__ = ["open_run_store"]


def open_run_store(
    path: str | Path,
    config_fingerprint: str,
    resolved_config: dict[str, Any],
    fmt: Literal["arrow", "parquet"] = "arrow",
    rows_per_shard: int = 512,
) -> RunStore | ObjectRunStore:
    """`RunStore.open` for a local path, `ObjectRunStore.open` for ``s3://bucket/prefix``."""
    where = parse_location(path)
    if isinstance(where, ObjectLocation):
        return ObjectRunStore.open(where, config_fingerprint, resolved_config, fmt, rows_per_shard)
    return RunStore.open(where, config_fingerprint, resolved_config, fmt, rows_per_shard)

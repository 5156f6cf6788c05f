"""`open_run_store(output.path)`: the one door to a run store, a local directory or an
object-store prefix.

boto3 is imported only once an ``s3://`` run is opened: the S3 backend is imported here
lazily. Kept apart from `collector.storage.runstore` (the surface and shared state), which
both backends import: a module that also imported them would close a circle.

Tests: tests/storage/test_runstore.py (boto3 only for s3://, the surface of both stores),
tests/storage/test_objectstore.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from collector.storage.location import ObjectLocation, parse_location

if TYPE_CHECKING:
    from collector.storage.local import LocalRunStore
    from collector.storage.runstore import RunStore
    from collector.storage.s3store import S3RunStore

__all__ = ["open_run_store"]


if TYPE_CHECKING:
    def _both_stores_are_run_stores(local: LocalRunStore, s3: S3RunStore) -> tuple[RunStore, RunStore]:
        """Never called: mypy checks here that each backend has the whole surface."""
        return local, s3


def open_run_store(
    path: str | Path,
    config_fingerprint: str,
    resolved_config: dict[str, Any],
    fmt: Literal["arrow", "parquet"] = "arrow",
    rows_per_shard: int = 512,
) -> LocalRunStore | S3RunStore:
    """`LocalRunStore.open` for a local path, `S3RunStore.open` for ``s3://bucket/prefix``."""
    where = parse_location(path)
    if isinstance(where, ObjectLocation):
        from collector.storage.s3store import S3RunStore

        return S3RunStore.open(where, config_fingerprint, resolved_config, fmt, rows_per_shard)
    from collector.storage.local import LocalRunStore

    return LocalRunStore.open(where, config_fingerprint, resolved_config, fmt, rows_per_shard)

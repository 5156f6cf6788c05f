"""Reading a run's committed episodes: the manifest's shards, and nothing else, once.

Every reader of a run (`collector stats`, `load_run`, the episode listing, the export, the
trainer view, the notebook) goes through here: `run_dataset` is a pyarrow dataset over the
shards the manifest names (a crash's orphans and quarantined files are never read),
`read_committed` a scan of it (some columns, a filter), and `read_columns` the fast path for
a few flat columns (Arrow shards memory-mapped in a few threads). A shard that cannot be
read is an `OutputError` of one line naming it, never a pyarrow traceback.

Tests: tests/analysis/test_stats_read.py, tests/analysis/test_stats.py, tests/storage/test_integrity.py
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.ipc as ipc

from collector.errors import OutputError
from collector.record.shards import SCHEMA, ShardError, describe_exception, format_of, read_shard
from collector.storage.manifest import committed_shard_paths

__all__ = ["read_columns", "read_committed", "run_dataset", "stored_columns"]


def run_dataset(run_dir: str | Path) -> ds.Dataset:
    """A pyarrow dataset over the committed shards of `run_dir` only (the manifest's list).

    Shards the manifest does not name (a crash's orphans) and quarantined files are never
    read. Raises OutputError when `run_dir` has no readable manifest, or (Parquet) when the
    first shard cannot be read.
    """
    paths = committed_shard_paths(run_dir)
    try:
        return _dataset(paths)
    except _READ_ERRORS as e:
        raise _blame(run_dir, paths, None, e) from e


def _dataset(paths: Sequence[Path]) -> ds.Dataset:
    if not paths:
        return ds.dataset([], format="ipc", schema=SCHEMA)
    fmt = format_of(paths[0])
    if fmt == "arrow":
        return ds.dataset([str(p) for p in paths], format="ipc", schema=SCHEMA)
    # Parquet names list items "element": let the files speak for their own nested types.
    return ds.dataset([str(p) for p in paths], format="parquet")


# What pyarrow raises for a damaged or missing file: ArrowInvalid & co. are ValueErrors,
# ArrowIOError and FileNotFoundError are OSErrors.
_READ_ERRORS = (pa.ArrowException, OSError, ValueError)


def read_committed(
    run_dir: str | Path, columns: Sequence[str] | None = None, filter: ds.Expression | None = None
) -> pa.Table:
    """The committed episodes of `run_dir` through a dataset scan (some columns, a filter).

    A shard that cannot be read is an OutputError of one line naming it (``"{path}:
    {reason}"``), never a pyarrow traceback: `collector stats`, `load_run` and the notebook
    all read through here or `read_columns`.
    """
    paths = committed_shard_paths(run_dir)
    cols = list(columns) if columns is not None else None
    try:
        return _dataset(paths).to_table(columns=cols, filter=filter)
    except _READ_ERRORS as e:
        raise _blame(run_dir, paths, cols, e) from e


def _blame(run_dir: str | Path, paths: Sequence[Path], columns: list[str] | None, error: BaseException
           ) -> OutputError:
    """The one-line error for a failed scan, naming the shard at fault.

    A dataset scan's message does not reliably name the file, so on failure (only then)
    each shard is read alone until one fails; if none does, the run dir is named instead.
    """
    for path in paths:
        try:
            read_shard(path, columns)
        except ShardError as e:
            return e
    return OutputError(f"{run_dir}: {describe_exception(error)}")


def stored_columns(run_dir: str | Path, *columns: str) -> list[str]:
    """Those of `columns` the run's shards hold: a schema-2 Parquet run has no `retries`."""
    names = set(run_dataset(run_dir).schema.names)
    return [c for c in columns if c in names]


def read_columns(run_dir: str | Path, columns: list[str]) -> pa.Table:
    """Some columns of every committed episode, the fastest way the shards allow: Arrow
    shards of one schema memory-mapped (`_read_ipc`), anything else through the dataset."""
    paths = committed_shard_paths(run_dir)
    if paths and format_of(paths[0]) == "arrow":
        table = _read_ipc(paths, columns)
        if table is not None:
            return table
    return read_committed(run_dir, columns)


def _read_ipc_one(path: Path, names: list[str], options: ipc.IpcReadOptions, columns: list[str]
                  ) -> pa.Table | None:
    try:
        with pa.memory_map(str(path)) as source:
            reader = ipc.open_file(source, options=options)
            if reader.schema.names != names:  # the projected names, in file order
                return None  # another schema version: the dataset path unifies them
            table = reader.read_all().select(columns)
            # Cheap on these few flat columns, and what turns bad offsets into an error here.
            table.validate(full=True)
            return table
    except _READ_ERRORS as e:
        raise ShardError(str(path), describe_exception(e)) from e


def _read_ipc(paths: Sequence[Path], columns: list[str]) -> pa.Table | None:
    """The columns of many small Arrow shards, memory-mapped, decompressing only those columns.

    About 2x faster than a pyarrow dataset scan over a run's thousands of 512-row shards
    (bench/stats.py: per-file overhead dominates). None when the shards' schemas differ or
    lack a column, so that the caller takes the dataset path, which unifies schemas.
    """
    try:
        with pa.memory_map(str(paths[0])) as source:
            names = ipc.open_file(source).schema.names
    except _READ_ERRORS as e:
        raise ShardError(str(paths[0]), describe_exception(e)) from e
    if any(c not in names for c in columns):
        return None
    indices = sorted(names.index(c) for c in columns)
    options = ipc.IpcReadOptions(included_fields=indices, use_threads=False)
    projected = [names[i] for i in indices]
    with ThreadPoolExecutor(max_workers=min(8, (os.cpu_count() or 1) * 2)) as pool:
        tables = list(pool.map(lambda p: _read_ipc_one(p, projected, options, columns), paths))
    if any(t is None for t in tables):
        return None
    try:
        return pa.concat_tables([t for t in tables if t is not None])
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return None

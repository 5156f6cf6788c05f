"""The fast Arrow read (`collector.analysis.committed`) gives what the dataset scan gives, or steps aside."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from collector.analysis.committed import _read_ipc, read_columns, run_dataset
from collector.stop import StopReason
from collector.storage.local import LocalRunStore
from collector.storage.manifest import committed_shard_paths
from tests.record.factory import make_batch

COLUMNS = ["budget", "is_truncated", "model", "output_tokens", "reward", "stop_reason",
           "wasted_output_tokens"]


def _run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    stops = (StopReason.DONE, StopReason.LENGTH, StopReason.MALFORMED_TOOL_CALL, StopReason.ERROR)
    with LocalRunStore.open(run, "fp", {}, "arrow", 3) as store:
        store.commit(make_batch(10, model="m-a", budget=32, stops=stops))
        store.commit(make_batch(7, model="m-b", budget=64, stops=stops, start=10))
    return run


def _sorted(table: pa.Table) -> list[dict[str, object]]:
    rows = table.select(COLUMNS).to_pylist()
    return sorted(rows, key=lambda r: (str(r["model"]), str(r["stop_reason"]), str(r["output_tokens"])))


def test_fast_read_equals_the_dataset_scan(tmp_path: Path) -> None:
    """Over several small shards the memory-mapped read is taken and yields exactly the scan's rows."""
    run = _run(tmp_path)
    paths = committed_shard_paths(run)
    assert len(paths) > 2
    fast = _read_ipc(paths, COLUMNS)
    assert fast is not None
    assert _sorted(fast) == _sorted(run_dataset(run).to_table(columns=COLUMNS))


def test_missing_column_falls_back_to_the_dataset(tmp_path: Path) -> None:
    """A column the shards do not hold makes the fast path step aside instead of failing."""
    run = _run(tmp_path)
    assert _read_ipc(committed_shard_paths(run), [*COLUMNS, "no_such_column"]) is None
    assert read_columns(run, COLUMNS).num_rows == 17

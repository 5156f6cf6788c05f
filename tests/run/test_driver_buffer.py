"""The driver's buffer of finished episodes is bounded across cells (`output.max_buffered_rows`),
whatever the number of cells: past the cap the largest cells are committed first."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import cast

import pytest

from collector.record.episode import Episode
from collector.run import job as job_mod
from collector.run.job import JobResult, _Driver, _Slot
from collector.run.plan import Plan
from tests.record.factory import make_batch
from tests.run.helpers import small_config


class RecordingStore:
    """Stands in for the run store: records each commit's episodes."""

    def __init__(self) -> None:
        self.commits: list[list[Episode]] = []

    def commit(self, episodes: Sequence[Episode]) -> int:
        self.commits.append(list(episodes))
        return len(episodes)


def driver(tmp_path: Path, cap: int, rows: int) -> tuple[_Driver, RecordingStore]:
    cfg = small_config(tmp_path / "run", output__rows_per_shard=rows, output__max_buffered_rows=cap,
                       output__commit_interval_s=3600.0)
    d = _Driver(cfg, cast(Plan, None), JobResult(tmp_path / "run", "r", 0, 0), None, None)
    store = RecordingStore()
    d.store = store
    return d, store


def cells(sizes: dict[str, int]) -> dict[tuple[str, int], list[Episode]]:
    return {(model, 64): make_batch(n, model=model, budget=64, start=i * 1000)
            for i, (model, n) in enumerate(sizes.items())}


def test_past_the_cap_the_largest_cells_are_committed_first(tmp_path: Path) -> None:
    """With no cell full but more rows buffered than the cap, the largest cells are committed
    (largest first) until at most half the cap is left; the small cells keep buffering."""
    d, store = driver(tmp_path, cap=12, rows=8)
    d.buffer = cells({"a": 7, "b": 5, "c": 3, "d": 2})
    d.commit()
    assert len(store.commits) == 1
    assert [ep.model for ep in store.commits[0]] == ["a"] * 7 + ["b"] * 5
    assert {cell[0]: len(eps) for cell, eps in d.buffer.items()} == {"c": 3, "d": 2}
    d.commit()  # under the cap, nothing full: nothing more to commit
    assert len(store.commits) == 1


def test_under_the_cap_only_full_shards_are_committed(tmp_path: Path) -> None:
    """Below the cap the driver still commits only whole shards (the cap does not shrink them)."""
    d, store = driver(tmp_path, cap=100, rows=8)
    d.buffer = cells({"a": 10, "b": 5})
    d.commit()
    assert [len(batch) for batch in store.commits] == [8]
    assert {cell[0]: len(eps) for cell, eps in d.buffer.items()} == {"a": 2, "b": 5}


def test_many_batches_returning_at_once_never_pile_up_past_the_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches collected one after another before the loop's commit (all returned in one wait)
    are committed as soon as the buffer passes the cap: it never holds more than the cap plus
    one batch, however many cells the sweep has."""
    d, store = driver(tmp_path, cap=8, rows=100)
    batches = {f"ref{i}": make_batch(4, model=f"m{i}", budget=64, start=i * 1000) for i in range(12)}
    monkeypatch.setattr(job_mod.ray, "get", lambda ref: batches[ref])
    slot = _Slot(0)
    slot.outstanding = len(batches)
    high = 0
    for ref in batches:
        d.inflight[ref] = (slot, 0, [])
        d.collect(ref)
        high = max(high, d._buffered())
    assert high <= 8
    committed = [ep.episode_id for batch in store.commits for ep in batch]
    buffered = [ep.episode_id for eps in d.buffer.values() for ep in eps]
    assert sorted(committed + buffered) == sorted(ep.episode_id for b in batches.values() for ep in b)

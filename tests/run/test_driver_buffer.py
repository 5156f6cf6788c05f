"""The driver's buffer of finished episodes is bounded across cells (`output.max_buffered_rows`),
whatever the number of cells: past the cap the largest cells are committed first
(`collector.run.commits`, and the driver over a fake pool: tests/run/fakepool.py)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from collector.record.episode import Episode
from collector.run.commits import CommitBuffer, episode_buffer
from collector.storage.pending import PendingShard
from tests.record.factory import make_batch
from tests.run.fakepool import FakePool, fake_driver, item
from tests.run.helpers import small_config


class RecordingStore:
    """Stands in for the run store: records each commit's episodes."""

    def __init__(self) -> None:
        self.commits: list[list[Episode]] = []

    def holds(self, episode_id: str) -> bool:
        return any(e.episode_id == episode_id for c in self.commits for e in c)

    def commit(self, episodes: Sequence[Episode]) -> int:
        self.commits.append(list(episodes))
        return len(episodes)

    def commit_pending(self, shards: Sequence[PendingShard]) -> int:
        raise AssertionError("driver-side writes never commit pending shards")


def buffer(tmp_path: Path, cap: int, rows: int, sizes: dict[str, int]) -> tuple[CommitBuffer[Episode],
                                                                                RecordingStore]:
    cfg = small_config(tmp_path / "run", output__rows_per_shard=rows, output__max_buffered_rows=cap,
                       output__commit_interval_s=3600.0)
    store = RecordingStore()
    buf = episode_buffer(store, cfg.output)
    for i, (model, n) in enumerate(sizes.items()):
        for episode in make_batch(n, model=model, budget=64, start=i * 1000):
            buf.add((model, 64), episode)
    return buf, store


def test_past_the_cap_the_largest_cells_are_committed_first(tmp_path: Path) -> None:
    """With no cell full but more rows buffered than the cap, the largest cells are committed
    (largest first) until at most half the cap is left; the small cells keep buffering."""
    buf, store = buffer(tmp_path, cap=12, rows=8, sizes={"a": 7, "b": 5, "c": 3, "d": 2})
    buf.commit()
    assert len(store.commits) == 1
    assert [ep.model for ep in store.commits[0]] == ["a"] * 7 + ["b"] * 5
    assert {cell[0]: len(eps) for cell, eps in buf.cells.items()} == {"c": 3, "d": 2}
    buf.commit()  # under the cap, nothing full: nothing more to commit
    assert len(store.commits) == 1


def test_under_the_cap_only_full_shards_are_committed(tmp_path: Path) -> None:
    """Below the cap the driver still commits only whole shards (the cap does not shrink them)."""
    buf, store = buffer(tmp_path, cap=100, rows=8, sizes={"a": 10, "b": 5})
    buf.commit()
    assert [len(batch) for batch in store.commits] == [8]
    assert {cell[0]: len(eps) for cell, eps in buf.cells.items()} == {"a": 2, "b": 5}


def test_many_batches_returning_at_once_never_pile_up_past_the_cap(tmp_path: Path) -> None:
    """Batches collected one after another before the loop's commit (all returned in one wait)
    are committed as soon as the buffer passes the cap: it never holds more than the cap plus
    one batch, however many cells the sweep has."""
    cfg = small_config(tmp_path / "run", output__rows_per_shard=100, output__max_buffered_rows=8,
                       output__commit_interval_s=3600.0, ray__episodes_in_flight=40)
    store, pool = RecordingStore(), FakePool()
    todo = [item(f"e{i}", model=f"m{i // 4}", sample=i) for i in range(48)]  # 12 cells of 4
    driver = fake_driver(cfg, store, pool, todo, planned=len(todo))
    driver.fill()
    back = pool.wait(list(driver.inflight), 0)
    assert len(back) == 12  # every batch is back at once
    high = 0
    for call in back:
        driver.collect(call)
        high = max(high, driver.buffered())
    assert high <= 8
    committed = [ep.episode_id for batch in store.commits for ep in batch]
    buffered = [ep.episode_id for eps in driver.episodes.cells.values() for ep in eps]
    assert sorted(committed + buffered) == sorted(i.episode_id for i in todo)

"""Driver-side writes without Ray: a worker's batch as encoded rows, and the driver committing them."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from collector.errors import CollectorError
from collector.record.rows import from_ipc, rows_of, to_ipc
from collector.record.shards import episodes_from_table, episodes_to_table, read_shard
from collector.run.encoded import EncodedBatch, encode_batch
from collector.run.plan import plan_work
from collector.run.simlaunch import provider_urls
from collector.run.worker import EpisodeWorker, WorkerSetup
from collector.storage.local import LocalRunStore
from collector.storage.manifest import committed_shard_paths
from tests.record.factory import make_batch
from tests.run.fakepool import FakePool, deliver, fake_driver
from tests.run.helpers import committed_id_counts, small_config


def test_a_batch_is_encoded_cell_by_cell_as_it_finished() -> None:
    """Every episode becomes one row, each cell's rows together in finishing order; the rows
    read back are the episodes, value for value."""
    a, b = make_batch(3, budget=64), make_batch(2, budget=128, start=10)
    finished = [a[0], b[0], a[1], b[1], a[2]]
    batch = encode_batch(finished)
    table = from_ipc(batch.rows)
    assert episodes_from_table(table) == [*a, *b]
    assert [r.episode_id for r in rows_of(table)] == [e.episode_id for e in [*a, *b]]
    assert batch.refused == ()


def test_an_unbuildable_row_is_refused_alone() -> None:
    """A value no column can hold (an int beyond int64 from a grader) costs only its episode."""
    work = make_batch(4)
    poisoned = dataclasses.replace(work[1], graded_reward=10**30)
    batch = encode_batch([work[0], poisoned, *work[2:]])
    assert [o.episode_id for o in batch.refused] == [poisoned.episode_id]
    assert "\n" not in batch.reasons[poisoned.episode_id]
    kept = [r.episode_id for r in rows_of(from_ipc(batch.rows))]
    assert kept == [e.episode_id for e in work if e is not work[1]]


def test_the_driver_commits_the_rows_and_reports_the_refused_one(tmp_path: Path) -> None:
    """Each row committed once (a batch that comes back twice included), into shards equal to
    the episodes' own; a refused episode is left uncommitted and named when the run ends."""
    work = make_batch(6)
    for i, episode in enumerate(work):  # every batch its own tools dictionary
        episode.tools = f'[{{"name": "tool{i % 4}"}}]'
    poisoned = dataclasses.replace(make_batch(1, start=20)[0], graded_reward=10**30)
    cfg = small_config(tmp_path / "run", output__commit_interval_s=3600.0, ray__batch_size=1)
    with LocalRunStore.open(tmp_path / "run", "fp", {}, "arrow", 4) as store:
        d = fake_driver(cfg, store, FakePool())
        # The first shard is stitched from two batches; the last batch is a late duplicate.
        deliver(d, d.pool, [work[:3], [*work[3:], poisoned], work[:2]])
        d.commit(force=True)
        assert d.result.committed == 6
        assert d.result.duplicates_dropped == 2
        assert d.uncommitted is not None
        assert d.uncommitted.uncommitted == {poisoned.episode_id}
        assert str(d.uncommitted).startswith("1 episode(s) could not be stored (")
    counts = committed_id_counts(tmp_path / "run")
    assert counts == {e.episode_id: 1 for e in work}
    shards = [read_shard(p) for p in sorted(committed_shard_paths(tmp_path / "run"))]
    assert [s.num_rows for s in shards] == [4, 2]  # full shards of 4, then the rest
    assert [s.column("tools").num_chunks for s in shards] == [1, 1]
    for shard in shards:
        episodes = episodes_from_table(shard)
        assert shard.equals(episodes_to_table(episodes))  # as if built from the episodes at once


def test_rows_of_another_schema_stop_the_run_in_one_line(tmp_path: Path) -> None:
    """A worker of another collector version (another shard schema) is not committed from."""
    cfg = small_config(tmp_path / "run")
    table = episodes_to_table(make_batch(2)).drop_columns(["tools"])
    with LocalRunStore.open(tmp_path / "run", "fp", {}, "arrow", 4) as store:
        d = fake_driver(cfg, store, FakePool())
        with pytest.raises(CollectorError) as info:
            deliver(d, d.pool, [EncodedBatch(to_ipc(table))])
    assert "another shard schema" in str(info.value)
    assert "\n" not in str(info.value)


def test_a_real_worker_returns_its_batch_as_rows(tmp_path: Path) -> None:
    """`EpisodeWorker.encode_batch` on the simulator: one row per item, nothing refused."""
    cfg = small_config(tmp_path / "run", env__tasks=2, samples_per_task=2)
    plan = plan_work(cfg)

    async def run() -> EncodedBatch:
        with provider_urls(plan.providers, cfg.seed) as urls:
            worker = EpisodeWorker(WorkerSetup(cfg, plan.run_id, urls, "w"))
            try:
                return await worker.encode_batch(plan.items)
            finally:
                await worker.close()

    batch = asyncio.run(run())
    rows = rows_of(from_ipc(batch.rows))
    assert sorted(r.episode_id for r in rows) == sorted(i.episode_id for i in plan.items)
    assert batch.refused == ()

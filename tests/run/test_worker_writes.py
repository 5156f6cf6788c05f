"""Worker-side writes without Ray: what a writing worker writes and returns, and the driver's dedupe."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pyarrow as pa
import pytest

from collector.config import OutputConfig
from collector.errors import ConfigError, OutputError
from collector.record.episode import EpisodeError
from collector.record.shards import read_shard
from collector.run.plan import plan_work
from collector.run.simlaunch import provider_urls
from collector.run.worker import EpisodeWorker, WorkerSetup
from collector.run.worker_writes import WrittenBatch, without_seen, write_kept, writes_on_workers
from collector.stop import StopReason
from collector.storage.local import LocalRunStore, LocalSink
from collector.storage.manifest import DATA_DIR, TMP_DIR, pending_path
from collector.storage.pending import PendingShard
from tests.record.factory import make_batch
from tests.run.helpers import small_config


def open_store(run: Path) -> LocalRunStore:
    return LocalRunStore.open(run, "fp-written", {}, "arrow", 4)


def shard_ids(run: Path, batch: WrittenBatch) -> list[set[str]]:
    """The ids in each pending file of a batch, read from the files."""
    return [set(read_shard(pending_path(run, s.path), ["episode_id"]).column("episode_id").to_pylist())
            for s in batch.shards]


def test_a_batch_is_written_one_shard_per_cell_without_the_run_stopping_episodes(
    tmp_path: Path
) -> None:
    """Kept episodes land in one pending shard per cell; quota and 401 episodes are returned, not written."""
    run = tmp_path / "run"
    small, big = make_batch(3, budget=64), make_batch(2, budget=128, start=10)
    quota = dataclasses.replace(make_batch(1, start=20)[0], stop_reason=StopReason.ERROR,
                                error=EpisodeError("QuotaExhausted", "insufficient_quota"))
    refused = dataclasses.replace(make_batch(1, start=21)[0], stop_reason=StopReason.ERROR,
                                  error=EpisodeError("RequestRejected", "invalid key (HTTP 401)"))
    with open_store(run) as st:
        batch = write_kept(st.sink(), [*small, quota, *big, refused])
    assert [o.episode_id for o in batch.outcomes] == [e.episode_id for e in [*small, quota, *big, refused]]
    assert sorted((s.budget, s.rows) for s in batch.shards) == [(64, 3), (128, 2)]
    assert sorted(map(sorted, shard_ids(run, batch))) == sorted(
        [sorted(e.episode_id for e in small), sorted(e.episode_id for e in big)])
    assert not list((run / DATA_DIR).iterdir())
    assert batch.refused == {}


def test_an_unstorable_row_is_refused_alone(tmp_path: Path) -> None:
    """A row whose value fits no schema is returned as refused; the rest of its cell is written."""
    run = tmp_path / "run"
    work = make_batch(4)
    poisoned = dataclasses.replace(work[1], graded_reward=10**30)
    with open_store(run) as st:
        batch = write_kept(st.sink(), [work[0], poisoned, *work[2:]])
    assert set(batch.refused) == {poisoned.episode_id}
    assert "\n" not in batch.refused[poisoned.episode_id]
    assert shard_ids(run, batch) == [{e.episode_id for e in work if e is not work[1]}]


def test_a_partly_seen_shard_is_rewritten_with_only_the_new_rows(tmp_path: Path) -> None:
    """The driver's dedupe: a shard of seen ids is discarded, a partly seen one rewritten to the new rows."""
    run = tmp_path / "run"
    work = make_batch(4)
    with open_store(run) as st:
        sink = st.sink()
        shard = write_kept(sink, work).shards[0]
        fresh = {e.episode_id for e in work[2:]}
        rewritten = without_seen(sink, shard, fresh)
        assert rewritten is not None
        assert rewritten.path != shard.path
        assert set(rewritten.episode_ids) == fresh
        assert not pending_path(run, shard.path).exists()
        assert set(read_shard(pending_path(run, rewritten.path)).column("episode_id").to_pylist()) == fresh
        assert without_seen(sink, rewritten, fresh) is rewritten
        assert without_seen(sink, rewritten, set()) is None
        assert not list((run / TMP_DIR).iterdir())


def test_auto_writes_on_workers_only_for_object_storage() -> None:
    """`worker_writes = "auto"`: workers write for s3:// runs, the driver for local ones; a bool decides."""
    assert writes_on_workers(OutputConfig(path="s3://bucket/run")) is True
    assert writes_on_workers(OutputConfig(path="runs/x")) is False
    assert writes_on_workers(OutputConfig(path="runs/x", worker_writes=True)) is True
    assert writes_on_workers(OutputConfig(path="s3://bucket/run", worker_writes=False)) is False


def test_worker_with_a_sink_writes_its_batch_and_returns_no_transcript(tmp_path: Path) -> None:
    """A worker given a sink returns outcomes and pending shards; the episodes' rows are only in the files."""
    cfg = small_config(tmp_path / "run", env__tasks=2, samples_per_task=1)
    plan = plan_work(cfg)
    store = open_store(tmp_path / "run")

    async def run() -> WrittenBatch:
        with provider_urls(plan.providers, cfg.seed) as urls:
            worker = EpisodeWorker(WorkerSetup(cfg, plan.run_id, urls, "w", sink=store.sink()))
            try:
                return await worker.write_batch(plan.items)
            finally:
                await worker.close()

    with store:
        batch = asyncio.run(run())
        assert {o.episode_id for o in batch.outcomes} == {i.episode_id for i in plan.items}
        assert sum(s.rows for s in batch.shards) == len(plan.items)
        assert not any(hasattr(o, "messages") for o in batch.outcomes)
        assert store.commit_pending(batch.shards) == len(plan.items)


def test_worker_refuses_a_run_dir_it_cannot_see(tmp_path: Path) -> None:
    """`worker_writes = true` on a path that is not the run dir on a worker: one line naming the option."""
    cfg = small_config(tmp_path / "run", env__tasks=1, samples_per_task=1)
    plan = plan_work(cfg)

    async def start() -> None:
        with provider_urls(plan.providers, cfg.seed) as urls:
            sink = LocalSink(str(tmp_path / "not-shared"), "arrow")
            worker = EpisodeWorker(WorkerSetup(cfg, plan.run_id, urls, "w", sink=sink))
            try:
                await worker.ready()
            finally:
                await worker.close()

    with pytest.raises(ConfigError) as info:
        asyncio.run(start())
    assert str(info.value).startswith("output.worker_writes: the run dir ")
    assert "not-shared" in str(info.value)
    assert "\n" not in str(info.value)


def test_a_failed_write_discards_the_batch_and_is_one_line(tmp_path: Path) -> None:
    """Storage failing mid-batch (a full disk) leaves no pending file of the batch and raises one line."""
    run = tmp_path / "run"
    with open_store(run) as st:
        real = st.sink()

        class FullAfterOne:
            def __init__(self) -> None:
                self.writes = 0

            def write(self, table: pa.Table, model: str, budget: int, ids: tuple[str, ...]) -> PendingShard:
                self.writes += 1
                if self.writes > 1:
                    raise OSError(28, "No space left on device")
                return real.write(table, model, budget, ids)

            def discard(self, shard: PendingShard) -> None:
                real.discard(shard)

        with pytest.raises(OutputError) as info:
            write_kept(FullAfterOne(), [*make_batch(2, budget=64), *make_batch(2, budget=128, start=5)])
    message = "a worker could not write its shard: OSError: [Errno 28] No space left on device"
    assert str(info.value) == message
    assert not list((run / TMP_DIR).iterdir())

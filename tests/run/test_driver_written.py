"""The driver with worker-side writes (no Ray: a fake pool, tests/run/fakepool.py): pending
shards buffered per cell, committed on the cadence, duplicates discarded or filtered, so that
each episode is committed once."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from collector.errors import QuotaExhausted
from collector.record.episode import Episode, EpisodeError
from collector.run.driver import Driver
from collector.run.worker_writes import write_kept
from collector.stop import StopReason
from collector.storage.local import LocalRunStore
from collector.storage.manifest import TMP_DIR
from tests.record.factory import make_batch
from tests.run.fakepool import FakePool, deliver, fake_driver
from tests.run.helpers import committed_id_counts, small_config


def writing_driver(tmp_path: Path, store: LocalRunStore, **output: Any) -> tuple[Driver, FakePool]:
    overrides = {f"output__{k}": v for k, v in {"commit_interval_s": 3600.0, **output}.items()}
    cfg = small_config(tmp_path / "run", output__worker_writes=True, ray__batch_size=1, **overrides)
    pool = FakePool()
    return fake_driver(cfg, store, pool, sink=store.sink()), pool


def test_a_batch_that_comes_back_twice_is_committed_once(tmp_path: Path) -> None:
    """A shard of seen ids is discarded, a partly seen one (split differently) filtered: each id once."""
    work = make_batch(6)
    with LocalRunStore.open(tmp_path / "run", "fp", {}, "arrow", 512) as store:
        d, pool = writing_driver(tmp_path, store)
        sink = store.sink()
        first, again, overlap = (write_kept(sink, work[:4]), write_kept(sink, work[:4]),
                                 write_kept(sink, work[2:]))
        deliver(d, pool, [first, again, overlap])
        assert [s.rows for shards in d.shards.cells.values() for s, _ in shards] == [4, 2]
        d.commit(force=True)
        assert d.result.committed == 6
        assert d.result.duplicates_dropped == 6  # the whole second batch, half of the third
        assert not list((tmp_path / "run" / TMP_DIR).iterdir())  # discarded and replaced files gone
    counts = committed_id_counts(tmp_path / "run")
    assert set(counts) == {e.episode_id for e in work}
    assert set(counts.values()) == {1}


def test_a_batch_that_comes_back_after_its_commit_is_dropped_too(tmp_path: Path) -> None:
    """The driver forgets the ids it committed (the store holds them): a late copy arriving
    after the commit is still discarded whole or filtered, never a shard left out."""
    work = make_batch(6)
    with LocalRunStore.open(tmp_path / "run", "fp", {}, "arrow", 512) as store:
        d, pool = writing_driver(tmp_path, store)
        sink = store.sink()
        deliver(d, pool, [write_kept(sink, work[:4])])
        d.commit(force=True)
        assert not d.seen  # committed ids are the store's to remember
        # The partly committed copy first: nothing seen since the commit may hide its old half.
        deliver(d, pool, [write_kept(sink, work[2:]), write_kept(sink, work[:4])])
        d.commit(force=True)
        assert d.uncommitted is None
        assert d.result.committed == 6
        assert d.result.duplicates_dropped == 6
    counts = committed_id_counts(tmp_path / "run")
    assert set(counts) == {e.episode_id for e in work}
    assert set(counts.values()) == {1}


def test_pending_shards_are_committed_on_the_driver_side_cadence(tmp_path: Path) -> None:
    """A cell is committed once its pending rows reach rows_per_shard; past max_buffered_rows the
    largest cells go first; the rest waits for the interval or the end."""
    with LocalRunStore.open(tmp_path / "run", "fp", {}, "arrow", 512) as store:
        d, pool = writing_driver(tmp_path, store, rows_per_shard=4, max_buffered_rows=10)
        sink = store.sink()
        batches = [write_kept(sink, make_batch(n, model=m, budget=64, start=i * 100))
                   for i, (m, n) in enumerate([("a", 4), ("b", 3), ("c", 2), ("d", 1)])]
        deliver(d, pool, batches)
        d.commit()
        assert d.result.committed == 4  # cell a is full; 6 rows left, under the cap
        assert {cell[0] for cell in d.shards.cells} == {"b", "c", "d"}
        deliver(d, pool, [write_kept(sink, make_batch(3, model="e", budget=64, start=900))])
        d.commit()  # 9 buffered, under the cap of 10: nothing is full
        assert d.result.committed == 4
        deliver(d, pool, [write_kept(sink, make_batch(2, model="f", budget=64, start=950))])
        # collected and committed at once past the cap: largest first (b, e) down to half of it
        assert d.result.committed == 10
        assert {cell[0] for cell in d.shards.cells} == {"c", "d", "f"}
        d.commit(force=True)
        assert d.result.committed == 15
        assert d.result.counts == {StopReason.DONE.value: 15}


def test_a_quota_episode_stops_the_run_and_is_never_committed(tmp_path: Path) -> None:
    """An episode that hit the account's quota is returned by the writing worker unwritten, and
    the driver stops the run on it as driver-side; the others of its batch are committed."""
    work: list[Episode] = make_batch(3)
    quota = dataclasses.replace(work[1], stop_reason=StopReason.ERROR,
                                error=EpisodeError("QuotaExhausted", "insufficient_quota"))
    with LocalRunStore.open(tmp_path / "run", "fp", {}, "arrow", 512) as store:
        d, pool = writing_driver(tmp_path, store)
        deliver(d, pool, [write_kept(store.sink(), [work[0], quota, work[2]])])
        d.commit(force=True)
        assert isinstance(d.stop_reason, QuotaExhausted)
        assert d.result.committed == 2
    assert set(committed_id_counts(tmp_path / "run")) == {work[0].episode_id, work[2].episode_id}

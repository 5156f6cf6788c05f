"""The driver loop over a fake pool (tests/run/fakepool.py): no Ray, no patching. A lost worker's
batches run again on its replacement, a held batch past its deadline is given up, a failure of
our own code stops the run, an id seen twice is committed once."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from collector.errors import CollectorError, ConfigError, QuotaExhausted
from collector.record.episode import Episode, EpisodeError
from collector.run.driver import Driver
from collector.run.plan import WorkItem
from collector.run.pool import WorkerFailed, WorkerLost
from collector.stop import StopReason
from collector.storage.pending import PendingShard
from tests.run.fakepool import FakePool, episode_of, fake_driver, item
from tests.run.helpers import small_config


class Store:
    """Records committed ids, dropping ids it already holds (as the run stores do)."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    def holds(self, episode_id: str) -> bool:
        return episode_id in self.ids

    def commit(self, episodes: Sequence[Episode]) -> int:
        fresh = [e.episode_id for e in episodes if e.episode_id not in self.ids]
        self.ids += fresh
        return len(fresh)

    def commit_pending(self, shards: Sequence[PendingShard]) -> int:
        raise AssertionError("driver-side writes only")


def run(tmp_path: Path, pool: FakePool, n: int = 12, **overrides: object) -> tuple[Store, Driver]:
    cfg = small_config(tmp_path / "run", **overrides)
    store = Store()
    todo = [item(f"e{i}", sample=i) for i in range(n)]
    driver = fake_driver(cfg, store, pool, todo, planned=n)
    driver.loop()
    driver.commit(force=True)
    return store, driver


def test_a_lost_workers_batch_runs_again_on_its_replacement(tmp_path: Path) -> None:
    pool = FakePool()
    pool.script["e0"] = WorkerLost("ActorDiedError")  # the first batch's worker dies holding it
    store, driver = run(tmp_path, pool)
    assert sorted(store.ids) == sorted(f"e{i}" for i in range(12))
    assert driver.result.worker_restarts == 1
    assert driver.result.redispatched >= 1
    first_actor, _ = pool.batches[0]
    assert first_actor in pool.killed
    rerun = [actor for actor, items in pool.batches[1:] if items[0].episode_id == "e0"]
    assert rerun
    assert rerun[0] != first_actor  # on the replacement


def test_a_held_batch_past_its_deadline_is_given_up_and_run_elsewhere(tmp_path: Path) -> None:
    """A frozen worker never answers: past `ray.batch_timeout_s` its batches go back to the
    queue and the worker is replaced; its late reply is never read."""
    pool = FakePool()
    pool.hold = True  # the batches handed out first stay unanswered: the worker is frozen
    cfg = small_config(tmp_path / "run", ray__batch_timeout_s=0.05, ray__workers=1)
    store = Store()
    driver = fake_driver(cfg, store, pool, [item(f"e{i}", sample=i) for i in range(4)], planned=4)
    driver.fill()
    frozen = set(pool.held)
    assert frozen
    pool.hold = False  # the replacement answers
    driver.loop()
    driver.commit(force=True)
    assert sorted(store.ids) == ["e0", "e1", "e2", "e3"]
    assert driver.result.worker_restarts == 1
    assert all(call in pool.held for call in frozen)  # never read


def test_our_own_failure_in_a_worker_stops_the_run_in_one_line(tmp_path: Path) -> None:
    pool = FakePool()
    pool.script["e0"] = WorkerFailed(ConfigError("provider.base_url: http://x is unreachable"))
    with pytest.raises(ConfigError, match="unreachable"):
        run(tmp_path, pool)
    other = FakePool()
    other.script["e0"] = WorkerFailed(RuntimeError("boom"))
    with pytest.raises(CollectorError, match=r"^a worker failed: RuntimeError: boom \(fake logs\)$"):
        run(tmp_path, other)


def test_an_id_returned_twice_is_committed_once(tmp_path: Path) -> None:
    pool = FakePool()
    twice = [episode_of(item("e0")), episode_of(item("e0"))]  # a batch re-run came back too
    pool.script["e0"] = twice
    store, driver = run(tmp_path, pool, ray__batch_size=1)
    assert store.ids.count("e0") == 1
    assert driver.result.duplicates_dropped == 1


def test_a_quota_episode_stops_handing_out_work(tmp_path: Path) -> None:
    pool = FakePool()
    quota = dataclasses.replace(episode_of(item("e0")), stop_reason=StopReason.ERROR,
                                error=EpisodeError("QuotaExhausted", "insufficient_quota"))
    pool.script["e0"] = [quota]
    store, driver = run(tmp_path, pool, n=40, ray__batch_size=1, ray__workers=1, ray__episodes_in_flight=1)
    assert isinstance(driver.stop_reason, QuotaExhausted)
    assert len(pool.batches) < 40  # stopped handing out work
    assert "e0" not in store.ids


def test_the_plan_is_read_as_batches_are_handed_out(tmp_path: Path) -> None:
    """The driver draws items from the plan only to fill the workers' outstanding batches: a
    million-episode plan is never held whole, and every item still runs once, in order."""
    drawn: list[str] = []

    def plan() -> Iterator[WorkItem]:
        for i in range(500):
            drawn.append(f"e{i}")
            yield item(f"e{i}", sample=i)

    pool = FakePool()
    cfg = small_config(tmp_path / "run", ray__batch_size=4, ray__workers=2)
    store = Store()
    driver = fake_driver(cfg, store, pool, plan(), planned=500)
    driver.fill()
    handed = sum(len(items) for _, items in pool.batches)
    assert 0 < handed < 100
    assert len(drawn) <= handed + 1  # one item peeked at most
    driver.loop()
    driver.commit(force=True)
    assert sorted(store.ids) == sorted(f"e{i}" for i in range(500))

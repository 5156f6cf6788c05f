"""The progress line's polls over a fake pool (tests/run/fakepool.py): the driver asks its
workers for their counts only when it draws the line, and the line it draws shows what they
answered to that poll, not to the one before."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

from collector.record.episode import Episode
from collector.run.progress import Progress
from collector.storage.pending import PendingShard
from tests.run.fakepool import FakePool, fake_driver, item
from tests.run.helpers import small_config


class Store:
    def __init__(self) -> None:
        self.ids: list[str] = []

    def holds(self, episode_id: str) -> bool:
        return episode_id in self.ids

    def commit(self, episodes: Sequence[Episode]) -> int:
        self.ids += [e.episode_id for e in episodes]
        return len(episodes)

    def commit_pending(self, shards: Sequence[PendingShard]) -> int:
        raise AssertionError("driver-side writes only")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_workers_are_polled_only_when_the_line_is_drawn(tmp_path: Path) -> None:
    pool, store, clock = FakePool(), Store(), Clock()
    todo = [item(f"e{i}", sample=i) for i in range(40)]  # 10 batches of 4: many passes of the loop
    driver = fake_driver(small_config(tmp_path / "run"), store, pool, todo, planned=40)
    stream = io.StringIO()
    driver.progress = Progress(40, stream=stream, live=False, log_interval_s=5.0, clock=clock)
    driver.show(force=True)
    assert pool.polls == 2  # the first line: one poll per worker
    driver.loop()  # the clock stands still: no line is due, so no worker is asked again
    assert len(store.ids) + driver.buffered() == 40
    assert pool.polls == 2
    assert len(stream.getvalue().splitlines()) == 1
    clock.now += 5.0
    driver.show()
    assert pool.polls == 4
    assert len(stream.getvalue().splitlines()) == 2


def test_a_drawn_line_shows_what_the_workers_answer_to_its_own_poll(tmp_path: Path) -> None:
    pool, store, clock = FakePool(), Store(), Clock()
    todo = [item(f"e{i}", sample=i) for i in range(8)]
    driver = fake_driver(small_config(tmp_path / "run"), store, pool, todo, planned=8)
    stream = io.StringIO()
    driver.progress = Progress(8, stream=stream, live=False, log_interval_s=5.0, clock=clock)
    driver.show(force=True)
    pool.hold = True
    driver.fill()  # every batch held: nothing returns, nothing is committed
    assert not pool.wait(list(driver.inflight), 0)
    for actor in {a for a, _ in pool.batches}:
        pool.finished[actor] = 3  # each worker has finished 3 of its episodes so far
    clock.now += 5.0
    driver.show()
    last = stream.getvalue().splitlines()[-1]
    assert "6/8" in last, last
    assert "(0 committed)" in last, last
    assert "done 6" in last, last

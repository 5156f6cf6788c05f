"""Feeding a GRPO consumer early: a follower started before its run waits (bounded) and ends with
the run, and `sweep.order = "group_major"` completes groups from the first commits on."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from collector.analysis.follow import Batch, Follower, FollowError
from collector.config import config_fingerprint
from collector.run.job import run_job
from collector.run.plan import Plan, plan_work
from collector.storage.manifest import committed_shard_paths
from tests.run.helpers import committed_id_counts, small_config

#: A guard against a hung test, never a measurement.
GUARD_S = 120.0


def _first_group_done(plan: Plan) -> int:
    """How many items are handed out before some group has every sample."""
    seen: dict[tuple[str, str, int], int] = {}
    for i, item in enumerate(plan.items, 1):
        key = (item.task_id, item.model, item.budget)
        seen[key] = seen.get(key, 0) + 1
        if seen[key] == plan.cfg.samples_per_task:
            return i
    raise AssertionError("no group completes")


def test_group_major_completes_a_group_with_its_first_items(tmp_path: Path) -> None:
    """Group-major hands a group's samples out together; sample-major completes none before its last round."""
    sample_major = plan_work(small_config(tmp_path / "a", samples_per_task=4))
    group_major = plan_work(small_config(tmp_path / "a", samples_per_task=4, sweep__order="group_major"))
    assert _first_group_done(group_major) == 4
    assert _first_group_done(sample_major) > 3 * sample_major.size // 4
    # The same episodes (ids, seeds) and the same run: only the order differs.
    assert sorted(i.episode_id for i in group_major.items) == sorted(i.episode_id for i in sample_major.items)
    seeds = {(i.episode_id, i.seed) for i in sample_major.items}
    assert {(i.episode_id, i.seed) for i in group_major.items} == seeds
    assert config_fingerprint(group_major.cfg) == config_fingerprint(sample_major.cfg)


def test_follower_waits_for_the_run_and_ends_with_it(tmp_path: Path) -> None:
    """A follower started before its run waits for it, delivers every group exactly once and ends."""
    run_dir = tmp_path / "run"
    cfg = small_config(run_dir, samples_per_task=3, sweep__order="group_major",
                       output__commit_interval_s=0.05)
    waiting = threading.Event()

    def sleep(seconds: float) -> None:
        waiting.set()  # the follower is polling for a run that does not exist yet
        threading.Event().wait(min(seconds, 0.02))

    batches: list[Batch] = []
    failure: list[Exception] = []

    def consume() -> None:
        try:
            batches.extend(Follower(run_dir, groups="complete", poll_s=0.02, wait_s=GUARD_S, sleep=sleep))
        except Exception as exc:  # noqa: BLE001 - any failure is asserted on by the test thread below
            failure.append(exc)

    consumer = threading.Thread(target=consume)
    consumer.start()
    assert waiting.wait(GUARD_S)
    assert not run_dir.exists()
    run_job(cfg, show_progress=False)
    consumer.join(GUARD_S)
    assert not consumer.is_alive()
    assert not failure
    delivered = [eid for b in batches for eid in b.table.column("episode_id").to_pylist()]
    assert sorted(delivered) == sorted(committed_id_counts(run_dir))
    assert len(delivered) == len(set(delivered)) == plan_work(cfg).size
    # Group-major with a short commit interval: groups arrive over several commits, not at the end.
    assert len(batches) > 1
    assert len(committed_shard_paths(run_dir)) > 1


def test_follower_gives_up_after_its_wait(tmp_path: Path) -> None:
    """A run that never starts ends the bounded wait with one line naming the run and the bound."""
    ticks = iter(range(1000))
    follower = Follower(tmp_path / "never", wait_s=5.0, sleep=lambda _s: None,
                        clock=lambda: float(next(ticks)))
    with pytest.raises(FollowError, match=r"no run started there within 5 s"):
        list(follower)

"""`collector.analysis.follow`: committed batches in commit order, resumable exactly (issue 27).

The unit tests drive a run store (`open_run_store`) from the follower's own poll (its `sleep`
hook commits the next batch), so every interleaving is an event, never a timing guess: resume from every
cursor a follow printed (records still in the log, then folded into the base), compaction
behind the cursor, forget, complete groups, the end. The process tests run `collector run`
on the simulator and, concurrently, `python -m collector follow`, SIGKILLed after it printed
a random number of lines and restarted from the last cursor it printed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from collector.analysis.follow import Batch, Follower, FollowError, follow
from collector.record.episode import Episode
from collector.stop import StopReason
from collector.storage.opening import open_run_store
from tests.record.factory import make_episode
from tests.s3server import S3Bucket
from tests.system.processes import user_env

REPO = Path(__file__).resolve().parents[2]
#: A guard against a hung test, never a measurement.
GUARD_S = 240.0


def episodes(tasks: range, *, sample: int = 0, models: tuple[str, ...] = ("m1",),
             errors: frozenset[str] = frozenset()) -> list[Episode]:
    return [make_episode(StopReason.ERROR if f"t{t}" in errors else StopReason.DONE, model=m, budget=64,
                         task=f"t{t}", sample=sample) for t in tasks for m in models]


def open_store(run: Path, samples: int = 1) -> Any:
    """A writer of `run` (the store's public surface only: its internals are another branch's)."""
    return open_run_store(run, "fp", {"samples_per_task": samples}, "arrow", 3)


def compact_on_disk(run: Path) -> int:
    """What the writer's compaction does, by the on-disk format: the base with every record
    folded in (removals, then additions) becomes the new base, then the records are deleted."""
    meta = run / ".collector"
    base = json.loads((meta / "manifest.json").read_text())
    for path in sorted(meta.glob("commit-*.json")):
        record = json.loads(path.read_text())
        if record["seq"] > base["log_through"]:
            gone = set(record["remove"])
            base["shards"] = [e for e in base["shards"] if e["path"] not in gone] + record["add"]
            base["log_through"] = record["seq"]
    tmp = meta / ".manifest.json.compact.tmp"
    tmp.write_text(json.dumps(base))
    os.replace(tmp, meta / "manifest.json")
    for path in meta.glob("commit-*.json"):
        path.unlink()
    return int(base["log_through"])


def rows(batches: Iterator[Batch] | Follower) -> list[tuple[str, str]]:
    """(cursor, episode id) per delivered row."""
    out = []
    for batch in batches:
        ids = batch.table.column("episode_id").to_pylist()
        assert len(ids) == len(batch.row_cursors)
        out.extend(zip(batch.row_cursors, ids, strict=True))
    return out


def driven(run: Path, steps: list[Callable[[], object]], **kwargs: object) -> Follower:
    """A follower whose every poll runs the next step (a commit, a close...) before looking again."""
    todo = list(steps)

    def poll(_: float) -> None:
        assert todo, "the follower kept polling after every step ran and the writer was gone"
        todo.pop(0)()

    return Follower(run, sleep=poll, poll_s=0, **kwargs)  # type: ignore[arg-type]


class Idle(Exception):
    """Raised by a follower's sleep hook: the poll found all there is (the writer still holds the run)."""


def one_poll(run: Path, **kwargs: object) -> list[tuple[str, str]]:
    """What a follower delivers in its first poll of a run whose writer is still open."""

    def stop(_: float) -> None:
        raise Idle

    got: list[tuple[str, str]] = []
    try:
        for batch in Follower(run, sleep=stop, poll_s=0, **kwargs):  # type: ignore[arg-type]
            got.extend(rows([batch]))
    except Idle:
        pass
    return got


def committed_in_order(run: Path) -> list[str]:
    from tests.checking import committed_rows

    return [str(r["episode_id"]) for r in committed_rows(run)]


def assert_resumes_exactly(run: Path, delivered: list[tuple[str, str]], **kwargs: object) -> None:
    """From every cursor delivered, a new follower delivers exactly the rows after it."""
    for i, (cursor, _) in enumerate(delivered):
        again = [eid for _, eid in rows(follow(run, since=cursor, poll_s=0, **kwargs))]  # type: ignore[arg-type]
        assert again == [eid for _, eid in delivered[i + 1:]], f"resumed from {cursor} (row {i})"


def test_live_commits_arrive_in_commit_order_and_resume_from_every_cursor(tmp_path: Path) -> None:
    run = tmp_path / "run"
    store = open_store(run)
    store.commit(episodes(range(4), models=("m1", "m2")))  # two cells, several shards: one commit
    steps: list[Callable[[], object]] = [
        lambda: store.commit(episodes(range(4, 9))),
        lambda: None,  # a poll that finds nothing new
        lambda: store.commit(episodes(range(9, 11), models=("m2",))),
        store.close,
    ]
    follower = driven(run, steps)
    batches = list(follower)
    assert [b.seq for b in batches] == [1, 2, 3]  # one table per commit
    delivered = rows(batches)
    assert [eid for _, eid in delivered] == committed_in_order(run)
    assert len(delivered) == 8 + 5 + 2
    assert follower.cursor == delivered[-1][0]
    # close compacted the log: every record is folded into the base and deleted
    assert not list((run / ".collector").glob("commit-*.json"))
    assert_resumes_exactly(run, delivered)


def test_resume_from_every_cursor_while_the_records_are_in_the_log(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with open_store(run) as store:
        for start in range(0, 12, 4):
            store.commit(episodes(range(start, start + 4)))
        assert len(list((run / ".collector").glob("commit-*.json"))) == 3
        delivered = one_poll(run)
        assert [eid for _, eid in delivered] == committed_in_order(run)
        for i, (cursor, _) in enumerate(delivered):
            again = one_poll(run, since=cursor)
            assert [eid for _, eid in again] == [eid for _, eid in delivered[i + 1:]], cursor


def test_a_cursor_behind_a_compaction_gets_exactly_what_was_committed_after_it(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with open_store(run) as store:
        store.commit(episodes(range(5)))
        store.commit(episodes(range(5, 7)))
    first = rows(follow(run, poll_s=0))
    with open_store(run) as store:  # a resume of the run: compaction on open, then more commits
        store.commit(episodes(range(7, 12)))
        store.commit(episodes(range(12, 13)))
        # and a compaction in the middle of the run, as the store does once the log is long
        assert compact_on_disk(run) == 4
        store.commit(episodes(range(13, 15)))
    manifest = json.loads((run / ".collector/manifest.json").read_text())
    assert manifest["log_through"] == 5
    assert not list((run / ".collector").glob("commit-*.json"))
    rest = rows(follow(run, since=first[-1][0]))
    assert [eid for _, eid in first + rest] == committed_in_order(run)
    assert_resumes_exactly(run, first + rest)


def strip_commit_seqs(run: Path) -> None:
    """Make the base what a store from before the per-entry ``seq`` wrote."""
    path = run / ".collector/manifest.json"
    manifest = json.loads(path.read_text())
    for entry in manifest["shards"]:
        entry.pop("seq", None)
    path.write_text(json.dumps(manifest))


def test_a_forget_behind_the_cursor_folded_into_the_base_is_exact_or_refused_in_one_line(
        tmp_path: Path) -> None:
    """The store's entries carry their commit's seq: a forget folded behind the cursor resumes
    exactly; a base written before that field is refused in one line naming run and cursor."""
    run = tmp_path / "run"
    with open_store(run) as store:
        store.commit(episodes(range(6), errors=frozenset({"t1"})))
    cursor = rows(follow(run, poll_s=0))[-1][0]
    with open_store(run) as store:
        store.forget({make_episode(StopReason.ERROR, model="m1", budget=64, task="t1").episode_id})
        store.commit(episodes(range(6, 8)))
    assert [e for _, e in rows(follow(run, since=cursor))] == [ep.episode_id for ep in episodes(range(6, 8))]
    strip_commit_seqs(run)
    with pytest.raises(FollowError) as caught:
        rows(follow(run, since=cursor))
    message = str(caught.value)
    assert "\n" not in message
    assert str(run) in message
    assert cursor in message
    assert "forget" in message


def test_entries_that_carry_their_commit_seq_resume_exactly_across_a_forget(tmp_path: Path) -> None:
    """The field the store would add (module docstring): with it a forget folded behind the
    cursor is exact too. Simulated by writing it into the base the way the store would."""
    run = tmp_path / "run"
    with open_store(run) as store:
        store.commit(episodes(range(3), errors=frozenset({"t1"})))
        store.commit(episodes(range(3, 6)))
    cursor = rows(follow(run, poll_s=0))[-1][0]
    path = run / ".collector/manifest.json"
    manifest = json.loads(path.read_text())
    for entry, seq in zip(manifest["shards"], [1, 2], strict=True):  # rows_per_shard 3: a shard each
        entry["seq"] = seq
    path.write_text(json.dumps(manifest))
    with open_store(run) as store:
        store.forget({make_episode(StopReason.ERROR, model="m1", budget=64, task="t1").episode_id})
        store.commit(episodes(range(6, 9)))
    manifest = json.loads(path.read_text())
    for entry in manifest["shards"]:
        # the store would write these itself: a replacement keeps its original's seq
        entry.setdefault("seq", 1 if entry["rows"] == 2 else 4)
    path.write_text(json.dumps(manifest))
    rest = [eid for _, eid in rows(follow(run, since=cursor))]
    assert rest == [ep.episode_id for ep in episodes(range(6, 9))]
    # without the field, the same history is refused (test above): the field is what makes it exact
    for entry in manifest["shards"]:
        del entry["seq"]
    path.write_text(json.dumps(manifest))
    with pytest.raises(FollowError, match="forget"):
        rows(follow(run, since=cursor))


def test_a_live_follower_overtaken_by_a_compaction_catches_up_from_the_base(tmp_path: Path) -> None:
    """Between two polls the run is closed (compacted), resumed and closed again: the records
    the follower had not read are gone; it gets exactly the base's shards after its state."""
    run = tmp_path / "run"
    store = open_store(run)
    store.commit(episodes(range(4)))

    def resumed() -> None:
        store.close()
        with open_store(run) as again:
            again.commit(episodes(range(4, 9)))  # two shards (rows_per_shard 3)
            again.commit(episodes(range(9, 10)))

    batches = list(driven(run, [resumed]))
    assert [b.seq for b in batches] == [1, 3, 3, 3]  # the catch-up comes shard by shard, at the base's seq
    assert [eid for _, eid in rows(batches)] == committed_in_order(run)


@pytest.mark.parametrize("seqs", [True, False])
def test_a_live_follower_overtaken_by_a_folded_forget_is_exact_or_stops_in_one_line(
        tmp_path: Path, seqs: bool) -> None:
    """Exact where the base's entries carry their commit seq; one line where they do not."""
    run = tmp_path / "run"
    store = open_store(run)
    store.commit(episodes(range(4), errors=frozenset({"t1"})))

    def resumed() -> None:
        store.close()
        with open_store(run) as again:
            again.forget({make_episode(StopReason.ERROR, model="m1", budget=64, task="t1").episode_id})
            again.commit(episodes(range(4, 6)))
        if not seqs:
            strip_commit_seqs(run)

    follower = driven(run, [resumed])
    if seqs:
        assert [e for _, e in rows(follower)] == [ep.episode_id for ep in episodes(range(6))]
        return
    with pytest.raises(FollowError, match=r"cursor [0-9a-f]{12}:1\.2\.part-\S+ is behind the base "
                                          r"\(log_through 3\)"):
        list(follower)


def test_a_live_follower_sees_a_forget_as_nothing_and_the_retry_as_a_new_commit(tmp_path: Path) -> None:
    run = tmp_path / "run"
    error = make_episode(StopReason.ERROR, model="m1", budget=64, task="t1")
    store = open_store(run)
    store.commit(episodes(range(4), errors=frozenset({"t1"})))
    retried = make_episode(StopReason.DONE, model="m1", budget=64, task="t1")
    steps: list[Callable[[], object]] = [lambda: store.forget({error.episode_id}),
                                         lambda: store.commit([retried]), store.close]
    batches = list(driven(run, steps))
    assert [b.seq for b in batches] == [1, 3]  # the forget (2) delivers nothing
    assert batches[0].errors == 1
    assert batches[1].errors == 0
    ids = [eid for _, eid in rows(batches)]
    assert ids.count(error.episode_id) == 2  # the error first, then its retry
    assert [ep.stop_reason for ep in batches[1].episodes()] == [StopReason.DONE]


def test_complete_groups_only_and_every_grouped_cursor_resumes_exactly(tmp_path: Path) -> None:
    run = tmp_path / "run"
    store = open_store(run, samples=3)
    store.commit(episodes(range(3), sample=0) + episodes(range(2), sample=1))
    steps: list[Callable[[], object]] = [
        lambda: store.commit(episodes(range(2), sample=2) + episodes(range(3, 5), sample=0)),
        lambda: store.commit(episodes(range(2, 3), sample=1, errors=frozenset({"t2"}))),
        lambda: store.commit(episodes(range(2, 3), sample=2) + episodes(range(3, 5), sample=1)),
        lambda: store.commit(episodes(range(3, 5), sample=2)),
        lambda: store.commit(episodes(range(5, 6), sample=0)),  # never completed
        store.close,
    ]
    follower = driven(run, steps, groups="complete")
    batches = list(follower)
    delivered = rows(batches)
    by_group: dict[str, list[int]] = {}
    for batch in batches:
        tasks = batch.table.column("task_id").to_pylist()
        samples = batch.table.column("sample").to_pylist()
        assert batch.groups * 3 == batch.table.num_rows
        for i in range(0, len(tasks), 3):  # each group whole and together, samples in order
            assert len(set(tasks[i:i + 3])) == 1
            assert samples[i:i + 3] == [0, 1, 2]
            by_group[tasks[i]] = samples[i:i + 3]
    assert sorted(by_group) == ["t0", "t1", "t2", "t3", "t4"]
    assert [b.errors for b in batches if "t2" in b.table.column("task_id").to_pylist()] == [1]
    assert follower.held == (1, 1)
    assert all(c.startswith("g") for c, _ in delivered)
    assert_resumes_exactly(run, delivered, groups="complete")
    # resumed inside a group, the group's rest still says its errors and counts as one group
    errors = [e for b in batches for e in b.group_errors]
    for i, (cursor, _) in enumerate(delivered):
        again = list(follow(run, since=cursor, groups="complete", poll_s=0))
        assert [e for b in again for e in b.group_errors] == errors[i + 1:], cursor
        assert sum(b.groups for b in again) == (len(delivered) - i - 1 + 2) // 3, cursor
    # and after the compaction on close, the same cursors from the base
    assert not list((run / ".collector").glob("commit-*.json"))


def test_held_samples_are_copied_out_of_their_shard_and_released_whole(tmp_path: Path) -> None:
    """Memory is the incomplete groups: a held row must not keep its whole shard alive."""
    from collector.analysis.follow import _Grouper
    from collector.record.shards import episodes_to_table

    grouper = _Grouper(2)
    shard = episodes_to_table(episodes(range(50), sample=0) + episodes(range(49, 50), sample=1))
    released, gids, gerrs = grouper.feed(shard)
    assert released.column("task_id").to_pylist() == ["t49", "t49"]
    assert (gids, gerrs) == ([1, 1], [0, 0])
    held = {id(t): t.num_rows for group in grouper.held.values() for t, _ in group.values()}
    assert len(grouper.held) == 49
    assert list(held.values()) == [49]  # one compact table of the 49 held rows, not the 51-row shard
    retried = episodes(range(2), sample=1, errors=frozenset({"t1"}))
    again, gids, gerrs = grouper.feed(episodes_to_table(retried))
    assert again.column("task_id").to_pylist() == ["t0", "t0", "t1", "t1"]
    assert (gids, gerrs) == ([2, 2, 3, 3], [0, 0, 1, 1])
    assert again.column("sample").to_pylist() == [0, 1, 0, 1]
    assert len(grouper.held) == 47


def test_a_grouped_follower_started_before_the_writer_wrote_its_config_waits_for_it(tmp_path: Path) -> None:
    """A writer's open creates the manifest, then config.resolved.json: a follower started in
    between reads the group size at the first row, once a commit (after the open) exists."""
    run = tmp_path / "run"
    store = open_store(run, samples=2)
    config = run / ".collector/config.resolved.json"
    written = config.read_text()
    config.unlink()

    def commit() -> None:
        config.write_text(written)
        store.commit(episodes(range(2), sample=0) + episodes(range(2), sample=1))

    got = rows(driven(run, [commit, store.close], groups="complete"))
    assert len(got) == 4


def test_grouped_and_plain_cursors_are_not_mixed(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with open_store(run, samples=1) as store:
        store.commit(episodes(range(4)))
    plain = rows(follow(run, poll_s=0))
    grouped = rows(follow(run, groups="complete"))
    assert [e for _, e in plain] == [e for _, e in grouped]
    with pytest.raises(FollowError, match="grouped cursor"):
        follow(run, since=grouped[0][0])
    # a plain cursor at a commit's end means nothing was held there: grouped mode takes it
    assert rows(follow(run, since=plain[-1][0], groups="complete")) == []


@pytest.mark.parametrize("bad", ["x", "3.4", "-1", "2.1.part-x+y"])
def test_a_bad_cursor_is_one_line(tmp_path: Path, bad: str) -> None:
    with pytest.raises(FollowError, match=f"{tmp_path}: '.*' is not a follow cursor"):
        follow(tmp_path, since=bad)


def test_a_cursor_of_another_run_or_from_the_future_is_refused(tmp_path: Path) -> None:
    for name, n in (("a", 4), ("b", 2)):
        with open_store(tmp_path / name) as store:
            store.commit(episodes(range(n)))
            store.commit(episodes(range(n, n + 1)))
    foreign = rows(follow(tmp_path / "a"))[-1][0]
    with pytest.raises(FollowError, match=r"cursor .* is of another run"):
        rows(follow(tmp_path / "b", since=foreign))
    store = rows(follow(tmp_path / "b"))[-1][0].split(":")[0]
    with pytest.raises(FollowError, match="ahead of the run"):
        rows(follow(tmp_path / "b", since=f"{store}:9.3.-"))
    with pytest.raises(FollowError, match="has only"):
        rows(follow(tmp_path / "b", since=f"{store}:0.0.-+9:part-x:0"))


def test_it_ends_only_once_the_writer_released_the_lock(tmp_path: Path) -> None:
    run = tmp_path / "run"
    store = open_store(run)
    store.commit(episodes(range(2)))
    polls = []
    steps: list[Callable[[], object]] = [lambda: polls.append(1)] * 5 + [store.close]
    assert len(rows(driven(run, steps))) == 2
    assert len(polls) == 5  # five idle polls while the lock was held: it kept following
    with pytest.raises(FollowError, match="is not a run"):
        rows(follow(tmp_path / "nothing"))


def test_forever_waits_for_the_run_and_follows_past_the_writers_end(tmp_path: Path) -> None:
    run = tmp_path / "run"
    stores: list[Any] = []
    steps: list[Callable[[], object]] = [
        lambda: None,  # no run yet: it waits
        lambda: stores.append(open_store(run)),
        lambda: stores[0].commit(episodes(range(2))),
        lambda: stores[0].close(),
        lambda: None,  # the writer is gone: it keeps polling
        lambda: stores.append(open_store(run)),  # a resumed run, compacted on open
        lambda: stores[1].commit(episodes(range(2, 3))),
        lambda: stores[1].close(),
    ]

    def poll(_: float) -> None:
        if not steps:
            raise Idle
        steps.pop(0)()

    got: list[tuple[str, str]] = []

    def consume() -> None:
        for batch in Follower(run, forever=True, sleep=poll, poll_s=0):
            got.extend(rows([batch]))

    with pytest.raises(Idle):
        consume()
    assert not steps
    assert [eid for _, eid in got] == committed_in_order(run)
    assert len(got) == 3


def test_a_shard_still_pending_after_its_record_is_read_from_tmp(tmp_path: Path) -> None:
    """Between the commit record and the move into data/ (or a crash there) the shard is in
    .collector/tmp/: committed all the same."""
    run = tmp_path / "run"
    with open_store(run) as store:
        store.commit(episodes(range(2)))
        store.commit(episodes(range(2, 3)))
        record = json.loads((run / ".collector/commit-000000002.json").read_text())
        rel = record["add"][0]["path"]
        os.replace(run / rel, run / ".collector/tmp" / (rel.rsplit("/", 1)[-1] + ".tmp"))
        assert [e for _, e in one_poll(run)] == committed_in_order(run)


def test_a_run_in_object_storage_counts_its_writer_by_the_lock_object_and_its_lease(
        tmp_path: Path, s3_bucket: S3Bucket) -> None:
    """In a bucket the lock is an object (deleted on release) with a lease: a writer killed on
    another host leaves it, and the follower ends once the lease has expired."""
    follower = Follower(s3_bucket.uri("run"))
    assert not follower._writer_present(tmp_path)  # no lock object: released
    for lease_s, present in ((120.0, True), (0.0, False)):
        body = json.dumps({"host": "elsewhere", "pid": 1, "lease_s": lease_s}).encode()
        s3_bucket.client.put_object(Bucket=s3_bucket.name, Key="run/.collector/run.lock", Body=body)
        assert follower._writer_present(tmp_path) is present, lease_s


def cli(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "collector", "follow", *args], env=user_env(),
                          capture_output=True, timeout=GUARD_S, check=False)

"""`collector follow` under faults: a `--retry-errors` after the cursor, cursors of another run or
torn, and an S3 follower whose clock is not the store's.

Writers are driven from the follower's own poll (its `sleep` hook), so every interleaving is
an event, never a timing guess (the helpers are tests/analysis/test_follow.py's).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import collector.analysis.follow as follow_module
from collector.analysis.follow import Follower, FollowError, follow
from collector.stop import StopReason
from collector.storage.opening import open_run_store
from tests.analysis.test_follow import committed_in_order, driven, episodes, open_store, rows
from tests.checking import assert_run_checked
from tests.record.factory import make_episode
from tests.s3server import S3Bucket

ERRORS = frozenset({"t2", "t7", "t11"})
MODELS = ("m1", "m2")


def retry_errors(run: Path) -> list[str]:
    """What `collector run --retry-errors` does to the store: forget the error episodes, commit
    their retries (same ids, now `done`), close (the log is folded into the base)."""
    retried = [make_episode(StopReason.DONE, model=m, budget=64, task=t)
               for t in sorted(ERRORS) for m in MODELS]
    with open_store(run) as store:
        store.forget({ep.episode_id for ep in retried})
        store.commit(retried)
    return [ep.episode_id for ep in retried]


def test_a_cursor_of_a_finished_run_after_retry_errors_is_exact_or_refused_in_one_line(
        tmp_path: Path) -> None:
    """From every cursor a follower of a finished run printed, after a `--retry-errors` that
    re-collected some episodes, a resumed follower either delivers exactly every row it had
    not delivered (the retries included) or is refused in one line; never skips one silently."""
    run = tmp_path / "run"
    with open_store(run) as store:
        for k in range(0, 15, 5):
            store.commit(episodes(range(k, k + 5), models=MODELS, errors=ERRORS))
    delivered = rows(follow(run, poll_s=0))  # read after the run ended: caught up from the base
    assert len(delivered) == 30
    retried = retry_errors(run)
    final = committed_in_order(run)
    exact, refusals = 0, []
    for i, (cursor, _) in enumerate(delivered):
        before = [eid for _, eid in delivered[:i + 1]]
        try:
            again = [eid for _, eid in rows(follow(run, since=cursor, poll_s=0))]
        except FollowError as e:
            refusals.append((cursor, str(e)))
            continue
        exact += 1
        assert not set(final) - set(before) - set(again), f"rows never delivered after {cursor}"
        assert len(again) == len(set(again))
        assert not (set(again) & set(before)) - set(retried), f"rows delivered twice after {cursor}"
    assert all(cursor in message and "\n" not in message for cursor, message in refusals)
    # The cursor a follower holds at the end of the run resumes exactly: the retries, once.
    assert sorted(eid for _, eid in rows(follow(run, since=delivered[-1][0], poll_s=0))) == sorted(retried)
    assert exact >= 1
    assert_run_checked(run)


@pytest.mark.parametrize("bad", [
    "0.0.-+", "0.0.-+5", "3", "3.12.part-000011-6bbc9d29",  # cursors without a run: torn or from before
    "abcdef012345:0.0.-+", "abcdef012345:0.0.-+5", "abcdef012345:1.2", "abcdef01234:1.2.x",
    "abcdef012345:1.2.x+0:y:0", "abcdef012345:1.2.x+-3:y:0", "abcdef012345:1.2.x+3:y", "gg",
])
def test_a_torn_or_malformed_cursor_is_refused_in_one_line(tmp_path: Path, bad: str) -> None:
    """A cursor cut short, or in a form `collector follow` never printed, is one line naming the
    run and the text, never read as another position (0, or the start)."""
    with open_store(tmp_path) as store:
        store.commit(episodes(range(2)))
    with pytest.raises(FollowError) as caught:
        rows(follow(tmp_path, since=bad))
    assert str(caught.value).startswith(f"{tmp_path}: {bad!r} is not a follow cursor")
    assert "\n" not in str(caught.value)


def test_a_cursor_of_another_run_is_refused_in_one_line(tmp_path: Path) -> None:
    """Two runs of one config made in the same second (or a run deleted and made again at its
    path) do not take each other's cursors, not even the start's, which would match any run."""
    for name in ("a", "b"):
        with open_store(tmp_path / name) as store:
            store.commit(episodes(range(3)))
    theirs = rows(follow(tmp_path / "a"))
    start = theirs[0][0].split(":")[0] + ":0.0.-"
    for cursor in (start, theirs[0][0], theirs[-1][0]):
        with pytest.raises(FollowError, match="is of another run") as caught:
            rows(follow(tmp_path / "b", since=cursor))
        assert "\n" not in str(caught.value)
    ours = rows(follow(tmp_path / "b"))
    assert rows(follow(tmp_path / "b", since=ours[0][0].split(":")[0] + ":0.0.-")) == ours


def test_a_run_without_a_store_id_is_followed_by_its_fingerprint_and_creation(tmp_path: Path) -> None:
    """A run written before store ids still gives cursors that resume it."""
    run = tmp_path / "run"
    with open_store(run) as store:
        store.commit(episodes(range(4)))
    path = run / ".collector/manifest.json"
    manifest = json.loads(path.read_text())
    del manifest["store_id"]
    path.write_text(json.dumps(manifest))
    delivered = rows(follow(run))
    assert [e for _, e in rows(follow(run, since=delivered[1][0]))] == [e for _, e in delivered[2:]]


class _Ahead(dt.datetime):
    """This process's clock, 150 s ahead of the store's."""

    @classmethod
    def now(cls, tz: Any = None) -> Any:
        return dt.datetime.now(tz) + dt.timedelta(seconds=150)


def test_an_s3_follower_whose_clock_runs_ahead_follows_a_live_writer_to_its_end(
        tmp_path: Path, s3_bucket: S3Bucket, monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer's lease is judged on the store's clock: a reader whose clock runs 150 s ahead
    does not take a live writer for dead (and end with nothing); it ends once the writer released."""
    monkeypatch.setenv("COLLECTOR_CACHE_DIR", str(tmp_path / "cache"))
    skewed = type("dt", (), {"datetime": _Ahead, "UTC": dt.UTC, "timedelta": dt.timedelta})
    monkeypatch.setattr(follow_module, "dt", skewed, raising=False)
    uri = s3_bucket.uri("run")
    store = open_run_store(uri, "fp", {"samples_per_task": 1}, "arrow", 3)
    store.commit(episodes(range(3)))
    ran: list[str] = []
    steps: list[Callable[[], object]] = [lambda: ran.append("commit") or store.commit(episodes(range(3, 5))),
                                         lambda: ran.append("close") or store.close()]
    got = rows(driven(uri, steps))  # type: ignore[arg-type]
    assert ran == ["commit", "close"]  # it kept following until the writer released the run
    assert len(got) == 5
    with pytest.raises(FollowError, match="is of another run"):
        Follower(uri, since="abcdef012345:0.0.-").__iter__().__next__()

"""S3 requests that botocore sends again: a conditional write whose first attempt landed but
whose answer was lost (a loopback proxy forwards the PUT to the moto server, then answers 500),
and throttling (503 SlowDown, several in a row). Each request kind of the store: the commit
record, forget's record, the lease renewal, the compaction, a worker's pending-shard PUT.

After each: no LockLost, no committed row lost, the lock released on close, and the run clean
for `collector check` (`check_run` on the readers' mirror)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from collector.analysis.check import check_run
from collector.errors import OutputError
from collector.record.shards import episodes_to_table
from collector.storage import s3client
from collector.storage.mirror import resolve_run
from collector.storage.s3store import S3RunStore
from tests.record.factory import make_batch
from tests.s3server import FaultyProxy, S3Bucket, faulty_s3  # noqa: F401 - the fixture, by name

FP = "fingerprint-retries"


def open_s3(bucket: S3Bucket) -> S3RunStore:
    return S3RunStore.open(bucket.uri(), FP, {}, "arrow", 3)


def put_to(name: str, condition: str | None = None) -> Any:
    """A matcher for the PUTs of keys under the run whose name holds `name` (and that carry the
    header `condition`, e.g. If-Match: a renewal, not the lock's creation)."""
    def match(method: str, path: str, headers: Any) -> bool:
        return (method == "PUT" and "/run/" in path and name in path.split("?")[0]
                and (condition is None or headers.get(condition) is not None))
    return match


def assert_clean(bucket: S3Bucket, committed: set[str], tmp_path: Any, monkeypatch: Any) -> None:
    """Every committed id still committed on a fresh open, data/ holds exactly them, the lock was
    released, nothing pending is left, and the readers' check of the mirror is ok."""
    assert "run/.collector/run.lock" not in bucket.keys("run/.collector/"), "the lock was left behind"
    assert not bucket.keys("run/.collector/tmp/")
    with open_s3(bucket) as st:
        assert st.warnings == []
        assert st.committed_ids() == committed
        listed = [i for key in bucket.keys("run/data/")
                  for i in st.read_shard({"path": key.removeprefix("run/")}, ["episode_id"])
                  .column("episode_id").to_pylist()]
    assert sorted(listed) == sorted(committed)
    monkeypatch.setenv("COLLECTOR_CACHE_DIR", str(tmp_path / "cache"))
    report = check_run(resolve_run(bucket.uri()))
    assert report.ok, report


def test_a_commit_record_whose_answer_was_lost_is_this_writers_commit(
        faulty_s3: tuple[S3Bucket, FaultyProxy], tmp_path: Any, monkeypatch: Any) -> None:  # noqa: F811
    bucket, proxy = faulty_s3
    work = make_batch(8)
    with open_s3(bucket) as st:
        fault = proxy.fail(put_to("/.collector/commit-"))
        assert st.commit(work[:5]) == 5  # the retry met 412 from its own first attempt
        assert fault.hits == 1
        assert st.commit(work[5:]) == 3  # the store goes on: it was never another writer
    assert_clean(bucket, {e.episode_id for e in work}, tmp_path, monkeypatch)


def test_forgets_record_whose_answer_was_lost_is_not_undone(
        faulty_s3: tuple[S3Bucket, FaultyProxy], tmp_path: Any, monkeypatch: Any) -> None:  # noqa: F811
    bucket, proxy = faulty_s3
    work = make_batch(9)
    gone = {work[0].episode_id, work[4].episode_id}
    with open_s3(bucket) as st:
        assert st.commit(work) == 9
        fault = proxy.fail(put_to("/.collector/commit-"))
        assert st.forget(gone) == 2  # the old shards are not "restored" over the landed record
        assert fault.hits == 1
        assert st.committed_ids() == {e.episode_id for e in work} - gone
    assert_clean(bucket, {e.episode_id for e in work} - gone, tmp_path, monkeypatch)


def test_a_lease_renewal_whose_answer_was_lost_keeps_the_lock(
        faulty_s3: tuple[S3Bucket, FaultyProxy], tmp_path: Any, monkeypatch: Any) -> None:  # noqa: F811
    bucket, proxy = faulty_s3
    work = make_batch(4)
    with open_s3(bucket) as st:
        fault = proxy.fail(put_to("/.collector/run.lock", "If-Match"))
        assert st.commit(work) == 4  # renewed before the record: the 412 was our own renewal
        assert fault.hits == 1
    assert_clean(bucket, {e.episode_id for e in work}, tmp_path, monkeypatch)


def test_a_compaction_on_close_whose_answer_was_lost_releases_the_lock(
        faulty_s3: tuple[S3Bucket, FaultyProxy], tmp_path: Any, monkeypatch: Any) -> None:  # noqa: F811
    bucket, proxy = faulty_s3
    work = make_batch(6)
    st = open_s3(bucket)
    assert st.commit(work) == 6
    fault = proxy.fail(put_to("/.collector/manifest.json", "If-Match"))
    st.close()
    assert fault.hits == 1
    assert not [k for k in bucket.keys("run/.collector/") if "/commit-" in k], "the log was not compacted"
    assert_clean(bucket, {e.episode_id for e in work}, tmp_path, monkeypatch)


def test_a_workers_pending_shard_put_whose_answer_was_lost_is_its_shard(
        faulty_s3: tuple[S3Bucket, FaultyProxy], tmp_path: Any, monkeypatch: Any) -> None:  # noqa: F811
    bucket, proxy = faulty_s3
    work = make_batch(5)
    with open_s3(bucket) as st:
        fault = proxy.fail(put_to("/.collector/tmp/", "If-None-Match"))
        ids = tuple(e.episode_id for e in work)
        shard = st.sink().write(episodes_to_table(work), "sim-perfect", 128, ids)
        assert fault.hits == 1
        assert st.commit_pending([shard]) == 5
    assert_clean(bucket, {e.episode_id for e in work}, tmp_path, monkeypatch)


def test_another_writers_record_is_still_lock_lost(
        faulty_s3: tuple[S3Bucket, FaultyProxy]) -> None:  # noqa: F811
    """The check is against what this writer sent: a record of other bytes at the seq, found by a
    retried create-only PUT, is another writer's, and the store stops."""
    from collector.storage.runstore import LockLost

    bucket, proxy = faulty_s3
    with open_s3(bucket) as st:
        st.commit(make_batch(2))
        theirs = b'{"seq": 2, "op": "commit", "at": "then", "next_part": 99, "remove": [], "add": []}'

        def lost_then_theirs(method: str, path: str, headers: Any) -> bool:
            if put_to("/.collector/commit-000000002")(method, path, headers):
                bucket.client.put_object(Bucket=bucket.name, Key="run/.collector/commit-000000002.json",
                                         Body=theirs)
                return True
            return False

        proxy.fail(lost_then_theirs, forward=False)
        with pytest.raises(LockLost, match="another writer committed record 2"):
            st.commit(make_batch(2, start=10))


def test_four_slowdowns_in_a_row_on_one_request_do_not_stop_the_run(
        faulty_s3: tuple[S3Bucket, FaultyProxy], tmp_path: Any, monkeypatch: Any) -> None:  # noqa: F811
    bucket, proxy = faulty_s3
    # The store's back-off shrunk from its 1 s start: botocore's own attempts (and their waits) stay.
    monkeypatch.setattr(s3client, "THROTTLE_BASE_S", 0.05)
    work = make_batch(4)
    with open_s3(bucket) as st:
        fault = proxy.fail(put_to("/.collector/commit-"), status=503, code="SlowDown", forward=False, times=4)
        assert st.commit(work) == 4
        assert fault.hits == 4
    assert_clean(bucket, {e.episode_id for e in work}, tmp_path, monkeypatch)


def test_throttling_is_retried_for_a_bounded_total(
        faulty_s3: tuple[S3Bucket, FaultyProxy], monkeypatch: Any) -> None:  # noqa: F811
    """A bucket that never stops throttling fails the request in one line once the documented
    total is spent (shrunk here), not forever."""
    bucket, proxy = faulty_s3
    # The store's bound alone, shrunk: one botocore attempt per send (its own back-off, up to 3 s
    # a request, is botocore's, not what this test is about), the store's waits from 50 ms.
    monkeypatch.setattr(s3client, "_MAX_ATTEMPTS", 1)
    monkeypatch.setattr(s3client, "THROTTLE_BASE_S", 0.05)
    monkeypatch.setattr(s3client, "THROTTLE_BUDGET_S", 0.5)
    with open_s3(bucket) as st:
        fault = proxy.fail(put_to("/.collector/commit-"), status=503, code="SlowDown", forward=False,
                           times=10**6)
        started = time.monotonic()
        with pytest.raises(OutputError, match=r"SlowDown") as info:
            st.commit(make_batch(2))
        assert "\n" not in str(info.value)
        # Our 0.5 s budget of waiting, then one line; a guard against sending forever, not a timing.
        assert time.monotonic() - started < 120
    # It was sent again until the budget was spent (50 ms, 100, 200, then what is left), not once.
    assert fault.hits >= 4

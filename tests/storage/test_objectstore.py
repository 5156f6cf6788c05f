"""A run in S3 (moto on loopback): exactly-once commits, one writer, recovery, refusals."""

from __future__ import annotations

import json
import pickle
import socket
import sys
from typing import Any, ClassVar

import pytest

from collector.errors import OutputError
from collector.storage import s3client
from collector.storage.local import LockLost
from collector.storage.opening import open_run_store
from collector.storage.s3store import S3RunStore, pending_rel
from tests.record.factory import make_batch
from tests.s3server import SECRET_ACCESS_KEY, S3Bucket

FP = "fingerprint-aaaaaaaaaaaa"
CFG: dict[str, Any] = {"name": "t"}


def open_s3(bucket: S3Bucket, rows: int = 3, fmt: str = "arrow", **kw: Any) -> S3RunStore:
    return S3RunStore.open(bucket.uri(), FP, CFG, fmt, rows, **kw)  # type: ignore[arg-type]


def data_ids(bucket: S3Bucket, store: S3RunStore) -> list[str]:
    """Every episode id in the objects under data/ (a plain listing, no manifest), with repeats."""
    ids: list[str] = []
    for key in bucket.keys("run/data/"):
        ids.extend(store.read_shard({"path": key.removeprefix("run/")}, ["episode_id"])
                   .column("episode_id").to_pylist())
    return ids


@pytest.mark.parametrize("fmt", ["arrow", "parquet"])
def test_commit_reopen_forget_round_trip(s3_bucket: S3Bucket, fmt: str) -> None:
    """Committed ids survive a reopen, data/ holds exactly the committed shards, forget takes ids out."""
    work = make_batch(10)
    with open_s3(s3_bucket, fmt=fmt) as st:
        assert st.commit(work[:7]) == 7
        assert st.commit(work[4:]) == 3  # overlap: only the new ones
    assert not [k for k in s3_bucket.keys("run/") if "/tmp/" in k]
    with open_s3(s3_bucket, fmt=fmt) as st:
        assert st.warnings == []
        assert st.committed_ids() == {e.episode_id for e in work}
        assert sorted(data_ids(s3_bucket, st)) == sorted(e.episode_id for e in work)
        assert {e["path"] for e in st.shards} == {k.removeprefix("run/") for k in s3_bucket.keys("run/data/")}
        assert st.forget([work[0].episode_id, work[8].episode_id, "not-committed"]) == 2
    with open_s3(s3_bucket, fmt=fmt) as st:
        left = {e.episode_id for e in work} - {work[0].episode_id, work[8].episode_id}
        assert st.committed_ids() == left
        assert sorted(data_ids(s3_bucket, st)) == sorted(left)
        assert st.warnings == []
    got = s3_bucket.client.get_object(Bucket=s3_bucket.name, Key="run/.collector/manifest.json")
    manifest = json.loads(got["Body"].read())
    assert manifest["format"] == fmt
    assert manifest["fingerprint"] == FP
    assert not [k for k in s3_bucket.keys("run/.collector/") if "commit-" in k]  # compacted on close
    assert "run/.collector/run.lock" not in s3_bucket.keys("run/")  # released


def test_a_second_writer_is_refused_in_one_line(s3_bucket: S3Bucket) -> None:
    """While one store holds the run, a second open is refused in one line naming the holder."""
    with open_s3(s3_bucket) as st:
        st.commit(make_batch(2))
        with pytest.raises(OutputError) as info:
            open_s3(s3_bucket)
        message = str(info.value)
        assert "in use by another collector process" in message
        assert "\n" not in message
        assert f"host {socket.gethostname()}" in message
        assert "pid " in message
        assert st.commit(make_batch(4)) == 2  # the first writer is unaffected


def test_a_writer_whose_lock_was_taken_over_gets_lock_lost(s3_bucket: S3Bucket) -> None:
    """A writer whose expired lease was taken over gets LockLost; the bucket holds the other's work."""
    first, second, third = make_batch(3), make_batch(3, start=10), make_batch(3, start=20)
    a = open_s3(s3_bucket, lease_s=0.0)  # a lease that has always expired: anyone may take it over
    a.commit(first)
    with open_s3(s3_bucket) as b:
        assert b.committed_ids() == {e.episode_id for e in first}
        with pytest.raises(LockLost, match="taken over"):
            a.commit(third)  # before b's first commit: the renewal alone must refuse it
        b.commit(second)
        with pytest.raises(LockLost):
            a.commit(third)  # and stays stopped
        a.close()
        assert "run/.collector/run.lock" in s3_bucket.keys("run/")  # a's close left b's lock alone
    with open_s3(s3_bucket) as st:
        assert st.committed_ids() == {e.episode_id for e in first + second}
        assert sorted(data_ids(s3_bucket, st)) == sorted(e.episode_id for e in first + second)
        assert st.warnings == []


def test_a_record_another_writer_created_first_is_never_overwritten(s3_bucket: S3Bucket) -> None:
    """The commit record is create-only: when its seq exists already, the commit is LockLost and
    nothing of it reaches data/ or the record."""
    with open_s3(s3_bucket) as st:
        st.commit(make_batch(3))
        theirs = {"seq": 2, "op": "commit", "at": "then", "next_part": 99, "remove": [], "add": []}
        key = "run/.collector/commit-000000002.json"
        s3_bucket.client.put_object(Bucket=s3_bucket.name, Key=key, Body=json.dumps(theirs))
        before = s3_bucket.keys("run/data/")
        with pytest.raises(LockLost, match="another writer committed record 2"):
            st.commit(make_batch(3, start=10))
        assert s3_bucket.keys("run/data/") == before
        assert not s3_bucket.keys("run/.collector/tmp/")
        got = s3_bucket.client.get_object(Bucket=s3_bucket.name, Key=key)
        assert json.loads(got["Body"].read()) == theirs


def test_a_compaction_never_overwrites_a_base_it_did_not_read(s3_bucket: S3Bucket) -> None:
    """The base manifest is replaced only over the version this writer read (If-Match on its ETag)."""
    st = open_s3(s3_bucket)
    st.commit(make_batch(3))
    key = "run/.collector/manifest.json"
    got = s3_bucket.client.get_object(Bucket=s3_bucket.name, Key=key)
    theirs = {**json.loads(got["Body"].read()), "updated": "by another writer"}
    s3_bucket.client.put_object(Bucket=s3_bucket.name, Key=key, Body=json.dumps(theirs))
    st.close()  # compacts on close: refused, the other's base stays
    got = s3_bucket.client.get_object(Bucket=s3_bucket.name, Key=key)
    assert json.loads(got["Body"].read())["updated"] == "by another writer"
    assert "run/.collector/commit-000000001.json" in s3_bucket.keys("run/")  # the record stays the truth


def test_a_deleted_and_recreated_lock_stops_the_old_writer(s3_bucket: S3Bucket) -> None:
    """A lock object deleted and re-created by someone else is not ours: the next commit is LockLost."""
    with open_s3(s3_bucket) as st:
        st.commit(make_batch(2))
        key = "run/.collector/run.lock"
        s3_bucket.client.delete_object(Bucket=s3_bucket.name, Key=key)
        s3_bucket.client.put_object(Bucket=s3_bucket.name, Key=key, Body=b'{"host": "elsewhere", "pid": 1}')
        with pytest.raises(LockLost):
            st.commit(make_batch(4))
    with open_s3(s3_bucket, lease_s=0.0) as st:  # (the foreign lock has no lease_s: ours, 0, applies)
        assert len(st.committed_ids()) == 2
    with open_s3(s3_bucket) as st:
        s3_bucket.client.delete_object(Bucket=s3_bucket.name, Key=key)  # deleted, not re-created
        with pytest.raises(LockLost):
            st.commit(make_batch(4))
    with open_s3(s3_bucket) as st:
        assert len(st.committed_ids()) == 2


def test_an_interrupted_copy_is_finished_and_strays_quarantined(s3_bucket: S3Bucket) -> None:
    """A committed shard left in tmp/ is copied into data/ on open; a stray in data/ is moved aside."""
    work = make_batch(5)
    with open_s3(s3_bucket) as st:
        st.commit(work)
        entry = st.shards[0]
    # As if the process died between the record and the copy: the shard is only in tmp/.
    c, b = s3_bucket.client, s3_bucket.name
    c.copy_object(Bucket=b, Key=f"run/{pending_rel(entry['path'])}",
                  CopySource={"Bucket": b, "Key": f"run/{entry['path']}"})
    c.delete_object(Bucket=b, Key=f"run/{entry['path']}")
    c.put_object(Bucket=b, Key="run/data/part-stray.arrow", Body=b"not ours")
    c.put_object(Bucket=b, Key="run/.collector/tmp/part-orphan.arrow.tmp", Body=b"uncommitted")
    with open_s3(s3_bucket) as st:
        assert st.committed_ids() == {e.episode_id for e in work}
        assert any("finished copying 1" in w for w in st.warnings)
        assert any("stray object data/part-stray.arrow" in w for w in st.warnings)
        assert sorted(data_ids(s3_bucket, st)) == sorted(e.episode_id for e in work)
    keys = s3_bucket.keys("run/")
    assert not [k for k in keys if "/tmp/" in k]
    assert "run/.collector/quarantine/data__part-stray.arrow.quarantined" in keys


def test_a_damaged_shard_is_quarantined_and_its_episodes_run_again(s3_bucket: S3Bucket) -> None:
    """A committed object whose bytes changed (same size) fails its sha256: quarantined, ids not committed."""
    with open_s3(s3_bucket) as st:
        st.commit(make_batch(6))
        entry = st.shards[0]
    key = f"run/{entry['path']}"
    body = bytearray(s3_bucket.client.get_object(Bucket=s3_bucket.name, Key=key)["Body"].read())
    body[len(body) // 2] ^= 0xFF
    s3_bucket.client.put_object(Bucket=s3_bucket.name, Key=key, Body=bytes(body))
    with open_s3(s3_bucket) as st:
        assert len(st.committed_ids()) == 6 - entry["rows"]
        assert any("checksum differs" in w for w in st.warnings)
    assert key not in s3_bucket.keys("run/")


def test_an_endpoint_ignoring_if_none_match_is_refused(
    s3_bucket: S3Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store that accepts a create-only PUT over an existing key is refused before anything is written."""
    real = s3client.make_client

    def stripping() -> Any:
        client = real()

        def strip(params: dict[str, Any], **_: Any) -> None:
            params.pop("IfNoneMatch", None)

        client.meta.events.register("provide-client-params.s3.PutObject", strip)
        return client

    monkeypatch.setattr(s3client, "make_client", stripping)
    with pytest.raises(OutputError) as info:
        open_s3(s3_bucket)
    assert "ignores conditional writes (If-None-Match); exactly-once cannot be guaranteed" in str(info.value)
    assert s3_bucket.keys("run/") == []  # the probe deleted, no lock, no manifest


def test_a_missing_bucket_and_a_wrong_secret_are_one_line(
    s3_bucket: S3Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S3 failures are one line naming the bucket and the S3 code, never the secret."""
    with pytest.raises(OutputError) as info:
        S3RunStore.open("s3://no-such-bucket-here/run", FP, CFG)
    assert "s3://no-such-bucket-here/" in str(info.value)
    assert "NoSuchBucket" in str(info.value)
    with pytest.raises(OutputError, match="is not an object-store location"):
        S3RunStore.open("runs/local", FP, CFG)
    assert isinstance(open_run_store(s3_bucket.uri(), FP, CFG), S3RunStore)


def test_a_failure_names_the_code_and_scrubs_the_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    """Text surfaced from botocore never carries a credential's value."""
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_ACCESS_KEY)

    class Failure(Exception):
        response: ClassVar[dict[str, Any]] = {
            "Error": {"Code": "Weird", "Message": f"bad {SECRET_ACCESS_KEY} here"},
            "ResponseMetadata": {"HTTPStatusCode": 400},
        }

    code, meaning = s3client.describe(Failure())
    assert code == "Weird"
    assert SECRET_ACCESS_KEY not in meaning
    assert "***" in meaning


def test_worker_side_shards_are_committed_by_name_once(s3_bucket: S3Bucket) -> None:
    """A pickled sink's pending shard is invisible until commit_pending names it; a duplicate is dropped."""
    from collector.record.shards import episodes_to_table
    from collector.storage.local import CommitIncomplete

    work = make_batch(6)

    def write(sink: Any, eps: list[Any]) -> Any:
        return sink.write(episodes_to_table(eps), "sim-perfect", 128, tuple(e.episode_id for e in eps))

    with open_s3(s3_bucket) as st:
        sink = pickle.loads(pickle.dumps(st.sink()))  # as a worker receives it
        shard = write(sink, work[:4])
        assert s3_bucket.keys("run/data/") == []  # pending: no reader sees it
        assert f"run/{pending_rel(shard.path)}" in s3_bucket.keys("run/")
        assert st.commit_pending([shard]) == 4
        assert s3_bucket.keys("run/data/") == [f"run/{shard.path}"]
        late = write(sink, work[2:6])
        with pytest.raises(CommitIncomplete) as info:
            st.commit_pending([late])  # holds 2 committed ids: dropped whole, the 2 new ones run again
        assert info.value.uncommitted == {e.episode_id for e in work[4:6]}
        orphan = write(sink, work[4:6])
    with open_s3(s3_bucket) as st:
        assert st.committed_ids() == {e.episode_id for e in work[:4]}
        assert st.warnings == []  # size and sha256 the sink recorded match the object
        assert st.commit(work) == 2
    assert f"run/{pending_rel(orphan.path)}" not in s3_bucket.keys("run/")  # removed by the open
    assert not s3_bucket.keys("run/.collector/tmp/")


def test_without_boto3_an_s3_run_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """boto3 not installed: one line naming the extra to install, not an ImportError traceback."""
    monkeypatch.setitem(sys.modules, "boto3", None)  # `import boto3` now raises ImportError
    with pytest.raises(OutputError, match=r"pip install 'collector\[s3\]'"):
        S3RunStore.open("s3://some-bucket/run", FP, CFG)


def test_a_failed_read_while_verifying_stops_the_open_and_quarantines_nothing(
    s3_bucket: S3Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GET that fails on open (throttling, a timeout) is one line; no good shard is moved aside."""
    with open_s3(s3_bucket) as st:
        st.commit(make_batch(6))
    real = s3client.S3Bucket.get

    def throttled(self: s3client.S3Bucket, key: str) -> Any:
        if "/data/" in key:
            raise OutputError(f"s3://{self.name}/{key}: read failed: slow down (SlowDown)")
        return real(self, key)

    with monkeypatch.context() as patched:
        patched.setattr(s3client.S3Bucket, "get", throttled)
        with pytest.raises(OutputError, match="SlowDown"):
            open_s3(s3_bucket)
    assert not s3_bucket.keys("run/.collector/quarantine/")
    with open_s3(s3_bucket) as st:
        assert len(st.committed_ids()) == 6
        assert st.warnings == []


def test_a_foreign_prefix_another_config_or_format_is_refused_in_one_line(s3_bucket: S3Bucket) -> None:
    """Like a local run dir: another fingerprint, another format, or a prefix of other objects is refused."""
    with open_s3(s3_bucket) as st:
        st.commit(make_batch(2))
    with pytest.raises(OutputError, match="written by a different config"):
        S3RunStore.open(s3_bucket.uri(), "another-fingerprint", CFG, "arrow", 3)
    with pytest.raises(OutputError, match=r'holds arrow shards; set output\.format = "arrow"'):
        open_s3(s3_bucket, fmt="parquet")
    s3_bucket.client.put_object(Bucket=s3_bucket.name, Key="other/notes.txt", Body=b"not a run")
    with pytest.raises(OutputError, match=r"is not empty and is not a run .*it holds notes\.txt"):
        S3RunStore.open(s3_bucket.uri("other"), FP, CFG)
    with open_s3(s3_bucket) as st:  # every refusal released the lock it took
        assert len(st.committed_ids()) == 2

"""The S3 lock's lease cannot be bypassed: a holder is "gone" only when it ran on this very host
(kernel and pid namespace, not a shared hostname), ages are the store's clock only, and the lease
is renewed while a long open or a large commit is under way."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import types
from typing import Any

import pytest

from collector.errors import OutputError
from collector.storage import s3lease
from collector.storage.s3store import S3RunStore
from tests.record.factory import make_batch
from tests.s3server import S3Bucket

FP = "fingerprint-lease"
LOCK_KEY = "run/.collector/run.lock"


def open_s3(bucket: S3Bucket, rows: int = 3, **kw: Any) -> S3RunStore:
    return S3RunStore.open(bucket.uri(), FP, {}, "arrow", rows, **kw)


def dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    return int(proc.stdout)


def plant_lock(bucket: S3Bucket, **token: Any) -> None:
    bucket.client.put_object(Bucket=bucket.name, Key=LOCK_KEY, Body=json.dumps(token))


def lock_token(bucket: S3Bucket) -> dict[str, Any]:
    got = bucket.client.get_object(Bucket=bucket.name, Key=LOCK_KEY)
    token: dict[str, Any] = json.loads(got["Body"].read())
    return token


class _Ahead(dt.datetime):
    """This writer's clock, an hour ahead of the store's."""

    @classmethod
    def now(cls, tz: dt.tzinfo | None = None) -> _Ahead:  # type: ignore[override]
        real = dt.datetime.now(tz)
        return cls.fromtimestamp(real.timestamp() + 3600, tz)


def test_host_identity_names_the_kernel_and_the_pid_namespace() -> None:
    machine, namespace = s3lease.host_identity().rsplit(":", 1)
    assert machine
    assert namespace.isdigit()


def test_a_fast_writer_clock_never_expires_a_live_lease(
        s3_bucket: S3Bucket, monkeypatch: pytest.MonkeyPatch) -> None:
    """A holder elsewhere renewed a minute's lease just now; this writer's clock runs an hour
    ahead. The age is the store's (its Date against the lock's LastModified): refused."""
    with open_s3(s3_bucket) as st:
        st.commit(make_batch(2))
    plant_lock(s3_bucket, host="elsewhere", host_id="other:1", pid=1, uuid="x", started="then", lease_s=60)
    monkeypatch.setattr(s3lease, "dt", types.SimpleNamespace(datetime=_Ahead, UTC=dt.UTC))
    with pytest.raises(OutputError, match="in use by another collector process"):
        open_s3(s3_bucket)


def test_an_expired_lease_is_still_taken_over(s3_bucket: S3Bucket) -> None:
    """A lease of 0 s has expired by the store's clock the moment it was written."""
    with open_s3(s3_bucket) as st:
        st.commit(make_batch(2))
    plant_lock(s3_bucket, host="elsewhere", host_id="other:1", pid=1, uuid="x", started="then", lease_s=0)
    with open_s3(s3_bucket) as st:
        assert len(st.committed_ids()) == 2


def test_the_lease_is_renewed_while_an_open_verifies_its_shards(s3_bucket: S3Bucket) -> None:
    """Verifying thousands of shards takes longer than a lease: it is renewed between them (a
    lease of 0 s is due at every step, so each verification renews)."""
    with open_s3(s3_bucket, rows=1) as st:
        st.commit(make_batch(6))
    with open_s3(s3_bucket, rows=1, lease_s=0.0) as st:
        assert len(st.shards) == 6
        assert lock_token(s3_bucket)["renewals"] >= 6


def test_the_lease_is_renewed_while_a_large_commit_writes_its_shards(s3_bucket: S3Bucket) -> None:
    with open_s3(s3_bucket, rows=1, lease_s=0.0) as st:
        before = lock_token(s3_bucket)["renewals"]
        assert st.commit(make_batch(5)) == 5  # five shard PUTs, then the record
        assert lock_token(s3_bucket)["renewals"] - before >= 5 + 1


def test_without_a_date_header_the_stores_clock_is_a_probe_objects(
        s3_bucket: S3Bucket, monkeypatch: pytest.MonkeyPatch) -> None:
    """An endpoint whose answers carry no Date: the age is still the store's (the LastModified of
    a probe key written now), never this writer's clock; the probe key is removed."""
    from collector.storage import s3client

    with open_s3(s3_bucket) as st:
        st.commit(make_batch(2))
    plant_lock(s3_bucket, host="elsewhere", host_id="other:1", pid=1, uuid="x", started="then", lease_s=60)
    real = s3client.S3Bucket.get_with_date

    def undated(self: s3client.S3Bucket, key: str) -> Any:
        found = real(self, key)
        return None if found is None else (*found[:3], None)

    monkeypatch.setattr(s3client.S3Bucket, "get_with_date", undated)
    monkeypatch.setattr(s3lease, "dt", types.SimpleNamespace(datetime=_Ahead, UTC=dt.UTC))
    with pytest.raises(OutputError, match="in use by another collector process"):
        open_s3(s3_bucket)
    assert not [k for k in s3_bucket.keys("run/.collector/") if "/probe-" in k]

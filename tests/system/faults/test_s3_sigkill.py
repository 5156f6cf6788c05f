"""SIGKILL a writer of an S3 run at any S3 request: nothing committed is lost, nothing counted twice."""

from __future__ import annotations

import json
import os
import random
import signal
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

from collector.storage.manifest import fold_records
from collector.storage.s3store import S3RunStore
from tests.record.factory import make_batch
from tests.s3server import S3Bucket
from tests.system.forkserver import STORES, Zygote

ROOT = Path(__file__).resolve().parents[3]

# What every child imports, done once in the zygote that forks them (tests/system/forkserver.py),
# with a client built once: botocore's parsed description of S3 is shared by the clients each child
# builds (collector.storage.s3client._session), as a long-lived process shares it.
_WARM = STORES + """
from collector.storage import s3client, s3store
s3client.make_client()
"""

# The child: a writer whose boto3 client dies (SIGKILL to itself) right before or after its
# n-th S3 request of one kind. A test-only wrapper around the client, nothing in production code.
_KILLER = textwrap.dedent(
    """
    import os, signal, sys, threading
    from collector.storage import commit as commit_mod
    from collector.storage import s3store as objectstore
    from collector.storage import s3client
    from tests.record.factory import make_batch

    uri, kind, when = sys.argv[1], sys.argv[4], sys.argv[6]
    first, count, n = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[5])
    commit_mod._COMPACT_MIN_RECORDS = 3  # compactions inside the loop, not only on close
    seen = 0
    counting = threading.Lock()
    forgetting = False

    def matches(method, kw):
        global kind
        key = kw.get("Key", "")
        if kind.startswith("forget-"):  # only the requests of the forget at the end of the run
            if not forgetting:
                return False
            kind = kind.removeprefix("forget-")
        if kind == "record":
            return method == "put_object" and "/.collector/commit-" in key
        if kind == "shard":
            return method == "put_object" and "/.collector/tmp/" in key
        if kind == "compaction":
            return method == "put_object" and key.endswith("/.collector/manifest.json") and "IfMatch" in kw
        if kind == "copy":
            return method == "copy_object"
        if kind == "delete":
            return method == "delete_object"
        raise SystemExit(f"unknown kind {kind}")

    class Killing:
        def __init__(self, client):
            self._client = client

        def __getattr__(self, name):
            attr = getattr(self._client, name)
            if name not in ("put_object", "copy_object", "delete_object"):
                return attr

            def call(**kw):
                global seen
                with counting:  # the store publishes shards from several threads
                    hit = matches(name, kw)
                    seen += hit
                    mine = seen
                if hit and mine == n and when == "before":
                    os.kill(os.getpid(), signal.SIGKILL)
                out = attr(**kw)
                if hit and mine == n and when == "after":
                    os.kill(os.getpid(), signal.SIGKILL)
                return out
            return call

    real = s3client.make_client
    s3client.make_client = lambda: Killing(real())
    work = make_batch(count, start=first)
    st = objectstore.S3RunStore.open(uri, "fp", {}, "arrow", 3)
    done = st.committed_ids()
    for i in range(0, len(work), 7):  # overlapping batches: many commits, late duplicates among them
        st.commit([e for e in work[max(0, i - 3):i + 7] if e.episode_id not in done])
    forgetting = True
    st.forget([e.episode_id for e in work[::6]])  # shards replaced: copies aside, a record, copies back
    st.close()
    print(seen)
    sys.exit(3)  # not killed: the kill point is past the end of this run
    """
)

_RNG = random.Random(19)
# (first task, kind of request, n-th of that kind, before/after it). Each child run has 10 new
# episodes at least, overlapping the previous run's range (20 episodes a run): counted without a
# kill, a run makes 4 record PUTs (3 commits and a forget),
# 9-11 shard PUTs, 13-15 copies, 23-25 deletes and 2 compactions (every 3 records, and on close),
# its forget 1 record, 7-8 copies and 13-14 deletes, plus the recovery of the previous kill: every
# n below lands (a child that ends unkilled fails the test). Twice the episodes a run made every
# reopen's checks read twice the shards, for no kill point more (24 s of CPU against 16).
_KILLS = [
    (0, "record", 2, "after"),
    (10, "copy", _RNG.randint(1, 6), "before"),
    (20, "compaction", 1, "after"),
    (30, "delete", _RNG.randint(1, 6), _RNG.choice(["before", "after"])),
    (40, "record", _RNG.randint(1, 4), "before"),
    (50, "shard", _RNG.randint(1, 6), _RNG.choice(["before", "after"])),
    (60, "compaction", 1, "before"),
    (70, "copy", _RNG.randint(1, 6), "after"),
    (80, "delete", _RNG.randint(1, 6), "after"),
    # Inside the forget that ends each run (it replaces 2 shards at least: 2 copies aside, 2
    # deletes from data/, 1 record, then the replacements copied in and the old copies deleted).
    (90, "forget-record", 1, "before"),
    (100, "forget-record", 1, "after"),
    (110, "forget-copy", _RNG.randint(1, 3), _RNG.choice(["before", "after"])),
    (120, "forget-delete", _RNG.randint(1, 2), _RNG.choice(["before", "after"])),
]


def _ids_of(bucket: S3Bucket, key: str) -> list[str]:
    body = bucket.client.get_object(Bucket=bucket.name, Key=key)["Body"].read()
    table = ipc.open_file(pa.py_buffer(body)).read_all()
    return [str(i) for i in table.column("episode_id").to_pylist()]


def _glob_ids(bucket: S3Bucket, read: dict[tuple[str, str], list[str]]) -> list[str]:
    """What a plain reader of data/ counts (a listing, no manifest), with repeats. `read` holds
    the ids of every (key, ETag) already read: data/ grows by a few shards per child run and is
    read twice after each, so only new or replaced objects are fetched (the ETag is the content's
    MD5: a forget's new content under an old key has a new one)."""
    ids: list[str] = []
    pages = bucket.client.get_paginator("list_objects_v2").paginate(Bucket=bucket.name, Prefix="run/data/")
    for page in pages:
        for obj in page.get("Contents", []):
            seen = (obj["Key"], obj["ETag"])
            if seen not in read:
                read[seen] = _ids_of(bucket, obj["Key"])
            ids += read[seen]
    return ids


def _committed_paths(bucket: S3Bucket) -> set[str]:
    """The shards the bucket's manifest and commit log name, folded as every reader does."""
    keys = bucket.keys("run/.collector/")
    if "run/.collector/manifest.json" not in keys:
        return set()
    got = bucket.client.get_object(Bucket=bucket.name, Key="run/.collector/manifest.json")
    base = json.loads(got["Body"].read())
    records = []
    for key in keys:
        name = key.rsplit("/", 1)[-1]
        if name.startswith("commit-") and int(name[7:16]) > base["log_through"]:
            records.append(json.loads(bucket.client.get_object(Bucket=bucket.name, Key=key)["Body"].read()))
    return {entry["path"] for entry in fold_records(base, sorted(records, key=lambda r: r["seq"]))["shards"]}


def test_sigkill_at_any_s3_request_never_loses_or_duplicates(s3_bucket: S3Bucket) -> None:
    """SIGKILL at a record PUT, copy, delete, shard PUT or compaction, in a commit or a forget: no id
    twice, nothing committed lost.

    After each kill, before anything reopens the run: a listing of data/ counts each id at
    most once, and only ids the reopened store reports committed; every shard the bucket's
    manifest + log name stays committed through the reopen. After the reopen data/ holds
    exactly the committed ids and tmp/ is empty.
    """
    env = {**os.environ, **s3_bucket.env(), "PYTHONPATH": str(ROOT)}
    count = 20  # per child run; kill points and the checks after each: _KILLS
    uri = s3_bucket.uri()
    read: dict[tuple[str, str], list[str]] = {}
    with Zygote(_WARM, env=env, cwd=ROOT) as zygote:
        for first, kind, n, when in _KILLS:
            rc = zygote.run(_KILLER, uri, str(first), str(count), kind, str(n), when)
            assert rc == -signal.SIGKILL, f"no kill at {kind} #{n} {when} (rc {rc})"
            seen = _glob_ids(s3_bucket, read)
            assert len(seen) == len(set(seen)), f"data/ counts a row twice after a kill at {kind} #{n} {when}"
            named = _committed_paths(s3_bucket)
            with S3RunStore.open(uri, "fp", {}, "arrow", 3) as st:
                committed = st.committed_ids()
                assert set(seen) <= committed, "a plain reader saw a row the resume collects again"
                lost = named - {e["path"] for e in st.shards}
                assert not lost, f"a committed shard was lost ({kind} #{n} {when})"
                assert not [w for w in st.warnings if "corrupt" in w]
                rows = _glob_ids(s3_bucket, read)
                assert len(rows) == len(set(rows))
                assert set(rows) == committed
                assert not s3_bucket.keys("run/.collector/tmp/")
    work = make_batch(_KILLS[-1][0] + count + 5)
    with S3RunStore.open(uri, "fp", {}, "arrow", 3) as st:
        assert 0 < len(st.committed_ids()) < len(work)  # the kills landed mid-run
        st.commit(work)
    assert sorted(_glob_ids(s3_bucket, read)) == sorted(e.episode_id for e in work)

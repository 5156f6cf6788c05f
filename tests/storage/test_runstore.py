"""The run store's shared surface: `CommitIncomplete` across pickle (it crosses Ray), the
`RunStore` protocol both stores satisfy, and `open_run_store` importing boto3 only for s3://."""

from __future__ import annotations

import pickle
from pathlib import Path

from collector.storage.local import LocalRunStore
from collector.storage.opening import open_run_store
from collector.storage.runstore import CommitIncomplete, RunStore
from collector.storage.s3store import S3RunStore
from tests.record.factory import make_batch
from tests.s3server import S3Bucket

ROOT = Path(__file__).resolve().parents[2]


def test_commit_incomplete_survives_a_pickle_round_trip() -> None:
    """All three fields come back (the default pickling calls __init__ with the message only,
    which raises TypeError on unpickling: a worker's error would never reach the driver)."""
    error = CommitIncomplete("2 episode(s) could not be committed to run (x)", 5, {"a", "b"})
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is CommitIncomplete
    assert str(back) == str(error)
    assert back.committed == 5
    assert back.uncommitted == {"a", "b"}


def test_both_stores_are_run_stores(tmp_path: Path, s3_bucket: S3Bucket) -> None:
    """Either store, opened through the one door, commits and reads through the protocol."""
    for where in (tmp_path / "run", s3_bucket.uri()):
        st: RunStore = open_run_store(where, "fp", {}, "arrow", 3)
        with st:
            assert isinstance(st, LocalRunStore | S3RunStore)
            assert st.commit(make_batch(4)) == 4
            assert sum(e["rows"] for e in st.shards) == 4
            table = st.read_shard(st.shards[0], ["episode_id"])
            assert table.num_rows == st.shards[0]["rows"]

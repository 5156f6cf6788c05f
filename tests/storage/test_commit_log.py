"""The append-only commit log: commits that cost the same at the end of a run as at its start,
read correctly by every reader before and after a compaction, and safe at every crash point."""

from __future__ import annotations

import json
import random
import textwrap
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from collector.analysis.check import check_run
from collector.analysis.export import export_run
from collector.analysis.stats import compute_stats
from collector.analysis.tables import load_run
from collector.errors import OutputError
from collector.record.shards import read_shard
from collector.storage import commit as commit_mod
from collector.storage import local as store_mod
from collector.storage import manifest as manifest_mod
from collector.storage.local import LocalRunStore
from collector.storage.manifest import (
    LOCK,
    MANIFEST,
    commit_record_path,
    commit_record_seqs,
    committed_shard_paths,
    read_manifest,
)
from tests.record.factory import make_batch

FP = "fingerprint-log"
ROOT = Path(__file__).resolve().parents[2]


def open_store(run_dir: Path, rows: int = 4) -> LocalRunStore:
    return LocalRunStore.open(run_dir, FP, {}, "arrow", rows)


def manifest_ids(run_dir: Path) -> list[str]:
    """Committed ids with repeats, read through the manifest (and its log) like every reader."""
    return [i for p in committed_shard_paths(run_dir)
            for i in read_shard(p, ["episode_id"]).column("episode_id").to_pylist()]


def glob_ids(run_dir: Path) -> list[str]:
    """Ids a plain reader sees: a pyarrow dataset over the run dir, no manifest."""
    dataset = ds.dataset(run_dir, format="ipc")
    if not dataset.files:
        return []
    return dataset.to_table(columns=["episode_id"]).column("episode_id").to_pylist()


def test_a_commit_writes_one_record_of_its_own_size_not_the_manifest(tmp_path: Path) -> None:
    """A commit leaves the base manifest untouched and writes one record naming only its own
    shards, so its cost does not grow with the shards already committed."""
    run = tmp_path / "run"
    work = make_batch(40)
    st = open_store(run)
    st.commit(work[:20])  # 5 shards
    base = (run / MANIFEST).read_bytes()
    st.commit(work[20:24])  # 1 shard
    assert (run / MANIFEST).read_bytes() == base
    seqs = commit_record_seqs(run)
    assert seqs == [1, 2]
    record = json.loads(commit_record_path(run, 2).read_text())
    assert [entry["rows"] for entry in record["add"]] == [4]
    assert record["remove"] == []
    assert sorted(manifest_ids(run)) == sorted(e.episode_id for e in work[:24])
    st.close()


def test_every_reader_sees_an_uncompacted_log(tmp_path: Path) -> None:
    """Commits and a forget still only in the log (the writer never closed): check, stats, load_run,
    export and a plain glob all see exactly the committed episodes."""
    run = tmp_path / "run"
    work = make_batch(12)
    st = open_store(run)
    st.commit(work[:8])
    st.commit(work[8:])
    st.forget({work[0].episode_id, work[9].episode_id})
    assert commit_record_seqs(run) == [1, 2, 3]
    kept = sorted(e.episode_id for e in work if e.episode_id not in {work[0].episode_id, work[9].episode_id})
    assert sorted(manifest_ids(run)) == kept
    assert sorted(glob_ids(run)) == kept
    assert check_run(run).ok
    assert check_run(run).episodes == 10
    assert compute_stats(run).episodes == 10
    assert load_run(run).num_rows == 10
    assert export_run(run, tmp_path / "out.parquet", "parquet") == 10
    del st  # the process "dies" holding the lock: no compaction on close
    with open_store(run) as again:
        assert sorted(again.committed_ids()) == kept
        assert commit_record_seqs(run) == []  # compacted on open
    base = json.loads((run / MANIFEST).read_text())  # the base alone now says it all
    folded = read_manifest(run)["shards"]
    assert sorted(e["path"] for e in base["shards"]) == sorted(e["path"] for e in folded)


def test_the_log_is_compacted_and_readers_agree_before_and_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the log holds enough records the store folds them into the base manifest and deletes
    them; the committed state is the same throughout, and close leaves one manifest."""
    monkeypatch.setattr(commit_mod, "_COMPACT_MIN_RECORDS", 3)
    run = tmp_path / "run"
    work = make_batch(28)
    st = open_store(run)
    for i in range(0, 28, 4):
        st.commit(work[i:i + 4])
        assert len(commit_record_seqs(run)) < 3
        assert sorted(manifest_ids(run)) == sorted(e.episode_id for e in work[:i + 4])
    assert read_manifest(run)["log_through"] == 7
    assert json.loads((run / MANIFEST).read_text())["log_through"] == 6  # compacted at 3 and 6
    st.close()
    assert commit_record_seqs(run) == []
    assert len(json.loads((run / MANIFEST).read_text())["shards"]) == 7


def test_a_crash_between_compaction_steps_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dying after the compacted base is in place but before its records are deleted: readers
    skip the folded records (no row counted twice), and the next open deletes them."""
    run = tmp_path / "run"
    work = make_batch(12)
    st = open_store(run)
    st.commit(work[:4])
    st.commit(work[4:8])

    def die(self: LocalRunStore) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(LocalRunStore, "_drop_folded_records", die)
    with pytest.raises(KeyboardInterrupt):
        st._compact("compaction")
    monkeypatch.undo()
    assert commit_record_seqs(run) == [1, 2]  # folded into the base, still on disk
    assert sorted(manifest_ids(run)) == sorted(e.episode_id for e in work[:8])
    del st
    with open_store(run) as again:
        assert commit_record_seqs(run) == []
        assert again.commit(work) == 4
    assert sorted(manifest_ids(run)) == sorted(e.episode_id for e in work)


def test_a_commit_cut_short_never_reaches_the_base_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit cut short before its record landed (Ctrl-C inside the write) stays uncommitted even
    after later commits succeed and the store closes: memory is never compacted into the base."""
    run = tmp_path / "run"
    work = make_batch(12)
    st = open_store(run)
    st.commit(work[:4])

    def interrupted(path: Path, payload: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(store_mod, "write_json_atomic", interrupted)
    with pytest.raises(KeyboardInterrupt):
        st.commit(work[4:8])
    monkeypatch.undo()
    assert st.commit(work[8:]) == 4
    st.close()
    expected = {e.episode_id for e in work[:4] + work[8:]}
    assert set(manifest_ids(run)) == expected
    with open_store(run) as again:
        assert again.committed_ids() == expected


def test_a_writer_that_lost_the_lock_never_compacts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lock replaced just after a commit's swap (another writer took the run dir over): the
    compaction due then is skipped, so a stale writer never replaces the new writer's base."""
    monkeypatch.setattr(commit_mod, "_COMPACT_MIN_RECORDS", 2)
    run = tmp_path / "run"
    work = make_batch(8)
    st = open_store(run)
    st.commit(work[:4])
    base = (run / MANIFEST).read_bytes()
    real_publish = LocalRunStore._publish

    def publish_then_lose_the_lock(self: LocalRunStore, entries: list[dict[str, object]]) -> None:
        real_publish(self, entries)
        (run / LOCK).unlink()
        (run / LOCK).touch()

    monkeypatch.setattr(LocalRunStore, "_publish", publish_then_lose_the_lock)
    assert st.commit(work[4:]) == 4  # committed (its record is in), then the lock went
    assert (run / MANIFEST).read_bytes() == base
    assert commit_record_seqs(run) == [1, 2]
    st.close()
    assert (run / MANIFEST).read_bytes() == base
    assert sorted(manifest_ids(run)) == sorted(e.episode_id for e in work)


def test_a_reader_racing_a_compaction_reads_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A compaction between a reader's read of the base and its listing of the records (they are
    gone, the base it read is old) makes the reader read again, never miss a commit."""
    run = tmp_path / "run"
    work = make_batch(12)
    st = open_store(run)
    for i in range(0, 12, 4):
        st.commit(work[i:i + 4])
    real = manifest_mod.commit_record_seqs
    raced: list[bool] = []

    def compact_in_between(run_dir: Path) -> list[int]:
        if not raced:
            raced.append(True)
            st._compact("compaction")
        return real(run_dir)

    monkeypatch.setattr(manifest_mod, "commit_record_seqs", compact_in_between)
    assert sorted(manifest_ids(run)) == sorted(e.episode_id for e in work)
    assert raced
    st.close()


def test_a_deleted_record_is_refused_in_one_line(tmp_path: Path) -> None:
    """A record missing from the middle of the log (deleted by hand) makes the manifest untrusted:
    one line naming the log, never a silent loss of that commit's episodes."""
    run = tmp_path / "run"
    work = make_batch(12)
    st = open_store(run)
    for i in range(0, 12, 4):
        st.commit(work[i:i + 4])
    commit_record_path(run, 2).unlink()
    with pytest.raises(OutputError, match="commit log has a gap") as info:
        read_manifest(run)
    assert "\n" not in str(info.value)
    assert not check_run(run).ok
    del st


_KILLER = textwrap.dedent(
    """
    import os, signal, sys
    from collector.storage import commit as commit_mod
    from collector.storage.local import LocalRunStore
    from tests.record.factory import make_batch

    commit_mod._COMPACT_MIN_RECORDS = 2  # a compaction every other commit: kills land in them too
    run, first, kill_at, counted = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    real = {"replace": os.replace, "fsync": os.fsync, "unlink": os.unlink}
    calls = 0

    def hooked(name):  # the process dies just after the kill_at-th counted call
        def call(*args, **kwargs):
            global calls
            real[name](*args, **kwargs)
            if counted == "any" or counted == name:
                calls += 1
                if calls == kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)
        return call

    os.replace, os.fsync, os.unlink = hooked("replace"), hooked("fsync"), hooked("unlink")
    work = make_batch(30, start=first)
    st = LocalRunStore.open(run, "fp", {}, "arrow", 3)
    done = st.committed_ids()
    for i in range(0, len(work), 4):
        st.commit([e for e in work[i:i + 4] if e.episode_id not in done])
        if i == 12:
            st.forget({work[0].episode_id})
    st.close()
    sys.exit(3)
    """
)
# Kill points from a fixed seed: after the n-th rename, fsync or unlink of any kind (every step of
# commits, the forget and compactions), and after the n-th unlink alone (the deletions of folded
# records and of temp files: inside a compaction, between its steps).
_RNG = random.Random(20261219)
_KILLS = [(first, _RNG.randint(2, 70), "any") for first in (0, 10, 20, 5, 15)]
_KILLS += [(first, _RNG.randint(1, 4), "unlink") for first in (25, 0, 12, 3, 18)]

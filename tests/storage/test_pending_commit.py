"""Worker-side writes on a run dir: `LocalRunStore.sink()` writes pending shards, `commit_pending`
commits them.

A pending shard is invisible to every reader until its commit record is in place; a crash
before the record leaves an orphan the next open deletes, one after it a move the next open
finishes; ids already committed or repeated are refused; the lock guards it as it guards
`commit`.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest

from collector.record.episode import Episode
from collector.record.shards import episodes_to_table
from collector.storage.local import CommitIncomplete, LocalRunStore, LocalSink, LockLost
from collector.storage.manifest import DATA_DIR, TMP_DIR, pending_path
from collector.storage.pending import PendingShard
from tests.checking import assert_run_checked
from tests.record.factory import make_batch

FP = "fingerprint-pending"


def open_store(run: Path, fmt: str = "arrow") -> LocalRunStore:
    return LocalRunStore.open(run, FP, {}, fmt, 4)  # type: ignore[arg-type]


def write(sink: LocalSink, episodes: list[Episode]) -> PendingShard:
    """What a writing worker does with one cell of its batch."""
    first = episodes[0]
    ids = tuple(e.episode_id for e in episodes)
    return sink.write(episodes_to_table(episodes), first.model, first.budget, ids)


def glob_ids(run: Path) -> list[str]:
    """What a plain reader (a dataset over the tree, no manifest) sees."""
    dataset = ds.dataset(run, format="ipc")
    return dataset.to_table(columns=["episode_id"]).column("episode_id").to_pylist() if dataset.files else []


@pytest.mark.parametrize("fmt", ["arrow", "parquet"])
def test_pending_shards_are_invisible_until_committed_and_survive_a_reopen(
    tmp_path: Path, fmt: str
) -> None:
    """A shard a worker wrote is seen by no reader until `commit_pending`, then by all, once, reopened too."""
    run = tmp_path / "run"
    work = make_batch(6)
    with open_store(run, fmt) as st:
        sink = pickle.loads(pickle.dumps(st.sink()))  # it travels to the workers
        shard = write(sink, work)
        assert shard.size == pending_path(run, shard.path).stat().st_size
        assert not list((run / DATA_DIR).iterdir())
        assert st.committed_ids() == set()
        assert st.commit_pending([shard]) == 6
        assert (run / shard.path).is_file()
        assert not pending_path(run, shard.path).exists()
    with open_store(run, fmt) as st:
        assert st.committed_ids() == {e.episode_id for e in work}
        assert not st.warnings  # size and checksum recorded by the worker are what open verifies
    assert_run_checked(run, allow_notes=False)


def test_crash_before_the_record_leaves_an_orphan_the_next_open_deletes(tmp_path: Path) -> None:
    """Pending shards never committed (driver died first) stay hidden, and the next open removes them."""
    run = tmp_path / "run"
    work = make_batch(6)
    with open_store(run) as st:
        st.commit_pending([write(st.sink(), work[:2])])
        write(st.sink(), work[2:])  # the driver "dies" before committing this one
    assert sorted(glob_ids(run)) == sorted(e.episode_id for e in work[:2])
    assert len(list((run / TMP_DIR).iterdir())) == 1
    with open_store(run) as st:
        assert st.committed_ids() == {e.episode_id for e in work[:2]}
        assert not list((run / TMP_DIR).iterdir())


class Killed(BaseException):
    """Stands in for the process dying right after the commit record is in place."""


def test_crash_after_the_record_the_next_open_finishes_the_move(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pending shard named by a commit record but not yet moved is committed: the next open moves it."""
    run = tmp_path / "run"
    work = make_batch(4)
    st = open_store(run)

    def die(self: LocalRunStore, entries: Any) -> None:
        raise Killed

    monkeypatch.setattr(LocalRunStore, "_publish", die)
    with pytest.raises(Killed):
        st.commit_pending([write(st.sink(), work)])
    monkeypatch.undo()
    st.close()
    assert glob_ids(run) == []
    with open_store(run) as st:
        assert st.committed_ids() == {e.episode_id for e in work}
    assert sorted(glob_ids(run)) == sorted(e.episode_id for e in work)
    assert_run_checked(run, allow_notes=False)


def test_committed_or_repeated_ids_are_refused(tmp_path: Path) -> None:
    """A pending shard of committed ids is dropped, one mixing old and new ids left out by name."""
    run = tmp_path / "run"
    work = make_batch(8)
    with open_store(run) as st:
        sink = st.sink()
        first = write(sink, work[:4])
        again = write(sink, work[:4])  # the same batch written twice (a late duplicate)
        assert st.commit_pending([first, again]) == 4
        assert not pending_path(run, again.path).exists()
        assert st.commit_pending([write(sink, work[:4])]) == 0
        mixed = write(sink, work[2:6])
        with pytest.raises(CommitIncomplete) as info:
            st.commit_pending([mixed, write(sink, work[6:])])
        assert info.value.committed == 2
        assert info.value.uncommitted == {e.episode_id for e in work[4:6]}
        assert "\n" not in str(info.value)
        assert not list((run / TMP_DIR).iterdir())
    with open_store(run) as st:
        assert st.committed_ids() == {e.episode_id for e in work[:4] + work[6:]}
    ids = glob_ids(run)
    assert len(ids) == len(set(ids)) == 6


def test_a_pending_file_missing_or_of_another_size_is_left_out(tmp_path: Path) -> None:
    """A shard whose file is not what its worker reported is never named in a commit; the others are."""
    run = tmp_path / "run"
    work = make_batch(9)
    with open_store(run) as st:
        sink = st.sink()
        lost, cut, fine = write(sink, work[:3]), write(sink, work[3:6]), write(sink, work[6:])
        pending_path(run, lost.path).unlink()
        file = pending_path(run, cut.path)
        file.write_bytes(file.read_bytes()[:100])
        with pytest.raises(CommitIncomplete) as info:
            st.commit_pending([lost, cut, fine])
        assert info.value.uncommitted == {e.episode_id for e in work[:6]}
        assert st.committed_ids() == {e.episode_id for e in work[6:]}
    assert_run_checked(run, allow_notes=False)


def test_a_lost_lock_refuses_commit_pending(tmp_path: Path) -> None:
    """With its lock file replaced, a store commits no pending shard (another writer may be at work)."""
    run = tmp_path / "run"
    with open_store(run) as st:
        shard = write(st.sink(), make_batch(2))
        (run / ".collector" / "run.lock").unlink()
        with pytest.raises(LockLost):
            st.commit_pending([shard])
        assert st.committed_ids() == set()
    assert glob_ids(run) == []


def test_sink_writes_nothing_visible_when_the_write_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that fails part-way (a full disk) leaves no pending file behind and raises."""
    run = tmp_path / "run"
    with open_store(run) as st:
        sink = st.sink()

        def full(path: Path, table: Any, fmt: str) -> None:
            Path(path).write_bytes(b"partial")
            raise OSError(28, "No space left on device")

        monkeypatch.setattr("collector.storage.local.write_shard", full)
        with pytest.raises(OSError, match="No space left"):
            write(sink, make_batch(2))
        assert not list((run / TMP_DIR).iterdir())

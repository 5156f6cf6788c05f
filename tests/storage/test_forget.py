"""`LocalRunStore.forget`: committed episodes removed exactly once, crash-safe like a commit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from collector.errors import OutputError
from collector.record.shards import read_shard
from collector.storage import local as store_mod
from collector.storage.local import LocalRunStore
from collector.storage.manifest import TMP_DIR, committed_shard_paths, read_manifest
from tests.record.factory import make_batch

FP = "fingerprint-forget"
CFG: dict[str, Any] = {"name": "t"}


class Killed(BaseException):
    """Stands in for the process dying: nothing of ours runs after it."""


def open_store(run_dir: Path, fmt: str = "arrow", rows: int = 4) -> LocalRunStore:
    return LocalRunStore.open(run_dir, FP, CFG, fmt, rows)  # type: ignore[arg-type]


def committed_rows(run_dir: Path) -> list[str]:
    """Every committed episode id, with repeats, read from the shards the manifest names."""
    ids: list[str] = []
    for path in committed_shard_paths(run_dir):
        ids.extend(read_shard(path, ["episode_id"]).column("episode_id").to_pylist())
    return ids


def shard_files(run_dir: Path) -> set[str]:
    """Every file a plain reader sees (outside .collector/)."""
    return {p.relative_to(run_dir).as_posix() for p in run_dir.glob("data/*") if p.is_file()}


def hidden_files(run_dir: Path) -> set[str]:
    return {p.name for p in (run_dir / TMP_DIR).iterdir()}


@pytest.mark.parametrize("fmt", ["arrow", "parquet"])
def test_forget_removes_exactly_those_rows_and_survives_reopen(tmp_path: Path, fmt: str) -> None:
    """Forgotten ids leave the committed data and the id set; every other row stays, verified on reopen."""
    run = tmp_path / "run"
    work = make_batch(10) + make_batch(3, budget=64, start=10)
    # Shard 1 loses two of four rows, shard 2 all four, the budget=64 shard nothing.
    gone = {e.episode_id for e in work[1:3] + work[4:8]}
    with open_store(run, fmt=fmt) as st:
        assert st.commit(work) == 13
        assert st.forget(gone | {"never-committed"}) == 6
        assert st.committed_ids() == {e.episode_id for e in work} - gone
        assert st.forget(gone) == 0  # already forgotten: nothing to do
    with open_store(run, fmt=fmt) as st:
        assert not st.warnings  # replacements pass the size and checksum check on open
        assert st.committed_ids() == {e.episode_id for e in work} - gone
        assert sorted(committed_rows(run)) == sorted({e.episode_id for e in work} - gone)
        # The forgotten episodes can be committed again, once.
        assert st.commit(work) == 6
    assert sorted(committed_rows(run)) == sorted(e.episode_id for e in work)
    assert shard_files(run) == {e["path"] for e in read_manifest(run)["shards"]}


def test_forget_writes_no_shard_for_an_emptied_one_and_keeps_the_layout(tmp_path: Path) -> None:
    """A shard left without rows is dropped with no replacement; replacements stay in their partition."""
    run = tmp_path / "run"
    work = make_batch(4) + make_batch(4, budget=64, start=4)
    with open_store(run) as st:
        st.commit(work)
        before = {e["path"]: e for e in st.shards}
        assert st.forget([e.episode_id for e in work[:4]] + [work[4].episode_id]) == 5
        after = st.shards
    assert len(after) == 1
    (entry,) = after
    assert entry["path"] not in before
    assert entry["path"].startswith("data/part-")
    assert (entry["rows"], entry["budget"]) == (3, 64)
    assert entry["size"] == (run / entry["path"]).stat().st_size
    assert shard_files(run) == {entry["path"]}


def test_a_crash_before_the_manifest_swap_keeps_the_old_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dying before the manifest swap leaves every episode committed; the next open restores the old files."""
    run = tmp_path / "run"
    work = make_batch(8)
    st = open_store(run)
    st.commit(work)

    def die(path: Path, payload: Any) -> None:
        raise Killed

    monkeypatch.setattr(store_mod, "write_json_atomic", die)
    with pytest.raises(Killed):
        st.forget([work[0].episode_id, work[5].episode_id])
    monkeypatch.undo()
    st.close()
    # Old files moved aside and replacements not yet in sight: a glob sees neither (never both).
    assert shard_files(run) == set()
    assert len(hidden_files(run)) == 4

    with open_store(run) as st2:
        assert st2.committed_ids() == {e.episode_id for e in work}
        assert any("finished moving 2" in w for w in st2.warnings)
    assert not hidden_files(run)
    assert sorted(committed_rows(run)) == sorted(e.episode_id for e in work)
    assert shard_files(run) == {e["path"] for e in read_manifest(run)["shards"]}


def test_a_crash_after_the_manifest_swap_keeps_the_new_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dying after the manifest swap, before the replacements are moved in, leaves the episodes forgotten."""
    run = tmp_path / "run"
    work = make_batch(8)
    st = open_store(run)
    st.commit(work)
    real = store_mod.write_json_atomic

    def swap_then_die(path: Path, payload: Any) -> None:
        real(path, payload)
        raise Killed

    monkeypatch.setattr(store_mod, "write_json_atomic", swap_then_die)
    with pytest.raises(Killed):
        st.forget([work[0].episode_id, work[5].episode_id])
    monkeypatch.undo()
    st.close()
    assert shard_files(run) == set()  # no forgotten row is in sight of a glob reader
    assert len(hidden_files(run)) == 4  # the old shards aside, the committed replacements pending
    kept = {e.episode_id for e in work} - {work[0].episode_id, work[5].episode_id}
    assert sorted(committed_rows(run)) == sorted(kept)  # readers of the manifest find the pending ones

    with open_store(run) as st2:
        assert st2.committed_ids() == kept
        assert any("finished moving 2" in w for w in st2.warnings)
    assert not hidden_files(run)
    assert sorted(committed_rows(run)) == sorted(kept)
    assert shard_files(run) == {e["path"] for e in read_manifest(run)["shards"]}


def test_a_failed_forget_is_aborted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An error before the swap removes the replacements and leaves ids, manifest and files as they were."""
    run = tmp_path / "run"
    work = make_batch(8)
    with open_store(run) as st:
        st.commit(work)
        files = shard_files(run)
        manifest = read_manifest(run)

        def full_disk(path: Path, payload: Any) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(store_mod, "write_json_atomic", full_disk)
        with pytest.raises(OutputError, match="No space left"):
            st.forget([work[0].episode_id])
        monkeypatch.undo()
        assert st.committed_ids() == {e.episode_id for e in work}
        assert shard_files(run) == files
        assert st.shards == manifest["shards"]
        assert st.forget([work[0].episode_id]) == 1
    assert sorted(committed_rows(run)) == sorted(e.episode_id for e in work[1:])


def test_forget_after_close_is_refused(tmp_path: Path) -> None:
    """A closed store forgets nothing: it no longer holds the run dir's lock."""
    with open_store(tmp_path / "run") as st:
        st.commit(make_batch(2))
    with pytest.raises(OutputError, match="closed"):
        st.forget([make_batch(1)[0].episode_id])

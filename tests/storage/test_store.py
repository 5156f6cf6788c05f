"""The run store: exactly-once commits, resume by set difference, refusing foreign dirs, recovery."""

from __future__ import annotations

import json
import random
import textwrap
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest

from collector.errors import OutputError
from collector.record.shards import read_shard
from collector.storage import local as store_mod
from collector.storage.local import LocalRunStore
from collector.storage.manifest import (
    DATA_DIR,
    LEGACY_MANIFEST,
    MANIFEST,
    META_DIR,
    QUARANTINE,
    RESOLVED_CONFIG,
    TMP_DIR,
    committed_shard_paths,
)
from tests.record.factory import make_batch

FP = "fingerprint-aaaaaaaaaaaa"
CFG: dict[str, Any] = {"name": "t", "sweep": {"models": ["sim-perfect"], "budgets": [64, 128]}}
ROOT = Path(__file__).resolve().parents[2]


def open_store(run_dir: Path, fp: str = FP, fmt: str = "arrow", rows: int = 4) -> LocalRunStore:
    return LocalRunStore.open(run_dir, fp, CFG, fmt, rows)  # type: ignore[arg-type]


def all_rows(run_dir: Path) -> list[str]:
    """Every committed episode id, with repeats, read from the shards the manifest names."""
    ids: list[str] = []
    for path in committed_shard_paths(run_dir):
        ids.extend(read_shard(path, ["episode_id"]).column("episode_id").to_pylist())
    return ids


@pytest.mark.parametrize("fmt", ["arrow", "parquet"])
def test_commit_then_resume_by_set_difference(tmp_path: Path, fmt: str) -> None:
    """Committed ids survive a reopen, so a rerun computes the missing work as a set difference."""
    work = make_batch(10)
    with open_store(tmp_path / "run", fmt=fmt) as st:
        assert st.commit(work[:6]) == 6
    with open_store(tmp_path / "run", fmt=fmt) as st:
        done = st.committed_ids()
        assert done == {e.episode_id for e in work[:6]}
        todo = [e for e in work if e.episode_id not in done]
        assert st.commit(todo) == 4
    assert sorted(all_rows(tmp_path / "run")) == sorted(e.episode_id for e in work)


def test_duplicates_are_dropped_at_commit(tmp_path: Path) -> None:
    """An id already committed, or repeated within one batch, is written once and not counted again."""
    work = make_batch(5)
    with open_store(tmp_path / "run") as st:
        assert st.commit(work[:3]) == 3
        assert st.commit([work[2], work[3], work[3], work[4], work[0]]) == 2
        assert st.commit(work) == 0
    rows = all_rows(tmp_path / "run")
    assert len(rows) == len(set(rows)) == 5


def test_shards_are_flat_in_data_and_split(tmp_path: Path) -> None:
    """Every cell's shards sit flat in data/, at most rows_per_shard each; model and budget are columns."""
    run = tmp_path / "run"
    batch = make_batch(9, model="org/Model-7B", budget=64) + make_batch(2, model="b", budget=128)
    with open_store(run, rows=4) as st:
        st.commit(batch)
        sizes = sorted(e["rows"] for e in st.shards)
    assert sizes == [1, 2, 4, 4]
    assert sorted(p.name for p in run.iterdir()) == [META_DIR, DATA_DIR]
    files = sorted((run / DATA_DIR).iterdir())
    assert [p.suffix for p in files] == [".arrow"] * 4  # no model or budget directories
    table = ds.dataset(run, format="ipc").to_table(columns=["model"], filter=ds.field("budget") == 64)
    assert table.column("model").unique().to_pylist() == ["org/Model-7B"]


def test_manifest_and_resolved_config_are_written(tmp_path: Path) -> None:
    """The manifest records fingerprint, format and shards; the resolved config is saved beside it."""
    run = tmp_path / "run"
    with open_store(run) as st:
        st.commit(make_batch(3))
    manifest = json.loads((run / MANIFEST).read_text())
    assert manifest["fingerprint"] == FP
    assert manifest["format"] == "arrow"
    assert sum(e["rows"] for e in manifest["shards"]) == 3
    saved = json.loads((run / RESOLVED_CONFIG).read_text())
    assert saved["config"] == CFG
    assert saved["fingerprint"] == FP


def test_a_different_config_is_refused_in_one_line(tmp_path: Path) -> None:
    """Opening a run dir with another fingerprint raises OutputError with a one-line message."""
    open_store(tmp_path / "run").close()
    with pytest.raises(OutputError) as info:
        open_store(tmp_path / "run", fp="another-fingerprint")
    message = str(info.value)
    assert "different config" in message
    assert "\n" not in message


def test_a_different_format_is_refused(tmp_path: Path) -> None:
    """A run of Arrow shards is not continued as Parquet (one dataset, one format)."""
    open_store(tmp_path / "run", fmt="arrow").close()
    with pytest.raises(OutputError, match="arrow shards"):
        open_store(tmp_path / "run", fmt="parquet")


def test_a_foreign_non_empty_directory_is_refused(tmp_path: Path) -> None:
    """A non-empty directory without a manifest is not taken over."""
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(OutputError, match="not a run directory"):
        open_store(tmp_path)


def test_an_unwritable_path_is_an_output_error(tmp_path: Path) -> None:
    """A run dir that cannot be created (a file is in the way) is a one-line OutputError."""
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputError, match="cannot write run dir"):
        open_store(tmp_path / "file" / "run")


def test_one_writer_at_a_time(tmp_path: Path) -> None:
    """A second open of a run dir that is open elsewhere is refused; after close it succeeds."""
    first = open_store(tmp_path / "run")
    with pytest.raises(OutputError, match="in use"):
        open_store(tmp_path / "run")
    first.close()
    open_store(tmp_path / "run").close()


def test_commit_after_close_is_refused(tmp_path: Path) -> None:
    """A closed store does not write."""
    st = open_store(tmp_path / "run")
    st.close()
    with pytest.raises(OutputError, match="closed"):
        st.commit(make_batch(1))


def visible_ids(run_dir: Path) -> list[str]:
    """What a plain glob reader (pyarrow dataset over the tree, no manifest) counts."""
    return ds.dataset(run_dir, format="ipc").to_table(columns=["episode_id"]).column("episode_id").to_pylist()


class Killed(BaseException):
    """Stands in for the process dying: nothing of ours runs after it."""


def test_crash_before_the_manifest_swap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Shards written but absent from the manifest stay hidden in .collector/tmp/, and are removed on open."""
    run = tmp_path / "run"
    work = make_batch(6)
    st = open_store(run)
    st.commit(work[:2])

    def die(path: Path, payload: Any) -> None:
        raise Killed

    monkeypatch.setattr(store_mod, "write_json_atomic", die)
    with pytest.raises(Killed):
        st.commit(work[2:])
    monkeypatch.undo()
    st.close()
    assert len(list((run / DATA_DIR).iterdir())) == 1  # only the committed shard is in sight
    assert sorted(visible_ids(run)) == sorted(e.episode_id for e in work[:2])
    assert len(list((run / TMP_DIR).iterdir())) == 1  # the orphan the "crash" left behind

    with open_store(run) as st2:
        assert st2.committed_ids() == {e.episode_id for e in work[:2]}
        assert not list((run / TMP_DIR).iterdir())
        assert st2.commit(work) == 4
    rows = all_rows(run)
    assert sorted(rows) == sorted(e.episode_id for e in work)


def test_crash_after_the_manifest_swap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A committed shard not yet moved into data/ is read through the manifest, and the next open moves it."""
    run = tmp_path / "run"
    work = make_batch(6)
    st = open_store(run)
    st.commit(work[:2])

    def die(self: LocalRunStore, entries: Any) -> None:
        raise Killed

    monkeypatch.setattr(LocalRunStore, "_publish", die)
    with pytest.raises(Killed):
        st.commit(work[2:])
    monkeypatch.undo()
    st.close()
    # Committed, but not yet in sight of a glob: never counted twice, never a row a resume re-runs.
    assert sorted(visible_ids(run)) == sorted(e.episode_id for e in work[:2])
    assert sorted(all_rows(run)) == sorted(e.episode_id for e in work)

    with open_store(run) as st2:
        assert st2.committed_ids() == {e.episode_id for e in work}
        assert any("finished moving" in w for w in st2.warnings)
        assert st2.commit(work) == 0
    assert sorted(visible_ids(run)) == sorted(e.episode_id for e in work)
    assert not list((run / TMP_DIR).iterdir())


def test_a_stray_file_in_data_is_moved_aside_on_open(tmp_path: Path) -> None:
    """A file in data/ that the manifest does not name is moved to quarantine on open, out of sight."""
    run = tmp_path / "run"
    with open_store(run) as st:
        st.commit(make_batch(2))
        shard = run / st.shards[0]["path"]
    (run / DATA_DIR / "part-999999-copied.arrow").write_bytes(shard.read_bytes())
    with open_store(run) as st:
        assert any("stray file data/part-999999-copied.arrow" in w for w in st.warnings)
    assert len(visible_ids(run)) == 2
    assert [p.name for p in (run / QUARANTINE).iterdir()] == ["data__part-999999-copied.arrow.quarantined"]


def test_a_legacy_run_dir_is_refused_in_one_line(tmp_path: Path) -> None:
    """A run dir of the layout before .collector/ is not continued: one line saying so."""
    run = tmp_path / "run"
    run.mkdir()
    (run / LEGACY_MANIFEST).write_text('{"shards": []}')
    with pytest.raises(OutputError, match="earlier run-dir layout") as info:
        open_store(run)
    assert "\n" not in str(info.value)
    assert not (run / META_DIR).exists()


def test_a_failed_commit_is_aborted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An exception during a commit removes its files and leaves the manifest and ids untouched."""
    run = tmp_path / "run"
    work = make_batch(6)
    with open_store(run) as st:
        st.commit(work[:2])

        def full_disk(path: Path, payload: Any) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(store_mod, "write_json_atomic", full_disk)
        with pytest.raises(OutputError, match="No space left"):
            st.commit(work[2:])
        monkeypatch.undo()
        assert st.committed_ids() == {e.episode_id for e in work[:2]}
        assert len(list((run / DATA_DIR).iterdir())) == 1
        assert not list((run / TMP_DIR).iterdir())
        assert st.commit(work) == 4
    assert len(all_rows(run)) == 6


def test_temp_files_are_removed_on_open(tmp_path: Path) -> None:
    """Half-written temp files left by a crash are deleted when the run dir is opened again."""
    run = tmp_path / "run"
    with open_store(run) as st:
        st.commit(make_batch(1))
    (run / TMP_DIR / "part-000009-deadbeef.arrow.tmp").write_bytes(b"half")
    (run / META_DIR / ".manifest.json.abcd1234.tmp").write_text("{")
    open_store(run).close()
    assert not list(run.rglob("*.tmp"))


@pytest.mark.parametrize("damage", ["truncate", "garbage", "delete"])
def test_a_corrupt_shard_is_reported_and_never_stops_resume(tmp_path: Path, damage: str) -> None:
    """A damaged committed shard is named in one warning line, quarantined, and its episodes run again."""
    run = tmp_path / "run"
    work = make_batch(8)
    with open_store(run) as st:
        st.commit(work[:4])
        st.commit(work[4:])
        victim = run / st.shards[0]["path"]
    data = victim.read_bytes()
    if damage == "truncate":
        victim.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        victim.write_bytes(b"\x00" * len(data))
    else:
        victim.unlink()
    with open_store(run) as st:
        assert len(st.warnings) == 1
        assert victim.name in st.warnings[0]
        assert "\n" not in st.warnings[0]
        assert st.committed_ids() == {e.episode_id for e in work[4:]}
        assert st.commit(work) == 4
    assert sorted(all_rows(run)) == sorted(e.episode_id for e in work)
    if damage != "delete":
        assert list((run / QUARANTINE).iterdir())


_KILLER = textwrap.dedent(
    """
    import os, signal, sys
    from collector.record.shards import episodes_to_table
    from collector.storage.local import LocalRunStore
    from tests.record.factory import make_batch

    run, fmt, when, mode = sys.argv[1], sys.argv[5], sys.argv[6], sys.argv[7]
    first, count, kill_at = (int(a) for a in sys.argv[2:5])
    real = {"replace": os.replace, "fsync": os.fsync}
    calls = 0

    def hooked(name):  # the process dies at the kill_at-th rename or fsync, just before or after it
        def call(*args):
            global calls
            calls += 1
            if calls == kill_at and when == "before":
                os.kill(os.getpid(), signal.SIGKILL)
            real[name](*args)
            if calls == kill_at and when == "after":
                os.kill(os.getpid(), signal.SIGKILL)
        return call

    os.replace, os.fsync = hooked("replace"), hooked("fsync")
    work = make_batch(count, start=first)
    st = LocalRunStore.open(run, "fp", {}, fmt, 3)
    done = st.committed_ids()
    sink = st.sink()
    for i in range(0, len(work), 7):  # overlapping batches: many commits, late duplicates among them
        batch = [e for e in work[max(0, i - 3):i + 7] if e.episode_id not in done]
        if mode == "episodes":
            st.commit(batch)
            continue
        # As a writing worker and its driver do: the worker writes the shard, the driver
        # drops what it has seen (here: what is committed) and commits the pending shard.
        fresh = [e for e in batch if e.episode_id not in st.committed_ids()]
        if fresh:
            ids = tuple(e.episode_id for e in fresh)
            st.commit_pending([sink.write(episodes_to_table(fresh), "sim-perfect", 128, ids)])
    sys.exit(3)  # not killed: the test asked for a kill point past the end
    """
)

# Kill points drawn from a fixed seed: (first task, kill at the n-th rename or fsync, before/after
# it). Per commit a shard is written (fsync), its dir fsynced, the manifest written (fsync,
# rename, fsync), each shard renamed into data/ and data/ fsynced: ~12 events for a 7-episode
# batch, so n up to 40 lands on every step of the first commits, shards and manifests alike.
_RNG = random.Random(20261201)
_KILLS = [(first, _RNG.randint(3, 40), _RNG.choice(["before", "after"])) for first in (0, 20, 40, 45, 10, 30)]


def test_a_failed_manifest_write_on_create_is_an_output_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run dir whose first manifest cannot be written (read-only, full) is a one-line OutputError."""

    def denied(path: Path, payload: Any) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(store_mod, "write_json_atomic", denied)
    with pytest.raises(OutputError, match=r"cannot write run dir .*Permission denied"):
        open_store(tmp_path / "run")
    monkeypatch.undo()
    open_store(tmp_path / "run").close()  # and the lock was released

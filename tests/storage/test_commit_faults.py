"""A commit under faults and poison: what the manifest names is never deleted, one bad cell or
value never blocks the others, a repeated manifest entry counts once, a lost lock stops the
writer."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from collector.analysis.check import check_run
from collector.analysis.stats import compute_stats
from collector.analysis.tables import load_run
from collector.config import LoopConfig
from collector.envs.arithmetic import ArithmeticEnv
from collector.episode.loop import EpisodeSpec, run_episode
from collector.errors import OutputError
from collector.providers.scripted import ScriptedProvider, text
from collector.record import shards as shards_mod
from collector.record.episode import MAX_TOKEN_COUNT, Episode
from collector.record.shards import read_shard
from collector.storage import local as store_mod
from collector.storage import manifest as manifest_mod
from collector.storage.local import CommitIncomplete, LocalRunStore, LockLost
from collector.storage.manifest import (
    DATA_DIR,
    LOCK,
    MANIFEST,
    TMP_DIR,
    committed_shard_paths,
    read_manifest,
)
from tests.record.factory import make_batch, make_episode

FP = "fingerprint-faults"


def open_store(run_dir: Path, rows: int = 4) -> LocalRunStore:
    return LocalRunStore.open(run_dir, FP, {}, "arrow", rows)


def stored_ids(run_dir: Path) -> list[str]:
    """Committed episode ids with repeats, read through the manifest like every reader."""
    return [i for p in committed_shard_paths(run_dir)
            for i in read_shard(p, ["episode_id"]).column("episode_id").to_pylist()]


# --- 1. once the manifest is swapped, the commit is done ------------------------------------


def test_fsync_failure_after_the_manifest_rename_keeps_the_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EIO from the run dir's fsync right after the manifest rename keeps every shard the new
    manifest names: the commit counts, a warning says so, stats and load_run read it all."""
    run = tmp_path / "run"
    work = make_batch(6)
    st = open_store(run)
    st.commit(work[:2])
    real_fsync_dir = manifest_mod.fsync_dir
    landed: list[int] = []

    def eio_after_rename(path: Path) -> None:
        shards = read_manifest(run)["shards"] if path == (run / MANIFEST).parent else []
        if len(shards) == 2:  # the new manifest (old shard + this commit's) is already in place
            landed.append(len(shards))
            raise OSError(errno.EIO, "Input/output error")
        real_fsync_dir(path)

    monkeypatch.setattr(manifest_mod, "fsync_dir", eio_after_rename)
    assert st.commit(work[2:]) == 4
    monkeypatch.undo()
    assert landed, "the fault did not hit after the manifest rename"
    assert any("Input/output error" in w and "may not survive a power loss" in w for w in st.warnings)
    assert st.committed_ids() == {e.episode_id for e in work}
    st.close()
    assert all(p.exists() for p in committed_shard_paths(run))
    assert load_run(run).num_rows == 6
    assert compute_stats(run).episodes == 6
    with open_store(run) as again:
        assert again.committed_ids() == {e.episode_id for e in work}
        assert not again.warnings


def test_fsync_failure_after_the_swap_of_a_forget_keeps_the_new_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`forget` (run --retry-errors) hit by EIO right after its manifest rename keeps the
    replacement shards the new manifest names: the forgotten ids are gone, the rest stays."""
    run = tmp_path / "run"
    work = make_batch(4)
    st = open_store(run)
    st.commit(work)
    old_paths = {e["path"] for e in st.shards}
    real_fsync_dir = manifest_mod.fsync_dir
    landed: list[bool] = []

    def eio_after_rename(path: Path) -> None:
        if path == (run / MANIFEST).parent and {e["path"] for e in read_manifest(run)["shards"]} != old_paths:
            landed.append(True)  # the swapped manifest (the replacement shard) is in place
            raise OSError(errno.EIO, "Input/output error")
        real_fsync_dir(path)

    monkeypatch.setattr(manifest_mod, "fsync_dir", eio_after_rename)
    assert st.forget({work[0].episode_id}) == 1
    monkeypatch.undo()
    assert landed
    st.close()
    assert sorted(stored_ids(run)) == sorted(e.episode_id for e in work[1:])
    assert check_run(run).ok


# --- 2. one poisoned value or cell never blocks the others ---------------------------------


def test_a_reply_claiming_absurd_token_counts_still_commits() -> None:
    """A provider whose usage says 10**30 output tokens gives a record clamped to MAX_TOKEN_COUNT,
    which commits like any other (no int64 overflow)."""
    spec = EpisodeSpec(run_id="r", model="m", provider_kind="chat", budget=64,
                       task=ArithmeticEnv(num_tasks=1).tasks()[0], sample=0, env_name="arithmetic")
    provider = ScriptedProvider([text("449", output_tokens=10**30)])
    loop = LoopConfig(max_steps=2, episode_timeout_s=10.0, tool_timeout_s=2.0)
    episode = asyncio.run(run_episode(spec, provider, ArithmeticEnv(num_tasks=1), loop))
    assert episode.turns[0].output_tokens == MAX_TOKEN_COUNT
    negative = dataclasses.replace(episode.turns[0], input_tokens=-7)
    assert negative.input_tokens == 0


def test_absurd_token_counts_do_not_block_a_commit(tmp_path: Path) -> None:
    """Turns built with token counts beyond int64 are stored clamped, and the commit goes through."""
    ep = make_episode()
    ep.turns = [dataclasses.replace(t, output_tokens=10**30, input_tokens=2**70) for t in ep.turns]
    with open_store(tmp_path / "run") as st:
        assert st.commit([ep]) == 1
    table = load_run(tmp_path / "run", columns=["output_tokens", "input_tokens"])
    assert table.column("output_tokens").to_pylist() == [MAX_TOKEN_COUNT * len(ep.turns)]


def test_a_model_name_too_long_for_a_directory_still_commits(tmp_path: Path) -> None:
    """A model name far past any filesystem's name limit commits: shards are named by number,
    never by model, and the model column keeps the full name."""
    long_a = "org/" + "é" * 150 + "-a"
    long_b = "org/" + "é" * 150 + "-b"
    run = tmp_path / "run"
    with open_store(run) as st:
        assert st.commit(make_batch(2, model=long_a) + make_batch(2, model=long_b)) == 4
    assert all(len(p.name.encode()) < 64 for p in committed_shard_paths(run))
    models = load_run(run, columns=["model"]).column("model").to_pylist()
    assert sorted(set(models)) == sorted([long_a, long_b])


def test_a_cell_that_cannot_be_written_leaves_the_other_cells_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When one (model, budget) cell fails to become a shard, the other cells of the same commit
    are committed, the failure names the cell, and none of its files are left behind."""
    run = tmp_path / "run"
    good, bad = make_batch(5, budget=128), make_batch(3, budget=64)
    real = shards_mod.episodes_to_table

    def poisoned(episodes: list[Episode]) -> pa.Table:
        if episodes[0].budget == 64:
            raise OverflowError("Python int too large to convert to C long")
        return real(episodes)

    monkeypatch.setattr(shards_mod, "episodes_to_table", poisoned)
    with open_store(run) as st:
        with pytest.raises(CommitIncomplete) as info:
            st.commit(good + bad)
        assert info.value.committed == 5
        assert info.value.uncommitted == {e.episode_id for e in bad}
        assert "3 episode(s) could not be committed" in str(info.value)
        assert "budget 64" in str(info.value)
        assert "\n" not in str(info.value)
        assert st.committed_ids() == {e.episode_id for e in good}
    assert sorted(stored_ids(run)) == sorted(e.episode_id for e in good)
    assert not list((run / TMP_DIR).glob("*"))  # the failed cell left no file behind
    monkeypatch.undo()
    with open_store(run) as st:  # the failed cell is not committed: a rerun writes it
        assert st.commit(good + bad) == 3


def test_one_poisoned_episode_costs_only_itself(tmp_path: Path) -> None:
    """An episode whose row cannot be stored (a grader's reward of 10**30 as an int) is left out
    of its shard; the healthy episodes of the same cell and commit are committed."""
    run = tmp_path / "run"
    work = make_batch(6)
    poisoned = dataclasses.replace(work[2], graded_reward=10**30)
    with open_store(run) as st:
        with pytest.raises(CommitIncomplete) as info:
            st.commit([*work[:2], poisoned, *work[3:]])
        assert info.value.uncommitted == {poisoned.episode_id}
        assert info.value.committed == 5
        assert "1 episode(s) could not be committed" in str(info.value)
    assert sorted(stored_ids(run)) == sorted(e.episode_id for e in work if e is not work[2])
    assert check_run(run).ok


def test_a_commit_of_only_the_poisoned_cell_is_incomplete_not_fatal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit that holds nothing but a cell whose values cannot be stored is a CommitIncomplete
    (the run goes on), exactly as when it shares the commit with healthy cells: whether a run
    continues must not depend on which cells a commit happened to hold."""
    run = tmp_path / "run"
    real = shards_mod.episodes_to_table

    def poisoned(episodes: list[Episode]) -> pa.Table:
        if episodes[0].budget == 64:
            raise OverflowError("Python int too large to convert to C long")
        return real(episodes)

    monkeypatch.setattr(shards_mod, "episodes_to_table", poisoned)
    bad = make_batch(3, budget=64)
    with open_store(run) as st:
        with pytest.raises(CommitIncomplete) as info:
            st.commit(bad)
        assert info.value.committed == 0
        assert info.value.uncommitted == {e.episode_id for e in bad}
        assert st.commit(make_batch(2, budget=128, start=50)) == 2  # the store goes on
    assert len(stored_ids(run)) == 2


def test_a_commit_where_every_cell_fails_commits_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When no cell can be written (a full disk), the commit is an OutputError and nothing of it
    is committed, as before."""
    run = tmp_path / "run"

    def full(*_: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with open_store(run) as st:
        st.commit(make_batch(1, start=99))
        monkeypatch.setattr(store_mod, "write_shard", full)
        with pytest.raises(OutputError, match="No space left") as info:
            st.commit(make_batch(2, budget=64) + make_batch(2, budget=128))
        assert not isinstance(info.value, CommitIncomplete)
        assert len(st.committed_ids()) == 1
    assert len(stored_ids(run)) == 1


# --- 3. a shard named twice -----------------------------------------------------------------


def test_a_shard_named_twice_counts_once_and_the_next_open_repairs_it(tmp_path: Path) -> None:
    """A manifest listing one shard twice: stats and load_run count its rows once, check names the
    repeat, and opening the run dir (a resume) drops it with a warning."""
    run = tmp_path / "run"
    work = make_batch(6)
    with open_store(run) as st:
        st.commit(work[:4])
        st.commit(work[4:])
    manifest = json.loads((run / MANIFEST).read_text())
    manifest["shards"].append(dict(manifest["shards"][0]))
    (run / MANIFEST).write_text(json.dumps(manifest))

    assert load_run(run).num_rows == 6
    assert compute_stats(run).episodes == 6
    report = check_run(run)
    assert report.episodes == 6
    assert any("named twice" in p for p in report.problems)

    with open_store(run) as st:
        assert any("more than once" in w for w in st.warnings)
        assert st.committed_ids() == {e.episode_id for e in work}
        assert st.commit(work) == 0
    paths = [e["path"] for e in json.loads((run / MANIFEST).read_text())["shards"]]
    assert len(paths) == len(set(paths)) == 2
    assert check_run(run).ok


# --- 4. the lock guards only while it is ours -----------------------------------------------


def test_a_deleted_lock_file_stops_the_writer_before_it_commits(tmp_path: Path) -> None:
    """The lock file deleted mid-run: the next commit writes nothing and raises one line, and so
    does every commit after it."""
    run = tmp_path / "run"
    work = make_batch(6)
    with open_store(run) as st:
        st.commit(work[:2])
        before = (run / MANIFEST).read_bytes()
        (run / LOCK).unlink()
        for _ in range(2):
            with pytest.raises(LockLost) as info:
                st.commit(work[2:])
            assert "deleted or replaced" in str(info.value)
            assert "\n" not in str(info.value)
        assert (run / MANIFEST).read_bytes() == before
    assert len(list((run / DATA_DIR).glob("*"))) == 1


def test_a_taken_over_lock_stops_the_first_writer_and_keeps_the_second(tmp_path: Path) -> None:
    """Lock deleted, a second writer opens the dir: the first one refuses to commit (its commits
    would be dropped by the second's manifest) while the second commits normally."""
    run = tmp_path / "run"
    work = make_batch(8)
    first = open_store(run)
    first.commit(work[:2])
    (run / LOCK).unlink()
    with open_store(run) as second:
        with pytest.raises(LockLost):
            first.commit(work[2:4])
        assert second.commit(work[4:]) == 4
    first.close()
    assert sorted(stored_ids(run)) == sorted(e.episode_id for e in work[:2] + work[4:])


def test_a_lock_replaced_during_a_commit_is_reported_not_counted_as_safe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lock replaced while the manifest is being swapped: the commit is reported as possibly
    overwritten by the other writer (one line), and the store commits nothing more."""
    run = tmp_path / "run"
    work = make_batch(6)
    real = store_mod.write_json_atomic

    def swap_then_take_over(path: Path, payload: Any) -> None:
        real(path, payload)
        (run / LOCK).unlink()
        fd = os.open(run / LOCK, os.O_CREAT | os.O_RDWR, 0o644)
        os.close(fd)

    with open_store(run) as st:
        monkeypatch.setattr(store_mod, "write_json_atomic", swap_then_take_over)
        with pytest.raises(LockLost, match="may have been overwritten"):
            st.commit(work[:3])
        monkeypatch.undo()
        with pytest.raises(LockLost):
            st.commit(work[3:])

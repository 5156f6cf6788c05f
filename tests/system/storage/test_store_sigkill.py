"""A writer process SIGKILLed at any moment of the local store's commit never loses or duplicates.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from collector.storage.local import LocalRunStore
from collector.storage.manifest import NotARunDirectory, read_manifest
from tests.record.factory import make_batch
from tests.storage.test_store import _KILLER, _KILLS, ROOT, all_rows
from tests.system.forkserver import STORES, Zygote


@pytest.mark.parametrize(
    ("fmt", "mode"), [("arrow", "episodes"), ("parquet", "episodes"), ("arrow", "pending")]
)
def test_sigkill_at_any_moment_never_loses_or_duplicates(tmp_path: Path, fmt: str, mode: str) -> None:
    """SIGKILL anywhere in a commit: a glob reader never counts a row twice nor one a resume re-runs.

    `pending` commits shards written as a worker writes them (`LocalRunStore.sink`) with
    `commit_pending`: the kill lands as well in a worker's write as in the driver's commit.

    After each kill, before anything reopens the dir, a plain pyarrow dataset over the tree
    (no manifest) must see each id at most once and only ids the reopened store reports as
    committed (so a resume will not collect them again); after the reopen it sees exactly
    those, and every shard the manifest and its log named before the reopen (committed, even
    when the kill stopped its move into data/) is still committed.
    """
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    count = 40
    glob_format = "ipc" if fmt == "arrow" else "parquet"

    def named_shards() -> set[str]:
        """What a reader holds committed now: the manifest with its log, without any recovery."""
        try:
            return {entry["path"] for entry in read_manifest(run)["shards"]}
        except NotARunDirectory:  # killed before the run's first manifest
            return set()

    def glob_ids() -> list[str]:
        dataset = ds.dataset(run, format=glob_format) if run.exists() else None
        if dataset is None or not dataset.files:  # killed before the first commit
            return []
        return dataset.to_table(columns=["episode_id"]).column("episode_id").to_pylist()

    with Zygote(STORES, env=env, cwd=ROOT) as zygote:
        for first, kill_at, when in _KILLS:
            args = [str(run), str(first), str(count), str(kill_at), fmt, when, mode]
            assert zygote.run(_KILLER, *args) == -signal.SIGKILL
            seen = glob_ids()
            assert len(seen) == len(set(seen)), f"a glob counts a row twice after a kill at {kill_at} {when}"
            named = named_shards()
            with LocalRunStore.open(run, "fp", {}, fmt, 3) as st:  # type: ignore[arg-type]
                assert named <= {e["path"] for e in st.shards}, f"committed shard lost ({kill_at} {when})"
                committed = st.committed_ids()
                assert set(seen) <= committed, "a glob reader saw a row the resume collects again"
                rows = all_rows(run)
                assert len(rows) == len(set(rows))
                assert committed == set(rows)
                assert sorted(glob_ids()) == sorted(rows)  # nothing committed stays out of sight
                assert not list(run.rglob("*.tmp"))
    work = make_batch(45 + count)
    with LocalRunStore.open(run, "fp", {}, fmt, 3) as st:  # type: ignore[arg-type]
        assert 0 < len(st.committed_ids()) < len(work)  # the kills landed mid-run
        st.commit(work)
    rows = all_rows(run)
    assert sorted(rows) == sorted(e.episode_id for e in work)
    assert sorted(glob_ids()) == sorted(rows)

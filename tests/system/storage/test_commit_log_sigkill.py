"""A writer process SIGKILLed anywhere in commits, forgets and compactions loses and duplicates nothing.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from collector.analysis.check import check_run
from collector.storage.local import LocalRunStore
from collector.storage.manifest import (
    DATA_DIR,
)
from tests.record.factory import make_batch
from tests.storage.test_commit_log import _KILLER, _KILLS, ROOT, glob_ids, manifest_ids
from tests.system.forkserver import STORES, Zygote


def test_sigkill_anywhere_in_commits_forgets_and_compactions(tmp_path: Path) -> None:
    """SIGKILL at a random rename, fsync or unlink of commits, a forget and compactions: a glob
    never counts a row twice nor one the reopened store calls uncommitted, and after the reopen
    the manifest, the glob and the store agree."""
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with Zygote(STORES, env=env, cwd=ROOT) as zygote:
        for first, kill_at, counted in _KILLS:
            rc = zygote.run(_KILLER, str(run), str(first), str(kill_at), counted)
            assert rc in (-signal.SIGKILL, 3)
            seen = glob_ids(run) if (run / DATA_DIR).exists() else []
            assert len(seen) == len(set(seen)), f"a glob counts a row twice after a kill at {kill_at}"
            with LocalRunStore.open(run, "fp", {}, "arrow", 3) as st:
                committed = st.committed_ids()
                assert set(seen) <= committed, f"a glob saw a row the resume runs again (kill at {kill_at})"
                rows = manifest_ids(run)
                assert len(rows) == len(set(rows))
                assert set(rows) == committed
                assert sorted(glob_ids(run)) == sorted(rows)
                assert not list(run.rglob("*.tmp"))
            assert check_run(run).ok
    work = make_batch(55)
    with LocalRunStore.open(run, "fp", {}, "arrow", 3) as st:
        st.commit(work)
    assert sorted(manifest_ids(run)) == sorted(e.episode_id for e in work)

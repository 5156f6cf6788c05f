"""A SIGTERM that lands while the driver is committing inside its loop: that commit finishes, then
the run stops; none of its episodes is dropped (`collector.run.signals`).

The signal lands on an event: the store's commit (local or in a bucket, driver- or worker-side
writes) is wrapped to send SIGTERM to this process the first time it is called, after the
driver has taken the batch out of its buffer and before the store has written it. Without
the deferral the handler raised right there, and the batch taken for that commit was lost
(not in the store, no longer in the buffer): a rerun had to collect it again.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest

from collector.run.job import Interrupted, run_job
from collector.run.plan import plan_work
from collector.storage.local import LocalRunStore
from collector.storage.mirror import resolve_run
from collector.storage.s3store import S3RunStore
from tests.run.helpers import committed_id_counts, small_config

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_cluster"), pytest.mark.timeout(240)]


def signal_on_first(method: Callable[..., int], taken: list[str],
                    ids: Callable[[Any], Iterable[str]]) -> Callable[..., int]:
    """`method` (a store's commit), sending SIGTERM to this process on its first call; `taken`
    gets the ids that call was asked to commit."""

    def wrapped(self: Any, units: Sequence[Any]) -> int:
        if not taken:
            taken.extend(i for unit in units for i in ids(unit))
            os.kill(os.getpid(), signal.SIGTERM)
        return method(self, units)

    return wrapped


@pytest.mark.parametrize("where", ["dir-driver-writes", "dir-worker-writes", "s3"])
def test_sigterm_during_an_in_loop_commit_keeps_that_commits_episodes(
    tmp_path: Path, where: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The interrupted run raises `Interrupted` (SIGTERM) with every episode of the signalled
    commit committed exactly once; the rerun collects only the rest."""
    run: Path | str = tmp_path / "run"
    store: type[LocalRunStore] | type[S3RunStore] = LocalRunStore
    if where == "s3":
        run = request.getfixturevalue("s3_bucket").uri("run")
        monkeypatch.setenv("COLLECTOR_CACHE_DIR", str(tmp_path / "cache"))
        store = S3RunStore
    cfg = small_config(run, ray__pool="ray", output__worker_writes=where != "dir-driver-writes",  # type: ignore[arg-type]
                       output__commit_interval_s=600.0, sweep__models=["sim-slow"])
    taken: list[str] = []
    # Driver-side writes commit episodes; worker-side writes commit the workers' pending shards.
    name, ids = (("commit", lambda ep: [ep.episode_id]) if where == "dir-driver-writes"
                 else ("commit_pending", lambda shard: shard.episode_ids))
    original = getattr(store, name)
    monkeypatch.setattr(store, name, signal_on_first(original, taken, ids))
    with pytest.raises(Interrupted) as info:
        run_job(cfg, show_progress=False)
    assert info.value.signum == signal.SIGTERM
    assert taken, "the signal did not land in a commit"
    counts = committed_id_counts(resolve_run(run))
    assert set(taken) <= set(counts)  # the signalled commit finished
    assert set(counts.values()) == {1}
    planned = {item.episode_id for item in plan_work(cfg).items}
    assert len(counts) < len(planned), "the run was not stopped mid-way"

    monkeypatch.setattr(store, name, original)
    again = run_job(cfg, show_progress=False)
    assert again.already == len(counts)
    assert again.already + again.committed == len(planned)
    final = committed_id_counts(resolve_run(run))
    assert set(final) == planned
    assert set(final.values()) == {1}

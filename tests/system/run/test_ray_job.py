"""The job on Ray workers (`ray.pool = "ray"`): what only Ray has (placement, start-up, its logs,
an actor killed), and a run directory that resumes across pools."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from collector.errors import CollectorError, ConfigError
from collector.run.job import Snapshot, run_job
from collector.run.plan import plan_work
from tests.run.helpers import committed_id_counts, run_killing_a_busy_worker, small_config

pytestmark = pytest.mark.usefixtures("ray_cluster")

def test_killed_worker_episodes_are_rerun_and_committed_once(tmp_path: Path) -> None:
    """Killing a Ray worker actor mid-run re-dispatches its in-flight episodes; each is committed once."""
    import ray

    run_killing_a_busy_worker(tmp_path, lambda actor: ray.kill(actor, no_restart=True), ray__pool="ray")


@pytest.mark.timeout(60)
def test_workers_that_do_not_fit_the_cluster_are_refused(tmp_path: Path) -> None:
    """cpus_per_worker beyond the cluster's CPUs is a one-line ConfigError before any actor, not a hang."""
    cfg = small_config(tmp_path / "run", ray__pool="ray", ray__cpus_per_worker=3)
    with pytest.raises(ConfigError) as info:
        run_job(cfg, show_progress=False)
    message = str(info.value)
    assert "\n" not in message
    assert "ray.cpus_per_worker" in message
    assert "ray.workers" in message
    assert "cluster has 2 CPUs" in message


@pytest.mark.timeout(60)
def test_worker_start_timeout_is_one_line(tmp_path: Path) -> None:
    """Workers not ready within ray.start_timeout_s end the run with one line naming the setting."""
    cfg = small_config(tmp_path / "run", ray__pool="ray", ray__start_timeout_s=0.001)
    with pytest.raises(CollectorError) as info:
        run_job(cfg, show_progress=False)
    assert "ray.start_timeout_s" in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.timeout(120)
def test_replacement_that_cannot_be_placed_stops_the_run(tmp_path: Path) -> None:
    """The only worker killed, its replacement unplaceable: the run stops in one line; a rerun completes."""
    import ray

    from collector.run.cluster import RayPool

    class Unplaceable(RayPool):
        """The Ray pool, but every actor after the first asks for a resource no node has."""

        created = 0

        def actor_options(self, num_cpus: float) -> dict[str, Any]:
            self.created += 1
            options = super().actor_options(num_cpus)
            return {**options, "resources": {"no_such_node": 1}} if self.created > 1 else options

    killed: list[object] = []

    def kill_all(snapshot: Snapshot) -> None:
        if not killed:
            killed.extend(snapshot.busy_actors)
            for actor in snapshot.busy_actors:
                ray.kill(actor, no_restart=True)

    # The replacement can never be placed: the run waits out its start timeout, which must also
    # cover the first worker's start on a loaded machine (15 s: Ray's start took over 6 there).
    cfg = small_config(
        tmp_path / "run", ray__pool="ray", sweep__models=["sim-slow"], env__tasks=10, ray__workers=1,
        ray__start_timeout_s=15.0,
    )
    with pytest.raises(CollectorError) as info:
        run_job(cfg, show_progress=False, on_commit=kill_all, pool=Unplaceable())
    assert len(killed) == 1
    assert "could not be placed" in str(info.value)
    assert "\n" not in str(info.value)
    before = committed_id_counts(tmp_path / "run")
    assert before
    assert set(before.values()) == {1}

    # The rerun's own start timeout is generous: it is not what is tested (and not in the run's identity).
    again = run_job(small_config(tmp_path / "run", ray__pool="ray", sweep__models=["sim-slow"], env__tasks=10,
                                 ray__workers=1, ray__start_timeout_s=120.0), show_progress=False)
    assert again.already == sum(before.values())
    counts = committed_id_counts(tmp_path / "run")
    assert set(counts) == {item.episode_id for item in plan_work(cfg).items}
    assert set(counts.values()) == {1}


def test_a_worker_failure_says_where_rays_logs_are(tmp_path: Path) -> None:
    """A worker that fails starting stops the run with one line naming the session's log
    directory, which holds the workers' logs."""
    cfg = small_config(
        tmp_path / "run", ray__pool="ray",
        env__name="workerfail_env:WorkerOnlyFailure",
        env__python_path=[str(Path(__file__).resolve().parents[2] / "run")],
    )
    with pytest.raises(CollectorError) as info:
        run_job(cfg, show_progress=False)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("a worker failed to start: RuntimeError: tasks cannot be listed on this worker")
    logs = Path(message.rsplit("(Ray logs: ", 1)[1].rstrip(")"))
    assert logs.is_dir()
    assert any(logs.glob("worker-*.err"))



def test_a_run_written_in_process_resumes_on_ray_and_back(tmp_path: Path) -> None:
    """The pool is not part of a run's identity: a sweep collected in process and grown on Ray,
    then grown again in process, commits every planned episode exactly once in one directory."""
    run_dir = tmp_path / "run"
    first = run_job(small_config(run_dir, sweep__budgets=[32]), show_progress=False)
    on_ray = run_job(small_config(run_dir, sweep__budgets=[32, 64], ray__pool="ray"), show_progress=False)
    back = run_job(small_config(run_dir, sweep__budgets=[32, 64, 128]), show_progress=False)
    assert (first.committed, on_ray.already, on_ray.committed) == (12, 12, 12)
    assert (back.already, back.committed) == (24, 12)
    counts = committed_id_counts(run_dir)
    cfg = small_config(run_dir, sweep__budgets=[32, 64, 128])
    assert set(counts) == {item.episode_id for item in plan_work(cfg).items}
    assert set(counts.values()) == {1}

"""`collector run --retry-errors`: episodes a failed provider turned into `error` are collected again.

A first run goes through a storm proxy that always fails two chosen tasks, so their
episodes exhaust their retries and are committed as `error`. A plain rerun would leave
them; the rerun with `--retry-errors` against the (now healthy) provider forgets them and
runs them again: no `error` row remains, every planned id is committed exactly once, and
`collector check` passes (the autouse fixture of this package runs it on the run dir).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from collector.cli import main
from collector.config import load_config
from collector.envs.arithmetic import ArithmeticEnv
from collector.run.job import run_job
from collector.run.plan import plan_work
from collector.sim.server import SimServer
from collector.stop import StopReason
from tests.checking import committed_ids, committed_rows
from tests.faults.storm import StormProxy

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def proxy() -> Iterator[StormProxy]:
    """A calm storm proxy in front of a fresh simulator; both stopped at the end."""
    with SimServer(seed=0) as sim:
        storm = StormProxy(sim.base_url, seed=3).up()
        storm.calm = True
        try:
            yield storm
        finally:
            storm.down()


def write_config(path: Path, run_dir: Path, proxy_url: str) -> Path:
    """A small sweep through the proxy: one retry with a short back-off, so doomed tasks fail fast."""
    path.write_text(f"""
name = "retry-errors"
samples_per_task = 2

[sweep]
models = ["sim-terse"]
budgets = [256]

[[sweep.providers]]
kind = "chat"
base_url = "{proxy_url}/v1"
label = "chat"
request_timeout_s = 2.0
retry = {{ max_retries = 1, initial_backoff_s = 0.05, max_backoff_s = 0.1 }}

[env]
name = "arithmetic"
tasks = 6

[ray]
pool = "in_process"
workers = 2
episodes_in_flight = 4
batch_size = 2
cpus_per_worker = 0.5

[output]
path = "{run_dir}"
rows_per_shard = 3
""")
    return path


def test_retry_errors_recollects_error_episodes_exactly_once(
    tmp_path: Path, proxy: StormProxy, capsys: pytest.CaptureFixture[str]
) -> None:
    """After an outage left `error` rows, a `--retry-errors` rerun replaces them all, each id once."""
    run_dir = tmp_path / "run"
    config = write_config(tmp_path / "retry.toml", run_dir, proxy.base_url)
    cfg = load_config(str(config), [])
    doomed = ArithmeticEnv().tasks()[:2]
    proxy.doomed = tuple(str(task.prompt).encode() for task in doomed)

    first = run_job(cfg, show_progress=False)
    planned = {item.episode_id for item in plan_work(cfg).items}
    rows = committed_rows(run_dir)
    errors = {r["episode_id"] for r in rows if r["stop_reason"] == StopReason.ERROR}
    doomed_ids = {t.id for t in doomed}
    assert errors == {r["episode_id"] for r in rows if r["task_id"] in doomed_ids}
    assert len(errors) == 4
    assert first.counts[StopReason.ERROR.value] == 4

    # The provider is healthy again; a plain rerun has nothing to do, the flag re-runs errors.
    proxy.doomed = ()
    assert run_job(cfg, show_progress=False).committed == 0
    capsys.readouterr()
    assert main(["run", str(config), "--retry-errors"]) == 0
    err = capsys.readouterr().err
    assert "4 earlier error episodes run again" in err  # the summary line
    assert "4 earlier errors re-run" in err  # the progress output

    counts = committed_ids(run_dir)
    assert set(counts) == planned
    assert set(counts.values()) == {1}
    rows = committed_rows(run_dir)
    assert not [r for r in rows if r["stop_reason"] == StopReason.ERROR]
    assert {r["episode_id"] for r in rows if r["task_id"] in doomed_ids} == errors

"""Provider storms: retried where retryable, `error` (never `length`, never training data) when not.

A `StormProxy` sits between the Ray workers and the simulator and serves 30% 429s with a
retry-after, bursts of 529s, 500s, streams (and bodies) cut midway and replies slower than
the request timeout; partway through the run it goes down and comes back up. The same
sweep is first collected through the calm proxy as the reference. Because the simulator is
deterministic in the request body, a retried request gets the reply the first attempt
would have had: every episode of the stormy run that did not end in `error` must equal its
reference episode, so a provider failure can never pass for a model failure.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from collector.analysis.stats import compute_stats
from collector.config import RunConfig
from collector.envs.arithmetic import ArithmeticEnv
from collector.run.job import Snapshot, run_job
from collector.run.plan import plan_work
from collector.sim.server import SimServer
from collector.stop import StopReason
from tests.checking import assert_run_checked, committed_ids, committed_rows
from tests.faults.storm import StormProxy

pytestmark = pytest.mark.timeout(240)

RETRYABLE_TYPES = {"ProviderUnavailable", "ProtocolViolation"}


@pytest.fixture
def proxy() -> Iterator[StormProxy]:
    """A storm proxy in front of a fresh simulator; both stopped at the end."""
    with SimServer(seed=0) as sim:
        storm = StormProxy(sim.base_url, seed=7).up()
        try:
            yield storm
        finally:
            storm.down()


def storm_config(run_dir: Path, proxy_url: str) -> RunConfig:
    """Two streaming wire formats through the proxy; short timeouts and back-off, four retries."""
    transport: dict[str, Any] = {
        "streaming": True,
        "request_timeout_s": 1.5,
        # About a second of retrying: longer than most bursts, shorter than the outage.
        "retry": {"max_retries": 4, "initial_backoff_s": 0.1, "max_backoff_s": 0.4},
    }
    return RunConfig.model_validate({
        "name": "storm",
        "samples_per_task": 2,
        "sweep": {
            "models": ["sim-terse"],
            "budgets": [48, 256],
            "providers": [
                {"kind": "chat", "base_url": proxy_url + "/v1", "label": "chat", **transport},
                {"kind": "anthropic", "base_url": proxy_url, "label": "anthropic", **transport},
            ],
        },
        "env": {"name": "arithmetic", "tasks": 10},
        "ray": {"pool": "in_process", "workers": 2, "episodes_in_flight": 6, "batch_size": 4,
                "cpus_per_worker": 0.5},
        "output": {"path": str(run_dir), "rows_per_shard": 4},
    })


def behaviour(row: dict[str, Any]) -> tuple[Any, ...]:
    """What the model did in an episode (independent of the transport's luck)."""
    turns = row["turns"]
    calls = [(c["name"], c["arguments_json"]) for c in row["executed_tool_calls"]]
    return (row["stop_reason"], row["reward"], len(turns), [t["finish_class"] for t in turns], calls)


def test_storm_retries_then_records_error_and_the_run_goes_on(tmp_path: Path, proxy: StormProxy) -> None:
    """Under a storm with an outage, non-error episodes equal the calm run's; failures are typed `error`."""
    calm_dir, storm_dir = tmp_path / "calm", tmp_path / "storm"
    proxy.calm = True
    calm = run_job(storm_config(calm_dir, proxy.base_url), show_progress=False)
    assert calm.counts.get(StopReason.ERROR.value, 0) == 0
    assert_run_checked(calm_dir, allow_notes=False)
    reference = {row["episode_id"]: behaviour(row) for row in committed_rows(calm_dir)}

    proxy.calm = False
    # Two tasks the provider always fails: their episodes must exhaust retries and end as error.
    doomed_tasks = list(ArithmeticEnv().tasks()[:2])
    proxy.doomed = tuple(str(task.prompt).encode() for task in doomed_tasks)
    outages: list[threading.Timer] = []

    def outage(snapshot: Snapshot) -> None:
        # One outage of about a second, once a few shards are in: episodes in flight then
        # exhaust their retries against a refused connection.
        if not outages and snapshot.committed >= 8:
            proxy.down()
            timer = threading.Timer(1.5, proxy.up)
            outages.append(timer)
            timer.start()

    cfg = storm_config(storm_dir, proxy.base_url)
    result = run_job(cfg, show_progress=False, on_commit=outage)
    for timer in outages:
        timer.join()
    assert outages, "the outage never happened"

    planned = {item.episode_id for item in plan_work(cfg).items}
    counts = committed_ids(storm_dir)
    assert set(counts) == planned
    assert set(counts.values()) == {1}
    assert_run_checked(storm_dir, allow_notes=False)

    # Every kind of fault was served, and most were absorbed by retries.
    for fault in ("rate_limit", "overload", "server_error", "drop", "slow"):
        assert proxy.counts[fault] > 0, (fault, proxy.counts)
    rows = committed_rows(storm_dir)
    errors = [row for row in rows if row["stop_reason"] == StopReason.ERROR]
    mix = Counter(str(r["stop_reason"]) for r in rows)
    doomed_ids = {t.id for t in doomed_tasks}
    assert {row["episode_id"] for row in rows if row["task_id"] in doomed_ids} <= {
        row["episode_id"] for row in errors
    }
    assert len(errors) < len(rows) * 0.6, mix

    # Exhausted retries are `error`: typed as a provider failure, not trainable, reward 0.
    for row in errors:
        assert row["error"]["type"] in RETRYABLE_TYPES, row["error"]
        assert row["trainable"] is False
        assert row["reward"] == 0.0
    # Everything else is exactly what the model did in the calm run.
    for row in rows:
        if row["stop_reason"] != StopReason.ERROR:
            assert behaviour(row) == reference[row["episode_id"]], row["episode_id"]
    cut = [row for row in rows if row["stop_reason"] == StopReason.LENGTH]
    assert len(cut) == sum(1 for b in reference.values() if b[0] == StopReason.LENGTH) - sum(
        1 for row in errors if reference[row["episode_id"]][0] == StopReason.LENGTH
    )

    # The counts are reported: by the job, and in the stats' error column.
    assert result.counts[StopReason.ERROR.value] == len(errors)
    assert sum(result.counts.values()) == len(planned)
    stats = compute_stats(storm_dir, by=("provider",))
    assert sum(g.errors for g in stats.groups) == len(errors)

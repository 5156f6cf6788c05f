"""Issue 27's done-when: a collection during which the simulator swaps its weights mid-run.

One in-process worker runs arithmetic episodes against the simulator's SGLang-shaped preset
(which reports `metadata.weight_version`). Before the run the simulator is told to swap
when three requests are generating at once (an event proving requests are in flight:
they are held until the mark, then aborted with `finish_reason: "abort"`), and after that
every few answered requests (so versions change between the turns of one episode).

What must hold: every turn's version is the version that answered it (the simulator's own
count of answers per version equals the record's), the aborted requests were re-sent
(their `abort` retries are counted and match the simulator's aborts), no `abort` became a
turn (so none became `done` or `length`), and each episode's span (first, last, distinct
count) is that of its turns.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx

from collector.config import RunConfig
from collector.record.episode import Episode
from collector.run.plan import plan_work
from collector.run.worker import EpisodeWorker, WorkerSetup
from collector.sim.server import SimServer
from collector.stop import StopReason


def _config(base_url: str, **provider: object) -> RunConfig:
    return RunConfig.model_validate({
        "name": "swap",
        "sweep": {"models": ["sim-sglang"], "budgets": [256]},
        "env": {"name": "arithmetic", "tasks": 6},
        "samples_per_task": 2,
        "ray": {"workers": 1, "episodes_in_flight": 4},
        "provider": {
            "kind": "chat", "base_url": base_url + "/v1", "allow_model_alias": True,
            # Fast back-off: the test waits for nothing but the swaps.
            "retry": {"max_retries": 4, "initial_backoff_s": 0.001, "max_backoff_s": 0.01},
            **provider,
        },
        "output": {"path": "unused"},
    })


def _run(cfg: RunConfig, base_url: str) -> list[Episode]:
    plan = plan_work(cfg)

    async def run() -> list[Episode]:
        worker = EpisodeWorker(WorkerSetup(cfg, plan.run_id, (base_url + "/v1",), "w"))
        try:
            return await worker.run_batch(plan.items)
        finally:
            await worker.close()

    return asyncio.run(run())


def test_versions_swapped_mid_run_are_recorded_and_aborts_retried() -> None:
    with SimServer(seed=3) as sim:
        control = sim.base_url + "/sim/weights"
        httpx.post(control, json={"when_in_flight": 3, "version": "v1"}).raise_for_status()
        httpx.post(control, json={"every": 5}).raise_for_status()
        episodes = _run(_config(sim.base_url), sim.base_url)
        state = httpx.get(control).json()

    turns = [t for e in episodes for t in e.turns]
    assert len(episodes) == 12
    assert state["swaps"] >= 3, state
    # Aborted requests were re-sent, counted under `abort`, exactly as many as were aborted.
    assert state["aborted"] >= 3
    assert sum(e.retries.count("abort") for e in episodes) == state["aborted"]
    # No abort ever became a turn, so none became done or length; nothing ended in error.
    assert not [t for t in turns if t.raw_finish_reason == "abort"]
    assert {e.stop_reason for e in episodes} <= {StopReason.DONE, StopReason.MAX_STEPS}
    # Every turn carries the version that answered it: the record's count per version is the
    # simulator's count of answers per version (v0 answered nothing: its requests were held
    # and aborted by the first swap).
    assert Counter(t.policy_version for t in turns) == Counter(state["answered"])
    assert "v0" not in state["answered"]
    assert {t.policy_version_source for t in turns} == {"server"}
    order = {f"v{i}": i for i in range(state["swaps"] + 1)}
    for e in episodes:
        versions = [t.policy_version for t in e.turns]
        assert versions == sorted(versions, key=lambda v: order[v or ""])  # never back in time
        assert (e.policy_version_first, e.policy_version_last) == (versions[0], versions[-1])
        assert e.policy_versions == len(set(versions))
    # The schedule swapped between turns of one episode: a trainer sees it straddle.
    assert any((e.policy_versions or 0) >= 2 for e in episodes)


def test_declared_version_from_a_url_fills_in_for_a_server_that_reports_none() -> None:
    """vLLM reports no version: the run's declared URL (here the simulator's SGLang-shaped
    `/get_weight_version`) is read before and after each request (the reading after wins
    after an abort; readings that differ leave the turn unknown)."""
    with SimServer(seed=4) as sim:
        control = sim.base_url + "/sim/weights"
        httpx.post(control, json={"when_in_flight": 3, "version": "v1"}).raise_for_status()
        cfg = _config(sim.base_url, policy_version_url=sim.base_url + "/get_weight_version")
        cfg = cfg.model_copy(update={"sweep": cfg.sweep.model_copy(update={"models": ["sim-terse"]})})
        episodes = _run(cfg, sim.base_url)
        state = httpx.get(control).json()

    turns = [t for e in episodes for t in e.turns]
    assert state["swaps"] == 1
    assert state["aborted"] >= 3
    assert sum(e.retries.count("abort") for e in episodes) == state["aborted"]
    # Nothing was answered by v0 (its requests were aborted): no turn may say v0. A request
    # that read v0 before the swap and was answered after it is unknown (None), never v0.
    assert state["answered"].keys() == {"v1"}
    assert {t.policy_version for t in turns} <= {"v1", None}
    assert sum(t.policy_version == "v1" for t in turns) >= len(turns) - 4  # at most the first wave
    assert {t.policy_version_source for t in turns if t.policy_version} == {"declared"}
    assert all(e.policy_versions == 1 for e in episodes if e.policy_version_first)


def test_streamed_aborts_are_retried_and_a_constant_version_is_declared() -> None:
    """Streams (which carry no version on any server) abort the same way; a run against one
    checkpoint declares it as a constant."""
    with SimServer(seed=5) as sim:
        control = sim.base_url + "/sim/weights"
        httpx.post(control, json={"when_in_flight": 4}).raise_for_status()
        cfg = _config(sim.base_url, streaming=True, policy_version="ckpt-1")
        episodes = _run(cfg, sim.base_url)
        state = httpx.get(control).json()

    turns = [t for e in episodes for t in e.turns]
    assert state["aborted"] >= 4
    assert sum(e.retries.count("abort") for e in episodes) == state["aborted"]
    assert not [t for t in turns if t.raw_finish_reason == "abort"]
    assert {e.stop_reason for e in episodes} <= {StopReason.DONE, StopReason.MAX_STEPS}
    assert {(t.policy_version, t.policy_version_source) for t in turns} == {("ckpt-1", "declared")}

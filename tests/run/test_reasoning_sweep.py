"""Thinking as a sweep axis: cells x reasoning settings, invalid cells refused up front, and the
statistics grouped by the setting with the simulator's thinking-cut truth met per cell."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from collector.analysis.stats import aggregate
from collector.cli import main
from collector.errors import ConfigError
from collector.record.episode import Episode
from collector.record.shards import episodes_to_table
from collector.run.plan import plan_work
from collector.run.simlaunch import provider_urls
from collector.run.worker import EpisodeWorker, WorkerSetup
from collector.sim.truth import binomial_interval, thinking_fills_cap_probability
from collector.storage.local import LocalRunStore
from tests.run.helpers import small_config
from tests.untraced import untraced

SETTINGS = [{"effort": "low"}, {"thinking_budget": 16}]


def test_every_cell_runs_once_per_reasoning_setting(tmp_path: Path) -> None:
    """The reasoning axis multiplies the cells, keeps their episode ids apart, and leaves the
    ids of a sweep without it unchanged."""
    plain = plan_work(small_config(tmp_path / "a"))
    swept = plan_work(small_config(tmp_path / "b", sweep__reasoning=SETTINGS))
    assert swept.size == len(swept.items) == 2 * plain.size
    assert len({i.episode_id for i in swept.items}) == len(swept.items)
    assert {i.reasoning_index for i in swept.items} == {0, 1}
    assert {i.reasoning_index for i in plain.items} == {None}
    assert not {i.episode_id for i in plain.items} & {i.episode_id for i in swept.items}


def test_an_anthropic_thinking_budget_not_below_the_cap_is_refused_naming_the_cell(tmp_path: Path) -> None:
    """An Anthropic thinking budget not below a cell's budget is a one-line config error naming
    the cell, raised while planning, before anything runs."""
    cfg = small_config(
        tmp_path / "run",
        provider={"kind": "sim", "sim_transport": "anthropic"},
        sweep={"models": ["sim-thinker"], "budgets": [4096, 1024], "reasoning": [{"thinking_budget": 2048}]},
    )
    with pytest.raises(
        ConfigError, match=r"sweep cell \(model 'sim-thinker', budget 1024, reasoning budget=2048\)"
    ):
        plan_work(cfg)
    ok = small_config(
        tmp_path / "ok",
        provider={"kind": "sim", "sim_transport": "gemini"},  # Gemini has no such rule
        sweep={"models": ["sim-thinker"], "budgets": [1024], "reasoning": [{"thinking_budget": 2048}]},
    )
    plan_work(ok)


def test_a_budget_by_reasoning_sweep_shows_thinking_cuts_per_cell_at_their_truth(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A demo-sized sweep (budgets x two reasoning settings, Gemini wire) groups its statistics
    by the setting, counts the episodes that spent a cap thinking per cell, and each cell's
    rate of first turns whose thought alone filled the cap falls in the simulator's analytic
    interval; a thinking budget under the cap removes those."""
    budgets = [24, 60, 120]
    cfg = small_config(
        tmp_path / "run",
        provider={"kind": "sim", "sim_transport": "gemini"},
        sweep={"models": ["sim-thinker"], "budgets": budgets, "reasoning": SETTINGS},
        env={"name": "arithmetic", "tasks": 100},
        samples_per_task=1,
    )
    plan = plan_work(cfg)

    async def run() -> list[Episode]:
        with provider_urls(plan.providers, cfg.seed) as urls:
            worker = EpisodeWorker(WorkerSetup(cfg, plan.run_id, urls, "w"))
            try:
                return await worker.run_batch(plan.items)
            finally:
                await worker.close()

    with untraced():  # samples over lines the other tests cover (tests/untraced.py)
        episodes = asyncio.run(run())
    stats = aggregate(episodes_to_table(episodes), ("model", "budget", "reasoning"))
    assert {(g.key["budget"], g.key["reasoning"]) for g in stats.groups} == {
        (b, s) for b in budgets for s in ("effort=low", "budget=16")
    }
    for g in stats.groups:
        budget, label = g.key["budget"], g.key["reasoning"]
        cell = [e for e in episodes if e.budget == budget and e.reasoning == label]
        filled = [e for e in cell if e.turns[0].reasoning_tokens >= e.turns[0].max_output_tokens]
        assert all("reasoning" in e.turns[0].length_signals for e in filled)
        truth = thinking_fills_cap_probability("sim-thinker", budget, 16 if label == "budget=16" else None)
        lo, hi = binomial_interval(truth, len(cell))
        assert lo <= len(filled) <= hi, (budget, label, truth, len(filled))
        assert g.thinking_cut >= len(filled)
    by_cell = {(g.key["budget"], g.key["reasoning"]): g.thinking_cut_rate for g in stats.groups}
    assert by_cell[(24, "effort=low")] > 0.5  # median thinking 60 tokens fills a 24-token cap
    assert by_cell[(24, "budget=16")] < by_cell[(24, "effort=low")]
    assert by_cell[(120, "budget=16")] == 0.0
    with LocalRunStore.open(tmp_path / "out", "fp", {}, "arrow", 64) as st:
        st.commit(episodes)
    assert main(["stats", str(tmp_path / "out")]) == 0
    header = capsys.readouterr().out.splitlines()[0].split()
    assert header[:3] == ["model", "budget", "reasoning"]  # grouped by the setting by default
    assert "thinking" in header


def test_an_anthropic_sampling_thinking_budget_not_below_a_cap_is_refused(tmp_path: Path) -> None:
    """Without a reasoning axis, `sampling.thinking_budget` is held to the same rule per cell."""
    cfg = small_config(
        tmp_path / "run",
        provider={"kind": "sim", "sim_transport": "anthropic"},
        sampling={"thinking_budget": 1024},
        sweep={"models": ["sim-thinker"], "budgets": [512, 4096]},
    )
    with pytest.raises(ConfigError, match=r"budget 512, sampling\.thinking_budget\)"):
        plan_work(cfg)


def test_the_shipped_reasoning_sweep_runs_and_shows_thinking_cuts_per_setting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """configs/reasoning_sweep.toml, as the README shows it (shrunk to fewer tasks, its workers in
    process), collects through the CLI and `collector stats --target` reports the thinking-cut rate
    per (budget, setting): the cap is spent on thought at the smallest budget and not under the
    thinking budget at the largest."""
    import json

    from collector.cli import main

    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    run_dir = tmp_path / "reasoning"
    overrides = [f"output.path={run_dir}", "env.options.num_tasks=20"]
    sets = [a for o in overrides for a in ("--set", o)]
    assert main(["run", "configs/reasoning_sweep.toml", "--in-process", "--quiet", *sets]) == 0
    capsys.readouterr()
    assert main(["stats", str(run_dir), "--target", "0.05", "--format", "json"]) == 0
    stats_out = capsys.readouterr().out
    rows = json.loads(stats_out)["rows"]
    by_cell = {(r["budget"], r["reasoning"]): r for r in rows}
    assert set(by_cell) == {(b, s) for b in (24, 60, 120, 240) for s in ("effort=low", "budget=16")}
    assert all(r["episodes"] == 40 for r in rows)
    assert by_cell[(24, "effort=low")]["thinking_cut_rate"] > 0.5
    assert by_cell[(240, "budget=16")]["thinking_cut_rate"] == 0.0

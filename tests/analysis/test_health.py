"""Group health (`collector stats --groups`) and `collector check --health` (collector.analysis.health)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from collector.analysis.health import compute_group_health, format_group_health, health_findings
from collector.cli import main
from collector.record.episode import Episode
from collector.stop import StopReason
from collector.storage.local import LocalRunStore
from collector.storage.manifest import committed_shard_paths
from tests.record.factory import make_episode

S = StopReason
SAMPLES = 4


def sample(stop: StopReason, task: str, s: int, budget: int, reward: float | None = None,
           model: str = "m1") -> Episode:
    """An episode whose answer text differs per sample, as real sampling at temperature > 0 gives."""
    ep = make_episode(stop, model=model, budget=budget, task=task, sample=s, reward=reward)
    for m in ep.messages:
        if m.role == "assistant" and m.text:
            m.text = f"{m.text} (sample {s})"
    if stop is S.DONE and reward is not None:
        ep.graded_reward = reward
    return ep


def commit(run: Path, episodes: list[Episode], samples: int = SAMPLES) -> Path:
    with LocalRunStore.open(run, "fp", {"samples_per_task": samples}, "arrow", 8) as st:
        st.commit(episodes)
    return run


def sweep() -> list[Episode]:
    """Budget 256: t0..t2 mixed rewards, t3 all 1.0. Budget 32: t0, t1 every sample cut, t2
    mixed, t3 one error (kept apart) and three 1.0; t4 has only 2 of 4 samples committed."""
    eps: list[Episode] = []
    for t in ("t0", "t1", "t2"):
        eps += [sample(S.DONE, t, s, 256, reward=float(s % 2)) for s in range(SAMPLES)]
    eps += [sample(S.DONE, "t3", s, 256, reward=1.0) for s in range(SAMPLES)]
    for t in ("t0", "t1"):
        eps += [sample(S.LENGTH, t, s, 32) for s in range(SAMPLES)]
    eps += [sample(S.DONE, "t2", s, 32, reward=float(s == 0)) for s in range(SAMPLES)]
    eps += [sample(S.ERROR, "t3", 0, 32)] + [sample(S.DONE, "t3", s, 32, reward=1.0) for s in (1, 2, 3)]
    eps += [sample(S.DONE, "t4", s, 32, reward=float(s)) for s in (0, 1)]
    return eps


def by_hand(run: Path) -> dict[int, dict[str, float]]:
    """The same counts from the shards with pandas, independently of the Arrow group-by."""
    df = pd.concat(pd.read_feather(p) for p in committed_shard_paths(run))
    df["stop_reason"] = df["stop_reason"].astype(str)
    out = {}
    for budget, cell in df.groupby("budget"):
        graded = cell[~cell.stop_reason.isin(["error", "timeout"])]
        g = graded.groupby("task_id")
        zero = g.reward.nunique() == 1
        cut = g.stop_reason.apply(lambda s: bool(s.isin(["length", "context_overflow"]).all()))
        out[int(budget)] = {
            "groups": cell.task_id.nunique(),
            "complete": int((cell.groupby("task_id")["sample"].nunique() >= SAMPLES).sum()),
            "zero_variance": int(zero.sum()),
            "zero_variance_share": g.size()[zero].sum() / len(graded),
            "zero_variance_cut": int((zero & cut).sum()),
            "infra_failures": int((cell.stop_reason.isin(["error", "timeout"])).sum()),
        }
    return out


def test_zero_variance_share_rises_with_truncation(tmp_path: Path) -> None:
    """The budget that cuts whole groups has the higher zero-variance share, all of it from cuts,
    and every count equals the one computed from the shards with pandas."""
    run = commit(tmp_path / "run", sweep())
    result = compute_group_health(run)
    assert result.by == ("model", "budget")  # as `collector stats`: no all-null reasoning axis
    rows = {r["budget"]: r for r in result.rows()}
    hand = by_hand(run)
    for budget, expected in hand.items():
        for k, v in expected.items():
            assert rows[budget][k] == pytest.approx(v), (budget, k)
    # Spelled out: at 256, 1 zero-variance group (t3) of 4 -> 4/16; at 32, t0, t1 (cut) and t3
    # (three 1.0s: the error is not a zero) of 5 groups -> (4 + 4 + 3) / 17 graded episodes.
    assert rows[256]["zero_variance_share"] == pytest.approx(4 / 16)
    assert rows[32]["zero_variance_share"] == pytest.approx(11 / 17)
    assert (rows[32]["zero_variance_cut"], rows[256]["zero_variance_cut"]) == (2, 0)
    assert (rows[32]["complete"], rows[32]["groups"], rows[32]["infra_failures"]) == (4, 5, 1)
    assert rows[32]["samples_per_task"] == SAMPLES


def test_an_error_is_not_a_zero(tmp_path: Path) -> None:
    """One error among three successes leaves the group zero-variance (it is not reward 0), and a
    group of failures only is counted as failed, not as a zero-variance group."""
    eps = [sample(S.ERROR, "t0", 0, 64)] + [sample(S.DONE, "t0", s, 64, reward=1.0) for s in (1, 2, 3)]
    eps += [sample(S.TIMEOUT, "t1", s, 64) for s in range(SAMPLES)]
    row = compute_group_health(commit(tmp_path / "run", eps)).rows()[0]
    got = (row["zero_variance"], row["graded_groups"], row["failed_groups"], row["infra_failures"])
    assert got == (1, 1, 1, 5)


def test_stats_groups_cli_json_and_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = commit(tmp_path / "run", sweep())
    assert main(["stats", str(run), "--groups", "--format", "json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["samples_per_task"] == SAMPLES
    assert {r["budget"]: r["zero_variance"] for r in payload["rows"]} == {32: 3, 256: 1}
    assert main(["stats", str(run), "--groups"]) == 0
    text = capsys.readouterr().out
    assert "zero-var share" in text
    assert "68.8%" not in text
    assert "64.7%" in text
    assert format_group_health(compute_group_health(run), "csv").splitlines()[0].startswith("model,budget,")


# --- check --health -------------------------------------------------------------------------


def healthy() -> list[Episode]:
    return [sample(stop, f"t{t}", s, 128, reward=float((s + t) % 2) if stop is S.DONE else None)
            for t in range(4) for s, stop in enumerate((S.DONE, S.DONE, S.DONE, S.LENGTH))]


def test_health_quiet_on_a_healthy_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = commit(tmp_path / "run", healthy())
    assert health_findings(run) == []
    assert main(["check", str(run), "--health"]) == 0
    assert "infrastructure failures: 0" in capsys.readouterr().out


def test_health_finds_planted_faults(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A hollow turn, two identical samples and an all-error task, each named with its ids."""
    eps = healthy()
    hollow = eps[0]
    hollow.messages[-1].text = ""  # the final turn spent 5 output tokens and showed nothing
    twin_a, twin_b = eps[5], eps[6]  # t1 samples 1 and 2
    for m_a, m_b in zip(twin_a.messages, twin_b.messages, strict=True):
        m_b.text = m_a.text
    broken = [sample(S.ERROR, "t9", s, 128) for s in range(SAMPLES)]
    run = commit(tmp_path / "run", eps + broken)
    found = {f.kind: f for f in health_findings(run, max_failure_share=0.5)}
    assert set(found) == {"hollow turns", "identical samples", "all samples failed"}
    assert found["hollow turns"].episode_ids == [hollow.episode_id]
    assert found["identical samples"].episode_ids == sorted([twin_a.episode_id, twin_b.episode_id])
    assert found["all samples failed"].episode_ids == sorted(e.episode_id for e in broken)
    # The default threshold (5%) also names the cell: 4 errors in 20 episodes.
    assert main(["check", str(run), "--health"]) == 1
    out = capsys.readouterr().out
    assert "failure share: model=sim-perfect" not in out
    assert "failure share: provider=chat" in out
    assert hollow.episode_id in out
    assert "infrastructure failures: 4 (error 4, timeout 0)" in out


def test_health_identical_samples_allowed_at_temperature_zero(tmp_path: Path) -> None:
    eps = [make_episode(S.DONE, task="t0", sample=s) for s in range(SAMPLES)]  # identical outputs
    for ep in eps:
        for turn in ep.turns:
            turn.temperature = 0.0
    assert health_findings(commit(tmp_path / "greedy", eps)) == []
    loose = [make_episode(S.DONE, task="t0", sample=s) for s in range(SAMPLES)]
    assert [f.kind for f in health_findings(commit(tmp_path / "sampled", loose))] == ["identical samples"]


def test_health_cut_rate_outlier(tmp_path: Path) -> None:
    eps = [sample(S.DONE, f"t{t}", s, 128, reward=float(s % 2)) for t in range(5) for s in range(SAMPLES)]
    eps += [sample(S.LENGTH, "t7", s, 128) for s in range(SAMPLES)]
    found = health_findings(commit(tmp_path / "run", eps))
    assert [f.kind for f in found] == ["cut-rate outlier"]
    assert "task t7: 4 of 4" in found[0].message
    assert len(found[0].episode_ids) == SAMPLES


# --- on the simulator -----------------------------------------------------------------------

SIM_BUDGETS = (8, 24, 512)
SIM_TASKS = 4


def sim_sweep(run: Path) -> Path:
    """sim-terse on 4 arithmetic tasks x 4 samples x budgets 8, 24, 512, run in-process (no Ray)
    against the simulator on loopback, committed like a run. At 8 every turn is cut."""
    import asyncio

    import httpx

    from collector.config import LoopConfig
    from collector.envs.arithmetic import ArithmeticEnv
    from collector.episode.loop import EpisodeSpec, run_episode
    from collector.providers import base_url_for, build_provider
    from collector.providers.base import Endpoint, RetryPolicy
    from collector.sim.server import SimServer

    env = ArithmeticEnv(num_tasks=SIM_TASKS)

    async def collect(url: str) -> list[Episode]:
        endpoint = Endpoint(base_url=base_url_for("chat", url), api_key="k", streaming=False,
                            request_timeout_s=10.0,
                            retry=RetryPolicy(max_retries=0, initial_backoff_s=0.01, max_backoff_s=0.01))
        async with httpx.AsyncClient() as client:
            provider = build_provider("chat", endpoint, client)
            return [await run_episode(EpisodeSpec("sim-run", "sim-terse", "chat", budget, task, sample=s,
                                                  seed=100 + s, env_name="arithmetic"),
                                      provider, env, LoopConfig())
                    for budget in SIM_BUDGETS for task in env.tasks() for s in range(SAMPLES)]

    with SimServer(seed=0) as sim:
        episodes = asyncio.run(collect(sim.base_url))
    config = {"samples_per_task": SAMPLES, "env": {"name": "arithmetic", "options": {"num_tasks": SIM_TASKS}}}
    with LocalRunStore.open(run, "fp", config, "arrow", 16) as st:
        st.commit(episodes)
    return run


@pytest.fixture(scope="module")
def sim_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sim_sweep(tmp_path_factory.mktemp("sim") / "run")


def test_simulator_zero_variance_rises_with_truncation(sim_run: Path) -> None:
    """On the simulator: the budget that cuts whole groups has every group zero-variance, all
    of them because of the cut, and the share falls as the budget grows; every count equals
    the pandas one from the shards."""
    rows = {r["budget"]: r for r in compute_group_health(sim_run).rows()}
    hand = by_hand(sim_run)
    for budget, expected in hand.items():
        for k, v in expected.items():
            assert rows[budget][k] == pytest.approx(v), (budget, k)
    assert rows[8]["zero_variance"] == rows[8]["zero_variance_cut"] == SIM_TASKS
    assert rows[8]["zero_variance_share"] == 1.0
    assert rows[8]["zero_variance_share"] > rows[24]["zero_variance_share"]
    assert rows[512]["zero_variance_cut"] == 0
    assert all(r["complete"] == SIM_TASKS for r in rows.values())


def test_simulator_run_is_healthy(sim_run: Path) -> None:
    assert health_findings(sim_run) == []

"""The reasoning-gym, OpenEnv and TRL demo configs on the simulator, run in process (`run --in-process`):
what a user trying them without a key sees (docs/environments.md).

The OpenEnv demo's server is examples/openenv_guess as it ships, served on loopback in a thread
of this process and given by `url` (the config's `server` command, a process, is the system
tier's: tests/system/test_openenv_demo.py).
"""

from __future__ import annotations

import importlib
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from collector.cli import main
from collector.record.shards import read_shard
from collector.stop import StopReason
from collector.storage.manifest import committed_shard_paths
from tests.envs.openenv_servers import EXAMPLES, Served, serve

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def _rows(run_dir: Path) -> list[dict[str, Any]]:
    return [row for p in committed_shard_paths(run_dir) for row in read_shard(p).to_pylist()]


@pytest.fixture
def guess_server() -> Iterator[Served]:
    with serve(importlib.import_module("openenv_guess.server").app) as served:
        yield served


def test_the_openenv_demo_gets_its_act_tool_called_on_the_simulator(
    guess_server: Served, tmp_path: Path
) -> None:
    """configs/openenv_demo.toml on the simulator: every uncut episode calls the `act` tool with a
    guess the action model accepts, scores 1 exactly when that guess is the game's secret, and no
    episode is an error."""
    lines = (CONFIGS / "openenv_demo.toml").read_text().splitlines()
    # The config as it ships, but for the server: the test's (`url`) instead of a command's.
    served = [f"url = {json.dumps(guess_server.url)}" if line.startswith("server = ") else
              f"python_path = {json.dumps([EXAMPLES])}" if line.startswith("python_path = ") else line
              for line in lines]
    assert served != lines
    path = tmp_path / "openenv_demo.toml"
    path.write_text("\n".join(served) + "\n")
    assert main(["run", str(path), "--in-process", "--quiet", "--set", f"output.path={tmp_path / 'run'}",
                 "--set", "env.options.num_tasks=4"]) == 0

    rows = _rows(tmp_path / "run")
    assert len(rows) == 2 * 2 * 4
    assert all(StopReason(r["stop_reason"]) is not StopReason.ERROR for r in rows), [r["error"] for r in rows]
    whole = [r for r in rows if StopReason(r["stop_reason"]) is StopReason.DONE]
    assert whole
    for row in whole:
        calls = [c for m in row["messages"] for c in m["tool_calls"]]
        assert [c["name"] for c in calls] == ["act"]
        guess = json.loads(calls[0]["arguments_json"])["guess"]
        assert 1 <= guess <= 10  # the prompt's first number in the action model's bounds (or a fault's bump)
        secret = int(row["task_id"].removeprefix("openenv-")) % 10 + 1  # the game's reset(seed)
        assert row["reward"] == (1.0 if guess == secret else 0.0)


def test_the_reasoning_gym_demo_on_the_simulator_is_graded_and_never_scores_a_cut_reply(
    tmp_path: Path,
) -> None:
    """configs/reasoning_gym.toml on the simulator: no error episode, a reply cut at the cap is
    `length` (never scored), and an uncut reply is graded by reasoning-gym's scorer; the simulator
    writes no `<answer>` tag (it reads no system prompt), so that grade is 0 (docs/environments.md)."""
    run_dir = tmp_path / "run"
    assert main(["run", str(CONFIGS / "reasoning_gym.toml"), "--in-process", "--quiet",
                 "--set", f"output.path={run_dir}", "--set", "env.options.size=5"]) == 0
    rows = _rows(run_dir)
    reasons = Counter(StopReason(r["stop_reason"]) for r in rows)
    assert len(rows) == 2 * 2 * 5
    assert reasons[StopReason.ERROR] == 0
    assert reasons[StopReason.LENGTH] > 0
    assert reasons[StopReason.DONE] > 0
    for row in rows:
        finals = [m["text"] for m in row["messages"] if m["role"] == "assistant"]
        assert row["num_tool_calls"] == 0
        if StopReason(row["stop_reason"]) is StopReason.DONE:
            assert "<answer>" not in (finals[-1] or "")
            assert row["reward"] == 0.0


def test_the_trl_demo_runs_as_written_and_stats_reads_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """configs/trl_demo.toml as it ships (but for its pool: the class runs the same in a Ray
    worker, which tests/system's Ray tests cover for any environment): the class's tools are
    called, the reward function scores the episodes it should, the 24-token budget ends
    episodes as `length` (never `error`), and `collector stats` prints a row per model and budget."""
    run_dir = tmp_path / "run"
    assert main(["run", str(CONFIGS / "trl_demo.toml"), "--in-process", "--quiet",
                 "--set", f"output.path={run_dir}"]) == 0
    capsys.readouterr()
    assert main(["stats", str(run_dir)]) == 0
    stats = capsys.readouterr().out
    rows = _rows(run_dir)
    assert len(rows) == 48
    reasons = {r["stop_reason"] for r in rows}
    assert "error" not in reasons
    assert {"done", "length"} <= reasons
    assert all(r["env"] == "trl:trl_shop.env:ShopEnv" for r in rows)
    done = [r for r in rows if r["stop_reason"] == "done" and r["task_id"] == "reserve-a17"]
    assert done
    assert any(r["reward"] == 1.0 for r in done)
    executed = {c["name"] for r in rows for c in r["executed_tool_calls"]}
    assert executed == {"check_stock", "reserve"}
    for model in ("sim-terse", "sim-sloppy"):
        for budget in (24, 256):
            assert any(line.split()[:2] == [model, str(budget)] for line in stats.splitlines()), stats

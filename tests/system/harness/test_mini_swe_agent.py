"""mini-swe-agent (PyPI) as a harness: configs/harness_mini_swe_agent.toml through `collector run`.

Each episode is a real mini-swe-agent process (its DefaultAgent, LocalEnvironment and LiteLLM
model, examples/harnesses/mini_swe_agent_harness.py) running bash commands in its working
directory against the gateway and the simulator, so these tests belong to the system tier.
The run is in process (`--in-process`: no Ray), the harnesses are child processes. Each one
imports LiteLLM, about 5 s of CPU: the runs are kept to 6 episodes in all.
"""

from __future__ import annotations

import json
from pathlib import Path

from collector.cli import main
from collector.record.episode import Episode
from collector.record.shards import episodes_from_table, read_shard
from collector.stop import StopReason
from collector.storage.manifest import committed_shard_paths

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "configs" / "harness_mini_swe_agent.toml"


def _run(tmp_path: Path, *settings: str) -> list[Episode]:
    """The documented config run by `collector run`, with the working directories kept."""
    run, work = tmp_path / "run", tmp_path / "work"
    work.mkdir()
    argv = ["run", str(CONFIG), "--in-process", "--quiet",
            "--set", f'output.path="{run}"', "--set", f'env.options.workdir_root="{work}"',
            "--set", "env.options.keep_workdir=true", "--set", "env.tasks=1"]
    for setting in settings:
        argv += ["--set", setting]
    assert main(argv) == 0
    episodes: list[Episode] = []
    for path in committed_shard_paths(run):
        episodes += episodes_from_table(read_shard(path))
    return episodes


def _executions(tmp_path: Path, episode: Episode) -> list[dict[str, str]]:
    """What the harness logged: one line per bash command it ran, with its tool call's id."""
    (base,) = (tmp_path / "work").glob(f"harness-{episode.episode_id[:12]}-*")
    log = base / "work" / "executions.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _executed_from_cut_turns(tmp_path: Path, episode: Episode) -> list[str]:
    """The logged commands whose tool call came from a turn the cap cut (a length signal on its
    record, whether or not the gateway withheld it)."""
    turn_of = {c.call_id: c.turn_index for c in episode.executed_tool_calls}
    cut = {t.index for t in episode.turns if t.length_signals}
    return [e["command"] for e in _executions(tmp_path, episode) if turn_of.get(e["id"]) in cut]


def test_mini_swe_agent_runs_as_episodes_and_never_runs_a_command_of_a_cut_turn(tmp_path: Path) -> None:
    """mini-swe-agent never runs a command of a cut turn; at a large budget it solves the task.

    Four of the config's six cells: sim-perfect at 15 (its first turn cut with the whole call)
    and at 18 (its first command run, the second turn cut with the whole call), sim-hidden-cut
    at 18 (a cut reported as `tool_calls`, at either turn) and sim-perfect at 1024 (solved).
    sim-hidden-cut at 15 and 1024 would add a hidden cut at the first turn, which the SDK loops'
    test has for sure (tests/system/harness/test_harness_run.py), and a second solved episode."""
    cells = [("sim-perfect", 15), ("sim-perfect", 18), ("sim-hidden-cut", 18), ("sim-perfect", 1024)]
    episodes = _run(tmp_path, "sweep.cells=[" + ", ".join(
        f'{{model = "{model}", budget = {budget}}}' for model, budget in cells) + "]")
    assert sorted((e.model, e.budget) for e in episodes) == sorted(cells)
    logged = 0
    for episode in episodes:
        ran = _executions(tmp_path, episode)
        logged += len(ran)
        returned = {c.call_id for c in episode.executed_tool_calls}
        assert {e["id"] for e in ran} <= returned  # everything it ran, the gateway returned
        assert _executed_from_cut_turns(tmp_path, episode) == []
        assert all(t.discarded for t in episode.turns if t.length_signals)
        if episode.budget == 1024:
            assert episode.stop_reason is StopReason.DONE
            assert episode.reward == 1.0  # the grader found the sum in answer.txt
            assert [e["command"] for e in ran] == [
                "echo $((17 + 25)) > answer.txt", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"]
        else:
            assert episode.stop_reason is StopReason.LENGTH
            assert episode.reward == 0.0
            assert episode.turns[-1].discarded
            assert all(t.harness_asked_cap is None for t in episode.turns)  # mini-swe-agent asks for no cap
            assert all(t.max_output_tokens == episode.budget for t in episode.turns)
    assert logged >= 3  # sim-perfect at 18 ran its first command, and two at 1024


def test_without_the_stop_rules_mini_swe_agent_runs_the_command_of_a_cut_turn(tmp_path: Path) -> None:
    """With the gateway only recording, mini-swe-agent runs a cut turn's call: the rules are what stop it."""
    episodes = _run(tmp_path, 'sweep.models=["sim-perfect"]', "sweep.budgets=[15, 18]",
                    "env.options.enforce_stop_rules=false")
    by_budget = {e.budget: e for e in episodes}
    assert _executed_from_cut_turns(tmp_path, by_budget[15])[0] == "echo $((17 + 25)) > answer.txt"
    assert _executed_from_cut_turns(tmp_path, by_budget[18]) == ["echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"]
    assert by_budget[18].stop_reason is StopReason.LENGTH  # the record still says where it would have ended

"""The collector's guarantee for a TRL class: nothing from a cut or malformed turn reaches it,
stop reasons are typed, and `collector stats` reads its run as a native environment's."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from collector.envs.base import Environment, EpisodeContext, EpisodeWorld, Task, Tool
from collector.envs.loading import load_environment
from collector.envs.toolkit import tool
from collector.envs.trl import TRLEnvironment
from collector.stop import StopReason
from tests.envs import trl_envs
from tests.envs.simrun import assert_only_whole_turns_ran, collect_on_sim, stats_table

ROWS = [
    {"id": f"shop-{i}", "prompt": f"Put {q} of 'A-{i}' in the cart.", "target": q}
    for i, q in enumerate((3, 5, 7))
]
CELLS = [("sim-sloppy", 20), ("sim-sloppy", 44), ("sim-sloppy", 400), ("sim-verbose", 90)]
SAMPLES = 12


class NativeShopWorld(EpisodeWorld):
    """LoggedShopEnv written for the collector's own API, offering the very same tool spec."""

    def __init__(
        self, target: int, specs: Sequence[Tool], log: list[tuple[int, str, dict[str, Any]]]
    ) -> None:
        self.target, self.total, self.log = target, 0, log
        functions = {"add_item": self.add_item, "add_note": self.add_note}
        self._tools = [
            tool(functions[s.name], name=s.name, description=s.description, parameters=s.parameters)
            for s in specs
        ]

    @property
    def tools(self) -> Sequence[Tool]:
        return self._tools

    def add_item(self, **arguments: Any) -> str:
        self.log.append((id(self), "add_item", arguments))
        self.total += arguments["quantity"]
        return f"cart holds {self.total}"

    def add_note(self, **arguments: Any) -> str:
        self.log.append((id(self), "add_note", arguments))
        return "noted"

    def grade(self, final_text: str | None) -> float:
        return 1.0 if self.total == self.target else 0.0


class NativeShopEnv(Environment):
    name = "native-shop"

    def __init__(self, tasks: Sequence[Task], specs: Sequence[Tool]) -> None:
        self._tasks, self.specs = list(tasks), specs
        self.log: list[tuple[int, str, dict[str, Any]]] = []

    def tasks(self) -> Sequence[Task]:
        return self._tasks

    def start(self, task: Task, context: EpisodeContext) -> NativeShopWorld:
        return NativeShopWorld(int(task.metadata["target"]), self.specs, self.log)


async def test_cut_and_malformed_turns_never_reach_a_trl_class(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On simulated models that cut and break calls, every execution the class logs is an executed
    call of a whole turn, the stop reasons are typed, and `collector stats` prints the same table
    as for the same tool written as a native environment."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    env = load_environment(
        "trl:tests.envs.trl_envs:LoggedShopEnv",
        {"task_file": str(rows), "reward": ["tests.envs.trl_envs:shop_reward"]},
    )
    assert isinstance(env, TRLEnvironment)
    trl_envs.EXECUTIONS.clear()
    episodes = await collect_on_sim(env, CELLS, SAMPLES)

    reasons = {e.stop_reason for e in episodes}
    assert {StopReason.LENGTH, StopReason.MALFORMED_TOOL_CALL, StopReason.DONE} <= reasons
    assert StopReason.ERROR not in reasons
    whole_but_cut = [
        c
        for e in episodes
        for m in e.messages
        if m.role == "assistant" and e.turns[m.turn_index].discarded
        for c in m.tool_calls
        if c.status == "ok"
    ]
    assert whole_but_cut  # cut and malformed turns did carry calls that parsed
    executed = [c for e in episodes for c in e.executed_tool_calls]
    assert len(trl_envs.EXECUTIONS) == len(executed)
    assert_only_whole_turns_ran(episodes)
    logged = sorted(json.dumps(a, sort_keys=True) for _, _, a in trl_envs.EXECUTIONS)
    assert logged == sorted(json.dumps(json.loads(c.arguments_json), sort_keys=True) for c in executed)
    assert any(e.reward == 1.0 for e in episodes)

    specs = [Tool(t.name, t.description, t.offered, lambda: None) for t in env.templates]
    native = NativeShopEnv(env.tasks(), specs)
    native_episodes = await collect_on_sim(native, CELLS, SAMPLES)
    assert [(e.stop_reason, e.reward) for e in native_episodes] == [
        (e.stop_reason, e.reward) for e in episodes
    ]
    assert len(native.log) == len(trl_envs.EXECUTIONS)

    table = stats_table(episodes, tmp_path / "trl-run", capsys)
    assert table == stats_table(native_episodes, tmp_path / "native-run", capsys)
    for model, budget in CELLS:
        assert any(line.split()[:2] == [model, str(budget)] for line in table.splitlines()), table

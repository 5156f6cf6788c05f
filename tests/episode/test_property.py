"""Property test: random scripted model behaviour never breaks the loop's invariants."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collector.config import LoopConfig
from collector.envs.base import Environment, EpisodeWorld, Task, Tool
from collector.envs.toolkit import tool
from collector.episode.loop import EpisodeSpec, run_episode
from collector.providers.scripted import ScriptedProvider, call, calls, cut, leaked, text
from collector.stop import StopReason
from collector.turn import ArgStatus, LengthSignal, ToolCall, Turn
from tests.episode.helpers import assert_settled


class _World(EpisodeWorld):
    """Every tool logs the call id it was given as `ref`, so we know exactly what ran."""

    def __init__(self, ran: list[str]) -> None:
        self.ran = ran
        self._tools = (
            tool(self.act, inline=True),
            tool(self.sweep, inline=True),
            tool(self.gate, inline=True, gate=True),
        )

    @property
    def tools(self) -> Sequence[Tool]:
        return self._tools

    def act(self, ref: str, amount: int) -> str:
        """Act."""
        self.ran.append(ref)
        return "ok"

    def sweep(self, ref: str = "") -> str:
        """All-optional."""
        self.ran.append(ref)
        return "swept"

    def gate(self, ref: str, deny: bool = False) -> str:
        """Gate."""
        self.ran.append(ref)
        if deny:
            raise PermissionError("denied")
        return "approved"

    def grade(self, final_text: str | None) -> float:
        return 1.0


class _Env(Environment):
    name = "prop"

    def __init__(self) -> None:
        self.ran: list[str] = []

    def tasks(self) -> Sequence[Task]:
        return [Task("t", "go")]

    def start(self, task: Task) -> EpisodeWorld:
        return _World(self.ran)


_ids = itertools.count()


@st.composite
def _call(draw: st.DrawFn) -> ToolCall:
    cid = f"c{next(_ids)}"
    name = draw(st.sampled_from(["act", "sweep", "gate", "missing"]))
    kind = draw(st.sampled_from(["ok", "ok", "malformed", "invalid"]))
    if kind == "malformed":
        return call(
            name, draw(st.sampled_from(['{"ref": "' + cid, "{", "[1]", '{"ref": "x"} <tool_call|'])), id=cid
        )
    args: dict[str, object] = {"ref": cid}
    if name == "act":
        args["amount"] = draw(st.integers(0, 2000))
    if name == "gate":
        args["deny"] = draw(st.booleans())
    if kind == "invalid":
        args["extra"] = 1
    return call(name, args, id=cid)


@st.composite
def _turn(draw: st.DrawFn) -> Turn:
    shape = draw(st.sampled_from(["calls", "calls", "cut", "text", "leaked"]))
    if shape == "text":
        return text("final")
    if shape == "leaked":
        return leaked("<tool_call>{")
    tool_calls = draw(st.lists(_call(), min_size=0 if shape == "cut" else 1, max_size=4))
    if shape == "cut":
        signal = draw(st.sampled_from(list(LengthSignal)))
        return cut(*tool_calls, signals=(signal,))
    return calls(*tool_calls)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    turns=st.lists(_turn(), min_size=1, max_size=8),
    stop_on=st.sets(st.sampled_from([StopReason.LENGTH, StopReason.MALFORMED_TOOL_CALL])),
    max_faults=st.integers(1, 3),
    max_steps=st.integers(1, 8),
)
def test_random_model_behaviour_keeps_the_invariants(
    turns: list[Turn], stop_on: set[StopReason], max_faults: int, max_steps: int
) -> None:
    """No tool runs from a length turn, every call id is settled once, stop_on reasons earn 0."""
    env = _Env()
    script = [*turns, *(text("final") for _ in range(max_steps))]
    settings_ = LoopConfig(stop_on=frozenset(stop_on), max_consecutive_faults=max_faults, max_steps=max_steps)
    spec = EpisodeSpec("run", "m", "scripted", 64, env.tasks()[0])
    episode = asyncio.run(run_episode(spec, ScriptedProvider(script), env, settings_))

    assert episode.stop_reason is not StopReason.ERROR
    assert_settled(episode)
    cut_ids = {c.id for t in turns if t.is_length for c in t.tool_calls}
    malformed_ids = {c.id for t in turns for c in t.tool_calls if c.status is ArgStatus.MALFORMED}
    assert not cut_ids & set(env.ran)
    assert not malformed_ids & set(env.ran)
    assert [e.call_id for e in episode.executed_tool_calls if e.name != "missing"] == env.ran
    for record in episode.turns:
        if record.finish_class == "length":
            assert record.discarded
            assert not any(e.turn_index == record.index for e in episode.executed_tool_calls)
    if episode.stop_reason in (StopReason.LENGTH, StopReason.MALFORMED_TOOL_CALL):
        assert episode.reward == 0.0
        last = episode.turns[-1]
        assert last.discarded
        assert not any(e.turn_index == last.index for e in episode.executed_tool_calls)
    if episode.stop_reason is StopReason.DONE:
        assert episode.reward == 1.0
    assert episode.num_turns <= max_steps

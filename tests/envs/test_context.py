"""Episode context for `Environment.start` and tools, and tools whose schema is given as data."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from collector.config import LoopConfig
from collector.envs.base import (
    Environment,
    EpisodeContext,
    EpisodeWorld,
    Task,
    Tool,
    ToolCallContext,
    start_world,
)
from collector.envs.toolkit import run_tool, tool
from collector.episode.loop import EpisodeSpec, run_episode
from collector.errors import EnvironmentFailure
from collector.providers.scripted import ScriptedProvider, call, calls, text
from collector.stop import StopReason
from tests.episode.helpers import assert_settled

TASK = Task("t1", "price the widget")
CTX = EpisodeContext("e1", "run-1", "t1", "m", "sim", 64, 2, 9, "ctx")


class _World(EpisodeWorld):
    def __init__(self, log: list[Any]) -> None:
        self.log = log
        self._tools = (tool(self.price, inline=True),)

    @property
    def tools(self) -> Sequence[Tool]:
        return self._tools

    def price(self, item: str, call: ToolCallContext) -> int:
        """The price of an item."""
        self.log.append((item, call))
        return 5

    async def open(self) -> None:
        self.log.append("open")

    async def close(self) -> None:
        self.log.append("close")

    async def grade(self, final_text: str | None) -> float:
        return 1.0 if final_text == "5" else 0.0


class ContextEnv(Environment):
    name = "ctx"

    def __init__(self) -> None:
        self.log: list[Any] = []
        self.contexts: list[EpisodeContext] = []

    def tasks(self) -> Sequence[Task]:
        return [TASK]

    def start(self, task: Task, context: EpisodeContext) -> EpisodeWorld:
        self.contexts.append(context)
        return _World(self.log)


async def test_start_and_tools_get_the_episode_and_call_context() -> None:
    """`start` gets the episode's ids, model, provider, budget, sample and seed; a tool that
    declares a ToolCallContext gets its call id and turn, which equal `executed_tool_calls`."""
    env = ContextEnv()
    script = [calls(call("price", {"item": "widget"}, id="c-7")), text("5")]
    spec = EpisodeSpec("run-1", "sim-terse", "simlabel", 96, TASK, sample=3, seed=11, env_name="ctx")
    episode = await run_episode(spec, ScriptedProvider(script), env, LoopConfig())
    assert episode.stop_reason is StopReason.DONE
    assert episode.reward == 1.0
    (context,) = env.contexts
    assert context == EpisodeContext(
        episode.episode_id, "run-1", "t1", "sim-terse", "simlabel", 96, 3, 11, "ctx"
    )
    assert env.log[0] == "open"
    assert env.log[-1] == "close"
    item, call_context = env.log[1]
    assert item == "widget"
    executed = episode.executed_tool_calls[0]
    assert (call_context.episode, call_context.call_id, call_context.turn_index) == (
        context,
        executed.call_id,
        executed.turn_index,
    )
    # The context parameter is not an argument the model sees or may send.
    assert set(_World([]).tools[0].parameters["properties"]) == {"item"}


class _OneArg(Environment):
    name = "one"

    def tasks(self) -> Sequence[Task]:
        return [TASK]

    def start(self, task: Task) -> EpisodeWorld:  # type: ignore[override]
        return _World([task.id])


class _KeywordOnly(_OneArg):
    def start(self, task: Task, *, context: EpisodeContext | None = None) -> EpisodeWorld:  # type: ignore[override]
        return _World([context])


def test_start_world_rule_keeps_one_argument_environments_working() -> None:
    """`start(task)` is called with the task alone; (task, context) and a keyword `context`
    get the context."""
    assert start_world(_OneArg(), TASK, CTX).log == ["t1"]  # type: ignore[attr-defined]
    assert start_world(_KeywordOnly(), TASK, CTX).log == [CTX]  # type: ignore[attr-defined]
    env = ContextEnv()
    start_world(env, TASK, CTX)
    assert env.contexts == [CTX]


SCHEMA = {
    "type": "object",
    "properties": {
        "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]+$"},
        "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
        "mode": {"oneOf": [{"const": "air"}, {"const": "sea"}]},
    },
    "required": ["sku", "quantity"],
    "additionalProperties": False,
}


async def test_tool_from_a_json_schema_is_validated_by_jsonschema() -> None:
    """A schema given as data is offered as is and enforced in full (pattern, bounds, oneOf),
    and an error names the field, never the value the model sent."""
    seen: list[dict[str, Any]] = []

    def order(**arguments: Any) -> str:
        seen.append(arguments)
        return "ordered"

    t = tool(order, name="order", description="Order stock.", parameters=SCHEMA, inline=True)
    assert (t.name, t.description, t.parameters) == ("order", "Order stock.", SCHEMA)
    ok = await run_tool(t, {"sku": "ABC-12", "quantity": 3, "mode": "sea"}, 1.0)
    assert (ok.content, ok.is_error) == ("ordered", False)
    assert seen == [{"sku": "ABC-12", "quantity": 3, "mode": "sea"}]
    bad_cases = [
        ({"sku": "hunter2-secret", "quantity": 3}, "arguments.sku: fails pattern"),
        ({"sku": "ABC-1", "quantity": 500}, "arguments.quantity: fails maximum"),
        ({"sku": "ABC-1", "quantity": "3"}, "arguments.quantity: expected integer"),
        ({"sku": "ABC-1", "quantity": 1, "mode": "rail"}, "arguments.mode: fails oneOf"),
        ({"sku": "ABC-1"}, "arguments.quantity: field required"),
        ({"sku": "ABC-1", "quantity": 1, "colour": "red"}, "arguments.colour: unknown argument"),
    ]
    for bad, message in bad_cases:
        out = await run_tool(t, bad, 1.0)
        assert out.is_error, bad
        assert not out.ran, bad
        assert message in out.content, (bad, out.content)
        assert "hunter2" not in out.content
        assert "rail" not in out.content
    assert len(seen) == 1
    with pytest.raises(ValueError, match="not a valid JSON Schema"):
        tool(order, name="broken", parameters={"type": "object", "properties": {"x": {"type": 5}}})


class _DyingWorld(_World):
    def price(self, item: str, call: ToolCallContext) -> int:
        """Its server is gone."""
        raise EnvironmentFailure("tool server exited with code 1")


class _DyingEnv(ContextEnv):
    def start(self, task: Task, context: EpisodeContext) -> EpisodeWorld:
        return _DyingWorld(self.log)


async def test_a_tool_raising_environment_failure_ends_the_episode_as_error() -> None:
    """A world broken under a call is an `error` episode naming the cause; every call id of the
    turn is settled once and the world is closed."""
    env = _DyingEnv()
    script = [calls(call("price", {"item": "a"}, id="c1"), call("price", {"item": "b"}, id="c2"))]
    spec = EpisodeSpec("r", "m", "p", 64, TASK)
    episode = await run_episode(spec, ScriptedProvider(script), env, LoopConfig())
    assert episode.stop_reason is StopReason.ERROR
    assert not episode.trainable
    assert episode.error is not None
    assert episode.error.type == "EnvironmentFailure"
    assert "tool price: EnvironmentFailure: tool server exited with code 1" in episode.error.message
    assert [c.call_id for c in episode.executed_tool_calls] == ["c1"]  # the second never ran
    assert_settled(episode)
    assert env.log[-1] == "close"


class _NeverOpens(_World):
    async def open(self) -> None:
        await asyncio.Event().wait()


class _NeverOpensEnv(ContextEnv):
    def start(self, task: Task, context: EpisodeContext) -> EpisodeWorld:
        return _NeverOpens(self.log)


async def test_a_world_that_never_opens_is_an_error_episode_not_a_hung_worker() -> None:
    """`open` is bounded by the episode's time limit; past it the episode ends as `error`."""
    episode = await run_episode(
        EpisodeSpec("r", "m", "p", 64, TASK), ScriptedProvider([]), _NeverOpensEnv(),
        LoopConfig(episode_timeout_s=0.05),
    )
    assert episode.stop_reason is StopReason.ERROR
    assert episode.error is not None
    assert episode.error.message.startswith("start: TimeoutError")


class _NeverGrades(_World):
    async def grade(self, final_text: str | None) -> float:
        await asyncio.Event().wait()
        return 1.0


class _NeverGradesEnv(ContextEnv):
    def start(self, task: Task, context: EpisodeContext) -> EpisodeWorld:
        return _NeverGrades(self.log)


async def test_an_async_grader_that_never_returns_is_an_error_episode() -> None:
    """An async grader is bounded by the tool timeout; past it the episode ends as `error`."""
    env = _NeverGradesEnv()
    episode = await run_episode(
        EpisodeSpec("r", "m", "p", 64, TASK), ScriptedProvider([text("5")]), env,
        LoopConfig(tool_timeout_s=0.05),
    )
    assert episode.stop_reason is StopReason.ERROR
    assert episode.error is not None
    assert episode.error.message.startswith("grade: TimeoutError")
    assert env.log[-1] == "close"


README = Path(__file__).resolve().parents[2] / "README.md"


async def test_the_readme_example_environment_runs() -> None:
    """The README's "Your own environment" code runs as shown: context, typed and JSON-schema
    tools, and the call context joining executed_tool_calls."""
    section = README_TEXT.split("## Your own environment", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    namespace: dict[str, Any] = {}
    exec(compile(code.group(1), "README.md", "exec"), namespace)
    env = namespace["MyEnv"](2)
    script = [
        calls(call("add", {"a": 40, "b": 2}, id="a1"), call("quote", {"zone": "mars"}, id="q1")),
        text("42"),
    ]
    worlds: list[Any] = []
    start = env.start
    env.start = lambda task, context: worlds.append(start(task, context)) or worlds[-1]
    spec = EpisodeSpec("r", "m", "p", 64, env.tasks()[0])
    episode = await run_episode(spec, ScriptedProvider(script), env, LoopConfig())
    assert (episode.stop_reason, episode.reward) == (StopReason.DONE, 1.0)
    assert worlds[0].calls == [(episode.episode_id, "a1")]
    quote = next(m for m in episode.messages if m.role == "tool" and m.call_id == "q1")
    assert quote.is_error
    assert "arguments.zone: not one of the allowed values" in quote.text


README_TEXT = README.read_text()

"""`openenv`: environments served by a real OpenEnv server (the `openenv` package's own server
classes, served by uvicorn on loopback in this process)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from collector.config import LoopConfig
from collector.envs.loading import load_environment
from collector.envs.openenv import OpenEnvEnvironment
from collector.episode.loop import EpisodeSpec, run_episode
from collector.errors import ConfigError
from collector.providers.scripted import ScriptedProvider, Step, call, calls, cut, text
from collector.record.episode import Episode
from collector.stop import StopReason
from collector.turn import Turn, TurnRequest
from tests.envs.openenv_servers import (
    EXECUTED,
    HANGING,
    Served,
    guess_app,
    serve,
    warehouse_app,
)

pytestmark = [
    # openenv 0.10's MCP bridge reads `Tool.inputSchema`, which FastMCP 4 (the release that
    # speaks MCP SDK 2, the SDK the collector's own mcp environment needs) marks deprecated.
    pytest.mark.filterwarnings("ignore:Accessing `Tool.inputSchema` is deprecated"),
]


@pytest.fixture(autouse=True)
def _fresh_log() -> Iterator[None]:
    EXECUTED.clear()
    yield
    EXECUTED.clear()


@pytest.fixture
def guess() -> Iterator[Served]:
    with serve(guess_app()) as served:
        yield served


@pytest.fixture
def warehouse() -> Iterator[Served]:
    with serve(warehouse_app()) as served:
        yield served


def _env(url: str, **options: object) -> OpenEnvEnvironment:
    env = load_environment("openenv", {"url": url, **options})
    assert isinstance(env, OpenEnvEnvironment)
    return env


async def _run(env: OpenEnvEnvironment, script: Sequence[Step] | ScriptedProvider, **loop: object) -> Episode:
    provider = script if isinstance(script, ScriptedProvider) else ScriptedProvider(script)
    spec = EpisodeSpec("run", "model", "scripted", 64, env.tasks()[0], env_name=env.name)
    return await run_episode(spec, provider, env, LoopConfig.model_validate({"tool_timeout_s": 5, **loop}))


def _guess(n: int, id: str | None = None) -> Turn:
    return calls(call("act", {"guess": n}, id=id))


async def test_a_typed_action_environment_is_one_tool_whose_schema_is_the_action_model(guess: Served) -> None:
    """The action model's JSON Schema (its `metadata` left out) is the one tool; each call is
    an action on the episode's own session, the reset observation ends the prompt, and
    the observation that says `done` ends the episode as `done` with the summed rewards."""
    env = _env(guess.url)
    episode = await _run(env, [_guess(3), _guess(1)])
    assert '"name": "act"' in episode.tools
    assert '"guess"' in episode.tools
    assert "metadata" not in episode.tools
    assert EXECUTED == [("guess", 3), ("guess", 1)]
    assert episode.stop_reason is StopReason.DONE
    assert episode.reward == pytest.approx(1.25)
    users = [m.text for m in episode.messages if m.role == "user"]
    assert len(users) == 1
    assert users[0].endswith("\n\nI picked a number from 1 to 10.")
    assert [m.text for m in episode.messages if m.role == "tool"] == ["lower", "right!"]


@pytest.mark.parametrize(("reward", "expected"), [("sum", 0.5), ("last", 0.25), ("final", 0.0)])
async def test_the_reward_is_read_from_the_observations_as_configured(
    guess: Served, reward: str, expected: float
) -> None:
    """`reward = "sum"` adds the steps' rewards, `"last"` keeps the last one, and `"final"` is
    the reward of the observation that said done: 0 when the episode ended without it."""
    env = _env(guess.url, reward=reward)
    episode = await _run(env, [_guess(3), _guess(5), text("I give up")])
    assert episode.stop_reason is StopReason.DONE
    assert episode.reward == pytest.approx(expected)


async def test_each_task_resets_the_server_with_its_own_options(guess: Served) -> None:
    """A task's `metadata.reset` reaches the server's reset: seed 2 moves the secret to 3."""
    env = _env(guess.url, tasks=[{"id": "s2", "prompt": "Find it.", "metadata": {"reset": {"seed": 2}}}],
               reward="final")
    episode = await _run(env, [_guess(1), _guess(3)])
    assert EXECUTED == [("guess", 1), ("guess", 3)]
    assert episode.reward == 1.0


async def test_an_mcp_style_environment_offers_its_own_tools(warehouse: Served) -> None:
    """An MCP-style OpenEnv environment's tools come from its list_tools action and each call
    is a call_tool action whose text result the model reads."""
    env = _env(warehouse.url)
    episode = await _run(env, [calls(call("order_status", {"order_id": "A-1"})), text("It has shipped.")])
    assert '"order_status"' in episode.tools
    assert '"refund"' in episode.tools
    assert EXECUTED == [("order_status", "A-1")]
    assert [m.text for m in episode.messages if m.role == "tool"] == ["shipped"]
    assert episode.stop_reason is StopReason.DONE


async def test_nothing_from_a_cut_turn_reaches_either_kind_of_server(
    guess: Served, warehouse: Served
) -> None:
    """A turn cut by the output cap whose calls look complete is `length`: neither the action
    nor the tool call is ever sent to the server."""
    typed = await _run(_env(guess.url), [_guess(3), cut(call("act", {"guess": 1}))])
    mcp = await _run(_env(warehouse.url), [cut(call("refund", {"order_id": "A-1", "amount": 500.0}))])
    assert EXECUTED == [("guess", 3)]
    assert typed.stop_reason is StopReason.LENGTH
    assert mcp.stop_reason is StopReason.LENGTH
    assert typed.reward == 0.0
    assert mcp.executed_tool_calls == []


async def test_nothing_from_a_malformed_turn_reaches_the_server(warehouse: Served) -> None:
    """A turn with a malformed call ends as `malformed_tool_call`; its valid sibling is not run."""
    bad = calls(call("order_status", {"order_id": "A-1"}), call("refund", '{"order_id": "A-1", "amount": 5'))
    episode = await _run(_env(warehouse.url), [bad])
    assert EXECUTED == []
    assert episode.stop_reason is StopReason.MALFORMED_TOOL_CALL


async def test_an_action_the_model_got_wrong_is_refused_before_it_is_sent(guess: Served) -> None:
    """Arguments outside the action model's schema (a guess over 10) are an error result
    for the model; the server never sees them and the episode goes on."""
    episode = await _run(_env(guess.url), [_guess(500), _guess(1)])
    assert EXECUTED == [("guess", 1)]
    assert episode.stop_reason is StopReason.DONE
    assert episode.tool_errors == 1


def test_a_server_that_is_down_is_one_line_before_the_run() -> None:
    """A URL nobody answers is a one-line config error naming the option and the server."""
    with serve(guess_app()) as served:
        url = served.url
    with pytest.raises(ConfigError) as caught:
        _env(url)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"env.options.url: openenv server at {url} did not give its action schema")


async def test_a_server_gone_before_the_episode_is_an_error_episode(guess: Served) -> None:
    """A server that went away after the run started ends the episode as `error` naming the
    server and the cause, never as a reward of 0."""
    env = _env(guess.url)
    guess.stop()
    episode = await _run(env, [_guess(3)])
    assert episode.stop_reason is StopReason.ERROR
    assert not episode.trainable
    assert episode.error is not None
    expected = f"start: EnvironmentFailure: openenv server at {guess.url}: cannot open a session"
    assert episode.error.message.startswith(expected)


class _StopsServerFirst(ScriptedProvider):
    """Stops the served app (and waits until it is gone) before its second turn."""

    def __init__(self, script: Sequence[Step], served: Served) -> None:
        super().__init__(script)
        self.served = served

    async def complete(self, request: TurnRequest) -> Turn:
        import asyncio

        if len(self.requests) == 1:
            await asyncio.to_thread(self.served.stop)
        return await super().complete(request)


async def test_a_session_closed_mid_episode_is_an_error_episode(guess: Served) -> None:
    """The server closing the session between two actions ends the episode as `error` naming
    the server and that it closed the session; the call that found it closed is recorded."""
    env = _env(guess.url)
    episode = await _run(env, _StopsServerFirst([_guess(3), _guess(1)], guess))
    assert EXECUTED == [("guess", 3)]
    assert episode.stop_reason is StopReason.ERROR
    assert episode.error is not None
    assert "closed the session during step" in episode.error.message
    assert guess.url in episode.error.message


async def test_a_server_that_hangs_is_an_error_episode(guess: Served) -> None:
    """A step the server never answers (it is seen hanging) ends the episode as `error` after
    `timeout_s`, naming the server and the wait, not as a tool error the model retries."""
    env = _env(guess.url, timeout_s=0.5)
    episode = await _run(env, [_guess(9)])
    assert HANGING.is_set()
    assert episode.stop_reason is StopReason.ERROR
    assert episode.error is not None
    assert "no answer to step within 0.5 s" in episode.error.message


async def test_an_environment_failing_in_its_step_is_an_error_episode(guess: Served) -> None:
    """An exception in the environment's own step (the server answers EXECUTION_ERROR) ends the
    episode as `error` quoting it."""
    episode = await _run(_env(guess.url), [_guess(8)])
    assert episode.stop_reason is StopReason.ERROR
    assert episode.error is not None
    assert "step failed on the server (EXECUTION_ERROR: unlucky number)" in episode.error.message


class _Garbling:
    """ASGI middleware over the real server: once armed, every WebSocket message it sends is
    replaced by text that is not the protocol."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.armed = False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def garbled(message: Any) -> None:
            if self.armed and message.get("type") == "websocket.send":
                message = {"type": "websocket.send", "text": "<html>502 Bad Gateway</html>"}
            await send(message)

        await self.app(scope, receive, garbled)


async def test_a_server_answering_garbage_is_an_error_episode() -> None:
    """An answer that is not JSON ends the episode as `error` saying so."""
    app = _Garbling(guess_app())
    with serve(app) as served:
        env = _env(served.url)
        app.armed = True
        episode = await _run(env, [_guess(3)])
    assert episode.stop_reason is StopReason.ERROR
    assert episode.error is not None
    assert "answered reset with something that is not JSON" in episode.error.message


async def test_a_tool_that_fails_on_the_server_is_an_error_result_the_model_reads(warehouse: Served) -> None:
    """An MCP tool raising on the server comes back as the call's error result (the episode
    goes on), quoting the tool's message."""
    script = [calls(call("cancel", {"order_id": "A-1"})), text("It cannot be cancelled.")]
    episode = await _run(_env(warehouse.url), script)
    assert EXECUTED == [("cancel", "A-1")]
    assert episode.stop_reason is StopReason.DONE
    results = [m for m in episode.messages if m.role == "tool"]
    assert results[0].is_error
    assert "has shipped and cannot be cancelled" in results[0].text


async def test_a_grade_tool_is_hidden_from_the_model_and_gives_the_reward(warehouse: Served) -> None:
    """With `grade_tool` that server tool is not offered to the model and is called once at
    grading with the final answer; its result is the reward."""
    env = _env(warehouse.url, grade_tool="check")
    episode = await _run(env, [calls(call("order_status", {"order_id": "A-1"})), text("It has shipped.")])
    assert '"check"' not in episode.tools
    assert EXECUTED == [("order_status", "A-1"), ("check", "It has shipped.")]
    assert episode.reward == 1.0


async def test_each_episode_has_its_own_session(guess: Served) -> None:
    """Two episodes in flight at once on one server each play their own game (their own
    reset seed, their own secret), so neither sees the other's state."""
    import asyncio

    tasks = [{"id": f"s{n}", "prompt": "Find it.", "metadata": {"reset": {"seed": n}}} for n in (0, 3)]
    env = _env(guess.url, tasks=tasks, reward="final")

    async def play(task_index: int, answer: int) -> Episode:
        spec = EpisodeSpec("run", "model", "scripted", 64, env.tasks()[task_index], env_name=env.name)
        provider = ScriptedProvider([_guess(answer)])
        return await run_episode(spec, provider, env, LoopConfig())

    first, second = await asyncio.gather(play(0, 1), play(1, 4))
    assert (first.reward, second.reward) == (1.0, 1.0)
    assert first.stop_reason is StopReason.DONE
    assert second.stop_reason is StopReason.DONE


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "env.options: the openenv environment needs url or server (a command), not both"),
        ({"url": "ftp://x"}, "env.options.url: 'ftp://x' is not an http(s) URL"),
        ({"server": ["python"], "reward": "mean"},
         "env.options.reward: must be one of sum, last, final (got 'mean')"),
        ({"server": "python -m x"}, "env.options.server: a command must be a non-empty list of strings"),
    ],
)
def test_bad_options_are_one_line_naming_the_option(options: dict[str, object], message: str) -> None:
    """Options the environment cannot use are refused before the run, one line each."""
    with pytest.raises(ConfigError) as caught:
        load_environment("openenv", options)
    assert str(caught.value) == message

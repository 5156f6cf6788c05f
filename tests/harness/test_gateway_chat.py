"""The harness gateway's Chat Completions route, in-process: an `openai` SDK tool loop through it.

The harness (examples/harnesses/openai_tool_loop.py, an ordinary loop that runs every call it
gets back) talks to the gateway's ASGI app, and the gateway to the simulator's, both through
`httpx.ASGITransport`: no socket, no child process.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI, PermissionDeniedError

from collector.envs.base import Task
from collector.stop import StopReason
from tests.harness.helpers import TASKS, bearer, post_twice, sweep

_LOOP = Path(__file__).resolve().parents[2] / "examples" / "harnesses" / "openai_tool_loop.py"
_spec = importlib.util.spec_from_file_location("openai_tool_loop", _LOOP)
assert _spec is not None
assert _spec.loader is not None
openai_tool_loop: Any = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(openai_tool_loop)

CHAT = "/v1/chat/completions"


def _drive(stream: bool) -> Any:
    async def drive(app: Any, root: str, token: str, task: Task, workdir: Path) -> None:
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app))
        async with AsyncOpenAI(
            base_url=root + "/v1", api_key=token, http_client=http, max_retries=0
        ) as c:
            with contextlib.suppress(PermissionDeniedError):  # the episode ended and the loop asked again
                await openai_tool_loop.run(c, str(task.prompt), workdir, stream=stream)

    return drive


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_no_logged_execution_comes_from_a_cut_turn(tmp_path: Path, stream: bool) -> None:
    """At small budgets an ordinary SDK tool loop behind the gateway never runs a call of a cut turn."""
    cut_turns, executions, from_cut = asyncio.run(sweep(tmp_path, _drive(stream), enforce=True))
    assert cut_turns >= 10  # the sweep cut turns
    assert executions >= 10  # and the loop ran calls
    assert from_cut == []


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_the_same_sweep_without_enforcement_runs_calls_of_cut_turns(tmp_path: Path, stream: bool) -> None:
    """A recording proxy (enforcement off) lets the same loop run calls of cut turns: the check can fail."""
    cut_turns, _, from_cut = asyncio.run(sweep(tmp_path, _drive(stream), enforce=False))
    assert cut_turns >= 10
    assert len(from_cut) >= 3


def _body(task: Task, **extra: Any) -> dict[str, Any]:
    return {
        "model": "whatever",
        "tools": openai_tool_loop.TOOLS,
        "messages": [{"role": "user", "content": task.prompt}],
        **extra,
    }


def test_a_cut_turn_reaches_the_harness_as_length_with_no_calls_and_ends_the_episode() -> None:
    """The cut turn's calls are withheld, its finish reason is `length`, the token is refused afterwards."""
    # A hidden cut: the server says `tool_calls` for a call cut at the cap (vLLM does).
    session, first, again = asyncio.run(
        post_twice(CHAT, _body(TASKS[1], max_tokens=5000), "sim-hidden-cut", 36, TASKS[1], bearer)
    )
    reply = first.json()
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "length"
    assert "tool_calls" not in choice["message"]
    assert reply["model"] == "sim-hidden-cut"
    turn = session.state.turns[0]
    assert (turn.raw_finish_reason, turn.length_signals) == ("tool_calls", ["cap_reached"])
    assert (turn.discarded, turn.num_tool_calls, turn.calls_withheld) == (True, 1, 1)
    assert (turn.max_output_tokens, turn.harness_asked_cap) == (36, 5000)
    assert session.reason is StopReason.LENGTH
    assert session.ended.is_set()
    assert session.state.executed == []
    assert again.status_code == 403
    assert "ended (length)" in again.json()["error"]["message"]
    unknown, _, _ = asyncio.run(
        post_twice(CHAT, _body(TASKS[1]), "sim-perfect", 36, TASKS[1], lambda token: bearer("not-" + token))
    )
    assert unknown.state.turns == []  # an unknown token reaches no provider


def test_a_streamed_cut_turn_carries_no_tool_call_delta() -> None:
    """Streamed, a withheld turn's events hold its text and `length`, never a tool-call delta."""
    body = _body(TASKS[1], stream=True, stream_options={"include_usage": True})
    session, reply, _ = asyncio.run(post_twice(CHAT, body, "sim-hidden-cut", 36, TASKS[1], bearer))
    assert reply.headers["content-type"].startswith("text/event-stream")
    events = [line[6:] for line in reply.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert not any("tool_calls" in ch["delta"] for c in chunks for ch in c["choices"])
    assert [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch["finish_reason"]] == ["length"]
    assert chunks[-1]["usage"]["completion_tokens"] == 36
    assert session.state.turns[0].calls_withheld == 1


def test_a_rewritten_history_is_marked_where_it_happened() -> None:
    """A request that does not extend what the harness sent before marks its turn `history_rewritten`."""
    from collector.config import LoopConfig
    from collector.episode.loop import EpisodeSpec
    from collector.harness.gateway import Gateway, episode_root
    from collector.harness.session import HarnessSession
    from collector.providers import build_provider
    from collector.providers.base import Endpoint
    from collector.sim.app import create_app

    async def go() -> list[bool | None]:
        gateway = Gateway()
        task = TASKS[1]
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(0))) as sim:
            spec = EpisodeSpec(run_id="r", model="sim-perfect", provider_kind="sim", budget=400, task=task)
            session = HarnessSession(
                spec, build_provider("chat", Endpoint("http://sim/v1"), sim), LoopConfig()
            )
            gateway.open(session)
            first = [{"role": "user", "content": task.prompt}]
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=gateway.app), base_url=episode_root("http://gw", session)
            ) as c:
                body = {"model": "m", "tools": openai_tool_loop.TOOLS, "messages": first}
                message = (await c.post(CHAT, json=body, headers=bearer(session.token))).json()
                message = message["choices"][0]["message"]
                result = {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "7"}
                extended = [*first, message, result]
                await c.post(CHAT, json={**body, "messages": extended}, headers=bearer(session.token))
                compacted = [
                    {"role": "user", "content": "Summary so far: the calculator said 7. " + task.prompt}
                ]
                await c.post(CHAT, json={**body, "messages": compacted}, headers=bearer(session.token))
        return [t.history_rewritten for t in session.state.turns]

    assert asyncio.run(go()) == [False, False, True]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content"),
    ],
)
def test_a_malformed_request_is_a_400_naming_the_field(body: dict[str, Any], field: str) -> None:
    """A body the gateway cannot read is answered 400 with the field named, and reaches no provider."""
    session, reply, _ = asyncio.run(post_twice(CHAT, body, "sim-perfect", 50, TASKS[0], bearer))
    assert reply.status_code == 400
    assert field in reply.json()["error"]["message"]
    assert session.state.turns == []

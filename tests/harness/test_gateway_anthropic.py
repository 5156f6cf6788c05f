"""The gateway's Anthropic Messages route, in-process: an `anthropic` SDK tool loop through it.

The loop (examples/harnesses/anthropic_tool_loop.py) runs every `tool_use` block it gets; the
gateway forwards to the simulator over the Chat wire, so the route translates both ways.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import sys
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from anthropic import AsyncAnthropic, PermissionDeniedError

from collector.config import LoopConfig
from collector.episode.loop import EpisodeSpec
from collector.harness.gateway import Gateway
from collector.harness.session import HarnessSession
from collector.providers import build_provider
from collector.providers.base import Endpoint
from collector.sim.app import create_app
from collector.stop import StopReason
from collector.turn import SamplingParams
from tests.harness.test_gateway_chat import CELLS, TASKS, Seen, _lines

HARNESSES = Path(__file__).resolve().parents[2] / "examples" / "harnesses"
if str(HARNESSES) not in sys.path:  # the loop imports its calculator from the OpenAI example
    sys.path.insert(0, str(HARNESSES))
anthropic_tool_loop: Any = importlib.import_module("anthropic_tool_loop")


async def _episode(
    gateway: Gateway,
    sim: httpx.AsyncClient,
    i: int,
    model: str,
    budget: int,
    workdir: Path,
    enforce: bool,
    stream: bool,
) -> tuple[HarnessSession, list[dict[str, Any]]]:
    task = TASKS[i]
    spec = EpisodeSpec(
        run_id="r",
        model=model,
        provider_kind="sim",
        budget=budget,
        task=task,
        seed=i,
        sampling=SamplingParams(extra_headers={"x-sim-seed": str(i)}),
    )
    provider = Seen(build_provider("chat", Endpoint("http://sim/v1"), sim))
    session = HarnessSession(spec, provider, LoopConfig(), enforce=enforce)
    gateway.open(session)
    workdir.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 - a test's temp dir, before the episode
    # The `anthropic` SDK is built on httpx2 (its own fork of httpx), with the same ASGI transport.
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=gateway.app))
    async with AsyncAnthropic(
        base_url="http://gateway", api_key=session.token, http_client=http, max_retries=0
    ) as client:
        with contextlib.suppress(PermissionDeniedError):  # the episode ended and the loop asked again
            await anthropic_tool_loop.run(client, str(task.prompt), workdir, stream=stream)
    gateway.close(session)
    return session, [json.loads(line) for line in _lines(workdir / "executions.jsonl")]


async def _sweep(tmp_path: Path, enforce: bool, stream: bool) -> tuple[int, int, list[str]]:
    gateway = Gateway()
    cut_turns = executions = 0
    from_cut: list[str] = []
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(0))) as sim:
        for model, budget in CELLS:
            for i in range(len(TASKS)):
                session, logged = await _episode(
                    gateway, sim, i, model, budget, tmp_path / f"{model}-{budget}-{i}", enforce, stream
                )
                cut_ids = {c.id for t in session.provider.turns if t.is_length for c in t.tool_calls}
                cut_turns += sum(1 for t in session.state.turns if t.length_signals)
                executions += len(logged)
                from_cut += [e["id"] for e in logged if e["id"] in cut_ids]
    return cut_turns, executions, from_cut


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_no_logged_tool_use_comes_from_a_cut_turn(tmp_path: Path, stream: bool) -> None:
    """An `anthropic` SDK loop behind the gateway never runs a `tool_use` of a cut turn, streamed or not."""
    cut_turns, executions, from_cut = asyncio.run(_sweep(tmp_path, True, stream))
    assert cut_turns >= 10
    assert executions >= 10
    assert from_cut == []


def test_without_enforcement_the_same_loop_runs_tool_uses_of_cut_turns(tmp_path: Path) -> None:
    """With the gateway only recording, the same loop runs calls of cut turns: the check above can fail."""
    _, _, from_cut = asyncio.run(_sweep(tmp_path, False, False))
    assert len(from_cut) >= 3


def test_a_cut_turn_is_max_tokens_with_no_tool_use_and_the_token_is_refused_after() -> None:
    """A withheld turn reaches the harness as `stop_reason: max_tokens` with text only; then a 403."""

    async def go() -> None:
        gateway = Gateway()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(0))) as sim:
            task = TASKS[1]
            spec = EpisodeSpec(run_id="r", model="sim-hidden-cut", provider_kind="sim", budget=36, task=task)
            session = HarnessSession(
                spec, build_provider("chat", Endpoint("http://sim/v1"), sim), LoopConfig()
            )
            gateway.open(session)
            body = {
                "model": "claude",
                "max_tokens": 1000,
                "tools": anthropic_tool_loop.TOOLS,
                "messages": [{"role": "user", "content": task.prompt}],
            }
            headers = {"x-api-key": session.token}
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=gateway.app), base_url="http://gw"
            ) as c:
                reply = (await c.post("/v1/messages", json=body, headers=headers)).json()
                again = await c.post("/v1/messages", json=body, headers=headers)
        assert reply["stop_reason"] == "max_tokens"
        assert [b["type"] for b in reply["content"]] in ([], ["text"])
        assert session.state.turns[0].calls_withheld == 1
        assert session.reason is StopReason.LENGTH
        assert again.status_code == 403
        assert again.json()["error"]["type"] == "permission_error"

    asyncio.run(go())


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        (
            {"max_tokens": 9, "messages": [{"role": "user", "content": [{"type": "image"}]}]},
            "messages[0].content[0]",
        ),
        (
            {
                "max_tokens": 9,
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "bash_20250124"}],
            },
            "tools[0]",
        ),
    ],
)
def test_a_messages_body_the_gateway_cannot_read_is_a_400_naming_the_field(
    body: dict[str, Any], field: str
) -> None:
    """A bad Messages body is a 400 in Anthropic's error shape naming the field; no turn is taken."""

    async def go() -> None:
        gateway = Gateway()
        spec = EpisodeSpec(run_id="r", model="sim-perfect", provider_kind="sim", budget=50, task=TASKS[0])
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(0))) as sim:
            session = HarnessSession(
                spec, build_provider("chat", Endpoint("http://sim/v1"), sim), LoopConfig()
            )
            gateway.open(session)
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=gateway.app), base_url="http://gw"
            ) as c:
                reply = await c.post("/v1/messages", json=body, headers={"x-api-key": session.token})
        assert reply.status_code == 400
        assert reply.json()["type"] == "error"
        assert field in reply.json()["error"]["message"]
        assert session.state.turns == []

    asyncio.run(go())


def test_a_messages_body_becomes_the_neutral_conversation() -> None:
    """System blocks, `tool_use` and `tool_result` blocks map onto the loop's messages, results first."""
    from collector.harness.anthropic_wire import parse_messages_request
    from collector.turn import AssistantMessage, SystemMessage, ToolResultMessage, UserMessage

    parsed = parse_messages_request(
        {
            "max_tokens": 500,
            "system": [{"type": "text", "text": "Be brief."}],
            "messages": [
                {"role": "user", "content": "add 2 and 3"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "Calling."},
                        {
                            "type": "tool_use",
                            "id": "tu1",
                            "name": "calculator",
                            "input": {"expression": "2+3"},
                        },
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "tu1", "content": "5", "is_error": False},
                        {"type": "text", "text": "and now?"},
                    ],
                },
            ],
        }
    )
    kinds = [type(m) for m in parsed.messages]
    assert kinds == [SystemMessage, UserMessage, AssistantMessage, ToolResultMessage, UserMessage]
    result = parsed.messages[3]
    assert isinstance(result, ToolResultMessage)
    assert (result.call_id, result.name, result.content) == ("tu1", "calculator", "5")
    assistant = parsed.messages[2]
    assert isinstance(assistant, AssistantMessage)
    assert assistant.tool_calls[0].arguments == {"expression": "2+3"}
    assert parsed.asked_cap == 500

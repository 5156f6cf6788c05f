"""The gateway's Anthropic Messages route, in-process: an `anthropic` SDK tool loop through it.

The loop (examples/harnesses/anthropic_tool_loop.py) runs every `tool_use` block it gets; the
gateway forwards to the simulator over the Chat wire, so the route translates both ways.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import sys
from pathlib import Path
from typing import Any

import httpx2
import pytest
from anthropic import AsyncAnthropic, PermissionDeniedError

from collector.envs.base import Task
from collector.stop import StopReason
from tests.harness.helpers import TASKS, post_twice, sweep

HARNESSES = Path(__file__).resolve().parents[2] / "examples" / "harnesses"
if str(HARNESSES) not in sys.path:  # the loop imports its calculator from the OpenAI example
    sys.path.insert(0, str(HARNESSES))
anthropic_tool_loop: Any = importlib.import_module("anthropic_tool_loop")
MESSAGES = "/v1/messages"


def _drive(stream: bool) -> Any:
    async def drive(app: Any, root: str, token: str, task: Task, workdir: Path) -> None:
        # The `anthropic` SDK is built on httpx2 (its own fork of httpx), with the same ASGI transport.
        http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app))
        async with AsyncAnthropic(
            base_url=root, api_key=token, http_client=http, max_retries=0
        ) as c:
            with contextlib.suppress(PermissionDeniedError):  # the episode ended and the loop asked again
                await anthropic_tool_loop.run(c, str(task.prompt), workdir, stream=stream)

    return drive


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_no_logged_tool_use_comes_from_a_cut_turn(tmp_path: Path, stream: bool) -> None:
    """An `anthropic` SDK loop behind the gateway never runs a `tool_use` of a cut turn, streamed or not."""
    cut_turns, executions, from_cut = asyncio.run(sweep(tmp_path, _drive(stream), enforce=True))
    assert cut_turns >= 10
    assert executions >= 10
    assert from_cut == []


def test_without_enforcement_the_same_loop_runs_tool_uses_of_cut_turns(tmp_path: Path) -> None:
    """With the gateway only recording, the same loop runs calls of cut turns: the check above can fail."""
    _, _, from_cut = asyncio.run(sweep(tmp_path, _drive(False), enforce=False))
    assert len(from_cut) >= 3


def _key(token: str) -> dict[str, str]:
    return {"x-api-key": token}


def test_a_cut_turn_is_max_tokens_with_no_tool_use_and_the_token_is_refused_after() -> None:
    """A withheld turn reaches the harness as `stop_reason: max_tokens` with text only; then a 403."""
    body = {
        "model": "claude",
        "max_tokens": 1000,
        "tools": anthropic_tool_loop.TOOLS,
        "messages": [{"role": "user", "content": TASKS[1].prompt}],
    }
    session, first, again = asyncio.run(post_twice(MESSAGES, body, "sim-hidden-cut", 36, TASKS[1], _key))
    reply = first.json()
    assert reply["stop_reason"] == "max_tokens"
    assert [b["type"] for b in reply["content"]] in ([], ["text"])
    assert session.state.turns[0].calls_withheld == 1
    assert session.reason is StopReason.LENGTH
    assert again.status_code == 403
    assert again.json()["error"]["type"] == "permission_error"


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

    session, reply, _ = asyncio.run(post_twice(MESSAGES, body, "sim-perfect", 50, TASKS[0], _key))
    assert reply.status_code == 400
    assert reply.json()["type"] == "error"
    assert field in reply.json()["error"]["message"]
    assert session.state.turns == []


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

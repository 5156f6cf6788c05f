"""The gateway's Responses route, in-process: an `openai-agents` Runner with a function tool through it."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from agents.exceptions import AgentsException
from openai import AsyncOpenAI, PermissionDeniedError

from collector.envs.arithmetic import ArithmeticEnv
from collector.envs.base import Task
from collector.harness.responses_wire import parse_responses_request
from collector.stop import StopReason
from collector.turn import AssistantMessage, SystemMessage, ToolResultMessage, UserMessage
from tests.harness.helpers import CALCULATOR_PARAMETERS, TASKS, bearer, post_twice, sweep
from tests.untraced import untraced

HARNESSES = Path(__file__).resolve().parents[2] / "examples" / "harnesses"
if str(HARNESSES) not in sys.path:  # the Runner imports its calculator from the OpenAI example
    sys.path.insert(0, str(HARNESSES))
agents_runner: Any = importlib.import_module("agents_runner")

#: The Runner already ignores the calls of a response whose status is `incomplete`; what it
#: runs is a cut that the server reports as complete (a hidden cut, vLLM-style) whose arguments
#: happen to parse: rare per turn, so the sweep is wider than the other routes'.
RUNNER_TASKS = ArithmeticEnv(num_tasks=60, seed=3).tasks()
RUNNER_CELLS = (("sim-hidden-cut", 36), ("sim-hidden-cut", 44), ("sim-hidden-cut", 48), ("sim-terse", 16))


async def _drive(app: Any, root: str, token: str, task: Task, workdir: Path) -> None:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app))
    async with AsyncOpenAI(base_url=root + "/v1", api_key=token, http_client=http, max_retries=0) as c:
        # The episode ended and the Runner asked again (403), or it gave up on an empty reply.
        with contextlib.suppress(PermissionDeniedError, AgentsException):
            await agents_runner.run(c, str(task.prompt), workdir)


def test_no_function_tool_run_by_the_agents_runner_comes_from_a_cut_turn(tmp_path: Path) -> None:
    """An `openai-agents` Runner behind the gateway never runs a function tool call of a cut turn."""
    with untraced():  # samples over lines the other tests cover (tests/untraced.py)
        cut_turns, executions, from_cut = asyncio.run(
            sweep(tmp_path, _drive, enforce=True, cells=RUNNER_CELLS, tasks=RUNNER_TASKS)
        )
    assert cut_turns >= 10
    assert executions >= 10
    assert from_cut == []


def test_without_enforcement_the_runner_runs_calls_of_cut_turns(tmp_path: Path) -> None:
    """With the gateway only recording, the same Runner runs calls of cut turns: the check above can fail."""
    with untraced():  # samples over lines the other tests cover (tests/untraced.py)
        _, _, from_cut = asyncio.run(
            sweep(tmp_path, _drive, enforce=False, cells=RUNNER_CELLS, tasks=RUNNER_TASKS)
        )
    assert len(from_cut) >= 2


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_cut_turn_is_incomplete_with_no_function_call_and_the_token_is_refused_after(stream: bool) -> None:
    """A withheld turn reaches a Responses harness as `status: incomplete` (max_output_tokens), text only."""
    tools = [{"type": "function", "name": "calculator", "parameters": CALCULATOR_PARAMETERS}]
    body = {
        "model": "m",
        "input": TASKS[2].prompt,
        "tools": tools,
        "stream": stream,
        "max_output_tokens": 900,
    }
    session, reply, again = asyncio.run(
        post_twice("/v1/responses", body, "sim-hidden-cut", 34, TASKS[2], bearer)
    )
    if stream:
        events = [json.loads(line[6:]) for line in reply.text.splitlines() if line.startswith("data: ")]
        assert not any(e["type"].startswith("response.function_call") for e in events)
        assert events[-1]["type"] == "response.incomplete"
        final = events[-1]["response"]
    else:
        final = reply.json()
    assert final["status"] == "incomplete"
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert all(item["type"] == "message" for item in final["output"])
    assert session.state.turns[0].calls_withheld == 1
    assert session.state.turns[0].harness_asked_cap == 900
    assert session.reason is StopReason.LENGTH
    assert again.status_code == 403


def test_responses_input_items_become_the_neutral_conversation() -> None:
    """Instructions, messages, function calls and their outputs map onto the loop's messages."""
    parsed = parse_responses_request(
        {
            "instructions": "Be brief.",
            "input": [
                {"role": "user", "content": "add 2 and 3"},
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "Calling."}],
                },
                {
                    "type": "function_call",
                    "call_id": "c1",
                    "name": "calculator",
                    "arguments": '{"expression": "2+3"}',
                },
                {"type": "function_call_output", "call_id": "c1", "output": "5"},
                # A turn of calls with no text before them (what the Runner sends back).
                {"type": "function_call", "call_id": "c2", "name": "calculator",
                 "arguments": '{"expression": "5*2"}'},
                {"type": "function_call_output", "call_id": "c2", "output": "10"},
            ],
        }
    )
    kinds = [type(m) for m in parsed.messages]
    assert kinds == [SystemMessage, UserMessage, AssistantMessage, ToolResultMessage, AssistantMessage,
                     ToolResultMessage]
    assistant, silent = parsed.messages[2], parsed.messages[4]
    assert isinstance(assistant, AssistantMessage)
    assert (assistant.text, assistant.tool_calls[0].arguments) == ("Calling.", {"expression": "2+3"})
    assert isinstance(silent, AssistantMessage)
    assert (silent.text, [c.id for c in silent.tool_calls]) == ("", ["c2"])
    result = parsed.messages[5]
    assert isinstance(result, ToolResultMessage)
    assert (result.name, result.content) == ("calculator", "10")
    with pytest.raises(Exception, match="previous_response_id: the gateway keeps no state"):
        parse_responses_request({"input": "x", "previous_response_id": "resp_1"})

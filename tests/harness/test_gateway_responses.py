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

from collector.config import LoopConfig
from collector.envs.arithmetic import ArithmeticEnv
from collector.episode.loop import EpisodeSpec
from collector.harness.gateway import Gateway
from collector.harness.responses_wire import parse_responses_request
from collector.harness.session import HarnessSession
from collector.providers import build_provider
from collector.providers.base import Endpoint
from collector.sim.app import create_app
from collector.stop import StopReason
from collector.turn import AssistantMessage, SamplingParams, SystemMessage, ToolResultMessage, UserMessage
from tests.harness.test_gateway_chat import TASKS, Seen, _lines

HARNESSES = Path(__file__).resolve().parents[2] / "examples" / "harnesses"
if str(HARNESSES) not in sys.path:  # the Runner imports its calculator from the OpenAI example
    sys.path.insert(0, str(HARNESSES))
agents_runner: Any = importlib.import_module("agents_runner")

#: The Runner already ignores the calls of a response whose status is `incomplete`; what it
#: runs is a cut that the server reports as complete (a hidden cut, vLLM-style) whose arguments
#: happen to parse: rare per turn, so the sweep is wider than the other routes'.
RUNNER_TASKS = ArithmeticEnv(num_tasks=60, seed=3).tasks()
RUNNER_CELLS = (("sim-hidden-cut", 36), ("sim-hidden-cut", 44), ("sim-hidden-cut", 48), ("sim-terse", 16))


async def _episode(
    gateway: Gateway, sim: httpx.AsyncClient, i: int, model: str, budget: int, workdir: Path, enforce: bool
) -> tuple[HarnessSession, list[dict[str, Any]]]:
    task = RUNNER_TASKS[i]
    spec = EpisodeSpec(
        run_id="r",
        model=model,
        provider_kind="sim",
        budget=budget,
        task=task,
        seed=i,
        sampling=SamplingParams(extra_headers={"x-sim-seed": str(i)}),
    )
    session = HarnessSession(
        spec, Seen(build_provider("chat", Endpoint("http://sim/v1"), sim)), LoopConfig(), enforce=enforce
    )
    gateway.open(session)
    workdir.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 - a test's temp dir, before the episode
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.app))
    async with AsyncOpenAI(
        base_url="http://gateway/v1", api_key=session.token, http_client=http, max_retries=0
    ) as client:
        # The episode ended and the Runner asked again (403), or it gave up on an empty reply.
        with contextlib.suppress(PermissionDeniedError, AgentsException):
            await agents_runner.run(client, str(task.prompt), workdir)
    gateway.close(session)
    return session, [json.loads(line) for line in _lines(workdir / "executions.jsonl")]


async def _sweep(tmp_path: Path, enforce: bool) -> tuple[int, int, list[str]]:
    gateway = Gateway()
    cut_turns = executions = 0
    from_cut: list[str] = []
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(0))) as sim:
        for model, budget in RUNNER_CELLS:
            for i in range(len(RUNNER_TASKS)):
                session, logged = await _episode(
                    gateway, sim, i, model, budget, tmp_path / f"{model}-{budget}-{i}", enforce
                )
                cut_ids = {c.id for t in session.provider.turns if t.is_length for c in t.tool_calls}
                cut_turns += sum(1 for t in session.state.turns if t.length_signals)
                executions += len(logged)
                from_cut += [e["id"] for e in logged if e["id"] in cut_ids]
    return cut_turns, executions, from_cut


def test_no_function_tool_run_by_the_agents_runner_comes_from_a_cut_turn(tmp_path: Path) -> None:
    """An `openai-agents` Runner behind the gateway never runs a function tool call of a cut turn."""
    cut_turns, executions, from_cut = asyncio.run(_sweep(tmp_path, True))
    assert cut_turns >= 10
    assert executions >= 10
    assert from_cut == []


def test_without_enforcement_the_runner_runs_calls_of_cut_turns(tmp_path: Path) -> None:
    """With the gateway only recording, the same Runner runs calls of cut turns: the check above can fail."""
    _, _, from_cut = asyncio.run(_sweep(tmp_path, False))
    assert len(from_cut) >= 2


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_cut_turn_is_incomplete_with_no_function_call_and_the_token_is_refused_after(stream: bool) -> None:
    """A withheld turn reaches a Responses harness as `status: incomplete` (max_output_tokens), text only."""

    async def go() -> None:
        gateway = Gateway()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(0))) as sim:
            task = TASKS[2]
            spec = EpisodeSpec(run_id="r", model="sim-hidden-cut", provider_kind="sim", budget=34, task=task)
            session = HarnessSession(
                spec, build_provider("chat", Endpoint("http://sim/v1"), sim), LoopConfig()
            )
            gateway.open(session)
            tools = [
                {
                    "type": "function",
                    "name": "calculator",
                    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
                }
            ]
            body = {
                "model": "m",
                "input": task.prompt,
                "tools": tools,
                "stream": stream,
                "max_output_tokens": 900,
            }
            headers = {"authorization": f"Bearer {session.token}"}
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=gateway.app), base_url="http://gw"
            ) as c:
                reply = await c.post("/v1/responses", json=body, headers=headers)
                again = await c.post("/v1/responses", json=body, headers=headers)
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

    asyncio.run(go())


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
            ],
        }
    )
    kinds = [type(m) for m in parsed.messages]
    assert kinds == [SystemMessage, UserMessage, AssistantMessage, ToolResultMessage]
    assistant = parsed.messages[2]
    assert isinstance(assistant, AssistantMessage)
    assert (assistant.text, assistant.tool_calls[0].arguments) == ("Calling.", {"expression": "2+3"})
    with pytest.raises(Exception, match="previous_response_id: the gateway keeps no state"):
        parse_responses_request({"input": "x", "previous_response_id": "resp_1"})

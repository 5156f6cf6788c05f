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

from collector.config import LoopConfig
from collector.envs.arithmetic import ArithmeticEnv
from collector.episode.loop import EpisodeSpec
from collector.harness.gateway import Gateway
from collector.harness.session import HarnessSession
from collector.providers import build_provider
from collector.providers.base import Endpoint, Provider
from collector.sim.app import create_app
from collector.stop import StopReason
from collector.turn import SamplingParams, Turn, TurnRequest

_LOOP = Path(__file__).resolve().parents[2] / "examples" / "harnesses" / "openai_tool_loop.py"
_spec = importlib.util.spec_from_file_location("openai_tool_loop", _LOOP)
assert _spec is not None
assert _spec.loader is not None
openai_tool_loop: Any = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(openai_tool_loop)

TASKS = ArithmeticEnv(num_tasks=12, seed=3).tasks()
#: Small budgets at which the simulator cuts calls whose arguments already parse: the turns a
#: recording proxy lets a harness run (a hidden cut says `tool_calls`, a plain one `length`).
CELLS = (
    ("sim-hidden-cut", 40),
    ("sim-hidden-cut", 48),
    ("sim-terse", 8),
    ("sim-terse", 16),
    ("sim-verbose", 32),
)


class Seen:
    """The provider adapter, keeping every turn it returned (what the model really did)."""

    def __init__(self, inner: Provider) -> None:
        self.inner, self.kind, self.turns = inner, inner.kind, list[Turn]()

    async def complete(self, request: TurnRequest) -> Turn:
        turn = await self.inner.complete(request)
        self.turns.append(turn)
        return turn


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def _episode(
    gateway: Gateway,
    sim: httpx.AsyncClient,
    task_index: int,
    budget: int,
    model: str,
    workdir: Path,
    *,
    enforce: bool = True,
    settings: LoopConfig | None = None,
    stream: bool = False,
) -> tuple[HarnessSession, list[dict[str, Any]]]:
    """One harness episode through the gateway; (its session, the executions the harness logged)."""
    task = TASKS[task_index]
    spec = EpisodeSpec(
        run_id="r",
        model=model,
        provider_kind="sim",
        budget=budget,
        task=task,
        seed=task_index,
        sampling=SamplingParams(extra_headers={"x-sim-seed": str(task_index)}),
    )
    provider = Seen(build_provider("chat", Endpoint("http://sim/v1", api_key="sk-provider-secret"), sim))
    session = HarnessSession(spec, provider, settings or LoopConfig(), enforce=enforce)
    gateway.open(session)
    workdir.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 - a test's temp dir, before the episode
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.app))
    client = AsyncOpenAI(base_url="http://gateway/v1", api_key=session.token, http_client=http, max_retries=0)
    async with client:
        # PermissionDenied: the episode ended at the gateway and the loop asked again.
        with contextlib.suppress(PermissionDeniedError):
            await openai_tool_loop.run(client, str(task.prompt), workdir, stream=stream)
    gateway.close(session)
    executions = [json.loads(line) for line in _lines(workdir / "executions.jsonl")]
    return session, executions


async def _sweep(tmp_path: Path, enforce: bool, stream: bool = False) -> tuple[int, int, list[str]]:
    """(cut turns, executions, executions whose call came from a cut turn) over small budgets."""
    gateway = Gateway()
    cut_turns = executions = 0
    from_cut: list[str] = []
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(0))) as sim:
        for model, budget in CELLS:
            for i in range(len(TASKS)):
                session, logged = await _episode(
                    gateway,
                    sim,
                    i,
                    budget,
                    model,
                    tmp_path / f"{enforce}-{model}-{budget}-{i}",
                    enforce=enforce,
                    stream=stream,
                )
                cut_ids = {c.id for t in session.provider.turns if t.is_length for c in t.tool_calls}
                cut_turns += sum(1 for t in session.state.turns if t.length_signals)
                executions += len(logged)
                from_cut += [e["id"] for e in logged if e["id"] in cut_ids]
    return cut_turns, executions, from_cut


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_no_logged_execution_comes_from_a_cut_turn(tmp_path: Path, stream: bool) -> None:
    """At small budgets an ordinary SDK tool loop behind the gateway never runs a call of a cut turn."""
    cut_turns, executions, from_cut = asyncio.run(_sweep(tmp_path, enforce=True, stream=stream))
    assert cut_turns >= 10  # the sweep cut turns
    assert executions >= 10  # and the loop ran calls
    assert from_cut == []


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_the_same_sweep_without_enforcement_runs_calls_of_cut_turns(tmp_path: Path, stream: bool) -> None:
    """A recording proxy (enforcement off) lets the same loop run calls of cut turns: the check can fail."""
    cut_turns, _, from_cut = asyncio.run(_sweep(tmp_path, enforce=False, stream=stream))
    assert cut_turns >= 10
    assert len(from_cut) >= 3


def test_a_cut_turn_reaches_the_harness_as_length_with_no_calls_and_ends_the_episode(tmp_path: Path) -> None:
    """The cut turn's calls are withheld, its finish reason is `length`, the token is refused afterwards."""

    async def go() -> None:
        gateway = Gateway()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(0))) as sim:
            task = TASKS[1]
            # A hidden cut: the server says `tool_calls` for a call cut at the cap (vLLM does).
            spec = EpisodeSpec(run_id="r", model="sim-hidden-cut", provider_kind="sim", budget=36, task=task)
            session = HarnessSession(
                spec, build_provider("chat", Endpoint("http://sim/v1"), sim), LoopConfig()
            )
            gateway.open(session)
            body = {
                "model": "whatever",
                "max_tokens": 5000,
                "tools": openai_tool_loop.TOOLS,
                "messages": [{"role": "user", "content": task.prompt}],
            }
            headers = {"authorization": f"Bearer {session.token}"}
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=gateway.app), base_url="http://gw"
            ) as c:
                reply = (await c.post("/v1/chat/completions", json=body, headers=headers)).json()
                again = await c.post("/v1/chat/completions", json=body, headers=headers)
                unknown = await c.post(
                    "/v1/chat/completions", json=body, headers={"authorization": "Bearer nope"}
                )
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
            assert unknown.status_code == 401

    asyncio.run(go())


def test_a_rewritten_history_is_marked_where_it_happened(tmp_path: Path) -> None:
    """A request that does not extend what the harness sent before marks its turn `history_rewritten`."""

    async def go() -> None:
        gateway = Gateway()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(0))) as sim:
            task = TASKS[1]
            spec = EpisodeSpec(run_id="r", model="sim-perfect", provider_kind="sim", budget=400, task=task)
            session = HarnessSession(
                spec, build_provider("chat", Endpoint("http://sim/v1"), sim), LoopConfig()
            )
            gateway.open(session)
            headers = {"authorization": f"Bearer {session.token}"}
            first = [{"role": "user", "content": task.prompt}]
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=gateway.app), base_url="http://gw"
            ) as c:
                body = {"model": "m", "tools": openai_tool_loop.TOOLS, "messages": first}
                message = (await c.post("/v1/chat/completions", json=body, headers=headers)).json()
                message = message["choices"][0]["message"]
                call = message["tool_calls"][0]
                extended = [*first, message, {"role": "tool", "tool_call_id": call["id"], "content": "7"}]
                await c.post("/v1/chat/completions", json={**body, "messages": extended}, headers=headers)
                compacted = [
                    {"role": "user", "content": "Summary so far: the calculator said 7. " + task.prompt}
                ]
                await c.post("/v1/chat/completions", json={**body, "messages": compacted}, headers=headers)
            assert [t.history_rewritten for t in session.state.turns] == [False, False, True]

    asyncio.run(go())


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
                reply = await c.post(
                    "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {session.token}"}
                )
        assert reply.status_code == 400
        assert field in reply.json()["error"]["message"]
        assert session.state.turns == []

    asyncio.run(go())


def test_a_streamed_cut_turn_carries_no_tool_call_delta() -> None:
    """Streamed, a withheld turn's events hold its text and `length`, never a tool-call delta."""

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
                "model": "m",
                "stream": True,
                "stream_options": {"include_usage": True},
                "tools": openai_tool_loop.TOOLS,
                "messages": [{"role": "user", "content": task.prompt}],
            }
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=gateway.app), base_url="http://gw"
            ) as c:
                reply = await c.post(
                    "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {session.token}"}
                )
        assert reply.headers["content-type"].startswith("text/event-stream")
        events = [line[6:] for line in reply.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert not any("tool_calls" in ch["delta"] for c in chunks for ch in c["choices"])
        assert [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch["finish_reason"]] == [
            "length"
        ]
        assert chunks[-1]["usage"]["completion_tokens"] == 36
        assert session.state.turns[0].calls_withheld == 1

    asyncio.run(go())

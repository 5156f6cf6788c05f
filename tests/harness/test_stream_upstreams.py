"""Each provider adapter passes its streamed text on as it reads it, whatever upstream wire the run speaks."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from collector.providers import base_url_for, build_provider
from collector.providers.base import Endpoint
from collector.providers.relay import relaying
from collector.sim.app import create_app
from collector.turn import SamplingParams, ToolSpec, Turn, TurnRequest, UserMessage
from tests.harness.helpers import CALCULATOR_PARAMETERS, TASKS


class Deltas:
    """A relay that keeps what it is told, and whether each upstream request asked for a stream."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.thoughts: list[str] = []
        self.attempts: set[int] = set()
        self.streamed: list[bool] = []

    def text(self, attempt: object, delta: str) -> None:
        self.attempts.add(id(attempt))
        self.texts.append(delta)

    def reasoning(self, attempt: object, delta: str) -> None:
        self.thoughts.append(delta)


async def _turn(wire: str, model: str) -> tuple[Turn, Deltas]:
    deltas = Deltas()
    sim = create_app(0)

    async def spy(scope, receive, send):  # type: ignore[no-untyped-def]
        """The simulator, noting whether each request asked for a stream."""
        if scope["type"] == "http":
            body = b""
            while True:
                message = await receive()
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
            deltas.streamed.append(b'"stream":true' in body.replace(b" ", b"") or b"streamGenerate" in
                                   scope["path"].encode())
            sent = False

            async def again():  # type: ignore[no-untyped-def]
                nonlocal sent
                if sent:
                    return {"type": "http.disconnect"}
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}

            await sim(scope, again, send)
        else:
            await sim(scope, receive, send)

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=spy)) as client:
        # The run's endpoint does not stream; with a relay set the adapter streams anyway.
        provider = build_provider(wire, Endpoint(base_url_for(wire, "http://sim")), client)
        tools = [ToolSpec("calculator", "Evaluate integer arithmetic.", CALCULATOR_PARAMETERS)]
        request = TurnRequest(model, [UserMessage(str(TASKS[0].prompt))], tools, 400,
                              SamplingParams(extra_headers={"x-sim-seed": "1"}))
        with relaying(deltas):
            turn = await provider.complete(request)
    return turn, deltas


@pytest.mark.parametrize("wire", ["chat", "responses", "anthropic", "gemini"])
def test_the_adapter_relays_its_text_delta_by_delta(wire: str) -> None:
    """The text a streamed upstream writes reaches the relay in pieces that add up to the turn's text."""
    turn, deltas = asyncio.run(_turn(wire, "sim-verbose"))
    assert deltas.streamed == [True]
    assert turn.text
    assert len(deltas.texts) > 1
    assert "".join(deltas.texts) == turn.text
    assert len(deltas.attempts) == 1


@pytest.mark.parametrize("wire", ["chat", "anthropic"])
def test_the_adapter_relays_its_reasoning_text_delta_by_delta(wire: str) -> None:
    """A thinking model's streamed reasoning reaches the relay apart from its text, and adds up to it."""
    turn, deltas = asyncio.run(_turn(wire, "sim-thinker"))
    assert turn.reasoning_text
    assert len(deltas.thoughts) > 1
    assert "".join(deltas.thoughts) == turn.reasoning_text
    assert "".join(deltas.texts) == turn.text

"""Fixtures for the provider tests: adapters over `httpx.MockTransport`, with a recorded sleep.

No test here touches the network or waits: replies are scripted in-process and the back-off
sleep only records the delays it was asked for.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest

from collector.providers import build_provider
from collector.providers.base import Endpoint, Provider, RetryPolicy
from collector.turn import ToolSpec, TurnRequest, UserMessage
from tests.providers.wirefab import Recorder

API_KEY = "sk-test-SECRET-0123456789abcdef"

BASE_URLS = {
    "chat": "http://provider.test/v1",
    "responses": "http://provider.test/v1",
    "anthropic": "http://provider.test",
    "gemini": "http://provider.test",
}

REFUND = ToolSpec(
    "refund",
    "Refund an order.",
    {
        "type": "object",
        "properties": {"order_id": {"type": "string"}, "amount": {"type": "number"}},
        "required": ["order_id", "amount"],
    },
)


def request(cap: int = 64) -> TurnRequest:
    """A one-message request offering the refund tool."""
    return TurnRequest(
        model="m-test", messages=[UserMessage("refund A-1001")], tools=[REFUND], max_output_tokens=cap
    )


class Sleeps:
    """An injectable sleep that never waits and remembers what it was asked."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


MakeProvider = Callable[..., Awaitable[tuple[Provider, Recorder, Sleeps]]]


@pytest.fixture
async def make() -> AsyncIterator[MakeProvider]:
    """Build an adapter of a kind over scripted replies; clients are closed at teardown."""
    clients: list[httpx.AsyncClient] = []

    async def factory(
        kind: str,
        *replies: httpx.Response | bytes | Exception,
        stream: bool = False,
        retries: int = 3,
        max_retry_after_s: float = 120.0,
    ) -> tuple[Provider, Recorder, Sleeps]:
        recorder = Recorder(*replies, stream=stream)
        client = httpx.AsyncClient(transport=httpx.MockTransport(recorder))
        clients.append(client)
        endpoint = Endpoint(
            BASE_URLS[kind],
            api_key=API_KEY,
            streaming=stream,
            retry=RetryPolicy(max_retries=retries, max_retry_after_s=max_retry_after_s),
        )
        sleeps = Sleeps()
        return build_provider(kind, endpoint, client, sleep=sleeps, rng=random.Random(0)), recorder, sleeps

    yield factory
    for client in clients:
        await client.aclose()

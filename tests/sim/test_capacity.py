"""The simulator's capacity model: slots, the FIFO queue, refusals past it, the token budget
(each step triggered on the model's own in-flight counts, never on a sleep)."""

from __future__ import annotations

import asyncio
import dataclasses

import httpx
import pytest

from collector.sim import PRESETS, create_app
from collector.sim.capacity import Capacity, CapacityModel, Refusal


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_slots_then_queue_then_refusal() -> None:
    """Two served at once, one queued (FIFO), the next refused with the configured status."""
    model = CapacityModel(Capacity(slots=2, queue_limit=1, refuse_status=503))

    async def go() -> None:
        assert await model.acquire(10) is None
        assert await model.acquire(10) is None
        assert model.running == 2
        queued = asyncio.ensure_future(model.acquire(10))
        await settle()
        assert not queued.done()
        assert len(model.queue) == 1
        refused = await asyncio.wait_for(model.acquire(10), 5)  # at once, never queued
        assert isinstance(refused, Refusal)
        assert refused.status == 503
        assert refused.retry_after_s is None
        model.release(10)
        assert await asyncio.wait_for(queued, 5) is None  # the freed slot went to the queue's head
        assert model.running == 2
        assert not model.queue

    asyncio.run(go())
    assert model.refused == 1
    assert model.served == 1


def test_kv_budget_holds_requests_that_do_not_fit() -> None:
    model = CapacityModel(Capacity(slots=8, queue_limit=4, kv_tokens=100))

    async def go() -> None:
        assert await model.acquire(70) is None
        waiting = asyncio.ensure_future(model.acquire(40))  # 110 > 100: waits though slots are free
        await settle()
        assert not waiting.done()
        model.release(70)
        assert await asyncio.wait_for(waiting, 5) is None
        assert model.kv_used == 40

    asyncio.run(go())


def test_queue_refusal_carries_retry_after() -> None:
    model = CapacityModel(Capacity(slots=1, queue_limit=0, refuse_status=429, refuse_retry_after_s=1.5))

    async def go() -> None:
        assert await model.acquire(1) is None
        refused = await asyncio.wait_for(model.acquire(1), 5)
        assert isinstance(refused, Refusal)
        assert refused.status == 429
        assert refused.headers["retry-after-ms"] == "1500"
        assert refused.headers["retry-after"] == "2"

    asyncio.run(go())


def test_batch_slows_service() -> None:
    model = CapacityModel(Capacity(slots=4, slowdown=0.5))
    model.running = 4
    assert model.service_s(0.1) == pytest.approx(0.15)


def test_token_budget_refuses_with_retry_after() -> None:
    now = [0.0]
    model = CapacityModel(Capacity(tokens_per_minute=6000, burst_s=1.0), clock=lambda: now[0])  # 100/s
    assert model.charge(60) is None
    refused = model.charge(60)
    assert isinstance(refused, Refusal)
    assert refused.status == 429
    assert refused.retry_after_s == pytest.approx(0.2)
    assert refused.headers["retry-after-ms"] == "200"
    assert refused.headers["x-ratelimit-remaining-tokens"] == "40"
    now[0] += 0.2
    assert model.charge(60) is None


def test_app_answers_429_past_the_token_budget() -> None:
    """Over HTTP: a reply carries the x-ratelimit headers, the request past the budget a 429
    the collector's own retry-after parsing reads (the bucket's clock stands still: the two
    requests are back to back however slow the machine)."""
    from collector.providers.http import parse_retry_after

    preset = dataclasses.replace(PRESETS["sim-perfect"], name="tight",
                                 capacity=Capacity(tokens_per_minute=60_000, burst_s=1.0))  # 1000/s
    app = create_app(0, {"tight": preset}, clock=lambda: 0.0)
    body = {"model": "tight", "max_tokens": 600, "messages": [{"role": "user", "content": "hi"}]}

    async def go() -> tuple[httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sim") as client:
            first = await client.post("/v1/chat/completions", json=body)
            second = await client.post("/v1/chat/completions", json=body)
            return first, second

    first, second = asyncio.run(go())
    assert first.status_code == 200
    assert first.headers["x-ratelimit-limit-tokens"] == "60000"
    assert int(first.headers["x-ratelimit-remaining-tokens"]) < 400
    assert second.status_code == 429
    wait = parse_retry_after(second.headers)
    assert wait is not None
    assert 0.0 < wait <= 1.0

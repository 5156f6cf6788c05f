"""The simulator's weights (`collector.sim.weights`): versions, swaps that abort what is in
flight, armed swaps, the schedule, and the replies' shapes (SGLang's `metadata`, `abort`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from collector.sim import weights as weights_module
from collector.sim.app import create_app


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(seed=1)),
                                 base_url="http://sim") as c:
        yield c


def _body(model: str = "sim-sglang", stream: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": "What is 2+2?"}],
                            "max_tokens": 64}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return body


async def _chat(client: httpx.AsyncClient, model: str = "sim-sglang", stream: bool = False,
                latency_ms: int | None = None) -> httpx.Response:
    headers = {"x-sim-latency-ms": str(latency_ms)} if latency_ms is not None else {}
    return await client.post("/v1/chat/completions", json=_body(model, stream), headers=headers)


async def _until_in_flight(client: httpx.AsyncClient, n: int) -> None:
    # Yields to the requests' tasks until the simulator says they are generating (no timer).
    while (await client.get("/sim/weights")).json()["in_flight"] < n:  # noqa: ASYNC110 (the app's own count)
        await asyncio.sleep(0)


async def test_a_swap_aborts_the_requests_in_flight(client: httpx.AsyncClient) -> None:
    """Two requests generating when the version changes answer `abort` with their old version;
    the next request is answered by the new one."""
    pending = [asyncio.create_task(_chat(client, latency_ms=60_000)) for _ in range(2)]
    await _until_in_flight(client, 2)
    swapped = (await client.post("/sim/weights", json={"version": "step-7"})).json()
    assert swapped["aborted_now"] == 2
    assert swapped["weight_version"] == "step-7"
    for reply in await asyncio.gather(*pending):
        body = reply.json()
        assert reply.status_code == 200
        assert body["choices"][0]["finish_reason"] == "abort"
        assert "tool_calls" not in body["choices"][0]["message"]
        assert body["metadata"] == {"weight_version": "v0"}
        assert body["usage"]["completion_tokens"] < 64  # partial, never the cap
    after = (await _chat(client)).json()
    assert after["metadata"] == {"weight_version": "step-7"}
    assert after["choices"][0]["finish_reason"] != "abort"
    state = (await client.get("/sim/weights")).json()
    assert state["aborted"] == 2
    assert state["answered"] == {"step-7": 1}
    assert state["in_flight"] == 0
    assert (await client.get("/get_weight_version")).json() == {"weight_version": "step-7"}
    assert (await client.get("/model_info")).json()["weight_version"] == "step-7"


async def test_an_armed_swap_fires_when_the_mark_is_in_flight(client: httpx.AsyncClient) -> None:
    """No latency set: the requests are held for the armed swap, and all three are aborted."""
    await client.post("/sim/weights", json={"when_in_flight": 3})
    replies = await asyncio.gather(*(_chat(client, stream=(i == 0)) for i in range(3)))
    events = replies[0].text.split("\n\n")
    assert '"finish_reason": "abort"' in events[-4]
    assert events[-2] == "data: [DONE]"
    assert "metadata" not in replies[0].text  # SGLang's streams carry no version
    assert all(r.json()["choices"][0]["finish_reason"] == "abort" for r in replies[1:])
    state = (await client.get("/sim/weights")).json()
    assert (state["weight_version"], state["swaps"], state["aborted"], state["armed"]) == ("v1", 1, 3, 0)


async def test_a_held_request_is_answered_when_the_mark_never_comes(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(weights_module, "HOLD_LIMIT_S", 0.01)
    await client.post("/sim/weights", json={"when_in_flight": 5})
    reply = (await _chat(client)).json()
    assert reply["choices"][0]["finish_reason"] != "abort"
    assert reply["metadata"]["weight_version"] == "v0"


async def test_the_schedule_swaps_every_n_answers(client: httpx.AsyncClient) -> None:
    await client.post("/sim/weights", json={"every": 2})
    versions = [(await _chat(client)).json()["metadata"]["weight_version"] for _ in range(5)]
    assert versions == ["v0", "v0", "v1", "v1", "v2"]


async def test_only_sglang_shaped_non_streamed_replies_report_the_version(client: httpx.AsyncClient) -> None:
    """vLLM reports no per-request version; SGLang's streams neither."""
    assert "metadata" not in (await _chat(client, model="sim-terse")).json()
    assert "metadata" not in (await _chat(client, stream=True)).text
    assert (await _chat(client)).json()["metadata"] == {"weight_version": "v0"}


@pytest.mark.parametrize(("body", "message"), [
    ([], "the body must be a JSON object"),
    ({"version": ""}, "version must be a non-empty string"),
    ({"when_in_flight": 0}, "when_in_flight must be a positive integer"),
    ({"every": True}, "every must be a positive integer or null"),
    ({"versoin": "v1"}, "unknown field 'versoin'"),
])
async def test_bad_control_bodies_are_400_naming_the_field(client: httpx.AsyncClient, body: Any,
                                                           message: str) -> None:
    reply = await client.post("/sim/weights", content=json.dumps(body))
    assert reply.status_code == 400
    assert reply.json()["error"]["message"] == f"/sim/weights: {message}"
    assert (await client.get("/sim/weights")).json()["swaps"] == 0

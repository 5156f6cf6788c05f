"""Token capture is on by default on the chat wire: a server that knows none of its fields
(hosted OpenAI) costs one refused request, then is never asked again."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import httpx

from collector.turn import SamplingParams
from tests.providers.conftest import MakeProvider, request

WIRE = Path(__file__).parent / "wire"


async def test_a_server_that_does_not_know_capture_costs_one_request(make: MakeProvider) -> None:
    """OpenAI's 400 for an unknown `return_token_ids` is answered once without capture, never asked again."""
    message = "Unrecognized request argument supplied: return_token_ids"
    refused = httpx.Response(400, json={"error": {"type": "invalid_request_error", "message": message}})
    ok = (WIRE / "llamacpp_toolcall_logprobs_stop.json").read_bytes()
    provider, recorder, _ = await make("chat", refused, ok, ok)
    params = dataclasses.replace(request(), params=SamplingParams(token_ids=True))
    assert (await provider.complete(params)).tool_calls
    await provider.complete(params)
    assert ["return_token_ids" in recorder.body(i) for i in range(3)] == [True, False, False]

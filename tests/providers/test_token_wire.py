"""Token capture on the chat wire: what is asked for, and a real llama.cpp reply read back."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import httpx

from collector.episode.tokens import TokenTracker
from collector.providers.chat import build_chat_body
from collector.record.episode import TurnRecord
from collector.turn import SamplingParams
from tests.providers.conftest import MakeProvider, request

WIRE = Path(__file__).parent / "wire"


def _asking(stream: bool = False) -> bytes:
    asked = dataclasses.replace(request(), params=SamplingParams(token_ids=True))
    return json.dumps(build_chat_body(asked, "max_tokens", stream)).encode()


def test_token_ids_ask_every_server_kind() -> None:
    """One switch asks vLLM, SGLang and llama.cpp for their ids (llama.cpp's ride in logprobs)."""
    body = json.loads(_asking())
    assert body["return_token_ids"] is True
    assert body["return_prompt_token_ids"] is True
    assert body["logprobs"] is True
    plain = build_chat_body(request(), "max_tokens", False)
    assert not {"return_token_ids", "return_prompt_token_ids", "logprobs"} & set(plain)


async def test_real_llamacpp_reply_ids_come_from_logprobs(make: MakeProvider) -> None:
    """A reply recorded from llama-server (top_logprobs trimmed): ids from `logprobs.content[].id`.

    Its stop string ended the turn: llama.cpp counted the stop string's 5 tokens in usage but
    returned no logprobs for them, so the record's count check is false.
    """
    raw = (WIRE / "llamacpp_toolcall_logprobs_stop.json").read_bytes()
    entries = json.loads(raw)["choices"][0]["logprobs"]["content"]
    provider, _, _ = await make("chat", raw)
    turn = await provider.complete(request())
    assert turn.token_ids == [e["id"] for e in entries]
    assert turn.logprobs == [e["logprob"] for e in entries]
    assert turn.prompt_token_ids is None
    assert turn.usage.output_tokens == len(entries) + 5
    record = TurnRecord(0, "tool_calls", "tool_calls", [], None, 36, 377, 64, 0.1, [], 1, 0, False)
    TokenTracker(True, 0.0).fill(record, turn)
    assert record.token_counts_ok is False


async def test_refused_capture_is_asked_again_without_it(make: MakeProvider) -> None:
    """A 400 naming logprobs (llama.cpp, tools + stream) is answered by one request without token capture."""
    message = "logprobs is not supported with tools + stream"
    refused = httpx.Response(400, json={"error": {"code": 400, "type": "invalid_request_error",
                                                  "message": message}})
    ok = (WIRE / "llamacpp_toolcall_logprobs_stop.json").read_bytes()
    provider, recorder, _ = await make("chat", refused, ok, ok)
    params = SamplingParams(token_ids=True)
    turn = await provider.complete(dataclasses.replace(request(), params=params))
    assert turn.tool_calls
    assert [("logprobs" in recorder.body(i)) for i in range(2)] == [True, False]
    await provider.complete(dataclasses.replace(request(), params=params))
    assert "return_token_ids" not in recorder.body(2)  # not asked again once refused

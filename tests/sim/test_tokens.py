"""The simulator's token ids: vLLM, SGLang and llama.cpp shapes, consistent with its own count."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from collector.sim import tokens as sim_tokens
from tests.sim.conftest import ARITH, REFUND, chat_body

VLLM = {"return_token_ids": True, "logprobs": True}
SGLANG = {"return_token_ids": True, "return_prompt_token_ids": True, "logprobs": True}


async def _post(client: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    r = await client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    result: dict[str, Any] = r.json()
    return result


async def _stream(client: httpx.AsyncClient, body: dict[str, Any]) -> list[dict[str, Any]]:
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    r = await client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return [json.loads(line[6:]) for line in r.text.splitlines()
            if line.startswith("data: ") and line != "data: [DONE]"]


def _stream_ids(chunks: list[dict[str, Any]]) -> list[int]:
    return [i for c in chunks for ch in c["choices"] for i in ch.get("token_ids") or ()]


def _stream_logprob_ids(chunks: list[dict[str, Any]]) -> list[int]:
    return [e["id"] for c in chunks for ch in c["choices"] if ch.get("logprobs")
            for e in ch["logprobs"]["content"]]


@pytest.mark.parametrize("cap", [3, 5, 9, 14, 40, 256])
@pytest.mark.parametrize("model", ["sim-perfect", "sim-verbose", "sim-leaky"])
async def test_vllm_ids_match_completion_tokens_cut_or_not(client: httpx.AsyncClient, model: str,
                                                           cap: int) -> None:
    """vLLM shape: one output id and one logprob per counted token, the same ids streamed and not."""
    body = chat_body(model, REFUND, cap, **VLLM)
    reply = await _post(client, body)
    choice = reply["choices"][0]
    ids = choice["token_ids"]
    assert len(ids) == reply["usage"]["completion_tokens"]
    assert len(choice["logprobs"]["content"]) == len(ids)
    assert all(e["logprob"] <= 0 for e in choice["logprobs"]["content"])
    assert reply["prompt_token_ids"]
    assert all(isinstance(i, int) for i in reply["prompt_token_ids"])
    chunks = await _stream(client, body)
    assert _stream_ids(chunks) == ids
    assert chunks[0]["prompt_token_ids"] == reply["prompt_token_ids"]
    assert all("prompt_token_ids" not in c for c in chunks[1:])


async def test_asking_for_ids_does_not_change_the_turn(client: httpx.AsyncClient) -> None:
    """The token-capture fields change how a reply is shown, never which turn is generated."""
    plain = await _post(client, chat_body("sim-verbose", REFUND, 64))
    asked = await _post(client, chat_body("sim-verbose", REFUND, 64, **SGLANG))
    assert asked["choices"][0]["message"] == plain["choices"][0]["message"]
    assert asked["usage"] == plain["usage"]


async def test_faithful_prompt_starts_with_previous_prompt_and_output(client: httpx.AsyncClient) -> None:
    """Replaying a turn verbatim: the next prompt's ids start with this prompt's ids + its output ids."""
    first = await _post(client, chat_body("sim-perfect", ARITH, 256, **VLLM))
    call = first["choices"][0]["message"]["tool_calls"][0]
    messages = [{"role": "user", "content": ARITH},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": call["id"], "content": "449"}]
    second = await _post(client, {**chat_body("sim-perfect", ARITH, 256, **VLLM), "messages": messages})
    head = first["prompt_token_ids"] + first["choices"][0]["token_ids"]
    assert second["prompt_token_ids"][: len(head)] == head
    rerendered = await _post(client, {**chat_body("sim-rerender", ARITH, 256, **VLLM), "messages": messages})
    assert rerendered["prompt_token_ids"][: len(head)] != head


async def test_drift_preset_rerenders_like_real_templates(client: httpx.AsyncClient) -> None:
    """sim-drift: the thought leads the output ids and is gone from the replayed prompt, the
    arguments come back `tojson`-spaced, and the content's last piece merges with a newline."""
    body = chat_body("sim-drift", ARITH, 256, **VLLM)
    tools = tuple(t["function"]["name"] for t in body["tools"])
    first = await _post(client, body)
    message = first["choices"][0]["message"]
    call = message["tool_calls"][0]
    ids = first["choices"][0]["token_ids"]
    think = first["usage"]["completion_tokens_details"]["reasoning_tokens"]
    assert message["reasoning"]
    assert think > 0
    assert len(ids) == first["usage"]["completion_tokens"]
    assert ids[0] == sim_tokens.piece_id(message["reasoning"][:4])  # the thought comes first
    compact = call["function"]["arguments"]
    assert ": " not in compact
    replay = [{"role": "user", "content": ARITH},
              {"role": "assistant", "content": message["content"], "tool_calls": [call]},
              {"role": "tool", "tool_call_id": call["id"], "content": "449"}]
    second = await _post(client, {**body, "messages": replay})
    prompt = second["prompt_token_ids"]
    assert prompt == sim_tokens.prompt_ids(replay, tools, rerender=False, template_drift=True)
    assert prompt != sim_tokens.prompt_ids(replay, tools, rerender=False)
    spaced = json.dumps(json.loads(compact))
    assert spaced != compact
    args_ids = [sim_tokens.piece_id(spaced[i:i + 4]) for i in range(0, len(spaced), 4)]
    assert any(prompt[i:i + len(args_ids)] == args_ids for i in range(len(prompt)))
    assert not set(ids[:think]) & set(prompt[len(first["prompt_token_ids"]):])  # thought stripped
    head = first["prompt_token_ids"] + ids
    assert prompt[: len(head)] != head
    assert prompt[: len(first["prompt_token_ids"])] == first["prompt_token_ids"]  # history before is kept


async def test_sglang_ids_are_per_choice_and_absent_from_streams(client: httpx.AsyncClient) -> None:
    """SGLang shape: prompt and output ids on the choice; streams carry none."""
    body = chat_body("sim-sglang", REFUND, 64, **SGLANG)
    reply = await _post(client, body)
    choice = reply["choices"][0]
    assert "prompt_token_ids" not in reply
    assert choice["prompt_token_ids"]
    assert len(choice["token_ids"]) == reply["usage"]["completion_tokens"]
    assert _stream_ids(await _stream(client, body)) == []


async def test_llamacpp_ids_ride_in_logprobs_only(client: httpx.AsyncClient) -> None:
    """llama.cpp shape: no id fields, each logprobs entry carries its `id`; streamed with tools: a 400."""
    body = chat_body("sim-llamacpp", REFUND, 64, logprobs=True, return_token_ids=True)
    reply = await _post(client, body)
    choice = reply["choices"][0]
    assert "token_ids" not in choice
    assert "prompt_token_ids" not in reply
    ids = [e["id"] for e in choice["logprobs"]["content"]]
    assert len(ids) == reply["usage"]["completion_tokens"]
    no_tools = {k: v for k, v in body.items() if k != "tools"}
    assert _stream_logprob_ids(await _stream(client, no_tools)) == [
        e["id"] for e in (await _post(client, no_tools))["choices"][0]["logprobs"]["content"]]
    refused = await client.post("/v1/chat/completions", json={**body, "stream": True})
    assert refused.status_code == 400
    assert "logprobs is not supported with tools + stream" in refused.text


async def test_stream_dropping_preset_sends_no_ids_in_streams(client: httpx.AsyncClient) -> None:
    """sim-stream-no-ids: ids in the JSON reply, none in the stream (vllm #27482)."""
    body = chat_body("sim-stream-no-ids", REFUND, 64, **VLLM)
    assert (await _post(client, body))["choices"][0]["token_ids"]
    assert _stream_ids(await _stream(client, body)) == []

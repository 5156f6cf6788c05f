"""Strict validation: bad histories and bodies are refused in each provider's own error shape."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.sim.conftest import ARITH, chat_body

CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "calculator", "arguments": '{"expression": "1 + 2"}'},
}


def _chat(*messages: dict[str, Any]) -> dict[str, Any]:
    body = chat_body("sim-perfect", ARITH, 64)
    body["messages"] = [{"role": "user", "content": ARITH}, *messages]
    return body


async def test_chat_accepts_the_replayed_history(client: httpx.AsyncClient) -> None:
    """A settled call, and a malformed call replayed as "{}" with an error result, are accepted."""
    broken = {**CALL, "id": "call_2", "function": {"name": "calculator", "arguments": "{}"}}
    body = _chat(
        {"role": "assistant", "content": None, "tool_calls": [broken]},
        {"role": "tool", "tool_call_id": "call_2", "content": "error: arguments were malformed"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "3"},
    )
    reply = await client.post("/v1/chat/completions", json=body)
    assert reply.status_code == 200
    assert reply.json()["choices"][0]["message"]["content"] == "3"


@pytest.mark.parametrize(
    ("messages", "status"),
    [
        (
            [
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {**CALL, "function": {"name": "calculator", "arguments": '{"expression": "1 +'}}
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "3"},
            ],
            500,
        ),
        ([{"role": "tool", "tool_call_id": "call_9", "content": "3"}], 400),
        (
            [
                {"role": "assistant", "content": None, "tool_calls": [CALL]},
                {"role": "user", "content": "go on"},
            ],
            400,
        ),
        ([{"role": "assistant", "content": None, "tool_calls": [CALL]}], 400),
        (
            [
                {"role": "assistant", "content": None, "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "call_1", "content": "3"},
                {"role": "tool", "tool_call_id": "call_1", "content": "3"},
            ],
            400,
        ),
    ],
)
async def test_chat_rejects_bad_histories(
    client: httpx.AsyncClient, messages: list[dict[str, Any]], status: int
) -> None:
    """Broken replayed arguments get a 500; orphan results and unsettled calls get a 400, OpenAI-shaped."""
    reply = await client.post("/v1/chat/completions", json=_chat(*messages))
    assert reply.status_code == status
    assert set(reply.json()["error"]) == {"message", "type", "param", "code"}


async def test_responses_rejects_bad_histories(client: httpx.AsyncClient) -> None:
    """Responses: unsettled function_call is 400, unparseable replayed arguments 500, settled ones pass."""
    call = {
        "type": "function_call",
        "call_id": "call_1",
        "name": "calculator",
        "arguments": '{"expression":"1+2"}',
    }
    out = {"type": "function_call_output", "call_id": "call_1", "output": "3"}
    base = {"model": "sim-perfect", "tools": [{"type": "function", "name": "calculator"}]}
    user = {"role": "user", "content": ARITH}
    ok = await client.post("/v1/responses", json={**base, "input": [user, call, out]})
    assert ok.status_code == 200
    assert ok.json()["output"][-1]["content"][0]["text"] == "3"
    missing = await client.post("/v1/responses", json={**base, "input": [user, call, user]})
    assert missing.status_code == 400
    orphan = await client.post("/v1/responses", json={**base, "input": [user, out]})
    assert orphan.status_code == 400
    broken = await client.post(
        "/v1/responses", json={**base, "input": [user, {**call, "arguments": "{"}, out]}
    )
    assert broken.status_code == 500
    assert broken.json()["error"]["type"] == "server_error"


async def test_anthropic_rules(client: httpx.AsyncClient) -> None:
    """Anthropic: max_tokens is required, a tool_use needs its tool_result in the next message."""
    use = {"type": "tool_use", "id": "toolu_1", "name": "calculator", "input": {"expression": "1 + 2"}}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "3"}
    base = {"model": "sim-perfect", "tools": [{"name": "calculator", "input_schema": {"type": "object"}}]}
    user = {"role": "user", "content": ARITH}
    no_cap = await client.post("/v1/messages", json={**base, "messages": [user]})
    assert no_cap.status_code == 400
    assert no_cap.json()["error"]["type"] == "invalid_request_error"
    ok = await client.post(
        "/v1/messages",
        json={
            **base,
            "max_tokens": 64,
            "messages": [
                user,
                {"role": "assistant", "content": [use]},
                {"role": "user", "content": [result]},
            ],
        },
    )
    assert ok.status_code == 200
    assert ok.json()["content"] == [{"type": "text", "text": "3"}]
    unsettled = await client.post(
        "/v1/messages",
        json={
            **base,
            "max_tokens": 64,
            "messages": [user, {"role": "assistant", "content": [use]}, {"role": "user", "content": "well?"}],
        },
    )
    assert unsettled.status_code == 400
    orphan = await client.post(
        "/v1/messages", json={**base, "max_tokens": 64, "messages": [{"role": "user", "content": [result]}]}
    )
    assert orphan.status_code == 400
    assert orphan.json()["type"] == "error"


async def test_gemini_rules(client: httpx.AsyncClient) -> None:
    """Gemini: a functionCall needs its functionResponse (by id) next; errors are RPC-shaped."""
    call = {"functionCall": {"id": "abcd1234", "name": "calculator", "args": {"expression": "1 + 2"}}}
    resp = {"functionResponse": {"id": "abcd1234", "name": "calculator", "response": {"output": "3"}}}
    tools = [{"functionDeclarations": [{"name": "calculator"}]}]
    user = {"role": "user", "parts": [{"text": ARITH}]}
    url = "/v1beta/models/sim-perfect:generateContent"
    ok = await client.post(
        url,
        json={
            "contents": [user, {"role": "model", "parts": [call]}, {"role": "user", "parts": [resp]}],
            "tools": tools,
        },
    )
    assert ok.status_code == 200
    assert ok.json()["candidates"][0]["content"]["parts"] == [{"text": "3"}]
    bad = await client.post(url, json={"contents": [user, {"role": "model", "parts": [call]}, user]})
    assert bad.status_code == 400
    assert bad.json()["error"]["status"] == "INVALID_ARGUMENT"


@pytest.mark.parametrize(
    ("path", "shape_key"),
    [
        ("/v1/chat/completions", "error"),
        ("/v1/responses", "error"),
        ("/v1/messages", "type"),
        ("/v1beta/models/sim-perfect:generateContent", "error"),
    ],
)
async def test_malformed_bodies_and_unknown_models(
    client: httpx.AsyncClient, path: str, shape_key: str
) -> None:
    """Non-JSON and wrongly typed bodies get 400, an unknown model 404, in the provider's own shape."""
    bad = await client.post(path, content=b"{not json")
    assert bad.status_code == 400
    assert shape_key in bad.json()
    typed = await client.post(
        path, json={"model": "sim-perfect", "messages": "x", "input": 3, "contents": 4, "max_tokens": 5}
    )
    assert typed.status_code == 400
    unknown_path = path.replace("sim-perfect", "no-such-model")
    unknown = await client.post(unknown_path, json={"model": "no-such-model", "messages": []})
    assert unknown.status_code == 404
    assert shape_key in unknown.json()


ANTHROPIC_BASE = {
    "model": "sim-perfect",
    "max_tokens": 64,
    "tools": [{"name": "calculator", "input_schema": {"type": "object"}}],
}
USE = {"type": "tool_use", "id": "toolu_1", "name": "calculator", "input": {"expression": "1 + 2"}}
RESULT = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "3"}


@pytest.mark.parametrize(
    "assistant",
    [
        {"role": "assistant", "content": [{"type": "text", "text": ""}]},
        {"role": "assistant", "content": ""},
        {"role": "assistant", "content": []},
        {"role": "assistant", "content": [{"type": "text", "text": "  \n"}]},
        {"role": "assistant", "content": [{"type": "text", "text": ""}, USE]},
    ],
    ids=["empty-text-block", "empty-string", "no-blocks", "blank-text-block", "empty-text-beside-call"],
)
async def test_anthropic_rejects_empty_assistant_content(
    client: httpx.AsyncClient, assistant: dict[str, Any]
) -> None:
    """A mid-history Anthropic assistant message that is empty, or has an empty or blank text block, is a
    400 invalid_request_error."""
    user = {"role": "user", "content": ARITH}
    after = (
        {"role": "user", "content": [RESULT]}
        if assistant["content"] and USE in assistant["content"]
        else {"role": "user", "content": "go on"}
    )
    reply = await client.post("/v1/messages", json={**ANTHROPIC_BASE, "messages": [user, assistant, after]})
    assert reply.status_code == 400
    body = reply.json()
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert "non-empty" in body["error"]["message"] or "non-whitespace" in body["error"]["message"]


async def test_anthropic_accepts_text_beside_call_and_empty_final_prefill(client: httpx.AsyncClient) -> None:
    """A non-empty text block beside a tool_use is accepted, and so is an empty final assistant message
    (a prefill)."""
    user = {"role": "user", "content": ARITH}
    spoken = {"role": "assistant", "content": [{"type": "text", "text": "Computing."}, USE]}
    ok = await client.post(
        "/v1/messages",
        json={**ANTHROPIC_BASE, "messages": [user, spoken, {"role": "user", "content": [RESULT]}]},
    )
    assert ok.status_code == 200
    prefill = await client.post(
        "/v1/messages", json={**ANTHROPIC_BASE, "messages": [user, {"role": "assistant", "content": []}]}
    )
    assert prefill.status_code == 200


@pytest.mark.parametrize(
    ("model_content", "field"),
    [
        ({"role": "model", "parts": [{"text": ""}]}, "contents[1].parts[0].data"),
        ({"role": "model", "parts": []}, "contents[1].parts"),
        ({"role": "model"}, "contents[1].parts"),
        (
            {"role": "model", "parts": [{"text": ""}, {"functionCall": {"name": "calculator", "args": {}}}]},
            "contents[1].parts[0].data",
        ),
    ],
    ids=["empty-text-part", "no-parts", "parts-missing", "empty-text-beside-call"],
)
async def test_gemini_rejects_empty_model_content(
    client: httpx.AsyncClient, model_content: dict[str, Any], field: str
) -> None:
    """A Gemini model content with no parts, or an empty text part, is a 400 INVALID_ARGUMENT naming
    the field."""
    user = {"role": "user", "parts": [{"text": ARITH}]}
    after = {"role": "user", "parts": [{"text": "go on"}]}
    if any("functionCall" in p for p in model_content.get("parts", [])):
        after = {
            "role": "user",
            "parts": [{"functionResponse": {"name": "calculator", "response": {"output": "3"}}}],
        }
    reply = await client.post(
        "/v1beta/models/sim-perfect:generateContent",
        json={
            "contents": [user, model_content, after],
            "tools": [{"functionDeclarations": [{"name": "calculator"}]}],
        },
    )
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["status"] == "INVALID_ARGUMENT"
    assert error["code"] == 400
    assert f"GenerateContentRequest.{field}" in error["message"]


@pytest.mark.parametrize(
    ("path", "key"),
    [
        ("/v1/chat/completions", "messages"),
        ("/v1/responses", "input"),
        ("/v1/messages", "messages"),
        ("/v1beta/models/sim-perfect:streamGenerateContent?alt=sse", "contents"),
    ],
)
async def test_deeply_nested_body_is_a_400_in_the_providers_shape(
    client: httpx.AsyncClient, path: str, key: str
) -> None:
    """A body nested past the JSON parser's recursion limit is a 400 in the dialect's error shape, not 500."""
    depth = 100_000
    body = b'{"model": "sim-perfect", "max_tokens": 5, "%s": %s%s}' % (
        key.encode(),
        b"[" * depth,
        b"]" * depth,
    )
    reply = await client.post(path, content=body, headers={"content-type": "application/json"})
    assert reply.status_code == 400
    assert reply.headers["content-type"] == "application/json"
    payload = reply.json()
    if path == "/v1/messages":
        assert payload["error"]["type"] == "invalid_request_error"
    elif "models/" in path:
        assert payload["error"]["status"] == "INVALID_ARGUMENT"
    else:
        assert payload["error"]["type"] == "invalid_request_error"
    assert "nested too deeply" in json.dumps(payload)


async def test_deeply_nested_replayed_arguments_are_refused_like_broken_ones(
    client: httpx.AsyncClient,
) -> None:
    """Replayed chat arguments nested past the parser's limit get the 500 that unparseable arguments get."""
    deep = "[" * 100_000 + "]" * 100_000
    call = {**CALL, "function": {"name": "calculator", "arguments": deep}}
    body = _chat(
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "3"},
    )
    reply = await client.post("/v1/chat/completions", json=body)
    assert reply.status_code == 500
    assert reply.json()["error"]["type"] == "server_error"

"""History replay and request parameters per dialect: calls and results go back in each dialect's
own shape with ids matched, broken arguments go back as `{}`, and sampling parameters pass through."""

from __future__ import annotations

import json
from typing import Any

import pytest

from collector.providers.anthropic import build_anthropic_body
from collector.providers.chat import build_chat_body
from collector.providers.gemini import build_gemini_body
from collector.providers.responses import build_responses_body
from collector.turn import (
    ArgStatus,
    AssistantMessage,
    Message,
    SamplingParams,
    SystemMessage,
    ToolCall,
    ToolResultMessage,
    ToolSpec,
    TurnRequest,
    UserMessage,
)
from tests.providers.conftest import MakeProvider, request
from tests.providers.wirefab import KINDS, WIRE, Fab, FabCall, build, sse


def wire(name: str) -> Any:
    return json.loads((WIRE / name).read_text())


def ok_call(call_id: str, name: str, raw: str) -> ToolCall:
    return ToolCall(call_id, name, json.loads(raw), ArgStatus.OK, raw_arguments=raw)


def test_chat_history_matches_wire_example() -> None:
    """The chat request example's messages are reproduced exactly from neutral history."""
    example = wire("chat_request.json")
    call = ok_call("call_KjzAbhiZC6nk81tQzL7pwlpc", "read_file", '{"path":"README.md"}')
    history: list[Message] = [
        SystemMessage("You are a coding agent."),
        UserMessage("how large is the README.md file in my current path"),
        AssistantMessage("", [call]),
        ToolResultMessage(call.id, "read_file", "# Demo\n(4.1 KB of text)"),
        UserMessage("Now read src/main.py"),
    ]
    tool = ToolSpec(
        "read_file",
        "Read the contents of a file at the given path.",
        example["tools"][0]["function"]["parameters"],
    )
    body = build_chat_body(
        TurnRequest("gpt-4.1", history, [tool], 16, SamplingParams(tool_choice="auto")),
        "max_completion_tokens",
        True,
    )
    assert body["messages"] == example["messages"]
    for key in ("model", "tool_choice", "max_completion_tokens", "stream", "stream_options"):
        assert body[key] == example[key]
    assert body["tools"][0]["function"]["parameters"] == tool.parameters


def test_responses_history_matches_wire_example() -> None:
    """Responses replays calls as function_call items linked by call_id, results as function_call_output."""
    example = wire("responses_request.json")
    call = ok_call("call_ITNAVLCwsZSEAlQHq8C8bS5L", "delete_template", '{"template_id":"03cb4fdd"}')
    history: list[Message] = [
        SystemMessage("You are a coding agent."),
        UserMessage("delete the template with ID 03cb4fdd"),
        AssistantMessage("", [call]),
        ToolResultMessage(call.id, "delete_template", '{"error":"template is in use"}'),
    ]
    body = build_responses_body(TurnRequest("gpt-5.2", history, [], 64), stream=True)
    assert body["instructions"] == example["instructions"]
    fc, out = body["input"][1], body["input"][2]
    want_fc = example["input"][2]
    assert fc == {k: want_fc[k] for k in ("type", "call_id", "name", "arguments")}
    assert out == example["input"][3]
    assert body["max_output_tokens"] == example["max_output_tokens"]


def test_anthropic_history_matches_wire_example() -> None:
    """Anthropic replays tool_use blocks and puts tool_result blocks first in the next user message."""
    example = wire("anthropic_request.json")
    call = ToolCall("toolu_01RX68weRSquLx6HUTj65iBo", "Read", {"file_path": "/srv/blah/foo"}, ArgStatus.OK)
    history: list[Message] = [
        SystemMessage("You are a coding agent."),
        UserMessage("read the foo file"),
        AssistantMessage("Let me read it.", [call]),
        ToolResultMessage(call.id, "Read", "hello from foo"),
        UserMessage("Now summarise it."),
    ]
    body = build_anthropic_body(TurnRequest("claude-sonnet-4-20250514", history, [], 1024), stream=True)
    assert body["system"] == example["system"]
    assert body["messages"][0] == {"role": "user", "content": [{"type": "text", "text": "read the foo file"}]}
    assert body["messages"][1:] == example["messages"][1:]
    assert body["max_tokens"] == 1024


def test_gemini_history_matches_wire_example() -> None:
    """Gemini replays the model content with its id and thoughtSignature, then a matching functionResponse."""
    example = wire("gemini_request.json")
    call = ToolCall(
        "fc_01", "read_file", {"path": "README.md"}, ArgStatus.OK, raw_object={"path": "README.md"}
    )
    call.signature = "RkFLRV9USE9VR0hUX1NJR05BVFVSRV9CWVRFUw=="
    history: list[Message] = [
        SystemMessage("You are a coding agent."),
        UserMessage("What is in README.md?"),
        AssistantMessage("", [call]),
        ToolResultMessage("fc_01", "read_file", "# Demo\n..."),
    ]
    spec = example["tools"][0]["functionDeclarations"][0]
    tool = ToolSpec(spec["name"], spec["description"], spec["parametersJsonSchema"])
    params = SamplingParams(
        temperature=1.0,
        tool_choice="auto",
        extra_body={"generationConfig": {"thinkingConfig": {"thinkingBudget": 0}}},
    )
    body = build_gemini_body(TurnRequest("gemini-2.5-flash", history, [tool], 256, params))
    assert body == example


MALFORMED = ToolCall(
    "call_bad", "refund", None, ArgStatus.MALFORMED, raw_arguments='{"order_id": "A-1", "amount": 10'
)
REPAIRED = ToolCall(
    "call_fix",
    "refund",
    {"q": 1},
    ArgStatus.REPAIRED,
    raw_arguments='{"q":1}<tool_call|>',
    repair="strip_delimiters",
)
HISTORY: list[Message] = [
    UserMessage("refund"),
    AssistantMessage("", [MALFORMED, REPAIRED]),
    ToolResultMessage("call_bad", "refund", "not executed: arguments were malformed", is_error=True),
    ToolResultMessage("call_fix", "refund", "ok"),
]


def test_malformed_and_repaired_replay_in_text_dialects() -> None:
    """Chat and Responses replay a malformed call as "{}" and a repaired one without the delimiter."""
    chat = build_chat_body(TurnRequest("m", HISTORY, [], 8), "max_tokens", False)
    args = [c["function"]["arguments"] for c in chat["messages"][1]["tool_calls"]]
    assert args == ["{}", '{"q":1}']
    assert [m["tool_call_id"] for m in chat["messages"][2:]] == ["call_bad", "call_fix"]
    responses = build_responses_body(TurnRequest("m", HISTORY, [], 8), False)
    calls = [i for i in responses["input"] if i.get("type") == "function_call"]
    assert [c["arguments"] for c in calls] == ["{}", '{"q":1}']
    outputs = [i["call_id"] for i in responses["input"] if i.get("type") == "function_call_output"]
    assert outputs == ["call_bad", "call_fix"]


def test_malformed_replay_in_object_dialects() -> None:
    """Anthropic and Gemini replay a malformed call with an empty object, never the fragment."""
    anthropic = build_anthropic_body(TurnRequest("m", HISTORY, [], 8), False)
    inputs = [b["input"] for b in anthropic["messages"][1]["content"] if b["type"] == "tool_use"]
    assert inputs == [{}, {"q": 1}]
    results = anthropic["messages"][2]["content"]
    assert [(r["tool_use_id"], r["is_error"]) for r in results] == [("call_bad", True), ("call_fix", False)]
    gemini = build_gemini_body(TurnRequest("m", HISTORY, [], 8))
    calls = [p["functionCall"] for p in gemini["contents"][1]["parts"]]
    assert [c["args"] for c in calls] == [{}, {"q": 1}]
    responses = [p["functionResponse"] for p in gemini["contents"][2]["parts"]]
    assert responses[0] == {
        "id": "call_bad",
        "name": "refund",
        "response": {"error": "not executed: arguments were malformed"},
    }


def test_gemini_made_up_ids_are_never_sent_back() -> None:
    """A call whose id the adapter made up is replayed, and answered, without an id."""
    call = ToolCall("gemini_r_0", "read_file", {"path": "a"}, ArgStatus.OK, had_wire_id=False)
    history: list[Message] = [
        UserMessage("read"),
        AssistantMessage("", [call]),
        ToolResultMessage(call.id, "read_file", "x"),
    ]
    body = build_gemini_body(TurnRequest("m", history, [], 8))
    assert body["contents"][1]["parts"][0] == {"functionCall": {"name": "read_file", "args": {"path": "a"}}}
    assert body["contents"][2]["parts"][0] == {
        "functionResponse": {"name": "read_file", "response": {"output": "x"}}
    }


def _gemini_chunk(part: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": [part]}, "index": 0}
    if finish is not None:
        candidate["finishReason"] = finish
    return {"candidates": [candidate], "usageMetadata": {"promptTokenCount": 9, "candidatesTokenCount": 4,
                                                         "thoughtsTokenCount": 30}}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_gemini_text_part_signature_goes_back_on_the_text_part(
    make: MakeProvider, stream: bool
) -> None:
    """A signature Gemini put on the text part of a turn without a call (in a stream, on a last,
    empty text piece) is kept and sent back on the one text part of that turn, whole text."""
    if stream:
        reply = sse([(None, _gemini_chunk({"text": "Sunny, "})),
                             (None, _gemini_chunk({"text": "then rain."})),
                             (None, _gemini_chunk({"text": "", "thoughtSignature": "SIG=="}, "STOP"))])
    else:
        reply = json.dumps(_gemini_chunk({"text": "Sunny, then rain.", "thoughtSignature": "SIG=="},
                                         "STOP")).encode()
    provider, _, _ = await make("gemini", reply, stream=stream)
    turn = await provider.complete(request())
    assert turn.text == "Sunny, then rain."
    assert turn.reasoning_items == [{"text": "Sunny, then rain.", "thoughtSignature": "SIG=="}]
    assert turn.reasoning_text is None  # the signed text is the answer, not a thought
    history: list[Message] = [UserMessage("weather?"),
                              AssistantMessage(turn.text, [], reasoning_items=turn.reasoning_items),
                              UserMessage("and tomorrow?")]
    body = build_gemini_body(TurnRequest("m", history, [], 8))
    assert body["contents"][1] == {
        "role": "model", "parts": [{"text": "Sunny, then rain.", "thoughtSignature": "SIG=="}]
    }


PARAMS = SamplingParams(
    temperature=0.3,
    top_p=0.9,
    seed=7,
    stop=["END"],
    tool_choice="refund",
    logprobs=True,
    top_logprobs=2,
    extra_body={"top_k": 20, "return_token_ids": True},
)
TOOL = ToolSpec("refund", "Refund.", {"type": "object", "properties": {}})


def test_chat_params_pass_through() -> None:
    """Chat gets temperature, top_p, seed, stop, a forced tool, logprobs, the cap field and extra_body."""
    body = build_chat_body(TurnRequest("m", [UserMessage("x")], [TOOL], 99, PARAMS), "max_tokens", False)
    assert body["max_tokens"] == 99
    assert (body["temperature"], body["top_p"], body["seed"], body["stop"]) == (0.3, 0.9, 7, ["END"])
    assert body["tool_choice"] == {"type": "function", "function": {"name": "refund"}}
    assert (body["logprobs"], body["top_logprobs"], body["top_k"], body["return_token_ids"]) == (
        True,
        2,
        20,
        True,
    )


def test_responses_params_pass_through() -> None:
    """Responses gets temperature, top_p, a forced tool, logprobs via include, and extra_body."""
    body = build_responses_body(TurnRequest("m", [UserMessage("x")], [TOOL], 99, PARAMS), False)
    assert (body["max_output_tokens"], body["temperature"], body["top_p"]) == (99, 0.3, 0.9)
    assert body["tool_choice"] == {"type": "function", "name": "refund"}
    assert body["include"] == ["message.output_text.logprobs"]
    assert body["top_k"] == 20
    assert "seed" not in body


def test_anthropic_params_pass_through() -> None:
    """Anthropic gets max_tokens, temperature, top_p, stop_sequences, a forced tool and extra_body."""
    body = build_anthropic_body(TurnRequest("m", [UserMessage("x")], [TOOL], 99, PARAMS), False)
    assert (body["max_tokens"], body["temperature"], body["top_p"], body["stop_sequences"]) == (
        99,
        0.3,
        0.9,
        ["END"],
    )
    assert body["tool_choice"] == {"type": "tool", "name": "refund"}
    assert body["top_k"] == 20


def test_gemini_params_pass_through() -> None:
    """Gemini gets generationConfig fields, a forced function via toolConfig, and extra_body."""
    body = build_gemini_body(TurnRequest("m", [UserMessage("x")], [TOOL], 99, PARAMS))
    assert body["generationConfig"] == {
        "maxOutputTokens": 99,
        "temperature": 0.3,
        "topP": 0.9,
        "seed": 7,
        "stopSequences": ["END"],
        "responseLogprobs": True,
        "logprobs": 2,
    }
    assert body["toolConfig"] == {
        "functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["refund"]}
    }


@pytest.mark.parametrize(
    ("choice", "chat", "anthropic", "gemini"),
    [
        ("auto", "auto", {"type": "auto"}, "AUTO"),
        ("required", "required", {"type": "any"}, "ANY"),
        ("none", "none", {"type": "none"}, "NONE"),
    ],
)
def test_tool_choice_modes(choice: str, chat: str, anthropic: dict[str, str], gemini: str) -> None:
    """The three tool_choice modes map to each dialect's own vocabulary."""
    req = TurnRequest("m", [UserMessage("x")], [TOOL], 9, SamplingParams(tool_choice=choice))
    assert build_chat_body(req, "max_tokens", False)["tool_choice"] == chat
    assert build_responses_body(req, False)["tool_choice"] == chat
    assert build_anthropic_body(req, False)["tool_choice"] == anthropic
    assert build_gemini_body(req)["toolConfig"]["functionCallingConfig"]["mode"] == gemini


async def test_chat_logprobs_and_token_ids_are_kept(make: MakeProvider) -> None:
    """Chat logprobs and vLLM-style token ids returned by the server are kept on the turn."""
    body = json.loads(build("chat", Fab(text="hi", out_tokens=2), False))
    body["choices"][0]["logprobs"] = {
        "content": [{"token": "h", "logprob": -0.5}, {"token": "i", "logprob": -0.25}]
    }
    body["choices"][0]["token_ids"] = [101, 102]
    provider, _, _ = await make("chat", json.dumps(body).encode())
    turn = await provider.complete(request())
    assert turn.logprobs == [-0.5, -0.25]
    assert turn.token_ids == [101, 102]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("stream", [False, True])
async def test_urls_per_dialect(make: MakeProvider, kind: str, stream: bool) -> None:
    """Each dialect posts to its own path under the base URL; Gemini streams with alt=sse."""
    call = FabCall("c", "refund", "{}", {})
    provider, recorder, _ = await make(kind, build(kind, Fab([call]), stream), stream=stream)
    await provider.complete(request())
    url = str(recorder.requests[0].url)
    expected = {
        "chat": "http://provider.test/v1/chat/completions",
        "responses": "http://provider.test/v1/responses",
        "anthropic": "http://provider.test/v1/messages",
        "gemini": "http://provider.test/v1beta/models/m-test:"
        + ("streamGenerateContent?alt=sse" if stream else "generateContent"),
    }[kind]
    assert url == expected
    sent = recorder.body()
    if kind in ("chat", "responses", "anthropic"):
        assert sent.get("stream", False) is stream

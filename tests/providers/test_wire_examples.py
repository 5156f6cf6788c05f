"""Every reply example of provider-protocols.md, served through `httpx.MockTransport`, becomes the
normalized turn its transport means: calls, argument status, raw and derived finish reasons."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from collector.errors import ProviderUnavailable
from collector.turn import ArgStatus, FinishClass, LengthSignal
from tests.providers.conftest import MakeProvider, request
from tests.providers.wirefab import WIRE

FR, CAP, CUT, TPL = (
    LengthSignal.FINISH_REASON,
    LengthSignal.CAP_REACHED,
    LengthSignal.STREAM_CUT,
    LengthSignal.UNCLOSED_TEMPLATE,
)
OK, REP, BAD = ArgStatus.OK, ArgStatus.REPAIRED, ArgStatus.MALFORMED


@dataclass
class Case:
    file: str
    kind: str
    cap: int
    finish: FinishClass
    raw: str | None
    signals: tuple[LengthSignal, ...] = ()
    calls: list[tuple[str, str, ArgStatus, Any]] = field(default_factory=list)
    text: str = ""
    incomplete: str | None = None
    usage: tuple[int, int] | None = None


CASES = [
    Case(
        "chat_response_toolcall.json",
        "chat",
        1024,
        FinishClass.TOOL_CALLS,
        "tool_calls",
        calls=[("call_KjzAbhiZC6nk81tQzL7pwlpc", "read_file", OK, {"path": "README.md"})],
        usage=(60, 15),
    ),
    Case(
        "chat_response_truncated.json",
        "chat",
        16,
        FinishClass.LENGTH,
        "length",
        (FR, CAP),
        calls=[("call_Q1w2E3r4T5y6U7i8O9p0Asdf", "read_file", BAD, None)],
    ),
    Case("chat_response_refusal.json", "chat", 1024, FinishClass.STOP, "stop"),
    Case(
        "chat_stream_toolcall.sse",
        "chat",
        1024,
        FinishClass.TOOL_CALLS,
        "tool_calls",
        calls=[
            ("call_AAAAAAAAAAAAAAAAAAAAAAAA", "read_file", OK, {"path": "README.md"}),
            ("call_BBBBBBBBBBBBBBBBBBBBBBBB", "read_file", OK, {"path": "src/main.py"}),
        ],
    ),
    Case(
        "chat_stream_truncated.sse",
        "chat",
        16,
        FinishClass.LENGTH,
        "length",
        (FR, CAP),
        calls=[("call_Q1w2E3r4T5y6U7i8O9p0Asdf", "read_file", BAD, None)],
        usage=(98, 16),
    ),
    Case(
        "leak_stream_gemma_marker.sse",
        "chat",
        1024,
        FinishClass.TOOL_CALLS,
        "tool_calls",
        calls=[("call-x", "composio_execute", REP, {"q": 1})],
    ),
    Case(
        "vllm_response_truncated_leak.json",
        "chat",
        32,
        FinishClass.LENGTH,
        "length",
        (FR, CAP, TPL),
        text='<tool_call>\n{"name": "write_file"',
    ),
    Case(
        "vllm_stream_toolcall.sse",
        "chat",
        1024,
        FinishClass.TOOL_CALLS,
        "tool_calls",
        calls=[("chatcmpl-tool-4f1c2d3e4b5a69788796a5b4c3d2e1f0", "read_file", OK, {"path": "README.md"})],
    ),
    Case(
        "responses_response_toolcall.json",
        "responses",
        1024,
        FinishClass.TOOL_CALLS,
        "completed",
        calls=[
            (
                "call_ITNAVLCwsZSEAlQHq8C8bS5L",
                "delete_template",
                OK,
                {"template_id": "03cb4fdd-8109-4a22-8e22-bb4975171395"},
            )
        ],
        usage=(6377, 119),
    ),
    Case(
        "responses_response_incomplete.json",
        "responses",
        64,
        FinishClass.LENGTH,
        "incomplete",
        (FR, CAP),
        calls=[("call_FAKE0002", "delete_template", BAD, None)],
        incomplete="max_output_tokens",
    ),
    Case(
        "responses_stream_toolcall.sse",
        "responses",
        1024,
        FinishClass.TOOL_CALLS,
        "completed",
        calls=[("call_GuuoyhUrVJQbWfHHz0xaX3n9", "list_templates", OK, {})],
    ),
    Case(
        "responses_stream_truncated.sse",
        "responses",
        64,
        FinishClass.LENGTH,
        "incomplete",
        (FR, CAP),
        calls=[("call_FAKE0003", "delete_template", BAD, None)],
        incomplete="max_output_tokens",
    ),
    Case(
        "anthropic_response_tooluse.json",
        "anthropic",
        1024,
        FinishClass.TOOL_CALLS,
        "tool_use",
        calls=[("toolu_01AusGgY5aKFhzWrFBv9JfHq", "Read", OK, {"file_path": "/srv/blah/foo"})],
        text="I'll read the file.",
        usage=(5 + 23490, 84),
    ),
    Case(
        # The input looks complete; only stop_reason shows the cut.
        "anthropic_response_truncated.json",
        "anthropic",
        1024,
        FinishClass.LENGTH,
        "max_tokens",
        (FR,),
        calls=[("toolu_FAKE00000000000000000002", "Write", OK, {"file_path": "/srv/out.py"})],
    ),
    Case("anthropic_response_refusal.json", "anthropic", 1024, FinishClass.CONTENT_FILTER, "refusal"),
    Case("anthropic_response_pause_turn.json", "anthropic", 1024, FinishClass.OTHER, "pause_turn"),
    Case(
        "anthropic_response_ctxwindow.json",
        "anthropic",
        32000,
        FinishClass.LENGTH,
        "model_context_window_exceeded",
        (FR,),
    ),
    Case(
        "anthropic_stream_tooluse.sse",
        "anthropic",
        1024,
        FinishClass.TOOL_CALLS,
        "tool_use",
        calls=[("toolu_01T1x1fJ34qAmk2tNTrN7Up6", "get_weather", OK, {"location": "San Francisco, CA"})],
        usage=(472, 89),
    ),
    Case(
        "anthropic_stream_truncated.sse",
        "anthropic",
        1024,
        FinishClass.LENGTH,
        "max_tokens",
        (FR,),
        calls=[("toolu_FAKE03", "Write", BAD, None)],
        text="I'll write the file.",
    ),
    Case(
        "gemini_response_functioncall.json",
        "gemini",
        1024,
        FinishClass.TOOL_CALLS,
        "STOP",
        calls=[("gemini_FAKE-resp-id-0001_0", "read_file", OK, {"path": "src/main.py"})],
        usage=(120, 78),
    ),
    Case(
        "gemini_response_parallel_calls.json",
        "gemini",
        1024,
        FinishClass.TOOL_CALLS,
        "STOP",
        calls=[
            ("y7kq2m1a", "read_file", OK, {"path": "README.md"}),
            ("p0x9c3vd", "read_file", OK, {"path": "src/main.py"}),
        ],
    ),
    # 256 thought tokens, no parts: the cap went to thinking (issue 16).
    Case("gemini_response_maxtokens.json", "gemini", 256, FinishClass.LENGTH, "MAX_TOKENS",
         (FR, CAP, LengthSignal.REASONING)),
    Case("gemini_response_malformed.json", "gemini", 1024, FinishClass.OTHER, "MALFORMED_FUNCTION_CALL"),
    Case(
        "gemini_response_blocked.json",
        "gemini",
        1024,
        FinishClass.CONTENT_FILTER,
        None,
        incomplete="PROHIBITED_CONTENT",
    ),
    Case(
        "gemini_stream_functioncall.sse",
        "gemini",
        1024,
        FinishClass.TOOL_CALLS,
        "STOP",
        calls=[("gemini_FAKE-resp-id-0004_0", "read_file", OK, {"path": "src/main.py"})],
    ),
    Case(
        "gemini_stream_truncated.sse",
        "gemini",
        16,
        FinishClass.LENGTH,
        "MAX_TOKENS",
        (FR, CAP),
        text="I will read the file now.",
    ),
    Case(
        "gemini_stream_toolcall_truncated.sse",
        "gemini",
        1024,
        FinishClass.LENGTH,
        "MAX_TOKENS",
        (FR,),
        text="I'll write the file now.",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.file)
async def test_wire_example_normalizes(make: MakeProvider, case: Case) -> None:
    """Each wire example yields its documented calls, argument status, raw reason and derived class."""
    stream = case.file.endswith(".sse")
    provider, recorder, _ = await make(case.kind, (WIRE / case.file).read_bytes(), stream=stream)
    turn = await provider.complete(request(case.cap))
    assert len(recorder.requests) == 1
    assert turn.finish_class is case.finish
    assert turn.raw_finish_reason == case.raw
    assert turn.length_signals == case.signals
    assert turn.is_length == bool(case.signals)
    assert [(c.id, c.name, c.status, c.arguments) for c in turn.tool_calls] == case.calls
    assert turn.text.startswith(case.text)
    assert turn.incomplete_reason == case.incomplete
    assert turn.max_output_tokens == case.cap
    if case.usage is not None:
        assert (turn.usage.input_tokens, turn.usage.output_tokens) == case.usage


async def test_gemini_made_up_id_is_flagged(make: MakeProvider) -> None:
    """A Gemini 2.x call without an id gets a stable made-up id marked had_wire_id=False."""
    provider, _, _ = await make("gemini", (WIRE / "gemini_response_functioncall.json").read_bytes())
    turn = await provider.complete(request())
    (call,) = turn.tool_calls
    assert call.had_wire_id is False
    assert call.signature == "RkFLRV9USE9VR0hUX1NJR05BVFVSRV9CWVRFUw=="


async def test_chat_refusal_text_is_kept(make: MakeProvider) -> None:
    """A chat refusal keeps its text on the turn and is a natural stop, not a tool turn."""
    provider, _, _ = await make("chat", (WIRE / "chat_response_refusal.json").read_bytes())
    turn = await provider.complete(request())
    assert turn.refusal == "I'm sorry, I can't help with that."
    assert turn.response_id == "chatcmpl-FAKE0000000000000000000003"


@pytest.mark.parametrize(
    ("kind", "file"),
    [
        ("chat", "chat_stream_error_midstream.sse"),
        ("chat", "openrouter_stream_error.sse"),
        ("responses", "responses_stream_failed.sse"),
        ("responses", "responses_stream_error_event.sse"),
        ("anthropic", "anthropic_stream_error.sse"),
    ],
)
async def test_midstream_error_retried_whole_then_unavailable(
    make: MakeProvider, kind: str, file: str
) -> None:
    """A transient mid-stream error event discards the partial stream and retries the whole request."""
    provider, recorder, sleeps = await make(kind, (WIRE / file).read_bytes(), stream=True, retries=2)
    with pytest.raises(ProviderUnavailable):
        await provider.complete(request())
    assert len(recorder.requests) == 3
    assert len(sleeps.waits) == 2

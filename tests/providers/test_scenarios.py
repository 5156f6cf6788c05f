"""The seed scenarios, in all four transports and both modes: a cut call is always a length turn,
leaked delimiters are repaired (and recorded), broken arguments stay malformed."""

from __future__ import annotations

import itertools

import pytest

from collector.turn import ArgStatus, FinishClass, LengthSignal
from tests.providers.conftest import MakeProvider, request
from tests.providers.wirefab import KINDS, MODES, Fab, FabCall, anthropic, build, chat

ALL_PATHS = list(itertools.product(KINDS, MODES))
# Paths where arguments travel as text: the only places delimiters can leak into them.
TEXT_PATHS = [("chat", False), ("chat", True), ("responses", False), ("responses", True), ("anthropic", True)]


def path_id(p: tuple[str, bool]) -> str:
    return f"{p[0]}-{'sse' if p[1] else 'json'}"


CUT_CASES = {
    # The refund of 1000 cut right after "10": an object transport may carry {"amount": 10}.
    "refund_cut": FabCall(
        "call_r", "refund", '{"order_id": "A-1001", "amount": 10', {"order_id": "A-1001", "amount": 10}
    ),
    # close_tickets with all-optional filters cut at once: an object transport may carry {}.
    "close_tickets_cut": FabCall("call_c", "close_tickets", "{", {}),
}


@pytest.mark.parametrize("path", ALL_PATHS, ids=path_id)
@pytest.mark.parametrize("case", sorted(CUT_CASES))
async def test_cut_call_is_a_length_turn(make: MakeProvider, path: tuple[str, bool], case: str) -> None:
    """A call cut by the cap is a length turn on every path, even when its object parses."""
    kind, stream = path
    call = CUT_CASES[case]
    reply = build(kind, Fab([call], text="Doing it.", cut=True, out_tokens=40), stream)
    provider, _, _ = await make(kind, reply, stream=stream)
    turn = await provider.complete(request(cap=64))
    assert turn.is_length
    assert turn.finish_class is FinishClass.LENGTH
    assert LengthSignal.FINISH_REASON in turn.length_signals
    assert turn.raw_finish_reason in {"length", "incomplete", "max_tokens", "MAX_TOKENS"}
    if (kind, stream) in TEXT_PATHS:
        (parsed,) = turn.tool_calls
        assert parsed.status is ArgStatus.MALFORMED
        assert parsed.arguments is None
        assert parsed.raw_arguments == call.args_text


@pytest.mark.parametrize("path", ALL_PATHS, ids=path_id)
async def test_output_at_cap_is_length_whatever_the_reason(
    make: MakeProvider, path: tuple[str, bool]
) -> None:
    """A call reported complete whose output tokens equal the cap is a length turn (vllm #58228)."""
    kind, stream = path
    call = FabCall(
        "call_h", "refund", '{"order_id": "A-1001", "amount": 10}', {"order_id": "A-1001", "amount": 10}
    )
    provider, _, _ = await make(kind, build(kind, Fab([call], out_tokens=32), stream), stream=stream)
    turn = await provider.complete(request(cap=32))
    assert turn.raw_finish_reason in {"tool_calls", "completed", "tool_use", "STOP"}
    assert turn.length_signals == (LengthSignal.CAP_REACHED,)
    assert turn.finish_class is FinishClass.LENGTH
    assert turn.tool_calls[0].status is ArgStatus.OK


@pytest.mark.parametrize("path", ALL_PATHS, ids=path_id)
async def test_complete_call_under_cap_is_not_length(make: MakeProvider, path: tuple[str, bool]) -> None:
    """A whole call under the cap is a tool-call turn with OK arguments on every path."""
    kind, stream = path
    call = FabCall(
        "call_ok", "refund", '{"order_id": "A-1001", "amount": 1000}', {"order_id": "A-1001", "amount": 1000}
    )
    provider, _, _ = await make(
        kind, build(kind, Fab([call], text="Refunding.", out_tokens=20), stream), stream=stream
    )
    turn = await provider.complete(request(cap=64))
    assert not turn.is_length
    assert turn.finish_class is FinishClass.TOOL_CALLS
    assert turn.text == "Refunding."
    (parsed,) = turn.tool_calls
    assert (parsed.id, parsed.name, parsed.status, parsed.arguments) == (
        "call_ok",
        "refund",
        ArgStatus.OK,
        {"order_id": "A-1001", "amount": 1000},
    )
    assert turn.usage.output_tokens == 20


LEAK_CASES = [
    ('{"tool":"GMAIL_CREATE_EMAIL_DRAFT","x":1}<tool_call|>', ArgStatus.REPAIRED, "strip_delimiters"),
    ('<tool_call>{"q":"hi"}</tool_call>', ArgStatus.REPAIRED, "strip_delimiters"),
    ('{"tool":"gmail"}<tool_call|>{"tool":"other"}', ArgStatus.REPAIRED, "strip_delimiters+leading_object"),
    ('{"body":"use <tool_call|> literally"}', ArgStatus.OK, None),
    ('{"arguments":{"body":"hi"]}}<tool_call|>', ArgStatus.MALFORMED, None),
]


@pytest.mark.parametrize("path", TEXT_PATHS, ids=path_id)
@pytest.mark.parametrize(
    ("args", "status", "repair"), LEAK_CASES, ids=["trailing", "wrapped", "concat", "in_string", "stray"]
)
async def test_leaked_delimiters_on_text_paths(
    make: MakeProvider, path: tuple[str, bool], args: str, status: ArgStatus, repair: str | None
) -> None:
    """Leaked delimiters are repaired and recorded, strings keep theirs, the stray-] blob stays malformed."""
    kind, stream = path
    provider, _, _ = await make(
        kind, build(kind, Fab([FabCall("call_l", "composio_execute", args)]), stream), stream=stream
    )
    turn = await provider.complete(request(cap=256))
    assert not turn.is_length
    (parsed,) = turn.tool_calls
    assert (parsed.status, parsed.repair) == (status, repair)
    assert parsed.raw_arguments == args
    assert (parsed.arguments is None) == (status is ArgStatus.MALFORMED)


async def test_anthropic_stream_unclosed_cut_block(make: MakeProvider) -> None:
    """An Anthropic stream whose cut tool_use block is never closed is a stream cut as well as max_tokens."""
    call = FabCall("toolu_x", "refund", '{"order_id": "A-1001", "amount": 10')
    reply = anthropic(Fab([call], cut=True, out_tokens=12), stream=True, close_cut_block=False)
    provider, _, _ = await make("anthropic", reply, stream=True)
    turn = await provider.complete(request(cap=64))
    assert turn.length_signals == (LengthSignal.FINISH_REASON, LengthSignal.STREAM_CUT)
    assert turn.tool_calls[0].status is ArgStatus.MALFORMED


async def test_chat_stream_done_without_finish_reason(make: MakeProvider) -> None:
    """A chat stream that reaches [DONE] without a finish reason is a stream cut."""
    call = FabCall("call_s", "refund", '{"order_id": "A-1001", "amount": 10')
    whole = chat(Fab([call], out_tokens=12), stream=True, finish="tool_calls")
    reply = whole.replace(b'"finish_reason": "tool_calls"', b'"finish_reason": null')
    assert reply != whole
    provider, _, _ = await make("chat", reply, stream=True)
    turn = await provider.complete(request(cap=64))
    assert turn.raw_finish_reason is None
    assert turn.length_signals == (LengthSignal.STREAM_CUT,)


@pytest.mark.parametrize("stream", MODES)
@pytest.mark.parametrize(
    ("finish", "out_tokens", "cut"), [("stop", 5, False), ("stop", 0, True), ("length", 64, True)]
)
async def test_hermes_block_in_content(
    make: MakeProvider, stream: bool, finish: str, out_tokens: int, cut: bool
) -> None:
    """A Hermes block left open in chat content is an unparsed call, and a length turn unless the
    server stopped naturally under the cap (a stop word matched inside the call: not the cap's doing)."""
    text = '<tool_call>\n{"name": "refund", "arguments": {"order_id": "A-1001", "amount": 10'
    provider, _, _ = await make(
        "chat", chat(Fab(text=text, out_tokens=out_tokens), stream, finish=finish), stream=stream
    )
    turn = await provider.complete(request(cap=64))
    assert turn.unparsed_tool_call
    assert (LengthSignal.UNCLOSED_TEMPLATE in turn.length_signals) is cut
    assert turn.is_length is cut
    assert turn.tool_calls == []

"""Property tests: no argument text and no cut point of a valid reply makes an adapter raise
anything but its own typed errors, and a cut stream is never taken for a complete turn."""

from __future__ import annotations

import asyncio
import random

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collector.errors import ProviderError
from collector.providers import build_provider
from collector.providers.base import Endpoint, RetryPolicy
from collector.turn import ArgStatus, Turn
from tests.providers.conftest import BASE_URLS, request
from tests.providers.wirefab import KINDS, WIRE, Fab, FabCall, build

STREAM_FILES = {
    "chat": [
        "chat_stream_toolcall.sse",
        "chat_stream_truncated.sse",
        "leak_stream_gemma_marker.sse",
        "vllm_stream_toolcall.sse",
    ],
    "responses": ["responses_stream_toolcall.sse", "responses_stream_truncated.sse"],
    "anthropic": ["anthropic_stream_tooluse.sse", "anthropic_stream_truncated.sse"],
    "gemini": [
        "gemini_stream_functioncall.sse",
        "gemini_stream_truncated.sse",
        "gemini_stream_toolcall_truncated.sse",
    ],
}
REFUND = FabCall(
    "call_p", "refund", '{"order_id": "A-1001", "amount": 1000}', {"order_id": "A-1001", "amount": 1000}
)


def _streams(kind: str) -> list[bytes]:
    bodies = [(WIRE / name).read_bytes() for name in STREAM_FILES[kind]]
    bodies.append(build(kind, Fab([REFUND], text="Refunding the order now.", out_tokens=20), True))
    bodies.append(build(kind, Fab([REFUND, REFUND], out_tokens=20), True))
    return bodies


VALID_STREAMS = [(kind, body) for kind in KINDS for body in _streams(kind)]


async def _run(kind: str, body: bytes, stream: bool) -> Turn | ProviderError:
    """Serve `body` once (no retries) and return the turn or the typed error."""

    def handler(request: httpx.Request) -> httpx.Response:
        ctype = "text/event-stream" if stream else "application/json"
        return httpx.Response(200, content=body, headers={"content-type": ctype})

    async def no_wait(_: float) -> None:
        return None

    endpoint = Endpoint(BASE_URLS[kind], api_key="k", streaming=stream, retry=RetryPolicy(max_retries=0))
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        provider = build_provider(kind, endpoint, client, sleep=no_wait, rng=random.Random(0))
        try:
            return await provider.complete(request(cap=4096))
        except ProviderError as exc:
            return exc


def test_every_valid_stream_is_complete() -> None:
    """Uncut, every stream in the property domain gives a turn (so cuts below are real cuts)."""
    for kind, body in VALID_STREAMS:
        assert isinstance(asyncio.run(_run(kind, body, True)), Turn), kind


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(VALID_STREAMS), st.data())
def test_cut_stream_is_never_complete(stream: tuple[str, bytes], data: st.DataObject) -> None:
    """Cut anywhere before its final line ends, a stream is a typed error or a length turn."""
    kind, body = stream
    # Past this point only the final blank line's terminator is missing, which SSE does not need.
    end = len(body.rstrip(b"\r\n"))
    cut = data.draw(st.integers(min_value=0, max_value=end))
    outcome = asyncio.run(_run(kind, body[:cut], True))
    assert isinstance(outcome, ProviderError) or outcome.is_length


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(KINDS), st.integers(min_value=0, max_value=10_000))
def test_cut_body_is_never_complete(kind: str, cut_seed: int) -> None:
    """A whole-body reply cut short is a typed error (never a turn, never another exception)."""
    body = build(kind, Fab([REFUND], text="Refunding.", out_tokens=20), False)
    cut = cut_seed % len(body)
    outcome = asyncio.run(_run(kind, body[:cut], False))
    assert isinstance(outcome, ProviderError)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(KINDS), st.booleans(), st.text(max_size=60), st.text(max_size=30), st.booleans())
def test_arbitrary_argument_text_never_raises(
    kind: str, stream: bool, args: str, text: str, cut: bool
) -> None:
    """Any argument and content text gives a turn or a typed error; MALFORMED calls carry no arguments."""
    call = FabCall("call_a", "refund", args, {"raw": args})
    outcome = asyncio.run(_run(kind, build(kind, Fab([call], text=text, cut=cut), stream), stream))
    if isinstance(outcome, ProviderError):
        return
    assert outcome.is_length or not cut
    for c in outcome.tool_calls:
        assert (c.arguments is None) == (c.status is ArgStatus.MALFORMED)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(KINDS), st.binary(max_size=200), st.booleans())
def test_garbage_replies_raise_only_typed_errors(kind: str, garbage: bytes, stream: bool) -> None:
    """Arbitrary bytes as a reply give a typed error or a turn, never an untyped exception."""
    outcome = asyncio.run(_run(kind, garbage, stream))
    assert isinstance(outcome, ProviderError | Turn)

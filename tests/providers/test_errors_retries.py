"""HTTP failures become typed errors; transient ones are retried with back-off, others are not;
keys never leak into errors."""

from __future__ import annotations

import email.utils
import pickle
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from collector.errors import (
    ContextOverflow,
    ProtocolViolation,
    ProviderError,
    ProviderUnavailable,
    QuotaExhausted,
    RequestRejected,
)
from collector.providers.http import parse_retry_after
from collector.turn import FinishClass
from tests.providers.conftest import API_KEY, MakeProvider, request
from tests.providers.wirefab import KINDS, WIRE, Fab, FabCall, build


def good(kind: str, stream: bool = False) -> bytes:
    """A complete, well-formed tool-call reply of `kind`."""
    call = FabCall(
        "call_1", "refund", '{"order_id":"A-1","amount":1000}', {"order_id": "A-1", "amount": 1000}
    )
    return build(kind, Fab([call]), stream)


def err(
    status: int, file: str | None = None, headers: dict[str, str] | None = None, body: bytes = b""
) -> httpx.Response:
    content = (WIRE / file).read_bytes() if file else body
    return httpx.Response(
        status, content=content, headers={"content-type": "application/json", **(headers or {})}
    )


@pytest.mark.parametrize(
    ("kind", "reply", "waits"),
    [
        ("chat", err(429, "chat_error_429_tpm.json", {"retry-after": "2"}), [2.0]),
        ("chat", err(429, "chat_error_429_tpm.json", {"retry-after-ms": "1500", "retry-after": "9"}), [1.5]),
        ("anthropic", err(429, "anthropic_error_429.json", {"retry-after": "11"}), [11.0]),
        ("gemini", err(429, "gemini_error_429.json"), [37.0]),
    ],
)
async def test_rate_limit_waits_as_told_then_succeeds(
    make: MakeProvider, kind: str, reply: httpx.Response, waits: list[float]
) -> None:
    """A 429 is retried after retry-after-ms, retry-after or Gemini RetryInfo, then the turn returns."""
    provider, recorder, sleeps = await make(kind, reply, good(kind))
    turn = await provider.complete(request())
    assert turn.finish_class is FinishClass.TOOL_CALLS
    assert len(recorder.requests) == 2
    assert sleeps.waits == waits


def test_retry_after_http_date() -> None:
    """retry-after given as an HTTP date becomes the seconds until then."""
    when = datetime.now(UTC) + timedelta(seconds=30)
    seconds = parse_retry_after({"retry-after": email.utils.format_datetime(when, usegmt=True)})
    assert seconds is not None
    assert 25 <= seconds <= 31


async def test_retry_after_over_limit_fails_now(make: MakeProvider) -> None:
    """A server asking to wait longer than max_retry_after_s fails at once as unavailable."""
    provider, recorder, sleeps = await make(
        "chat", err(429, "chat_error_429_tpm.json", {"retry-after": "600"})
    )
    with pytest.raises(ProviderUnavailable):
        await provider.complete(request())
    assert len(recorder.requests) == 1
    assert sleeps.waits == []


@pytest.mark.parametrize(
    ("kind", "status", "file"),
    [
        ("chat", 500, "chat_error_500.json"),
        ("anthropic", 529, "anthropic_error_529.json"),
        ("anthropic", 500, "anthropic_error_500.json"),
        ("gemini", 503, "gemini_error_503.json"),
        ("gemini", 500, "gemini_error_500.json"),
        ("responses", 502, None),
        ("chat", 504, None),
        ("chat", 408, None),
        ("chat", 409, None),
    ],
)
async def test_transient_status_retried_with_capped_backoff(
    make: MakeProvider, kind: str, status: int, file: str | None
) -> None:
    """Transient statuses are retried with exponential back-off, capped, then raise ProviderUnavailable."""
    provider, recorder, sleeps = await make(
        kind, err(status, file, body=b"<html>bad gateway</html>"), retries=5
    )
    with pytest.raises(ProviderUnavailable) as info:
        await provider.complete(request())
    assert info.value.status == status
    assert len(recorder.requests) == 6
    assert len(sleeps.waits) == 5
    caps = [min(8.0, 0.5 * 2**i) for i in range(5)]
    assert all(cap / 2 <= wait <= cap for wait, cap in zip(sleeps.waits, caps, strict=True))


async def test_transient_then_success(make: MakeProvider) -> None:
    """A 503 followed by a good reply returns the good turn."""
    provider, recorder, _ = await make("gemini", err(503, "gemini_error_503.json"), good("gemini"))
    turn = await provider.complete(request())
    assert len(turn.tool_calls) == 1
    assert len(recorder.requests) == 2


@pytest.mark.parametrize(
    ("kind", "status", "file", "error"),
    [
        ("chat", 429, "chat_error_429_quota.json", QuotaExhausted),
        ("chat", 402, "openrouter_error_402.json", QuotaExhausted),
        ("chat", 400, "chat_error_context_length.json", ContextOverflow),
        ("chat", 400, "vllm_error_context.json", ContextOverflow),
        ("chat", 400, "vllm_error_context_legacy.json", ContextOverflow),
        ("chat", 400, "llamacpp_error_context.json", ContextOverflow),
        ("responses", 400, "responses_error_context_length.json", ContextOverflow),
        ("anthropic", 400, "anthropic_error_context.json", ContextOverflow),
        ("gemini", 400, "gemini_error_context.json", ContextOverflow),
        ("gemini", 400, "gemini_error_missing_signature.json", RequestRejected),
        ("anthropic", 429, "anthropic_error_429.json", QuotaExhausted),
        ("chat", 401, None, RequestRejected),
        ("chat", 404, None, RequestRejected),
    ],
)
async def test_fatal_errors_are_typed_and_not_retried(
    make: MakeProvider, kind: str, status: int, file: str | None, error: type[ProviderError]
) -> None:
    """Quota, context overflow and other 4xx surface as their own type after one request."""
    provider, recorder, sleeps = await make(kind, err(status, file))
    with pytest.raises(error) as info:
        await provider.complete(request())
    assert type(info.value) is error
    assert len(recorder.requests) == 1
    assert sleeps.waits == []


async def test_should_retry_false_overrides_status(make: MakeProvider) -> None:
    """`x-should-retry: false` stops a 500 from being retried."""
    provider, recorder, _ = await make(
        "anthropic", err(500, "anthropic_error_500.json", {"x-should-retry": "false"})
    )
    with pytest.raises(RequestRejected):
        await provider.complete(request())
    assert len(recorder.requests) == 1


@pytest.mark.parametrize(
    "exc", [httpx.ConnectError("refused"), httpx.ReadTimeout("slow"), httpx.RemoteProtocolError("x")]
)
async def test_transport_errors_retried(make: MakeProvider, exc: Exception) -> None:
    """Connection errors and timeouts are retried and recover when the server comes back."""
    provider, recorder, _ = await make("chat", exc, good("chat"))
    turn = await provider.complete(request())
    assert len(turn.tool_calls) == 1
    assert len(recorder.requests) == 2


@pytest.mark.parametrize("kind", KINDS)
async def test_stream_without_terminal_event_is_retried(make: MakeProvider, kind: str) -> None:
    """A stream that closes before its terminal event is discarded and asked for again whole."""
    whole = good(kind, stream=True)
    dropped = whole[: whole.rfind(b"data:")]
    provider, recorder, _ = await make(kind, dropped, whole, stream=True)
    turn = await provider.complete(request())
    assert turn.finish_class is FinishClass.TOOL_CALLS
    assert len(recorder.requests) == 2


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("where", ["midway", "before-terminal"])
async def test_stream_without_terminal_event_is_unavailable_never_a_cut(
    make: MakeProvider, kind: str, where: str
) -> None:
    """A stream that closes before its terminal event, midway or just before it, raises ProviderUnavailable
    once its retries are spent: it is never returned as a STREAM_CUT length turn."""
    whole = good(kind, stream=True)
    if kind == "gemini":
        # One chunk holds the whole call; without its finishReason it is not the last chunk.
        unfinished = whole.replace(b'"finishReason": "STOP", ', b"")
        assert unfinished != whole
        dropped = unfinished if where == "midway" else b""
    else:
        starts = [i for i in range(len(whole)) if whole.startswith(b"data:", i)]
        dropped = whole[: starts[len(starts) // 2] if where == "midway" else starts[-1]]
    provider, recorder, _ = await make(kind, dropped, dropped, stream=True, retries=1)
    with pytest.raises(ProviderUnavailable, match="stream ended without"):
        await provider.complete(request())
    assert len(recorder.requests) == 2


@pytest.mark.parametrize("kind", KINDS)
async def test_non_wire_200_is_protocol_violation(make: MakeProvider, kind: str) -> None:
    """A 200 whose body is not the wire format raises ProtocolViolation after its retries."""
    provider, recorder, _ = await make(kind, b'{"unexpected": true}', b"not json", retries=1)
    with pytest.raises(ProtocolViolation):
        await provider.complete(request())
    assert len(recorder.requests) == 2


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("stream", [False, True])
async def test_key_sent_in_dialect_header_only(make: MakeProvider, kind: str, stream: bool) -> None:
    """The API key goes in the dialect's own header and never in the URL."""
    provider, recorder, _ = await make(kind, good(kind, stream), stream=stream)
    await provider.complete(request())
    sent = recorder.requests[0]
    header = {
        "chat": "authorization",
        "responses": "authorization",
        "anthropic": "x-api-key",
        "gemini": "x-goog-api-key",
    }
    expected = f"Bearer {API_KEY}" if kind in ("chat", "responses") else API_KEY
    assert sent.headers[header[kind]] == expected
    assert API_KEY not in str(sent.url)
    assert API_KEY.encode() not in sent.content


@pytest.mark.parametrize(
    "reply",
    [
        err(
            401,
            body=b'{"error": {"message": "Incorrect API key provided: '
            + API_KEY.encode()
            + b'", "code": "invalid_api_key"}}',
        ),
        err(
            401, body=b'{"error": {"message": "Incorrect API key provided: sk-test-****cdef.", "type": "x"}}'
        ),
        err(
            500,
            body=b'{"error": {"message": "upstream said ' + API_KEY.encode() + b'", "type": "server_error"}}',
        ),
        httpx.ConnectError("cannot connect with key " + API_KEY),
    ],
)
async def test_key_never_in_error_messages(
    make: MakeProvider, reply: httpx.Response | Exception, caplog: pytest.LogCaptureFixture
) -> None:
    """Neither the key nor a masked echo of it appears in an exception, its args, or a log line."""
    provider, _, _ = await make("chat", reply, retries=1)
    with pytest.raises(ProviderError) as info:
        await provider.complete(request())
    rendered = [str(info.value), repr(info.value), repr(info.value.args), caplog.text]
    for text in rendered:
        assert API_KEY not in text
        assert "sk-test" not in text


def test_errors_round_trip_through_pickle() -> None:
    """Provider errors keep type, message, status and retry_after through pickling (Ray boundaries)."""
    error = ProviderUnavailable("chat: rate", 429, 2.5)
    back = pickle.loads(pickle.dumps(error))
    assert (type(back), back.message, back.status, back.retry_after_s) == (
        ProviderUnavailable,
        "chat: rate",
        429,
        2.5,
    )
    quota = pickle.loads(pickle.dumps(QuotaExhausted("q", 429)))
    assert str(quota) == "q (HTTP 429)"


async def test_gemini_daily_quota_is_fatal(make: MakeProvider) -> None:
    """A Gemini 429 whose QuotaFailure names a per-day quota is QuotaExhausted, not retried."""
    body = (WIRE / "gemini_error_429.json").read_bytes().replace(b"PerMinutePerProject", b"PerDayPerProject")
    provider, recorder, _ = await make("gemini", err(429, body=body))
    with pytest.raises(QuotaExhausted):
        await provider.complete(request())
    assert len(recorder.requests) == 1

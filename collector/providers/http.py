"""Posting and streaming over a handed-in `httpx.AsyncClient`, with retries and error typing.

This is the one place where HTTP failures become `collector.errors` types. Adapters call
`Http.post_json` or `Http.stream` for a single attempt and wrap the whole attempt (request,
stream consumption and parsing) in `Http.retrying`, so a stream that fails midway is thrown
away and asked for again whole, never returned as a turn.

Classification (by status, then the body's structured `code` / `type` / `status`; wording
is used only to tell a context overflow from other invalid requests on servers that have no
structured code for it):

- transport errors, timeouts, 408, 409, 429 (rate), 5xx and 529, mid-stream error events of
  a transient kind, streams ending without their terminal event, and 200 bodies that are not
  the wire format -> retried, then `ProviderUnavailable` / `ProtocolViolation`;
- 429 or 402 for quota / billing / credits (OpenAI `insufficient_quota`, Anthropic
  `billing_error` and its spend-cap 429 without `retry-after`, Gemini per-day quotas)
  -> `QuotaExhausted`, never retried;
- context overflow (`context_length_exceeded`, llama.cpp `exceed_context_size_error`, and the
  Anthropic, Gemini and vLLM invalid-request wordings) -> `ContextOverflow`, never retried;
- a 5xx (or an error event) saying the tool-call arguments failed to parse -> the not
  retryable `UnparsedArguments`, which the adapter may read as a cut turn, its message cut
  before the quoted arguments (`collector.providers.servercut`);
- any other 4xx -> `RequestRejected`, never retried. Anthropic's `x-should-retry` header
  overrides the status rule, as its SDK does.

A reply whose finish reason is `abort` (vLLM and SGLang cancel in-flight requests when
weights are swapped; `collector.providers.finish` decides `retry`) is not a turn: it is sent
again, counted under the cause `abort`, with the same back-off and the same
`RetryPolicy.max_retries`; past them the call fails as `ProviderUnavailable` (the episode is
`error`). Here, not in each adapter, so that every wire that can abort is covered by one rule.

Back-off is capped exponential with jitter; a server's own wait (`retry-after-ms`, then
`retry-after` in seconds or as an HTTP date, then Gemini's `RetryInfo.retryDelay` in the
body) replaces it, and a wait longer than `RetryPolicy.max_retry_after_s` fails at once.
The sleep function is injectable so tests never wait.

Limits per attempt (`Endpoint`): `request_timeout_s` is an idle limit (connect, and each wait
for the next bytes, on either transport: httpx applies it per read, as
`collector.providers.transport` does), so a reply that keeps arriving is never cut by it;
`request_deadline_s`, when set, bounds the whole attempt from request to last byte; a reply
body longer than `max_reply_bytes` is abandoned as soon as it is (a `Content-Length` over
the limit is refused before reading). Each failure is retried like any other of its kind
(a timeout, a `ProtocolViolation`), then ends the episode as `error`.

Secrets: the API key goes into exactly one header, credentials from the base URL into
`Authorization: Basic` (or the query they were written in), and no message built here ever
includes a header, the URL's query or the key; provider messages are truncated and scrubbed
of every credential the endpoint sends, in every form (`Endpoint.credentials`), and of
key-shaped tokens (OpenAI echoes a masked key in its 401 message).

The direct path. On the collector's own client (`transport.FastClient`, what the worker
builds) a request does not go through httpx's client layer, which per request merges the
client's URL, headers, cookies and timeout into a new `httpx.Request`, runs the auth,
redirect and event-hook machinery and wraps the response: work the collector's client never
needs (no auth, hooks, redirects or proxies), about 0.3 ms of CPU a turn (BENCHMARKS.md a).
Instead each (URL, streaming) request is built once by httpx itself (`client.build_request`,
so the bytes on the wire are what httpx would send) and each turn only the extra headers
(where httpx puts them), the body and its Content-Length are new: on `StreamTransport`
they go straight to `StreamTransport.exchange`, on a transport around it (admission) as
an `httpx.Request`.
Everything that classifies is shared (the transport's exceptions, `classify_http_error` on
an `httpx.Response` for every non-2xx), and a reply httpx would act on (a Content-Encoding,
a cookie) gets httpx's own handling. A client holding a cookie, a closed client and any
other client (a user's proxies) keep httpx's client path.

Tests: tests/providers/test_errors_retries.py, tests/providers/test_retry_causes.py,
tests/providers/test_transport.py, tests/providers/test_finish.py (abort),
tests/providers/test_http_direct.py (the direct path against httpx's).
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import json
import random
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import httpx

from collector.errors import (
    ContextOverflow,
    ProtocolViolation,
    ProviderError,
    ProviderUnavailable,
    QuotaExhausted,
    RequestRejected,
)
from collector.providers.base import Endpoint, basic_authorization
from collector.providers.finish import is_abort
from collector.providers.retryafter import header_retry_after_s
from collector.providers.servercut import UnparsedArguments, says_arguments_unparsed, withhold_fragment
from collector.providers.sse import SSEDecoder, SSEEvent
from collector.providers.transport import FastClient, Reply, StreamTransport, Timeouts, origin_of
from collector.turn import Turn

__all__ = [
    "ABORT_CAUSE",
    "PATH_MARK",
    "Http",
    "Sleep",
    "classify_error_body",
    "classify_http_error",
    "parse_retry_after",
    "retry_cause",
]

#: The retry cause of a request the server finished with `abort` (`providers.finish`).
ABORT_CAUSE = "abort"

#: How a 404's message names the URL path that was not found: `... [path /chat/completions]`.
PATH_MARK = "[path "

T = TypeVar("T")
Sleep = Callable[[float], Awaitable[None]]
Headers = Mapping[str, str]
"""Per-request HTTP headers beside the dialect's own (`SamplingParams.extra_headers`)."""

RETRYABLE_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504, 529})

_QUOTA_MARKERS = frozenset(
    {"insufficient_quota", "billing_error", "quota_exceeded", "billing_hard_limit_reached"}
)
_CONTEXT_CODES = frozenset(
    {"context_length_exceeded", "exceed_context_size_error", "context_window_exceeded"}
)
# Wordings for servers with no structured code for it (Anthropic, Gemini, vLLM, SGLang).
_CONTEXT_WORDING = re.compile(
    r"prompt is too long|maximum context length|input token count .{0,40}exceeds|"
    r"exceeds the (?:available )?context|context window",
    re.IGNORECASE,
)
_TRANSIENT_STREAM_TYPES = frozenset(
    {
        "server_error",
        "api_error",
        "overloaded_error",
        "rate_limit_exceeded",
        "rate_limit_error",
        "timeout_error",
        "internal_error",
        "unavailable",
        "internal",
        "resource_exhausted",
        "deadline_exceeded",
        "vector_store_timeout",
    }
)
_KEYLIKE = re.compile(r"\b(?:sk|pk|rk|key|api|AIza)[-_A-Za-z0-9*.]{6,}", re.IGNORECASE)
_MAX_MESSAGE = 240


def _scrub(text: str, secret: str | Sequence[str] | None) -> str:
    secrets = (secret,) if isinstance(secret, str) else (secret or ())
    for value in sorted(secrets, key=len, reverse=True):  # `user:pass` before `pass`
        if value:
            text = text.replace(value, "[redacted]")
    text = _KEYLIKE.sub("[redacted]", text)
    text = " ".join(text.split())
    return text if len(text) <= _MAX_MESSAGE else text[:_MAX_MESSAGE] + "..."


def _error_object(body: Any) -> dict[str, Any]:
    """The error object of any of the four shapes (wrapped, unwrapped vLLM, list-wrapped Gemini)."""
    if isinstance(body, list) and len(body) == 1:
        body = body[0]
    if not isinstance(body, dict):
        return {}
    inner = body.get("error")
    if isinstance(inner, dict):
        return inner
    return body


def _retry_info_delay(err: Mapping[str, Any]) -> float | None:
    details = err.get("details")
    if not isinstance(details, list):
        return None
    for item in details:
        if isinstance(item, dict) and str(item.get("@type", "")).endswith("RetryInfo"):
            delay = item.get("retryDelay")
            if isinstance(delay, str) and delay.endswith("s"):
                try:
                    return max(0.0, float(delay[:-1]))
                except ValueError:
                    return None
    return None


def _daily_quota(err: Mapping[str, Any]) -> bool:
    details = err.get("details")
    if not isinstance(details, list):
        return False
    for item in details:
        if isinstance(item, dict) and str(item.get("@type", "")).endswith("QuotaFailure"):
            for violation in item.get("violations") or ():
                if isinstance(violation, dict) and "perday" in str(violation.get("quotaId", "")).lower():
                    return True
    return False


def parse_retry_after(headers: Mapping[str, str], body: Any = None) -> float | None:
    """Seconds the server asked us to wait, from headers or a Gemini RetryInfo, or None
    (`collector.providers.retryafter`: a date `datetime` cannot hold is None, never a raise)."""
    wait = header_retry_after_s(headers)
    if wait is not None:
        return wait
    return _retry_info_delay(_error_object(body)) if body is not None else None


def _labels(err: Mapping[str, Any]) -> list[str]:
    labels = []
    for key in ("code", "type", "status"):
        value = err.get(key)
        if isinstance(value, str) and value:
            labels.append(value.lower())
    return labels


def classify_error_body(
    body: Any,
    status: int | None,
    secret: str | Sequence[str] | None,
    dialect: str,
    retry_after: float | None = None,
) -> ProviderError:
    """Type an error from its decoded body (HTTP error or mid-stream error event)."""
    err = _error_object(body)
    labels = _labels(err)
    raw_message = err.get("message")
    unparsed = isinstance(raw_message, str) and says_arguments_unparsed(raw_message)
    # The wording is followed by the model's argument text: never kept (servercut rule 3).
    detail = _scrub(withhold_fragment(raw_message), secret) if isinstance(raw_message, str) else ""
    kind = "/".join(labels) if labels else "error"
    message = f"{dialect}: {kind}" + (f": {detail}" if detail else "")
    if any(label in _QUOTA_MARKERS for label in labels) or status == 402 or _daily_quota(err):
        return QuotaExhausted(message, status)
    if any(label in _CONTEXT_CODES for label in labels):
        return ContextOverflow(message, status)
    if status in (400, 413, 422) and isinstance(raw_message, str) and _CONTEXT_WORDING.search(raw_message):
        return ContextOverflow(message, status)
    if unparsed and (status is None or status >= 500):
        return UnparsedArguments(message, status)  # deterministic: never retried (servercut)
    if retry_after is None:
        retry_after = _retry_info_delay(err)
    if status is None:
        # A mid-stream error event: transient kinds are retried whole, others are rejections.
        if any(label in _TRANSIENT_STREAM_TYPES for label in labels) or not labels:
            return ProviderUnavailable(message, None, retry_after)
        code = err.get("code")
        if isinstance(code, int) and (code >= 500 or code in RETRYABLE_STATUSES):
            return ProviderUnavailable(message, None, retry_after)
        return RequestRejected(message, None)
    if status in RETRYABLE_STATUSES or status >= 500:
        return ProviderUnavailable(message, status, retry_after)
    return RequestRejected(message, status)


def classify_http_error(
    response: httpx.Response, content: bytes, secret: str | Sequence[str] | None, dialect: str
) -> ProviderError:
    """Type a non-2xx response."""
    try:
        body: Any = json.loads(content) if content else None
    except ValueError:
        body = None  # HTML from a proxy, or nothing: the status decides.
    retry_after = parse_retry_after(response.headers, body)
    error = classify_error_body(body, response.status_code, secret, dialect, retry_after)
    sent_wait = "retry-after" in response.headers or "retry-after-ms" in response.headers
    if dialect == "anthropic" and response.status_code == 429 and not sent_wait:
        # Anthropic sends retry-after with every rate limit; the spend-cap 429 has none and
        # keeps failing (provider-protocols.md 3.6), so it is a quota, fatal for the run. One
        # whose value cannot be read (a date past datetime's range) is still a rate limit.
        return QuotaExhausted(error.message, 429)
    should_retry = response.headers.get("x-should-retry")
    if (
        should_retry == "true"
        and not error.retryable
        and not isinstance(error, QuotaExhausted | ContextOverflow | UnparsedArguments)
    ):
        return ProviderUnavailable(error.message, error.status, retry_after)
    if should_retry == "false" and error.retryable:
        return RequestRejected(error.message, error.status)
    if response.status_code == 404 and isinstance(error, RequestRejected):
        # A 404 means an unknown model or a wrong URL path (a base_url without /v1): keep the
        # path, so the run's message can tell which (the query, where a key may be, is not kept).
        with contextlib.suppress(RuntimeError):  # a Response built without a request
            return RequestRejected(f"{error.message} {PATH_MARK}{response.request.url.path}]", 404)
    return error


class Http:
    """One dialect's view of the handed-in client: URL-independent headers, retries, sleep."""

    __slots__ = (
        "_client", "_deadline", "_dialect", "_fast", "_headers", "_max_bytes", "_params", "_policy", "_rng",
        "_secret", "_sleep", "_targets", "_timeout", "_urls",
    )

    def __init__(
        self,
        client: httpx.AsyncClient,
        endpoint: Endpoint,
        dialect: str,
        headers: dict[str, str],
        sleep: Sleep | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._client = client
        self._dialect = dialect
        self._headers = {"content-type": "application/json", **headers}
        if endpoint.basic_auth is not None and "authorization" not in self._headers:
            self._headers["authorization"] = basic_authorization(*endpoint.basic_auth)
        self._params = endpoint.query or None
        # Every credential sent, in every form (the Basic base64 among them), for `_scrub`.
        self._secret = (*endpoint.credentials, *((endpoint.api_key,) if endpoint.api_key else ()))
        self._policy = endpoint.retry
        self._timeout = endpoint.request_timeout_s
        self._deadline = endpoint.request_deadline_s
        self._max_bytes = endpoint.max_reply_bytes
        self._sleep: Sleep = sleep or asyncio.sleep
        self._rng = rng or random.Random()
        self._urls: dict[str, httpx.URL] = {}
        """Each URL parsed once: httpx parses a str URL on every request (20 us a turn)."""
        self._fast = client if isinstance(client, FastClient) else None
        self._targets: dict[tuple[str, bool], _Target | None] = {}
        """The direct path's prebuilt requests, per (URL, streaming)."""

    def _url(self, url: str) -> httpx.URL:
        parsed = self._urls.get(url)
        if parsed is None:
            parsed = self._urls[url] = httpx.URL(url)
        return parsed

    def protocol_error(self, what: str) -> ProtocolViolation:
        """A 200 reply that is not the wire format (no raw content in the message)."""
        return ProtocolViolation(f"{self._dialect}: {what}")

    def stream_error(self, payload: Any) -> ProviderError:
        """Type a mid-stream error event."""
        return classify_error_body(payload, None, self._secret, self._dialect)

    def _transport_error(self, exc: Exception) -> ProviderUnavailable:
        # The class name only: httpx messages can carry the URL, and URLs can carry keys.
        return ProviderUnavailable(f"{self._dialect}: transport error {type(exc).__name__}")

    def _oversize(self) -> ProtocolViolation:
        return self.protocol_error(f"reply body over provider.max_reply_bytes = {self._max_bytes}")

    async def _read_body(self, response: httpx.Response) -> bytes:
        """The whole (decoded) body, or a ProtocolViolation as soon as it exceeds the limit."""
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self._max_bytes:
            raise self._oversize()
        return await self._bounded(response.aiter_bytes())

    async def _bounded(self, chunks: AsyncIterator[bytes]) -> bytes:
        """The chunks joined, or a ProtocolViolation as soon as they exceed the limit."""
        parts: list[bytes] = []
        size = 0
        async for chunk in chunks:
            size += len(chunk)
            if size > self._max_bytes:
                raise self._oversize()
            parts.append(chunk)
        return b"".join(parts)

    @contextlib.asynccontextmanager
    async def _within_deadline(self) -> AsyncIterator[None]:
        """The attempt's total deadline (`request_deadline_s`), a retryable timeout on expiry."""
        deadline = asyncio.timeout(self._deadline)
        try:
            async with deadline:
                yield
        except TimeoutError:
            if not deadline.expired():
                raise
            limit = f"provider.request_deadline_s = {self._deadline:g}s"
            raise ProviderUnavailable(f"{self._dialect}: reply not complete within {limit}") from None

    def _target(self, url: str, extra_headers: Mapping[str, str] | None, sse: bool) -> _Direct | None:
        """What the direct path sends, or None for httpx's client path.

        Direct only on the collector's own client (`FastClient`), and only while that client
        is open and holds no cookie: a cookie a server set once sends every later request
        through the client layer, which attaches it exactly as httpx does. The prebuilt part
        is per (URL, streaming); extra headers (per episode, e.g. the simulator's seed) are
        added per request, where httpx would put them.
        """
        client = self._fast
        if client is None or client.is_closed or client.cookies:
            return None
        key = (url, sse)
        target = self._targets.get(key)
        if target is None:
            if key in self._targets:
                return None  # httpx's path for good (see `_Target.build`)
            # Streaming: httpx's `accept` comes after the extra headers, unless it overrides
            # one of the dialect's own (a dict keeps the first place of a key).
            after = 1 if sse and "accept" not in self._headers else 0
            target = self._targets[key] = _Target.build(
                client, self._url(url), self._request_headers(None, sse), after, self._params, self._timeout
            )
            if target is None:
                return None
        if not extra_headers:
            return target, ()
        extra = target.extra(extra_headers)
        return None if extra is None else (target, extra)

    def _request_headers(self, extra_headers: Mapping[str, str] | None, sse: bool) -> Mapping[str, str]:
        if sse:
            return {**self._headers, **(extra_headers or {}), "accept": "text/event-stream"}
        return {**self._headers, **extra_headers} if extra_headers else self._headers

    async def _send_whole(
        self, url: str, body: bytes, extra_headers: Mapping[str, str] | None
    ) -> tuple[httpx.Response | Reply, bytes]:
        """One POST read whole: the response (a plain `Reply` on the direct path when it is a
        2xx with nothing for httpx to do) and its decoded body."""
        direct = self._target(url, extra_headers, False)
        if direct is None:
            async with self._client.stream(
                "POST", self._url(url), content=body, headers=self._request_headers(extra_headers, False),
                params=self._params, timeout=self._timeout,
            ) as response:
                content = await self._read_body(response)
            return response, content
        target, extra = direct
        transport = target.client.direct
        if isinstance(transport, StreamTransport):
            reply = await transport.exchange(target.origin, target.payload(body, extra), target.timeouts)
            if reply.status_code < 300 and reply.plain():
                try:
                    content = await self._read_reply(reply)
                finally:
                    await reply.aclose()
                return reply, content
            response = target.adopt(reply.response(target.request))
        else:
            response = await target.send(transport, body, extra)
        try:
            content = await self._read_body(response)
        finally:
            await response.aclose()
        return response, content

    async def post_json(
        self, url: str, body: bytes, extra_headers: Mapping[str, str] | None = None
    ) -> tuple[Any, float]:
        """One POST; the decoded JSON reply and the seconds it took."""
        started = time.perf_counter()
        try:
            if self._deadline is None:
                response, content = await self._send_whole(url, body, extra_headers)
            else:
                async with self._within_deadline():
                    response, content = await self._send_whole(url, body, extra_headers)
        except httpx.HTTPError as exc:
            raise self._transport_error(exc) from None
        elapsed = time.perf_counter() - started
        if response.status_code >= 300:
            assert isinstance(response, httpx.Response)  # errors always take httpx's response
            raise classify_http_error(response, content, self._secret, self._dialect)
        try:
            return json.loads(content), elapsed
        except ValueError:
            raise self.protocol_error("reply body is not JSON") from None

    async def get_json(self, url: str, extra_headers: Mapping[str, str] | None = None) -> Any:
        """One GET, no retries, within `request_timeout_s` in all: the decoded JSON reply, or a
        `ProviderError` (for metadata a caller can do without, such as a vocabulary size)."""
        headers = {**self._headers, **(extra_headers or {})}
        try:
            async with asyncio.timeout(self._timeout):
                async with self._client.stream("GET", url, headers=headers, params=self._params) as response:
                    content = await self._read_body(response)
        except (httpx.HTTPError, TimeoutError) as exc:
            raise self._transport_error(exc) from None
        if response.status_code >= 300:
            raise classify_http_error(response, content, self._secret, self._dialect)
        try:
            return json.loads(content)
        except ValueError:
            raise self.protocol_error("reply body is not JSON") from None

    async def _read_reply(self, reply: Reply) -> bytes:
        """`_read_body` for a plain `Reply` (no Content-Encoding): the same limit, checked the same way."""
        declared = reply.header(b"content-length") or b""
        if declared.isdigit() and int(declared) > self._max_bytes:
            raise self._oversize()
        if reply.content is not None:
            if len(reply.content) > self._max_bytes:
                raise self._oversize()
            return reply.content
        return await self._bounded(reply.aiter_bytes())

    @contextlib.asynccontextmanager
    async def _open_stream(self, url: str, body: bytes,
                           extra_headers: Mapping[str, str] | None) -> AsyncIterator[httpx.Response]:
        """The streaming POST's response, open for reading: through the client, or direct."""
        direct = self._target(url, extra_headers, True)
        if direct is None:
            async with self._client.stream(
                "POST", self._url(url), content=body, headers=self._request_headers(extra_headers, True),
                params=self._params, timeout=self._timeout,
            ) as response:
                yield response
            return
        target, extra = direct
        transport = target.client.direct
        if isinstance(transport, StreamTransport):
            reply = await transport.exchange(target.origin, target.payload(body, extra), target.timeouts)
            response = target.adopt(reply.response(target.request))
        else:
            response = await target.send(transport, body, extra)
        try:
            yield response
        finally:
            await response.aclose()

    async def stream(
        self,
        url: str,
        body: bytes,
        consume: Callable[[AsyncIterator[SSEEvent]], Awaitable[T]],
        extra_headers: Mapping[str, str] | None = None,
    ) -> tuple[T, float]:
        """One streaming POST; `consume` reads the SSE events and returns what it built."""
        started = time.perf_counter()
        try:
            async with self._within_deadline(), self._open_stream(url, body, extra_headers) as response:
                if response.status_code >= 300:
                    content = await self._read_body(response)
                    raise classify_http_error(response, content, self._secret, self._dialect)
                events = _events(response, self._max_bytes, self._oversize)
                result = await consume(events)
                await _drain(events)
        except httpx.HTTPError as exc:
            raise self._transport_error(exc) from None
        return result, time.perf_counter() - started

    def _backoff(self, retries: int) -> float:
        """The wait before retry `retries + 1`: capped exponential, jittered into its upper half."""
        policy = self._policy
        cap = min(policy.max_backoff_s, policy.initial_backoff_s * (2**retries))
        return float(cap * (0.5 + 0.5 * self._rng.random()))

    async def retrying(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """Run `attempt` until it succeeds, fails for good, or the retries are spent.

        The cause of every retry (`retry_cause`) goes on the returned `Turn` or on the error
        that escapes (`ProviderError.retries`), so the record says what a rate went through.
        """
        policy = self._policy
        retries = 0
        causes: list[str] = []
        while True:
            try:
                result = await attempt()
            except ProviderError as exc:
                exc.retries = tuple(causes)
                if not exc.retryable or retries >= policy.max_retries:
                    raise
                wait = exc.retry_after_s
                if wait is not None and wait > policy.max_retry_after_s:
                    too_long = ProviderUnavailable(
                        f"{self._dialect}: server asked to wait {wait:.0f}s, over the limit", exc.status
                    )
                    too_long.retries = tuple(causes)
                    raise too_long from exc
                if wait is None:
                    wait = self._backoff(retries)
                retries += 1
                causes.append(retry_cause(exc))
                await self._sleep(wait)
            else:
                if isinstance(result, Turn) and is_abort(self._dialect, result.raw_finish_reason):
                    # Cancelled under us (weights swapped): not an answer, not a cut. Sent
                    # again within the same policy; past it, the episode is `error`.
                    if retries >= policy.max_retries:
                        aborted = ProviderUnavailable(
                            f"{self._dialect}: request aborted by the server "
                            f"(finish {result.raw_finish_reason!r}) after {retries} retries"
                        )
                        aborted.retries = tuple(causes)
                        raise aborted
                    wait = self._backoff(retries)
                    retries += 1
                    causes.append(ABORT_CAUSE)
                    await self._sleep(wait)
                    continue
                if isinstance(result, Turn):
                    result.retries = tuple(causes)
                return result


RawHeaders = tuple[tuple[bytes, bytes], ...]


class _Target:
    """One request the direct path sends again and again: built once by httpx itself.

    `client.build_request` makes it with the client's own merging (default headers, the
    query, Host, the timeout extension), so what goes on the wire is byte for byte what
    the client layer would have sent; per turn only the extra headers, the body and its
    Content-Length are new.
    """

    __slots__ = ("after", "before", "client", "head", "length", "names", "origin", "request", "tail",
                 "timeouts")

    def __init__(self, client: FastClient, request: httpx.Request, after: int) -> None:
        self.client = client
        self.request = request
        raw = request.headers.raw
        split = len(raw) - 1 - after
        self.before, self.after = raw[:split], raw[split:-1]
        """The headers before and after where httpx puts the extra ones; then Content-Length."""
        self.length = raw[-1][0] + b": "
        self.names = frozenset(name.lower() for name, _ in raw)
        lines = [b"POST " + (request.url.raw_path or b"/") + b" HTTP/1.1"]
        lines.extend(name + b": " + value for name, value in self.before)
        lines.append(b"")
        self.head = b"\r\n".join(lines)
        self.tail = b"".join(name + b": " + value + b"\r\n" for name, value in self.after)
        self.origin = origin_of(request.url)
        self.timeouts: Timeouts = request.extensions["timeout"]

    @classmethod
    def build(cls, client: FastClient, url: httpx.URL, headers: Mapping[str, str], after: int,
              params: tuple[tuple[str, str], ...] | None, timeout: float | None) -> _Target | None:
        """`after`: how many of `headers`' last entries httpx puts after a request's extra headers."""
        # A one-byte body, so that httpx puts its Content-Length last (an empty one goes first).
        request = client.build_request("POST", url, content=b"-", headers=headers, params=params,
                                       timeout=timeout)
        raw = request.headers.raw
        lengths = [i for i, (name, _) in enumerate(raw) if name.lower() == b"content-length"]
        if lengths != [len(raw) - 1] or any(name.lower() == b"transfer-encoding" for name, _ in raw):
            return None  # the dialect's own Content-Length or Transfer-Encoding: httpx's path
        return cls(client, request, after)

    def extra(self, extra_headers: Mapping[str, str]) -> RawHeaders | None:
        """The extra headers as httpx encodes them, or None when httpx would merge one with a
        header it already has (a run overriding `user-agent`, say): that request takes httpx's path."""
        out = []
        for name, value in extra_headers.items():
            if not isinstance(name, str) or not isinstance(value, str) or not (name + value).isascii():
                return None  # httpx's own TypeError / UnicodeEncodeError, from its own path
            key = name.encode("ascii")
            if key.lower() in self.names:
                return None
            out.append((key, value.encode("ascii")))
        return tuple(out)

    def payload(self, body: bytes, extra: RawHeaders) -> bytes:
        """The request on the wire: what `StreamTransport` serializes for httpx's request."""
        size = str(len(body)).encode("ascii")
        if extra:
            lines = b"".join(name + b": " + value + b"\r\n" for name, value in extra)
            return b"".join((self.head, lines, self.tail, self.length, size, b"\r\n\r\n", body))
        return b"".join((self.head, self.tail, self.length, size, b"\r\n\r\n", body))

    def adopt(self, response: httpx.Response) -> httpx.Response:
        """What the client layer does to a response it did not build: its cookies are stored."""
        self.client.cookies.extract_cookies(response)
        return response

    async def send(self, transport: httpx.AsyncBaseTransport, body: bytes,
                   extra: RawHeaders) -> httpx.Response:
        """Through a transport that wraps `StreamTransport` (admission): an httpx request
        built from the prebuilt parts, handed to the transport as the client would."""
        headers = [*self.before, *extra, *self.after]
        request = httpx.Request("POST", self.request.url, headers=headers, content=body,
                                extensions=self.request.extensions)
        response = await transport.handle_async_request(request)
        response.request = request
        return self.adopt(response)


_Direct = tuple[_Target, RawHeaders]
"""A direct send: the prebuilt request and this request's extra headers."""


def retry_cause(exc: ProviderError) -> str:
    """The cause a retry is counted under: `429`, `5xx`, `timeout`, `dropped` or `other`
    (and `abort`, `ABORT_CAUSE`, for a reply that finished `abort`: no exception, see `retrying`)."""
    status = exc.status
    if isinstance(exc, ProtocolViolation):
        return "other"  # a 200 reply that is not the wire format
    if status == 429:
        return "429"
    if status == 408 or (status is None and "Timeout" in exc.message):
        return "timeout"
    if status is not None:
        return "5xx" if status >= 500 else "other"
    if "transport error" in exc.message or "stream ended" in exc.message:
        return "dropped"
    return "5xx"  # a transient error event inside a stream: the server's failure, in band


DRAIN_EVENTS = 4
"""Events read past the terminal one so the connection can be reused (see `_drain`)."""
DRAIN_WAIT_S = 0.05
"""How long `_drain` waits for the body's end: it is normally in the same read already."""


async def _drain(events: AsyncIterator[SSEEvent]) -> None:
    """Read what is left of a stream whose terminal event was consumed: the body's end (a
    chunked `0\r\n\r\n`) usually follows in the same packet, and only a body read to its end
    leaves the kept-alive connection in the pool; the adapters stop at the terminal event, so
    without this every streamed turn opened a new connection (a new TLS handshake against a
    hosted API). Bounded in events and time: a server that goes on sending, or holds the body
    open, costs only the connection, which closing the response then drops."""

    async def rest() -> None:
        count = 0
        async for _ in events:
            count += 1
            if count >= DRAIN_EVENTS:
                return

    with contextlib.suppress(TimeoutError, httpx.HTTPError, ProviderError):
        await asyncio.wait_for(rest(), DRAIN_WAIT_S)


async def _events(
    response: httpx.Response, max_bytes: int, oversize: Callable[[], ProtocolViolation]
) -> AsyncIterator[SSEEvent]:
    decoder = SSEDecoder()
    # Bytes, not text, so the limit counts what arrived; decoded as httpx's aiter_text does.
    text = codecs.getincrementaldecoder(response.encoding or "utf-8")(errors="replace")
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > max_bytes:
            raise oversize()
        for event in decoder.feed(text.decode(chunk)):
            yield event
    for event in decoder.feed(text.decode(b"", final=True)):
        yield event
    for event in decoder.close():
        yield event

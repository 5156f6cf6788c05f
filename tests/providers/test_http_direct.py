"""`Http`'s direct path (the collector's own `fast_client`, past httpx's client layer) against
httpx's client path, over the same loopback servers: the same bytes on the wire, the same
errors, the same streams, cookies, pool and timeouts.

Three clients: `direct` is `fast_client()` (straight to `StreamTransport.exchange`),
`wrapped` is `fast_client` around the worker's `AdmissionTransport` (an httpx request handed
to the transport, no client layer), `httpx` is a plain `httpx.AsyncClient` on the same
transport (the reference: every request through httpx's client layer).
"""

from __future__ import annotations

import asyncio
import gzip
import json
import random
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from collector.errors import ProviderError, ProviderUnavailable, RequestRejected
from collector.providers import base_url_for, build_provider
from collector.providers.base import Endpoint
from collector.providers.http import Http, retry_cause
from collector.providers.sse import SSEEvent
from collector.providers.transport import Origin, Reply, StreamTransport, Timeouts, fast_client
from collector.run.admission import Admission, AdmissionTransport
from collector.turn import SamplingParams, TurnRequest, UserMessage
from tests.providers.conftest import REFUND, Sleeps
from tests.providers.wirefab import Fab, FabCall, build

KINDS = ("direct", "wrapped", "httpx")
DIALECTS = ("chat", "responses", "anthropic", "gemini")


class Spy(StreamTransport):
    """`StreamTransport` that counts what came through httpx's request API and records the
    timeouts every exchange was given."""

    def __init__(self) -> None:
        super().__init__()
        self.through_httpx = 0
        self.timeouts: list[dict[str, float | None]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.through_httpx += 1
        return await super().handle_async_request(request)

    async def exchange(self, origin: Origin, payload: bytes, timeouts: Timeouts, head: bool = False) -> Reply:
        self.timeouts.append(dict(timeouts))
        return await super().exchange(origin, payload, timeouts, head)


def client_of(kind: str, spy: Spy) -> httpx.AsyncClient:
    if kind == "direct":
        return fast_client(spy)
    if kind == "wrapped":
        return fast_client(AdmissionTransport(spy, Admission(64)))
    return httpx.AsyncClient(transport=spy, timeout=None)


@dataclass
class Say:
    """One scripted answer: bytes to write, then close the connection or keep it."""

    data: bytes
    close: bool = False
    silent: bool = False
    """Write nothing; wait for the client to give up."""


def whole(body: bytes, *headers: bytes, status: bytes = b"200 OK") -> Say:
    extra = b"".join(h + b"\r\n" for h in headers)
    return Say(b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\n" + extra
               + b"content-length: %d\r\n\r\n" % len(body) + body)


def chunked(body: bytes, ctype: bytes = b"text/event-stream", pieces: int = 3) -> Say:
    size = -(-len(body) // pieces)
    pieces = (body[i:i + size] for i in range(0, len(body), size))
    parts = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces)
    return Say(b"HTTP/1.1 200 OK\r\ncontent-type: " + ctype + b"\r\ntransfer-encoding: chunked\r\n\r\n"
               + parts + b"0\r\n\r\n")


class Scripted:
    """A loopback HTTP/1.1 server: answers request i with `answers[i]` (the last one repeats),
    records every request as it arrived (head and body) and counts connections."""

    def __init__(self, *answers: Say) -> None:
        self.answers = list(answers)
        self.requests: list[bytes] = []
        self.connections = 0
        self.url = ""
        self._server: asyncio.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                self.requests.append(head + await reader.readexactly(length))
                index = min(len(self.requests), len(self.answers)) - 1
                answer = self.answers[index]
                if answer.silent:
                    await reader.read()
                    return
                writer.write(answer.data)
                await writer.drain()
                if answer.close:
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def __aenter__(self) -> Scripted:
        self._server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()


def chat_reply(stream: bool = False) -> bytes:
    call = FabCall("call_1", "refund", '{"order_id":"A-1","amount":5}', {"order_id": "A-1", "amount": 5})
    return build("chat", Fab([call]), stream)


def turn_request(extra_headers: dict[str, str] | None = None) -> TurnRequest:
    return TurnRequest("m-test", [UserMessage("refund A-1001")], [REFUND], 64,
                       SamplingParams(seed=1, extra_headers=extra_headers or {}))


async def collect(events: AsyncIterator[SSEEvent]) -> list[tuple[str, str]]:
    return [(e.event, e.data) async for e in events]


async def call(http: Http, url: str, stream: bool) -> object:
    """One POST through `http`, streamed (its SSE events) or not (its JSON)."""
    if stream:
        return (await http.stream(url, b"{}", collect))[0]
    return (await http.post_json(url, b"{}"))[0]


def outcome(exc: ProviderError) -> tuple[type, str, int | None, str]:
    return type(exc), exc.message, exc.status, retry_cause(exc)


# --- the bytes on the wire ---------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_the_direct_path_sends_byte_for_byte_what_httpx_sends(dialect: str, stream: bool) -> None:
    """Each dialect's request (key header, content-type, accept, Basic auth from the URL, the
    URL's query, a run's extra headers, varying or overriding one of httpx's, httpx's default
    headers, Host) is the same on the wire
    whether it goes through httpx's client layer or past it; and the direct client really
    goes past it (no httpx request at all)."""
    body = build(dialect, Fab([FabCall("call_1", "refund", '{"order_id":"A-1","amount":5}',
                                       {"order_id": "A-1", "amount": 5})]), stream)
    answer = chunked(body) if stream else whole(body)
    seen: dict[str, list[bytes]] = {}
    tool_calls: dict[str, list[Any]] = {}
    connections: dict[str, int] = {}
    for kind in KINDS:
        spy = Spy()
        async with Scripted(answer) as server, client_of(kind, spy) as client:
            base = server.url + ("/v1" if dialect in ("chat", "responses") else "")
            endpoint = Endpoint(base, api_key="sk-test-SECRET-0123456789abcdef", streaming=stream,
                                basic_auth=("user", "pass"), query=(("tenant", "t-1"),))
            provider = build_provider(dialect, endpoint, client, sleep=Sleeps(), rng=random.Random(0))
            # Extra headers that change per episode (the worker's simulator seed), one that
            # overrides a header httpx sets (it merges them), and none.
            extras = [{"x-run": "r-7", "OpenAI-Beta": "b"}, {"x-run": "r-8", "User-Agent": "mine/1"}, {}]
            turns = [await provider.complete(turn_request(extra)) for extra in extras]
            tool_calls[kind] = [[(c.name, c.arguments) for c in t.tool_calls] for t in turns]
            netloc = server.url.removeprefix("http://").encode()
            seen[kind] = [r.replace(netloc, b"SERVER") for r in server.requests]
            connections[kind] = server.connections
        if kind == "direct":
            assert spy.through_httpx == 1  # only the turn whose extra header httpx merges
    assert seen["direct"] == seen["httpx"]
    assert seen["wrapped"] == seen["httpx"]
    # Whole replies: the second turn reused the connection. A stream the adapter stops
    # reading at its terminal event closes it, through httpx or not.
    assert connections["direct"] == connections["httpx"] == connections["wrapped"]
    assert stream or connections["direct"] == 1
    assert len(seen["direct"]) == 3
    assert tool_calls["direct"] == tool_calls["httpx"] == tool_calls["wrapped"]
    assert tool_calls["direct"][0] == [("refund", {"order_id": "A-1", "amount": 5})]
    head = seen["direct"][0].split(b"\r\n\r\n", 1)[0].lower()
    assert b"?tenant=t-1" in head.split(b"\r\n", 1)[0]
    assert b"\r\nx-run: r-7" in head
    assert b"\r\nuser-agent: python-httpx/" in head
    assert b"\r\nuser-agent: mine/1\r\n" in seen["direct"][1].lower()
    assert b"python-httpx" not in seen["direct"][1]
    assert (b"\r\naccept: text/event-stream" in head) == stream


@pytest.mark.parametrize("stream", [False, True])
async def test_the_endpoint_timeouts_reach_the_transport_unchanged(stream: bool) -> None:
    """`request_timeout_s` reaches `StreamTransport` as connect, read, write and pool limits,
    exactly as httpx's client passes them."""
    got: dict[str, list[dict[str, float | None]]] = {}
    for kind in KINDS:
        spy = Spy()
        async with Scripted(chunked(chat_reply(True)) if stream else whole(chat_reply())) as server, \
                client_of(kind, spy) as client:
            http = Http(client, Endpoint(server.url, request_timeout_s=7.5), "chat", {})
            if stream:
                await http.stream(server.url + "/chat/completions", b"{}", collect)
            else:
                await http.post_json(server.url + "/chat/completions", b"{}")
        got[kind] = spy.timeouts
    assert got["direct"] == got["wrapped"] == got["httpx"] == [
        {"connect": 7.5, "read": 7.5, "write": 7.5, "pool": 7.5}
    ]


# --- errors --------------------------------------------------------------------------------

SCENARIOS: dict[str, tuple[Callable[[], Say | None], str]] = {
    # name: (the server's answer, None for a refused connection; the class name in the message)
    "refused": (lambda: None, "ConnectError"),
    "silent": (lambda: Say(b"", silent=True), "ReadTimeout"),
    "garbage head": (lambda: Say(b"SPDY/9 what\r\n\r\n", close=True), "RemoteProtocolError"),
    "closed before a byte": (lambda: Say(b"", close=True), "RemoteProtocolError"),
    "closed inside a sized body": (
        lambda: Say(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n" + b"{" * 10, close=True),
        "RemoteProtocolError"),
    "closed inside a chunked body": (
        lambda: Say(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\n{\"a\":\r\n40\r\n{",
                    close=True),
        "RemoteProtocolError"),
}


@asynccontextmanager
async def serving(answer: Say | None) -> AsyncIterator[str]:
    """The URL of a server giving `answer`; of a closed port when it is None."""
    async with Scripted(answer or Say(b"")) as server:
        if answer is not None:
            yield server.url
            return
    yield server.url


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
async def test_transport_failures_are_typed_as_through_httpx(scenario: str, stream: bool) -> None:
    """A refused connection, a silent server, a garbage head, a server that closes before its
    reply or inside the body: the same `ProviderUnavailable` (message, status, retry cause)
    on every client, streamed or not."""
    make_answer, class_name = SCENARIOS[scenario]
    results = {}
    for kind in KINDS:
        async with serving(make_answer()) as url, client_of(kind, Spy()) as client:
            http = Http(client, Endpoint(url, request_timeout_s=0.3), "chat", {})
            with pytest.raises(ProviderUnavailable) as caught:
                await call(http, url + "/chat/completions", stream)
        results[kind] = outcome(caught.value)
    assert results["direct"] == results["httpx"] == results["wrapped"]
    expected_cause = "timeout" if class_name.endswith("Timeout") else "dropped"
    assert results["direct"] == (
        ProviderUnavailable, f"chat: transport error {class_name}", None, expected_cause
    )


@pytest.mark.parametrize("stream", [False, True])
async def test_error_statuses_are_classified_as_through_httpx(stream: bool) -> None:
    """A 429 with retry-after, an overload 529, a 404 (its path kept) and a gzip-encoded 400:
    the same typed errors on every client."""
    gzipped = gzip.compress(b'{"error": {"message": "bad value", "type": "invalid_request_error"}}')
    answers = [
        whole(b'{"error": {"message": "slow down", "type": "rate_limit"}}', b"retry-after: 3",
              status=b"429 Too Many"),
        whole(b'{"error": {"message": "overloaded"}}', status=b"529 Overloaded"),
        whole(b'{"error": {"message": "no such model"}}', status=b"404 Not Found"),
        whole(gzipped, b"content-encoding: gzip", status=b"400 Bad Request"),
    ]
    results: dict[str, list[Any]] = {}
    for kind in KINDS:
        results[kind] = []
        async with Scripted(*answers) as server, client_of(kind, Spy()) as client:
            http = Http(client, Endpoint(server.url + "/v1"), "chat", {})
            for _ in answers:
                with pytest.raises(ProviderError) as caught:
                    await call(http, server.url + "/v1/chat/completions", stream)
                results[kind].append((*outcome(caught.value), caught.value.retry_after_s))
    assert results["direct"] == results["httpx"] == results["wrapped"]
    assert results["direct"] == [
        (ProviderUnavailable, "chat: rate_limit: slow down", 429, "429", 3.0),
        (ProviderUnavailable, "chat: error: overloaded", 529, "5xx", None),
        (RequestRejected, "chat: error: no such model [path /v1/chat/completions]", 404, "other", None),
        (RequestRejected, "chat: invalid_request_error: bad value", 400, "other", None),
    ]


# --- bodies, streams, cookies, the pool ------------------------------------------------------


async def test_encoded_and_chunked_replies_are_decoded_as_httpx_decodes_them() -> None:
    """A gzip-encoded reply and a chunked one come back as the JSON they carry, on every client."""
    reply = json.loads(chat_reply())
    for kind in KINDS:
        async with Scripted(whole(gzip.compress(chat_reply()), b"content-encoding: gzip"),
                            chunked(chat_reply(), b"application/json")) as server, \
                client_of(kind, Spy()) as client:
            http = Http(client, Endpoint(server.url), "chat", {})
            first, _ = await http.post_json(server.url + "/chat/completions", b"{}")
            second, _ = await http.post_json(server.url + "/chat/completions", b"{}")
            assert server.connections == 1  # both bodies read to their end: the connection was kept
        assert first == second == reply, kind


@pytest.mark.parametrize("kind", KINDS)
async def test_sse_streams_arrive_whole_on_every_client(kind: str) -> None:
    """A chunked SSE stream split mid-event (and mid UTF-8 character) decodes to the same events."""
    events = "".join(f'data: {{"n": {i}, "s": "é✓"}}\n\n' for i in range(5)).encode() + b"data: [DONE]\n\n"
    async with Scripted(chunked(events, b"text/event-stream; charset=utf-8", pieces=7)) as server, \
            client_of(kind, Spy()) as client:
        http = Http(client, Endpoint(server.url), "chat", {})
        got, _ = await http.stream(server.url + "/chat/completions", b"{}", collect)
    assert got == [("message", f'{{"n": {i}, "s": "é✓"}}') for i in range(5)] + [("message", "[DONE]")]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_cookie_the_server_sets_is_sent_back_on_the_direct_path(stream: bool) -> None:
    """A Set-Cookie on a reply is stored in the fast client's jar and sent with the next request."""
    body = chat_reply(stream)
    if stream:
        first = chunked(body)
        first.data = first.data.replace(b"\r\n\r\n", b"\r\nset-cookie: lb=node-7; Path=/\r\n\r\n", 1)
    else:
        first = whole(body, b"set-cookie: lb=node-7; Path=/")
    async with Scripted(first, chunked(body) if stream else whole(body)) as server, fast_client() as client:
        http = Http(client, Endpoint(server.url), "chat", {})
        for _ in range(2):
            if stream:
                await http.stream(server.url + "/chat/completions", b"{}", collect)
            else:
                await http.post_json(server.url + "/chat/completions", b"{}")
        assert dict(client.cookies) == {"lb": "node-7"}
    assert b"\r\ncookie: lb=node-7" not in server.requests[0].lower()
    assert b"\r\ncookie: lb=node-7" in server.requests[1].lower()


async def test_the_direct_path_keeps_the_pool_reuse_and_resend_rules() -> None:
    """Sequential requests share one kept-alive connection (streamed bodies too); concurrent
    ones each get their own; a reused connection that answers nothing is replaced once."""
    async with Scripted(chunked(chat_reply(), b"application/json")) as server, fast_client() as client:
        http = Http(client, Endpoint(server.url), "chat", {})
        for _ in range(4):
            await http.post_json(server.url + "/chat/completions", b"{}")
        assert server.connections == 1

    arrived = asyncio.Event()

    class Gathering(Scripted):
        async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            head = await reader.readuntil(b"\r\n\r\n")
            await reader.readexactly(int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0]))
            if self.connections == 6:
                arrived.set()
            await arrived.wait()  # answer only once all six are in flight at once
            writer.write(whole(chat_reply()).data)
            await writer.drain()
            writer.close()

    async with Gathering() as server, fast_client() as client:
        http = Http(client, Endpoint(server.url), "chat", {})
        await asyncio.gather(*(http.post_json(server.url + "/chat/completions", b"{}") for _ in range(6)))
        assert server.connections == 6

    # Answer the first request, then read the second whole and close without a byte: the
    # kept-alive connection is replaced and the request sent once more.
    async with Scripted(whole(chat_reply()), Say(b"", close=True), whole(chat_reply())) as server, \
            fast_client() as client:
        http = Http(client, Endpoint(server.url), "chat", {})
        await http.post_json(server.url + "/chat/completions", b"first")
        await http.post_json(server.url + "/chat/completions", b"second")
    assert [r.split(b"\r\n\r\n", 1)[1] for r in server.requests] == [b"first", b"second", b"second"]
    assert server.connections == 2


async def test_a_closed_client_fails_as_httpx_fails() -> None:
    """After `aclose`, a post raises httpx's RuntimeError on every client, not a retryable error."""
    for kind in KINDS:
        async with Scripted(whole(chat_reply())) as server:
            client = client_of(kind, Spy())
            http = Http(client, Endpoint(server.url), "chat", {})
            await http.post_json(server.url + "/chat/completions", b"{}")
            await client.aclose()
            with pytest.raises(RuntimeError, match="client has been closed"):
                await http.post_json(server.url + "/chat/completions", b"{}")


async def test_any_other_client_keeps_httpx_s_client_layer_proxies_included() -> None:
    """A client that is not the collector's own (here one with a proxy, as `provider.http_client
    = "httpx"` makes for proxy users) goes through httpx: the request reaches the proxy in
    absolute form, and the client's event hooks see it."""
    hooked: list[str] = []

    async def hook(request: httpx.Request) -> None:
        hooked.append(str(request.url))

    hooks = {"request": [hook]}
    async with Scripted(whole(chat_reply())) as proxy, \
            httpx.AsyncClient(proxy=proxy.url, timeout=None, event_hooks=hooks) as client:
        http = Http(client, Endpoint("http://provider.test/v1"), "chat", {})
        payload, _ = await http.post_json("http://provider.test/v1/chat/completions", b"{}")
    assert payload == json.loads(chat_reply())
    assert proxy.requests[0].startswith(b"POST http://provider.test/v1/chat/completions HTTP/1.1\r\n")
    assert hooked == ["http://provider.test/v1/chat/completions"]


@pytest.mark.parametrize("dialect", ["chat", "responses", "anthropic", "gemini"])
async def test_streamed_turns_reuse_one_connection(dialect: str) -> None:
    """The adapters stop reading at the terminal event; the rest of the body (the chunked
    end) is read for them, so sequential streamed turns share one kept-alive connection
    instead of opening one each (a TLS handshake per turn against a hosted API)."""
    call = FabCall("call_1", "refund", '{"order_id":"A-1","amount":5}', {"order_id": "A-1", "amount": 5})
    async with Scripted(chunked(build(dialect, Fab([call]), True))) as server, fast_client() as client:
        endpoint = Endpoint(base_url_for(dialect, server.url), api_key="k", streaming=True)
        provider = build_provider(dialect, endpoint, client)
        for _ in range(3):
            turn = await provider.complete(turn_request())
            assert [c.name for c in turn.tool_calls] == ["refund"]
    assert len(server.requests) == 3
    assert server.connections == 1

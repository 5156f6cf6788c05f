"""`StreamTransport`: a small HTTP/1.1 transport for `httpx.AsyncClient` over asyncio streams.

Why it exists. The adapters keep httpx's API (a handed-in `httpx.AsyncClient`, MockTransport
and ASGITransport in tests), but httpx's default transport, httpcore, is where a collector's
CPU goes: its pool does work proportional to connections x queued requests on every request,
and each request passes through anyio, h11 and several layers of state machines. Measured
in bench/overhead.py (BENCHMARKS.md): about 1.2-1.8 ms of client CPU per turn with httpcore,
against a small fraction of that with this transport under the same httpx client.

What it does, and only that:
- HTTP/1.1 with keep-alive over `asyncio.open_connection` (TLS through an `ssl.SSLContext`,
  built once per transport, never per client); one request per connection at a time;
- a pool per origin of idle connections, reused last-in first-out; a connection is opened
  whenever none is idle, so a request never waits for another one (no pool queue, nothing
  proportional to the number of connections). The caller bounds concurrency (the worker's
  slots), so the number of connections never exceeds the episodes in flight;
- bodies by Content-Length, chunked, or until close. A small body with a Content-Length
  (a model's reply) is read with the head (under the same idle limit) and the connection is free at
  once; any other body is streamed to httpx. httpx decodes Content-Encoding itself. A
  streamed response not read to its end closes its connection;
- a kept-alive connection whose close has already arrived is dropped before reuse. A close
  can still race with a request (the server times the idle connection out as we write), so
  a request that got not a single byte back on a *reused* connection is sent once more, on a
  new connection, and only once. That request may have reached the server: HTTP/1.1 cannot
  tell a request the server never read from one it read and then dropped (a crash, a proxy
  timeout). We accept the risk because a model call is safe to send twice: it changes
  nothing at the provider but cost (the lost generation may be billed), and only the reply
  that arrives is used, once. On a fresh connection nothing is resent here; the failure goes
  to the adapter's retry policy (`collector.providers.http`), which resends it the same way;
- the `timeout` extension's connect, read and write values, each an *idle* limit as in
  httpcore: connect bounds opening the connection, write each wait for the send buffer to
  drain, read each wait for the next bytes of the response (head or body). A reply that
  keeps arriving is never cut by it, however long it takes in total (the total deadline is
  `collector.providers.http`'s); failures become the httpx exception types
  (`ConnectError`, `ReadTimeout`, `RemoteProtocolError`, ...), so
  `collector.providers.http` classifies them as it does httpcore's.

`exchange` is the same transport without httpx's request and response objects: the
collector's hot path (`collector.providers.http`) hands it a prebuilt request and reads the
`Reply`. `FastClient` (from `fast_client`) marks the client the hot path may bypass.

Not supported: HTTP/2, proxies, upgrades. Use httpx's default transport for those.

Tests: tests/providers/test_transport.py, tests/providers/test_http_direct.py,
tests/providers/test_limits.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Mapping
from types import TracebackType

import httpx

__all__ = ["FastClient", "Reply", "StreamTransport", "Timeouts", "fast_client", "origin_of"]

_HEAD_LIMIT = 1 << 16
_CHUNK = 1 << 16
_NO_BODY_STATUSES = frozenset({204, 304})
#: Response headers that httpx's response or client does something with (decode, store).
_HTTPX_ACTS_ON = frozenset({b"content-encoding", b"set-cookie", b"set-cookie2"})
#: Bodies up to this size with a Content-Length are read with the head (a model reply is a
#: few KiB); longer ones, and chunked or close-delimited ones (real SSE), are streamed.
_EAGER_LIMIT = 1 << 22

Origin = tuple[str, str, int]
#: The `timeout` extension of an httpx request: connect, read, write, pool (seconds or None).
Timeouts = Mapping[str, float | None]


class _Conn:
    __slots__ = ("origin", "reader", "writer")

    def __init__(self, origin: Origin, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.origin = origin
        self.reader = reader
        self.writer = writer

    def usable(self) -> bool:
        return not self.writer.is_closing() and not self.reader.at_eof()

    def close(self) -> None:
        self.writer.close()


def origin_of(url: httpx.URL) -> Origin:
    """The pool key of a URL: (scheme, host, port), the port filled in from the scheme."""
    scheme = url.scheme
    return (scheme, url.host, url.port or (443 if scheme == "https" else 80))


class Reply:
    """A response as `StreamTransport.exchange` read it: the head, and either the whole body
    (`content`, read with the head) or the rest of it (`stream`, to be read or closed).

    `response()` makes it an `httpx.Response`; the hot path in `collector.providers.http`
    reads a plain reply without one (`aiter_bytes`, `header`) and builds it only when httpx's
    own handling is wanted (Content-Encoding to decode, an error status to classify, a
    cookie to store, an SSE stream to decode as text).
    """

    __slots__ = ("content", "headers", "reason", "status_code", "stream", "version")

    def __init__(self, status: int, reason: bytes, version: bytes, headers: list[tuple[bytes, bytes]],
                 content: bytes | None, stream: _Body | None) -> None:
        self.status_code = status
        self.reason = reason
        self.version = version
        self.headers = headers
        self.content = content
        self.stream = stream

    def header(self, name: bytes) -> bytes | None:
        """Header `name` (lower case), or None; repeated ones joined by ", " as httpx's `get` does."""
        values = [value for key, value in self.headers if key.lower() == name]
        return b", ".join(values) if values else None

    def plain(self) -> bool:
        """No header httpx would act on: no Content-Encoding to decode, no cookie to store."""
        return not any(key.lower() in _HTTPX_ACTS_ON for key, _ in self.headers)

    def response(self, request: httpx.Request | None = None) -> httpx.Response:
        stream: httpx.AsyncByteStream = self.stream if self.stream is not None else httpx.ByteStream(
            self.content or b"")
        extensions = {"http_version": self.version, "reason_phrase": self.reason}
        return httpx.Response(self.status_code, headers=self.headers, stream=stream, extensions=extensions,
                              request=request)

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        """The body as it came (the caller checks there is no Content-Encoding first)."""
        if self.stream is None:
            if self.content:
                yield self.content
            return
        async for data in self.stream:
            yield data

    async def aclose(self) -> None:
        if self.stream is not None:
            await self.stream.aclose()


class _Idle:
    """The read timeout as an idle limit: one `asyncio.timeout`, pushed back before every read.

    Armed only while a read waits: a streamed body disarms it before handing bytes to httpx,
    since a timer left running across a `yield` would cancel whatever the consumer is doing.
    """

    __slots__ = ("_limit", "_loop", "_timer")

    def __init__(self, timer: asyncio.Timeout, limit: float | None) -> None:
        self._timer = timer
        self._limit = limit
        self._loop = asyncio.get_running_loop()

    def arm(self) -> None:
        if self._limit is not None:
            self._timer.reschedule(self._loop.time() + self._limit)

    def disarm(self) -> None:
        self._timer.reschedule(None)


async def _read_exactly(reader: asyncio.StreamReader, size: int, idle: _Idle) -> AsyncIterator[bytes]:
    """`size` bytes in pieces, each read under the idle limit; EOF first is IncompleteReadError."""
    remaining = size
    while remaining:
        idle.arm()
        data = await reader.read(min(remaining, _CHUNK))
        if not data:
            raise asyncio.IncompleteReadError(b"", remaining)
        remaining -= len(data)
        yield data


class _Body(httpx.AsyncByteStream):
    """The response body as httpx reads it; gives the connection back when read to the end."""

    def __init__(self, transport: StreamTransport, conn: _Conn, length: int | None, chunked: bool,
                 keep_alive: bool, read_timeout: float | None) -> None:
        self._transport = transport
        self._conn = conn
        self._length = length
        self._chunked = chunked
        self._keep_alive = keep_alive
        self._read_timeout = read_timeout
        self._done = False
        self._released = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        reader = self._conn.reader
        try:
            async with asyncio.timeout(None) as timer:
                idle = _Idle(timer, self._read_timeout)
                if self._chunked:
                    source = _chunks(reader, idle)
                elif self._length is not None:
                    source = _read_exactly(reader, self._length, idle)
                else:
                    source = _until_close(reader, idle)
                    self._keep_alive = False
                async for data in source:
                    idle.disarm()
                    yield data
        except asyncio.IncompleteReadError:
            raise httpx.RemoteProtocolError("connection closed inside the response body") from None
        except TimeoutError:
            raise httpx.ReadTimeout("timed out reading the response body") from None
        except (OSError, asyncio.LimitOverrunError, ValueError) as exc:
            raise httpx.ReadError(f"reading the response body failed: {type(exc).__name__}") from None
        self._done = True

    async def aclose(self) -> None:
        if not self._released:
            self._released = True
            self._transport._release(self._conn, self._done and self._keep_alive)


async def _chunks(reader: asyncio.StreamReader, idle: _Idle) -> AsyncIterator[bytes]:
    while True:
        idle.arm()
        line = await reader.readuntil(b"\r\n")
        size = int(line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            # Trailers (rare) end with an empty line.
            idle.arm()
            while await reader.readuntil(b"\r\n") != b"\r\n":
                idle.arm()
            return
        async for data in _read_exactly(reader, size, idle):
            yield data
        idle.arm()
        if await reader.readexactly(2) != b"\r\n":
            raise ValueError("chunk not followed by CRLF")


async def _until_close(reader: asyncio.StreamReader, idle: _Idle) -> AsyncIterator[bytes]:
    while True:
        idle.arm()
        data = await reader.read(_CHUNK)
        if not data:
            return
        yield data


class StreamTransport(httpx.AsyncBaseTransport):
    """HTTP/1.1 over asyncio streams for one `httpx.AsyncClient`; see the module docstring.

    One instance serves any number of concurrent requests on one event loop. `ssl_context`
    defaults to `ssl.create_default_context()`, built on the first https request.
    """

    def __init__(self, ssl_context: ssl.SSLContext | None = None, max_idle_per_origin: int = 4096) -> None:
        self._ssl = ssl_context
        self._max_idle = max_idle_per_origin
        self._idle: dict[Origin, list[_Conn]] = {}
        self._closed = False

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl

    async def _connect(self, origin: Origin, limit_s: float | None) -> _Conn:
        scheme, host, port = origin
        tls = self._ssl_context() if scheme == "https" else None
        try:
            async with asyncio.timeout(limit_s):
                reader, writer = await asyncio.open_connection(
                    host, port, ssl=tls, server_hostname=host if tls else None, limit=_HEAD_LIMIT
                )
        except TimeoutError:
            raise httpx.ConnectTimeout("timed out connecting") from None
        except OSError as exc:
            raise httpx.ConnectError(f"connection failed: {type(exc).__name__}") from None
        return _Conn(origin, reader, writer)

    def _idle_conn(self, origin: Origin) -> _Conn | None:
        idle = self._idle.get(origin)
        while idle:
            conn = idle.pop()
            if conn.usable():
                return conn
            conn.close()
        return None

    def _release(self, conn: _Conn, reusable: bool) -> None:
        idle = self._idle.setdefault(conn.origin, [])
        if reusable and not self._closed and len(idle) < self._max_idle and conn.usable():
            idle.append(conn)
        else:
            conn.close()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        payload = _serialize(request, await _body(request))
        reply = await self.exchange(origin_of(url), payload, request.extensions.get("timeout", {}),
                                    head=request.method == "HEAD")
        return reply.response()

    async def exchange(self, origin: Origin, payload: bytes, timeouts: Timeouts,
                       head: bool = False) -> Reply:
        """Send one serialized request and read the reply's head (and its body when small).

        The shared core of `handle_async_request` and of the collector's hot path
        (`collector.providers.http` sends its own prebuilt requests through it, skipping
        httpx's client layer): the same pool, the same resend rule, the same timeouts and
        the same httpx exception types either way.
        """
        if self._closed:
            raise httpx.ConnectError("the transport is closed")
        if origin[0] not in ("http", "https"):
            raise httpx.UnsupportedProtocol(f"unsupported scheme {origin[0]!r}")
        conn = self._idle_conn(origin)
        reused = conn is not None
        if conn is None:
            conn = await self._connect(origin, timeouts.get("connect"))
        try:
            return await self._exchange(conn, payload, timeouts, head)
        except _Stale:
            # No byte back on a kept-alive connection: most often the server had closed it
            # idle as we wrote. The server may also have read the request and dropped it;
            # resending a model call is accepted anyway (see the module docstring).
            if not reused:
                raise httpx.RemoteProtocolError("server closed the connection without a reply") from None
            conn = await self._connect(origin, timeouts.get("connect"))
            try:
                return await self._exchange(conn, payload, timeouts, head)
            except _Stale:
                raise httpx.RemoteProtocolError("server closed the connection without a reply") from None

    async def _exchange(self, conn: _Conn, payload: bytes, timeouts: Timeouts, head_request: bool) -> Reply:
        """Send the request and read the response head, and the body too when it is small and
        framed by Content-Length (the connection is free at once); any other
        body is streamed by `_Body`."""
        read_timeout = timeouts.get("read")
        got_head = False
        body: bytes | None = None
        try:
            conn.writer.write(payload)
            if conn.writer.transport.get_write_buffer_size() > _CHUNK:
                async with asyncio.timeout(timeouts.get("write")):
                    await conn.writer.drain()
            async with asyncio.timeout(None) as timer:
                idle = _Idle(timer, read_timeout)
                while True:
                    idle.arm()
                    head = await conn.reader.readuntil(b"\r\n\r\n")
                    status, reason, version, headers = _parse_head(head)
                    if not 100 <= status < 200 or status == 101:
                        break
                got_head = True
                length, chunked, keep_alive = _framing(version, headers)
                if head_request or status in _NO_BODY_STATUSES:
                    length, chunked = 0, False
                if not chunked and length is not None and length <= _EAGER_LIMIT:
                    body = b"".join([data async for data in _read_exactly(conn.reader, length, idle)])
        except asyncio.IncompleteReadError as exc:
            conn.close()
            if not exc.partial and not got_head:
                raise _Stale from None
            raise httpx.RemoteProtocolError("connection closed inside the response") from None
        except TimeoutError:
            conn.close()
            raise httpx.ReadTimeout("timed out waiting for the response") from None
        except (ConnectionResetError, BrokenPipeError):
            conn.close()
            if got_head:
                raise httpx.ReadError("connection reset inside the response") from None
            raise _Stale from None
        except OSError as exc:
            conn.close()
            raise httpx.ReadError(f"connection failed: {type(exc).__name__}") from None
        except (asyncio.LimitOverrunError, ValueError, httpx.RemoteProtocolError) as exc:
            conn.close()
            raise httpx.RemoteProtocolError(f"malformed response head: {type(exc).__name__}") from None
        except BaseException:
            conn.close()  # cancelled mid-request: the connection's state is unknown
            raise
        if body is not None:
            self._release(conn, keep_alive)
            return Reply(status, reason, version, headers, body, None)
        stream = _Body(self, conn, None if chunked else length, chunked, keep_alive, read_timeout)
        return Reply(status, reason, version, headers, None, stream)

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close()
        for conns in idle.values():
            for conn in conns:
                with contextlib.suppress(OSError, asyncio.CancelledError):
                    await conn.writer.wait_closed()

    async def __aenter__(self) -> StreamTransport:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None = None, exc: BaseException | None = None,
                        tb: TracebackType | None = None) -> None:
        await self.aclose()


class _Stale(Exception):
    """A reused connection answered nothing at all: the server had closed it."""


async def _body(request: httpx.Request) -> bytes:
    try:
        return request.content
    except httpx.RequestNotRead:
        return await request.aread()


def _serialize(request: httpx.Request, body: bytes) -> bytes:
    url = request.url
    target = url.raw_path or b"/"
    lines = [request.method.encode("ascii") + b" " + target + b" HTTP/1.1"]
    has_length = False
    for name, value in request.headers.raw:
        lname = name.lower()
        if lname == b"transfer-encoding":
            continue  # the body was read whole: it goes with a Content-Length
        if lname == b"content-length":
            has_length = True
        lines.append(name + b": " + value)
    if not has_length and (body or request.method in ("POST", "PUT", "PATCH")):
        lines.append(b"Content-Length: " + str(len(body)).encode("ascii"))
    lines.append(b"")
    lines.append(body)
    return b"\r\n".join(lines)


def _framing(version: bytes, headers: list[tuple[bytes, bytes]]) -> tuple[int | None, bool, bool]:
    """(Content-Length, chunked, keep-alive) of a response head."""
    length: int | None = None
    chunked = False
    keep_alive = version == b"HTTP/1.1"
    for name, value in headers:
        lname = name.lower()
        if lname == b"content-length":
            length = int(value)
        elif lname == b"transfer-encoding":
            chunked = b"chunked" in value.lower()
        elif lname == b"connection":
            lowered = value.lower()
            keep_alive = b"close" not in lowered and (keep_alive or b"keep-alive" in lowered)
    return length, chunked, keep_alive


def _parse_head(head: bytes) -> tuple[int, bytes, bytes, list[tuple[bytes, bytes]]]:
    lines = head[:-4].split(b"\r\n")
    version, _, rest = lines[0].partition(b" ")
    code, _, reason = rest.partition(b" ")
    if not version.startswith(b"HTTP/1.") or len(code) != 3:
        raise httpx.RemoteProtocolError("not an HTTP/1.x status line")
    headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip():
            raise httpx.RemoteProtocolError("malformed header line")
        headers.append((name, value.strip()))
    return int(code), reason, version, headers


class _SetCookieCookies(httpx.Cookies):
    """httpx's cookie store, skipping the work when a response sets no cookie.

    httpx builds urllib request and response adaptors for every response to let the
    cookie jar look for cookies: a tenth of the collector's CPU per turn in the profile
    (BENCHMARKS.md), almost always for nothing. Same result: without a Set-Cookie (or the
    obsolete Set-Cookie2) header the jar would store nothing.
    """

    def extract_cookies(self, response: httpx.Response) -> None:
        headers = response.headers
        if "set-cookie" in headers or "set-cookie2" in headers:
            super().extract_cookies(response)


class FastClient(httpx.AsyncClient):
    """The collector's own client (`fast_client`): an `httpx.AsyncClient` like any other for
    every caller, which `collector.providers.http` also knows how to send through directly.

    Being the collector's own is what makes the shortcut safe: no auth, no event hooks, no
    redirects followed, no mounts or proxies (an explicit transport turns the proxy
    environment off), so httpx's client layer would only rebuild the same request each turn.
    `direct` is the transport to send through: the `StreamTransport` itself, or whatever
    wraps it (the worker's `AdmissionTransport`).
    """

    def __init__(self, transport: httpx.AsyncBaseTransport) -> None:
        super().__init__(transport=transport, timeout=None)
        self.direct = transport
        # httpx offers no switch for this; `_cookies` is what its `cookies` property wraps.
        # tests/providers/test_transport.py checks that cookies still work through it.
        self._cookies = _SetCookieCookies()


def fast_client(transport: httpx.AsyncBaseTransport | None = None) -> FastClient:
    """The collector's HTTP client: `StreamTransport`, no client-wide timeout (each request
    sets its own), cookies extracted only from responses that set one."""
    return FastClient(transport or StreamTransport())

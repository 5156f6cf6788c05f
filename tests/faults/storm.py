"""A stormy provider: a loopback proxy in front of the simulator that injects provider faults.

The simulator's own presets inject faults too, but a storm needs knobs they do not have:
bursts of 529s, replies slower than the client's timeout, and a server that goes away and
comes back. `StormProxy` forwards every request to an upstream simulator and, per
request, draws from a seeded generator which fault (if any) to serve instead:

- ``rate_limit``: 429 with `retry-after-ms` (short, so tests do not wait);
- ``overload``: a burst of consecutive 529s (`overloaded_error`), `burst` requests long;
- ``server_error``: a 500 in the provider's error shape;
- ``drop``: the upstream reply, cut at a random point before its end (a stream without its
  terminal event, or a 200 body that is no longer JSON);
- ``slow``: the upstream reply, after sleeping longer than the client's request timeout;
- ``doomed``: a 500 for every request whose body holds one of the `doomed` markers, so that
  chosen episodes exhaust their retries whatever the luck of the draw;
- ``quota``: once `quota_after` requests have been served, every request gets OpenAI's
  `insufficient_quota` 429 (an account out of credit: fatal for the run, never retried).

`down()` stops the listening server (connections are refused), `up()` brings it back on the
same port. `calm` turns every fault off. `counts` tallies requests and injected faults.
A fault changes only what the client receives, never what the model "said": the upstream
simulator is deterministic in the request body, so a retried request gets the very reply
the first attempt would have had.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route


@dataclass
class StormRates:
    rate_limit: float = 0.30
    overload: float = 0.04
    server_error: float = 0.05
    drop: float = 0.05
    slow: float = 0.03
    burst: int = 3
    """Consecutive 529s once an overload starts."""
    slow_s: float = 2.5
    """How long a slow reply waits: longer than the client's request timeout."""


def _error_body(path: str, status: int, kind: str, message: str) -> bytes:
    if path.startswith("/v1/messages"):
        return json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()
    return json.dumps({"error": {"message": message, "type": kind, "code": kind}}).encode()


class StormProxy:
    """The proxy (see module docstring). Start with `up()`; `base_url` is its root."""

    def __init__(self, upstream: str, seed: int = 0, rates: StormRates | None = None) -> None:
        self.upstream = upstream.rstrip("/")
        self.rates = rates or StormRates()
        self.rng = random.Random(seed)
        self.calm = False
        self.doomed: tuple[bytes, ...] = ()
        """Requests whose body contains one of these always get a 500, calm or not."""
        self.quota_after: int | None = None
        """When set, requests after this many get a quota 429, calm or not."""
        self.counts: Counter[str] = Counter()
        self.port = 0
        self._burst_left = 0
        self._lock = threading.Lock()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _draw(self) -> str | None:
        with self._lock:
            self.counts["requests"] += 1
            if self.quota_after is not None and self.counts["requests"] > self.quota_after:
                return "quota"
            if self.calm:
                return None
            if self._burst_left > 0:
                self._burst_left -= 1
                return "overload"
            u = self.rng.random()
            r = self.rates
            for name, p in (("rate_limit", r.rate_limit), ("overload", r.overload),
                            ("server_error", r.server_error), ("drop", r.drop), ("slow", r.slow)):
                if u < p:
                    if name == "overload":
                        self._burst_left = r.burst - 1
                    return name
                u -= p
            return None

    def _cut_point(self, size: int) -> int:
        with self._lock:
            return self.rng.randint(max(1, size // 5), max(1, (size * 4) // 5))

    def _app(self) -> Starlette:
        clients: list[httpx.AsyncClient] = []

        @contextlib.asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            # One upstream client per serving period, closed when the proxy goes down.
            clients.append(httpx.AsyncClient(timeout=30))
            try:
                yield
            finally:
                await clients.pop().aclose()

        async def forward(request: Request) -> Response:
            client = clients[0]
            path = request.url.path
            body = await request.body()
            fault = "doomed" if any(marker in body for marker in self.doomed) else self._draw()
            if fault is not None:
                self.counts[fault] += 1
            if fault == "quota":
                payload = json.dumps({"error": {
                    "message": "You exceeded your current quota, please check your plan and billing details.",
                    "type": "insufficient_quota", "param": None, "code": "insufficient_quota"}}).encode()
                return Response(payload, 429, media_type="application/json")
            if fault == "rate_limit":
                payload = _error_body(path, 429, "rate_limit_error", "Rate limit reached; slow down.")
                return Response(payload, 429, {"retry-after-ms": "5", "content-type": "application/json"})
            if fault == "overload":
                return Response(_error_body(path, 529, "overloaded_error", "Overloaded"), 529,
                                media_type="application/json")
            if fault in ("server_error", "doomed"):
                return Response(_error_body(path, 500, "api_error", "Internal server error"), 500,
                                media_type="application/json")
            if fault == "slow":
                await asyncio.sleep(self.rates.slow_s)
            headers = {k: v for k, v in request.headers.items() if k.lower() in ("content-type", "x-api-key",
                                                                                 "authorization")}
            url = self.upstream + path + (f"?{request.url.query}" if request.url.query else "")
            reply = await client.post(url, content=body, headers=headers)
            content = reply.content
            if fault == "drop" and reply.status_code == 200 and len(content) > 2:
                content = content[: self._cut_point(len(content))]
            return Response(content, reply.status_code, media_type=reply.headers.get("content-type"))

        return Starlette(routes=[Route("/{path:path}", forward, methods=["POST"])], lifespan=lifespan)

    def up(self) -> StormProxy:
        """Listen (again) on the proxy's port; returns once connections are accepted."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self._app(), log_level="critical", access_log=False, lifespan="on",
                                timeout_graceful_shutdown=1)
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True,
                                  name=f"storm-proxy-{self.port}")
        self._server, self._thread, self._sock = server, thread, sock
        thread.start()
        deadline = time.monotonic() + 15
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the storm proxy did not start")
            time.sleep(0.01)
        return self

    def down(self) -> None:
        """Stop listening: new connections are refused until `up()`."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._sock is not None:
            self._sock.close()
        self._server = self._thread = self._sock = None
        with self._lock:
            self.counts["down"] += 1

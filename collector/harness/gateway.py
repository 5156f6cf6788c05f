"""The harness gateway: the model server a harness talks to, one base URL and token per episode.

An ASGI app (Starlette, as the simulator) with OpenAI Chat Completions, OpenAI Responses and
Anthropic Messages under each episode's own root, `/e/<episode key>`: the harness's OpenAI base
URL is `<root>/e/<key>/v1` (`.../chat/completions`, `.../responses`, `.../models`) and its
Anthropic base URL `<root>/e/<key>` (the Anthropic SDKs append `/v1/messages`). A request is
answered only when its path's episode and its API key (`Authorization: Bearer <token>`, or
Anthropic's `x-api-key`) are the same episode's: a token of another episode is a 403 naming
that cause (the token is never echoed), an unknown token a 401, a path naming no episode a
404, and an episode that ended is a 403 naming how it ended, for its URL and its token alike
(a harness that keeps calling gets a clear error, never another turn). Errors are written in
the wire's error shape.

A streamed request gets its text as the model writes it and its calls once the turn is
classified (`collector.harness.stream`): no tool-call delta of a withheld call is ever written.

`GatewayServer` serves the app on a loopback socket from the worker's own event loop, so the
sessions call the worker's provider adapters on the loop their HTTP clients belong to. One
server serves every episode of a worker, each at its own root. The address is loopback unless
`env.options.host` names another (a harness in a container), and the token is required either
way.

Tests: tests/harness/test_gateway_chat.py, tests/harness/test_episode_url.py,
tests/harness/test_stream.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import secrets
import socket
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from collector.harness.anthropic_wire import MessageStream, parse_messages_request, render_message
from collector.harness.chat_wire import ChatStream, parse_chat_request, render_chat_completion
from collector.harness.request import ERROR_KINDS, BadRequest, GatewayTurn, HarnessRequest, Refused
from collector.harness.responses_wire import ResponseStream, parse_responses_request, render_response
from collector.harness.session import HarnessSession
from collector.harness.stream import StreamWriter, stream_reply
from collector.turn import JSONObject

__all__ = ["Gateway", "GatewayServer", "episode_root"]

#: Ended episodes remembered for a clear 403 (past this, an old URL or token is just unknown).
_ENDED_KEPT = 10_000


def episode_root(root: str, session: HarnessSession) -> str:
    """The episode's own root on the server at `root`: its Anthropic base URL, `/v1` its OpenAI one."""
    return f"{root}/e/{session.key}"


def _error(message: str, status: int) -> JSONResponse:
    """An error in OpenAI's shape."""
    kind = ERROR_KINDS.get(status, "gateway_error")
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)


def _anthropic_error(message: str, status: int) -> JSONResponse:
    """An error in Anthropic's shape."""
    kind = ERROR_KINDS.get(status, "api_error")
    return JSONResponse({"type": "error", "error": {"type": kind, "message": message}}, status_code=status)


@dataclass(slots=True, frozen=True)
class _Wire:
    """How one route reads a request and writes a turn, a stream and an error."""

    parse: Callable[[dict[str, Any]], HarnessRequest]
    render: Callable[[GatewayTurn, str], JSONObject]
    writer: Callable[[str, str, HarnessRequest], StreamWriter]
    """(stream id, model, request) -> the events of one streamed reply."""
    error: Callable[[str, int], JSONResponse]


_CHAT = _Wire(parse_chat_request, render_chat_completion,
              lambda rid, model, parsed: ChatStream(rid, model, parsed.stream_usage), _error)
_RESPONSES = _Wire(parse_responses_request, render_response,
                   lambda rid, model, _: ResponseStream(rid, model), _error)
_MESSAGES = _Wire(parse_messages_request, render_message,
                  lambda rid, model, _: MessageStream(rid, model), _anthropic_error)


@dataclass(slots=True)
class _Ended:
    token: str
    message: str


class Gateway:
    """The episodes a worker's gateway answers for, and the ASGI app that answers."""

    def __init__(self) -> None:
        self._sessions: dict[str, HarnessSession] = {}
        """Open episodes by key (the path's `/e/<key>`)."""
        self._keys: dict[str, str] = {}
        """Open episodes' keys by token: a token used on another episode's URL is named as such."""
        self._ended: OrderedDict[str, _Ended] = OrderedDict()
        self._ended_tokens: dict[str, str] = {}
        self._streaming: set[asyncio.Task[None]] = set()
        """Turns being streamed: kept until they end, whether or not their harness still reads."""
        self.app = Starlette(routes=[
            Route("/e/{key}/v1/chat/completions", self._route(_CHAT), methods=["POST"]),
            Route("/e/{key}/v1/messages", self._route(_MESSAGES), methods=["POST"]),
            Route("/e/{key}/v1/responses", self._route(_RESPONSES), methods=["POST"]),
            Route("/e/{key}/v1/models", self._models, methods=["GET"]),
        ])

    def open(self, session: HarnessSession) -> None:
        self._sessions[session.key] = session
        self._keys[session.token] = session.key

    def close(self, session: HarnessSession) -> None:
        """The episode is over: its URL and its token are refused from now on."""
        if self._sessions.pop(session.key, None) is not None:
            self._keys.pop(session.token, None)
            message = (f"{session.harness}: episode {session.spec.episode_id} ended; "
                       "this endpoint accepts no more requests")
            self._ended[session.key] = _Ended(session.token, message)
            self._ended_tokens[session.token] = message
            while len(self._ended) > _ENDED_KEPT:
                _, old = self._ended.popitem(last=False)
                self._ended_tokens.pop(old.token, None)

    def _session(self, request: Request) -> HarnessSession:
        """The episode the path names, if the request's token is that episode's; else `Refused`."""
        auth = request.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            token = auth[7:].strip()
        else:  # Anthropic's SDKs send the key in its own header
            token = request.headers.get("x-api-key", "")
        key = request.path_params["key"]
        session = self._sessions.get(key)
        if session is not None and hmac.compare_digest(token.encode(), session.token.encode()):
            return session
        ended = self._ended.get(key)
        if ended is not None:
            raise Refused(ended.message, 403)
        ended_message = self._ended_tokens.get(token)
        if ended_message is not None:
            raise Refused(ended_message, 403)
        if token in self._keys:
            raise Refused("this API key belongs to another episode than the one this URL names: use the "
                          "base URL the collector gave this harness with its key", 403)
        if session is None:
            raise Refused("no episode is served at this URL: use the base URL the collector gave this "
                          "harness", 404)
        raise Refused("unknown episode token: pass the token the collector gave this harness as its API key",
                      401)

    async def _parse(self, request: Request, parse: Callable[[dict[str, Any]], HarnessRequest]) -> tuple[
            HarnessSession, HarnessRequest]:
        """The session and the parsed request; `BadRequest` / `Refused` for the route to write."""
        session = self._session(request)
        try:
            body: Any = json.loads(await request.body())
        except ValueError:
            raise BadRequest("the request body is not JSON") from None
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        return session, parse(body)

    def _route(self, wire: _Wire) -> Callable[[Request], Awaitable[Response]]:
        """The endpoint of one wire: parse, take the turn, write it (or the error) in the wire's shape."""

        async def endpoint(request: Request) -> Response:
            try:
                session, parsed = await self._parse(request, wire.parse)
                model = session.spec.model
                if parsed.stream:
                    writer = wire.writer("gw-" + secrets.token_hex(10), model, parsed)
                    return await stream_reply(session.complete(parsed), writer, wire.error, self._streaming)
                turn = await session.complete(parsed)
            except BadRequest as exc:
                return wire.error(str(exc), 400)
            except Refused as exc:
                return wire.error(str(exc), exc.status)
            return JSONResponse(wire.render(turn, model))

        return endpoint

    async def _models(self, request: Request) -> Response:
        try:
            session = self._session(request)
        except Refused as exc:
            return _error(str(exc), exc.status)
        return JSONResponse({"object": "list", "data": [{"id": session.spec.model, "object": "model",
                                                         "owned_by": "collector"}]})


class _QuietServer(uvicorn.Server):
    """uvicorn without its signal handlers: the worker's process owns its signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class GatewayServer:
    """`Gateway` served on (host, an OS-chosen port) from the running event loop."""

    def __init__(self, gateway: Gateway, host: str = "127.0.0.1") -> None:
        self.gateway = gateway
        self.host = host
        self.port = 0
        self._server: _QuietServer | None = None
        self._task: asyncio.Task[None] | None = None
        self._sock: socket.socket | None = None

    @property
    def root(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        if self._server is not None:
            return
        family = socket.getaddrinfo(self.host, 0, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        # Accepted connections inherit it: a reply written in two segments (head, body) must not
        # wait for the harness's delayed ACK (40 ms a turn on Linux).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((self.host, 0))
        sock.listen(1024)
        self._sock = sock
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.gateway.app, log_level="warning", access_log=False, lifespan="off",
                                timeout_graceful_shutdown=1)
        server = _QuietServer(config)
        self._server = server
        self._task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            if self._task.done():
                self._task.result()
                raise RuntimeError("the harness gateway did not start")
            await asyncio.sleep(0.005)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task
        if self._sock is not None:
            self._sock.close()
        self._server = self._task = self._sock = None

"""The harness gateway: the model server a harness talks to, one token per episode.

An ASGI app (Starlette, as the simulator) with OpenAI Chat Completions
(`/v1/chat/completions`), OpenAI Responses (`/v1/responses`) and Anthropic Messages
(`/v1/messages`: the Anthropic SDKs take the server root as their base URL). Each request
carries an episode's token as its API key (`Authorization: Bearer <token>`, or Anthropic's
`x-api-key`); the token picks the `HarnessSession` that answers. An unknown token is a 401;
a token whose episode ended is a 403 naming how it ended (a harness that keeps calling gets
a clear error, never another turn). Errors are written in OpenAI's error shape.

A streamed request gets its events once the turn is classified (`render_chat_stream`): no
tool-call delta of a withheld call is ever written. The text is not relayed as the model
writes it: the provider adapter returns whole turns.

`GatewayServer` serves the app on a loopback socket from the worker's own event loop, so the
sessions call the worker's provider adapters on the loop their HTTP clients belong to. One
server serves every episode of a worker; the tokens keep the episodes apart. The address is
loopback unless `env.options.host` names another (a harness in a container), and the token is
required either way.

Tests: tests/harness/test_gateway_chat.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
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

from collector.harness.anthropic_wire import parse_messages_request, render_message, render_message_stream
from collector.harness.chat_wire import parse_chat_request, render_chat_completion, render_chat_stream
from collector.harness.request import BadRequest, GatewayTurn, HarnessRequest, Refused
from collector.harness.responses_wire import parse_responses_request, render_response, render_response_stream
from collector.harness.session import HarnessSession
from collector.turn import JSONObject

__all__ = ["Gateway", "GatewayServer"]

#: Ended episodes' tokens remembered for a clear 403 (past this, an old token is just unknown).
_ENDED_KEPT = 10_000


#: Error types by status: the same names in OpenAI's and Anthropic's error shapes.
_KINDS = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error"}


def _error(message: str, status: int) -> JSONResponse:
    """An error in OpenAI's shape."""
    kind = _KINDS.get(status, "gateway_error")
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)


def _anthropic_error(message: str, status: int) -> JSONResponse:
    """An error in Anthropic's shape."""
    kind = _KINDS.get(status, "api_error")
    return JSONResponse({"type": "error", "error": {"type": kind, "message": message}}, status_code=status)


@dataclass(slots=True, frozen=True)
class _Wire:
    """How one route reads a request and writes a turn, a stream and an error."""

    parse: Callable[[dict[str, Any]], HarnessRequest]
    render: Callable[[GatewayTurn, str], JSONObject]
    stream: Callable[[GatewayTurn, str, HarnessRequest], list[str]]
    error: Callable[[str, int], JSONResponse]


_CHAT = _Wire(parse_chat_request, render_chat_completion,
              lambda turn, model, parsed: render_chat_stream(turn, model, parsed.stream_usage), _error)
_RESPONSES = _Wire(parse_responses_request, render_response,
                   lambda turn, model, _: render_response_stream(turn, model), _error)
_MESSAGES = _Wire(parse_messages_request, render_message,
                  lambda turn, model, _: render_message_stream(turn, model), _anthropic_error)


def _sse(events: list[str]) -> Response:
    """A streamed reply, sent once the turn is classified (see `collector.harness.session`)."""
    return Response("".join(events), media_type="text/event-stream", headers={"cache-control": "no-cache"})


class Gateway:
    """The episodes a worker's gateway answers for, and the ASGI app that answers."""

    def __init__(self) -> None:
        self._sessions: dict[str, HarnessSession] = {}
        self._ended: OrderedDict[str, str] = OrderedDict()
        self.app = Starlette(routes=[
            Route("/v1/chat/completions", self._route(_CHAT), methods=["POST"]),
            Route("/v1/messages", self._route(_MESSAGES), methods=["POST"]),
            Route("/v1/responses", self._route(_RESPONSES), methods=["POST"]),
            Route("/v1/models", self._models, methods=["GET"]),
        ])

    def open(self, session: HarnessSession) -> None:
        self._sessions[session.token] = session

    def close(self, session: HarnessSession) -> None:
        """The episode is over: its token is refused from now on."""
        if self._sessions.pop(session.token, None) is not None:
            self._ended[session.token] = (f"{session.harness}: episode {session.spec.episode_id} ended; "
                                          "this token accepts no more requests")
            while len(self._ended) > _ENDED_KEPT:
                self._ended.popitem(last=False)

    def _session(self, request: Request) -> HarnessSession:
        auth = request.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            token = auth[7:].strip()
        else:  # Anthropic's SDKs send the key in its own header
            token = request.headers.get("x-api-key", "")
        session = self._sessions.get(token)
        if session is not None:
            return session
        ended = self._ended.get(token)
        if ended is not None:
            raise Refused(ended, 403)
        raise Refused("unknown episode token: pass the token the collector gave this harness as its API key",
                      401)

    async def _turn(self, request: Request, parse: Callable[[dict[str, Any]], HarnessRequest]) -> tuple[
            HarnessSession, HarnessRequest, GatewayTurn]:
        """The session, the parsed request and its turn; `BadRequest` / `Refused` for the route to write."""
        session = self._session(request)
        try:
            body: Any = json.loads(await request.body())
        except ValueError:
            raise BadRequest("the request body is not JSON") from None
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        parsed = parse(body)
        return session, parsed, await session.complete(parsed)

    def _route(self, wire: _Wire) -> Callable[[Request], Awaitable[Response]]:
        """The endpoint of one wire: parse, take the turn, write it (or the error) in the wire's shape."""

        async def endpoint(request: Request) -> Response:
            try:
                session, parsed, turn = await self._turn(request, wire.parse)
            except BadRequest as exc:
                return wire.error(str(exc), 400)
            except Refused as exc:
                return wire.error(str(exc), exc.status)
            model = session.spec.model
            if parsed.stream:
                return _sse(wire.stream(turn, model, parsed))
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

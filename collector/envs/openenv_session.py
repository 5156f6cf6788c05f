"""One OpenEnv session: the server's WebSocket protocol, spoken with `websockets`.

Tests: tests/envs/test_openenv.py.

Learnt from `openenv` 0.10's own server (`openenv.core.env_server.http_server`): the HTTP
``/reset`` and ``/step`` routes build a fresh environment per request, so an episode's state
lives only in a WebSocket session on ``/ws``: one connection, one environment instance on
the server. The client sends JSON messages ``{"type": "reset", "data": {...}}``,
``{"type": "step", "data": <action>}`` and ``{"type": "close"}``; the server answers each
of the first two with ``{"type": "observation", "data": {"observation": {...}, "reward":
r, "done": d}}`` or ``{"type": "error", "data": {"message": ..., "code": ...}}``. MCP-style
environments take the actions ``{"type": "list_tools"}`` and ``{"type": "call_tool",
"tool_name": ..., "arguments": {...}}`` through the same ``step``. ``GET /schema`` gives the
action model's JSON Schema.

Every way a server can fail is an `EnvironmentFailure` naming the server (its public URL,
credentials left out) and the cause: it cannot be reached, it does not answer within
`timeout_s`, it closes the session, or it answers something that is not the protocol. An
``error`` answer is split by its code: ``VALIDATION_ERROR`` means the action was refused
before it ran (`ActionRefused`, a result the model reads), anything else means the
environment itself failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from collector.config import public_url
from collector.errors import EnvironmentFailure

__all__ = ["ActionRefused", "Observation", "OpenEnvSession", "observation_text", "ws_url"]

#: The largest message accepted from a server: an observation is replayed to the model on
#: every later turn, so a bigger one is a broken server, not a result.
MAX_MESSAGE_BYTES = 8 * 1024 * 1024


class ActionRefused(Exception):
    """The server refused the action before running it (it did not fit the action model)."""


class Observation:
    """One observation as the server sent it: its fields, its reward and its `done`."""

    __slots__ = ("done", "fields", "reward")

    def __init__(self, fields: dict[str, Any], reward: float | None, done: bool) -> None:
        self.fields = fields
        self.reward = reward
        self.done = done


def ws_url(url: str) -> str:
    """The session endpoint of a server given by its base URL (``http://host:port`` -> ``ws://host:port/ws``)."""
    base = url.rstrip("/")
    if base.startswith("https://"):
        base = "wss://" + base[len("https://"):]
    elif base.startswith("http://"):
        base = "ws://" + base[len("http://"):]
    return base if base.endswith("/ws") else base + "/ws"


def observation_text(fields: dict[str, Any]) -> str:
    """What the model reads of an observation: its one text field as is, else its fields as
    JSON (the `metadata` the server keeps for itself left out)."""
    shown = {k: v for k, v in fields.items() if k != "metadata"}
    if len(shown) == 1:
        (value,) = shown.values()
        if isinstance(value, str):
            return value
    return json.dumps(shown, ensure_ascii=False, default=str) if shown else ""


class OpenEnvSession:
    """One WebSocket session with an OpenEnv server (see the module docstring)."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self.url = url
        self.where = f"openenv server at {public_url(url)}"
        self.timeout_s = timeout_s
        self._socket: ClientConnection | None = None

    def _failure(self, cause: str) -> EnvironmentFailure:
        return EnvironmentFailure(f"{self.where}: {cause}")

    async def open(self) -> None:
        try:
            self._socket = await asyncio.wait_for(
                connect(ws_url(self.url), max_size=MAX_MESSAGE_BYTES, open_timeout=None, ping_interval=None),
                self.timeout_s,
            )
        except TimeoutError:
            raise self._failure(f"no session within {self.timeout_s:g} s") from None
        except (OSError, InvalidHandshake, InvalidURI) as exc:
            raise self._failure(f"cannot open a session ({type(exc).__name__}: {exc})") from None

    async def close(self) -> None:
        socket, self._socket = self._socket, None
        if socket is None:
            return
        try:
            with contextlib.suppress(ConnectionClosed):
                await socket.send(json.dumps({"type": "close"}))
            await socket.close()
        finally:
            # A server that hangs never answers the closing handshake, and the caller's bound
            # cancels the wait: the socket is dropped then, never left for the collector to find.
            socket.transport.abort()

    async def reset(self, options: dict[str, Any]) -> Observation:
        return await self._exchange("reset", {"type": "reset", "data": options})

    async def step(self, action: dict[str, Any]) -> Observation:
        return await self._exchange("step", {"type": "step", "data": action})

    async def _exchange(self, what: str, message: dict[str, Any]) -> Observation:
        socket = self._socket
        if socket is None:
            raise self._failure("no open session")
        try:
            async with asyncio.timeout(self.timeout_s):
                await socket.send(json.dumps(message))
                raw = await socket.recv()
        except TimeoutError:
            raise self._failure(f"no answer to {what} within {self.timeout_s:g} s") from None
        except ConnectionClosed as exc:
            code = exc.rcvd.code if exc.rcvd is not None else None
            raise self._failure(f"closed the session during {what} (close code {code})") from None
        return self._parse(what, raw)

    def _parse(self, what: str, raw: str | bytes) -> Observation:
        try:
            answer = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise self._failure(f"answered {what} with something that is not JSON "
                                f"({len(raw)} bytes)") from None
        kind = answer.get("type") if isinstance(answer, dict) else None
        data = answer.get("data") if isinstance(answer, dict) else None
        if kind == "error" and isinstance(data, dict):
            text = " ".join(str(data.get("message", "")).split())[:300]
            if data.get("code") == "VALIDATION_ERROR":
                raise ActionRefused(text or "the action did not fit the environment's action model")
            raise self._failure(f"{what} failed on the server ({data.get('code')}: {text})")
        fields = data.get("observation") if isinstance(data, dict) else None
        if kind != "observation" or not isinstance(data, dict) or not isinstance(fields, dict):
            raise self._failure(f"answered {what} with a message that is not an observation "
                                f"(type {kind!r:.40})")
        reward = data.get("reward")
        done = data.get("done", False)
        if reward is not None and (
            isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward)
        ):
            raise self._failure(f"answered {what} with a reward that is not a number ({reward!r:.40})")
        if not isinstance(done, bool):
            raise self._failure(f"answered {what} with a done that is not a boolean ({done!r:.40})")
        return Observation(data["observation"], None if reward is None else float(reward), done)

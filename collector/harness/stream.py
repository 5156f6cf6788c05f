"""A streamed reply to a harness: the text as the model writes it, the calls once the turn is classified.

A harness that asks for a stream gets its reply's head at once and then the model's text
(and reasoning text) delta by delta, as the run's provider adapter reads the upstream stream
(`collector.providers.relay`: the adapter's own stream reader passes each delta on; there
is no second parser here). Tool-call deltas are never relayed: the session
(`collector.harness.session`) classifies the whole turn first, and only then does the stream
write the calls returned to the harness with the turn's finish reason. A withheld turn ends
with no call and the wire's truncation signal; nothing of its calls was ever written.

`TurnRelay` is the bridge between the adapter (which calls it synchronously as it reads) and
the reply being written (which awaits its queue). A stream that fails midway is retried
whole by the adapter; the harness already has the failed attempt's text, so the retry's text
is passed on only past what was sent (when it repeats it, as a seeded retry does); a retry
whose text departs from what the harness has is not relayed further (the harness keeps what
it saw, and its next request, not extending the recorded turn, is marked `history_rewritten`).
A turn whose text did not come as deltas (an adapter that does not stream, as token-in) gets
its text in one delta before its calls.

Each wire writes its events with a `StreamWriter` (chat_wire, responses_wire, anthropic_wire).
A request refused before any event (an ended episode, a provider that failed before its first
delta) gets the plain HTTP error; a failure after the stream began is the wire's error event.

Tests: tests/harness/test_stream.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from starlette.responses import JSONResponse, Response, StreamingResponse

from collector.harness.request import BadRequest, GatewayTurn, Refused
from collector.providers.relay import relaying

__all__ = ["StreamWriter", "TurnRelay", "stream_reply"]


class StreamWriter(Protocol):
    """One wire's events of one streamed reply, in the order they are written."""

    def start(self) -> list[str]: ...

    def text(self, delta: str) -> list[str]: ...

    def reasoning(self, delta: str) -> list[str]: ...

    def finish(self, turn: GatewayTurn) -> list[str]: ...

    def fail(self, message: str, status: int) -> list[str]: ...


@dataclass(slots=True)
class _Kind:
    """What was passed on of one kind of text (answer or reasoning), and from which attempt."""

    sent: list[str] = field(default_factory=list)
    source: object = None
    """The adapter's reader whose deltas are being passed on as they come."""
    attempt: object = None
    attempt_text: str = ""
    departed: bool = False


class TurnRelay:
    """The adapter's deltas of one turn, queued for the reply (see the module docstring)."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[tuple[str, str] | GatewayTurn | Exception] = asyncio.Queue()
        self._kinds = {"text": _Kind(), "reasoning": _Kind()}

    def text(self, attempt: object, delta: str) -> None:
        self._take("text", attempt, delta)

    def reasoning(self, attempt: object, delta: str) -> None:
        self._take("reasoning", attempt, delta)

    def _take(self, kind: str, attempt: object, delta: str) -> None:
        if not delta:
            return
        k = self._kinds[kind]
        if k.source is None:
            k.source = attempt
        if attempt is k.source:  # the common case: the attempt being relayed writes on
            self._send(k, kind, delta)
            return
        # A retry: pass on only what extends the text the harness already has.
        if attempt is not k.attempt:
            k.attempt, k.attempt_text = attempt, ""
        k.attempt_text += delta
        if k.departed:
            return
        sent = "".join(k.sent)
        k.sent = [sent]
        got = k.attempt_text
        if len(got) <= len(sent):
            k.departed = not sent.startswith(got)
        elif not got.startswith(sent):
            k.departed = True
        else:
            k.source = attempt
            self._send(k, kind, got[len(sent):])

    def _send(self, k: _Kind, kind: str, delta: str) -> None:
        k.sent.append(delta)
        self.queue.put_nowait((kind, delta))

    def rest_of_text(self, text: str) -> str:
        """What of the turn's text the harness has not had (all of it when nothing streamed)."""
        k = self._kinds["text"]
        if k.departed:
            return ""
        sent = "".join(k.sent)
        return text[len(sent):] if text.startswith(sent) else ""

    async def run(self, complete: Awaitable[GatewayTurn]) -> None:
        """Take the turn with this relay set; its end (the turn, or why not) goes last on the queue."""
        try:
            with relaying(self):
                turn = await complete
        except Exception as exc:  # noqa: BLE001 - written to the harness as the wire's error
            self.queue.put_nowait(exc)
        else:
            self.queue.put_nowait(turn)


def _status(exc: Exception) -> tuple[str, int]:
    if isinstance(exc, Refused):
        return str(exc), exc.status
    if isinstance(exc, BadRequest):
        return str(exc), 400
    return f"gateway error: {type(exc).__name__}", 500


async def stream_reply(complete: Awaitable[GatewayTurn], writer: StreamWriter,
                       error: Callable[[str, int], JSONResponse], keep: set[asyncio.Task[None]]) -> Response:
    """The streamed reply to one request: its events as the turn comes (see the module docstring).

    The turn is taken in a task of its own, kept in `keep` until it ends: a harness that hangs
    up mid-stream does not cut the turn short (it is recorded whole, as it was sampled)."""
    relay = TurnRelay()
    task = asyncio.create_task(relay.run(complete))
    keep.add(task)
    task.add_done_callback(keep.discard)
    first = await relay.queue.get()
    if isinstance(first, Exception):
        message, status = _status(first)
        return error(message, status)

    async def events() -> AsyncIterator[str]:
        for event in writer.start():
            yield event
        item: tuple[str, str] | GatewayTurn | Exception = first
        while True:
            if isinstance(item, tuple):
                kind, delta = item
                for event in writer.text(delta) if kind == "text" else writer.reasoning(delta):
                    yield event
            elif isinstance(item, Exception):
                for event in writer.fail(*_status(item)):
                    yield event
                return
            else:
                rest = relay.rest_of_text(item.text)
                for event in [*(writer.text(rest) if rest else []), *writer.finish(item)]:
                    yield event
                return
            item = await relay.queue.get()

    return StreamingResponse(events(), media_type="text/event-stream", headers={"cache-control": "no-cache"})

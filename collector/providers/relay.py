"""Relaying a streamed turn's text as it arrives, to whoever serves it on while it is read.

The adapters return whole turns; the harness gateway (`collector.harness.stream`) must also
pass the model's text on as it is written, before the turn is whole and classified. Rather
than parse the stream a second time, the adapters' own stream readers tell a `StreamRelay`
about each text and reasoning delta as they take it in. The relay is set for one call with
`relaying(...)` (a context variable, so the retries and wrappers between the caller and the
reader need not carry it); while one is set, the adapter reads the reply as a stream even if
its endpoint says `streaming = false`, so the text can come as it is written.

Each delta comes with the reader it belongs to (`attempt`): a stream that fails midway is
retried whole by `Http.retrying`, and the retry's reader is a new object, so a relay can
tell the retry's text from the text of the attempt it already passed on.

Tests: tests/harness/test_stream.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Protocol

__all__ = ["StreamRelay", "current_relay", "relaying"]


class StreamRelay(Protocol):
    """Told each text and reasoning delta of a streamed turn as the adapter reads it."""

    def text(self, attempt: object, delta: str) -> None: ...

    def reasoning(self, attempt: object, delta: str) -> None: ...


_RELAY: ContextVar[StreamRelay | None] = ContextVar("collector_stream_relay", default=None)


def current_relay() -> StreamRelay | None:
    """The relay of the call being made, if its caller set one."""
    return _RELAY.get()


@contextlib.contextmanager
def relaying(relay: StreamRelay) -> Iterator[None]:
    """Within this block, the adapters stream and tell `relay` each delta they read."""
    token = _RELAY.set(relay)
    try:
        yield
    finally:
        _RELAY.reset(token)

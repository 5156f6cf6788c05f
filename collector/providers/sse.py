"""A small incremental Server-Sent Events decoder.

All four transports stream with SSE, with different habits: Anthropic and Responses send an
`event:` line before every `data:` line; Chat Completions and Gemini send `data:` only;
OpenRouter interleaves `: OPENROUTER PROCESSING` comment lines; Gemini frames with CRLF.
The decoder follows the WHATWG rules that matter for that: lines end in LF, CRLF or CR (a CR
at the end of one chunk may pair with an LF at the start of the next), a blank line
dispatches the event, several `data:` lines join with LF, one space after the colon is
dropped, lines starting with `:` are comments, and unknown fields are ignored.

An event not yet dispatched when the stream ends (no blank line after it) is *discarded*, as
the spec says. That is the safe reading for us: a stream cut in the middle of its last event
must look like a stream without its terminal event, never like a complete one.

It is fed decoded text (`httpx.Response.aiter_text()`), not lines, so that our own line
splitting applies; `str.splitlines` would also split on U+2028 and friends, which JSON
strings may carry raw.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SSEDecoder", "SSEEvent"]


@dataclass(slots=True, frozen=True)
class SSEEvent:
    """One dispatched event: its `event:` name ("message" when absent) and joined data."""

    event: str
    data: str


class SSEDecoder:
    """Feed text chunks in, get complete events out. Not thread-safe; one per stream."""

    __slots__ = ("_buffer", "_data", "_event", "_has_data")

    def __init__(self) -> None:
        self._buffer = ""
        self._event = ""
        self._data: list[str] = []
        self._has_data = False

    def feed(self, chunk: str) -> list[SSEEvent]:
        """Decode a chunk of text; return the events it completed (possibly none)."""
        buffer = self._buffer + chunk
        if not buffer:
            return []
        # A trailing CR may be the first half of a CRLF: hold it until the next chunk.
        hold_cr = buffer.endswith("\r")
        if hold_cr:
            buffer = buffer[:-1]
        if "\r" in buffer:
            buffer = buffer.replace("\r\n", "\n").replace("\r", "\n")
        lines = buffer.split("\n")
        self._buffer = lines.pop() + ("\r" if hold_cr else "")
        events: list[SSEEvent] = []
        for line in lines:
            # Inline fast path for the overwhelmingly common `data:` line.
            if line.startswith("data:"):
                self._data.append(line[6:] if line.startswith("data: ") else line[5:])
                self._has_data = True
                continue
            event = self._line(line)
            if event is not None:
                events.append(event)
        return events

    def close(self) -> list[SSEEvent]:
        """End of stream. A held CR ends its line; an undispatched event is discarded."""
        events: list[SSEEvent] = []
        if self._buffer.endswith("\r"):
            event = self._line(self._buffer[:-1])
            if event is not None:
                events.append(event)
        self._buffer = ""
        self._event = ""
        self._data = []
        self._has_data = False
        return events

    def _line(self, line: str) -> SSEEvent | None:
        if not line:
            if not self._has_data:
                self._event = ""
                return None
            event = SSEEvent(self._event or "message", "\n".join(self._data))
            self._event = ""
            self._data = []
            self._has_data = False
            return event
        if line[0] == ":":
            return None  # comment / keep-alive
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
            self._has_data = True
        elif name == "event":
            self._event = value
        # `id`, `retry` and unknown fields carry nothing we use.
        return None

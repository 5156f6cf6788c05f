"""The SSE decoder: field parsing, comments, multi-line data, every line ending, any chunking."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from collector.providers.sse import SSEDecoder, SSEEvent
from tests.providers.wirefab import WIRE


def decode(*chunks: str) -> list[SSEEvent]:
    decoder = SSEDecoder()
    events = [e for chunk in chunks for e in decoder.feed(chunk)]
    return events + decoder.close()


def test_event_and_data_fields() -> None:
    """`event:` names the event, `data:` carries it, one leading space is dropped."""
    assert decode("event: ping\ndata: {}\n\n") == [SSEEvent("ping", "{}")]
    assert decode("data:x\n\n") == [SSEEvent("message", "x")]
    assert decode("data:  two spaces\n\n") == [SSEEvent("message", " two spaces")]


def test_comments_and_unknown_fields_are_ignored() -> None:
    """Lines starting with `:` (OpenRouter keep-alives) and unknown fields are skipped."""
    assert decode(": OPENROUTER PROCESSING\n\nid: 3\nretry: 10\nfoo: bar\ndata: a\n\n") == [
        SSEEvent("message", "a")
    ]


def test_multi_line_data_joins_with_newline() -> None:
    """Several data lines in one event join with a newline."""
    assert decode("data: a\ndata: b\n\n") == [SSEEvent("message", "a\nb")]


def test_crlf_and_cr_line_endings() -> None:
    """CRLF and bare CR end lines like LF, including a CRLF split across chunks."""
    assert decode("data: a\r\n\r\ndata: b\r\rdata: c\n\n") == [
        SSEEvent("message", "a"),
        SSEEvent("message", "b"),
        SSEEvent("message", "c"),
    ]
    assert decode("data: a\r", "\n\r", "\n") == [SSEEvent("message", "a")]


def test_undispatched_event_is_discarded_at_end() -> None:
    """An event without its closing blank line is dropped at end of stream (a cut is never complete)."""
    assert decode("data: a\n\ndata: b\n") == [SSEEvent("message", "a")]
    assert decode("data: a\n\ndata: b") == [SSEEvent("message", "a")]


def test_json_with_unicode_line_separators_is_one_line() -> None:
    """U+2028 inside data (legal raw in JSON strings) does not split the line."""
    assert decode('data: {"t": "a\u2028b"}\n\n') == [SSEEvent("message", '{"t": "a\u2028b"}')]


def test_event_name_resets_between_events() -> None:
    """An event name applies to its own event only."""
    assert decode("event: error\ndata: 1\n\ndata: 2\n\n") == [
        SSEEvent("error", "1"),
        SSEEvent("message", "2"),
    ]


@given(st.data())
def test_any_chunking_gives_the_same_events(data: st.DataObject) -> None:
    """Splitting a wire example into arbitrary chunks never changes the decoded events."""
    name = data.draw(st.sampled_from(sorted(p.name for p in WIRE.glob("*.sse"))))
    text = (WIRE / name).read_text(encoding="utf-8")
    cuts = sorted(data.draw(st.lists(st.integers(min_value=0, max_value=len(text)), max_size=12)))
    chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    assert decode(*chunks) == decode(text)
    assert decode(text)

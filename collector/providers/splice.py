"""Encode a request body without re-encoding the history every turn (issue 14).

An episode's history only grows, yet every turn sends all of it: encoding the whole body
each turn made a turn's client CPU grow with the history, and an episode's cost quadratic
in its turns. `encode_spliced` is a layer *around* each adapter's body builder (which it
does not change): the builder still makes the body as dicts, and this encodes the body's
history list (`messages`, `input`, `contents`) item by item, keeping each item's bytes in
the episode's `TurnRequest.wire_cache` for the next turn.

Which bytes are reused is decided by comparing the items, not by knowing the dialect: an
item equal to the one at the same place last turn (a cheap comparison: the strings are the
same objects) gets last turn's bytes. So Anthropic's and Gemini's merging of consecutive
blocks into one wire message, or any later change to a builder (reasoning blocks, a new
field), stays correct: a changed item is simply encoded again. The rest of the body is kept
encoded too, and reused while it is equal. The result is byte for byte
`encode_body(body)`: `[a,b]` with compact separators is `[` + `a` + `,` + `b` + `]`
(tests/providers/test_splice.py compares the two for every dialect, streaming or not).
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from collector.providers.common import encode_body
from collector.turn import JSONObject

__all__ = ["encode_spliced"]

#: Stands in for the history while the rest of the body is encoded; random per process, so
#: no text a model or a tool wrote can be mistaken for it.
_MARK = "collector-history-" + secrets.token_hex(16)
_MARK_BYTES = json.dumps(_MARK).encode()
#: `encode_body`'s settings, made once: `json.dumps` with non-default arguments builds a new
#: encoder on every call, which costs more than encoding a short item.
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def _encode(value: Any) -> bytes:
    """What `encode_body` makes of `value`, byte for byte (the same encoder settings)."""
    return _ENCODER.encode(value).encode()


def encode_spliced(body: JSONObject, history_key: str, cache: dict[str, Any]) -> bytes:
    """`encode_body(body)`, reusing the bytes of the history items `cache` kept last turn.

    The rest of the body (model, tools, cap, parameters) is reused too when it is equal,
    keys in the same order, to last turn's: the tool schemas are most of a short body.
    """
    items = body.get(history_key)
    if not isinstance(items, list):  # an `extra_body` replaced the history: nothing to reuse
        return encode_body(body)
    state = cache.get(history_key)
    parts: list[bytes] = []
    rest = [(k, v) for k, v in body.items() if k != history_key]
    shell: tuple[bytes, bytes] | None = None
    if state is not None:
        old_items, old_parts, old_rest, old_shell = state
        for new, old, encoded in zip(items, old_items, old_parts, strict=False):
            if new is not old and new != old:
                break
            parts.append(encoded)
        if rest == old_rest:
            shell = old_shell
    parts.extend(_encode(item) for item in items[len(parts):])
    if shell is None:
        body[history_key] = [_MARK]
        try:
            whole = _encode(body)
        finally:
            body[history_key] = items
        head, found, tail = whole.partition(b"[" + _MARK_BYTES + b"]")
        if not found:  # cannot happen (the mark is in the body); be safe
            return encode_body(body)
        shell = (head, tail)
    cache[history_key] = (items, parts, rest, shell)
    return b"".join((shell[0], b"[", b",".join(parts), b"]", shell[1]))

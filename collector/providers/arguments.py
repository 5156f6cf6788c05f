"""Tool-call arguments: strict parsing, two conservative repairs, and leaked-template detection.

Every seed bug in this project begins where argument text becomes an object. The rules here
are deliberately narrow, because a parser that "helps" is how `amount: 1000` ran as
`amount: 10`:

1. Strict JSON first (`json.loads`, with NaN/Infinity refused), and the result must be a JSON
   *object*. Valid text is never rewritten, so a delimiter inside a legitimate string value
   (`{"body": "use <tool_call|> literally"}`) is left alone.
2. Only when strict parsing fails, one of two repairs, recorded by name:
   - ``strip_delimiters``: remove known chat-template delimiters that a gateway leaked
     (provider-protocols.md section 6) *outside* JSON strings, then parse strictly again;
   - ``leading_object`` (or ``strip_delimiters+leading_object``): take the first complete
     JSON object at the start when what follows it is only another fragment (``{``...) or
     nothing once delimiters are gone.
3. Nothing else. No bracket is closed, no quote guessed, no lenient JSON library used: a cut
   `{"amount": 10` stays MALFORMED.

A repair never makes a call runnable on its own: the episode loop also refuses every call
from a length turn, whatever its status here.

The same delimiter table drives `unclosed_template`, which finds chat-template tool-call
blocks that were opened in the *text* of a turn but never closed (a server-side parser gave
up, usually because the cap cut the call), and `has_template_opener`, which reports any
tool-call block left unparsed in the text.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from collector.turn import ArgStatus, JSONObject

__all__ = [
    "CALL_CLOSERS",
    "LEAKED_DELIMITERS",
    "ParsedArguments",
    "has_template_opener",
    "parse_arguments",
    "strip_delimiters",
    "unclosed_template",
]

LEAKED_DELIMITERS: tuple[str, ...] = (
    # Kimi K2
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    # Granite, and the tinyagents table
    "<|tool_call|>",
    "<|tool_sep|>",
    # Gemma 4 (opener and its odd closer), Hermes / Qwen / GLM
    "<|tool_call>",
    "<tool_call|>",
    "</tool_call>",
    "<tool_call>",
    # Llama 3.x
    "<|python_tag|>",
    "<|eom_id|>",
    "<|eot_id|>",
    # gpt-oss harmony
    "<|call|>",
    "<|end|>",
    # Mistral
    "[TOOL_CALLS]",
    "[ARGS]",
    # DeepSeek V3 / V3.1 (U+FF5C and U+2581, not ASCII)
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
    "<｜end▁of▁sentence｜>",
)
"""Delimiters stripped by the ``strip_delimiters`` repair (longest first where they overlap).

`<|"|>` (Gemma 4's string delimiter) is deliberately absent: turning it into a quote would be
guessing quotes, and Gemma's unquoted keys would not parse anyway."""

# Longest first, so "<|tool_call|>" is removed whole rather than leaving "|>" behind.
_STRIP_ORDER = tuple(sorted(LEAKED_DELIMITERS, key=len, reverse=True))
_FIRST_CHARS = frozenset(d[0] for d in LEAKED_DELIMITERS)


class ParsedArguments(NamedTuple):
    """The outcome of parsing one argument text."""

    value: JSONObject | None
    status: ArgStatus
    repair: str | None


def _refuse_constant(name: str) -> Any:
    # NaN / Infinity are not JSON; a tool must never receive them from "repaired" text.
    raise ValueError(f"non-standard JSON constant {name}")


_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)


def _strict_object(text: str) -> JSONObject | None:
    try:
        value = _DECODER.decode(text)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def strip_delimiters(text: str) -> tuple[str, bool]:
    """Remove known delimiters that occur outside JSON string literals.

    Returns the new text and whether anything was removed. Text inside a string literal
    (tracked with escapes) is copied untouched, so a value that mentions a delimiter keeps it.
    """
    out: list[str] = []
    removed = False
    i = 0
    n = len(text)
    in_string = False
    start = 0
    while i < n:
        ch = text[i]
        if in_string:
            if ch == "\\":
                i += 2
                continue
            if ch == '"':
                in_string = False
            i += 1
            continue
        if ch == '"':
            in_string = True
            i += 1
            continue
        if ch in _FIRST_CHARS:
            for delim in _STRIP_ORDER:
                if text.startswith(delim, i):
                    out.append(text[start:i])
                    i += len(delim)
                    start = i
                    removed = True
                    break
            else:
                i += 1
            continue
        i += 1
    if not removed:
        return text, False
    out.append(text[start:])
    return "".join(out), True


def _leading_object(text: str) -> JSONObject | None:
    """The first complete JSON object at the start of `text`, when only a fragment follows."""
    body = text.lstrip()
    if not body.startswith("{"):
        return None
    try:
        value, end = _DECODER.raw_decode(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict):
        return None
    rest = body[end:].lstrip()
    # Only nothing, or the start of another concatenated object, may follow; any other tail
    # (text, a stray bracket) means we do not understand the string and refuse it.
    if rest and not rest.startswith("{"):
        return None
    return value


def parse_arguments(text: str) -> ParsedArguments:
    """Parse tool-call argument text: strict JSON object first, then one conservative repair.

    Never raises. MALFORMED means no object could be obtained without guessing.
    """
    value = _strict_object(text)
    if value is not None:
        return ParsedArguments(value, ArgStatus.OK, None)
    stripped, removed = strip_delimiters(text)
    if removed:
        value = _strict_object(stripped)
        if value is not None:
            return ParsedArguments(value, ArgStatus.REPAIRED, "strip_delimiters")
    value = _leading_object(stripped)
    if value is not None:
        repair = "strip_delimiters+leading_object" if removed else "leading_object"
        return ParsedArguments(value, ArgStatus.REPAIRED, repair)
    return ParsedArguments(None, ArgStatus.MALFORMED, None)


# --- Tool-call blocks left in the text of a turn -------------------------------------------

# (opener, closers): a block is unclosed when the last opener comes after every closer.
_PAIRED: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("<tool_call>", ("</tool_call>",)),
    ("<|tool_call>", ("<tool_call|>",)),
    ("<｜tool▁calls▁begin｜>", ("<｜tool▁calls▁end｜>",)),
    ("<｜tool▁call▁begin｜>", ("<｜tool▁call▁end｜>",)),
    ("<|tool_calls_section_begin|>", ("<|tool_calls_section_end|>",)),
    ("<|tool_call_begin|>", ("<|tool_call_end|>",)),
    ("<start_function_call>", ("<end_function_call>",)),
    ("<minimax:tool_call>", ("</minimax:tool_call>",)),
    ("<|channel|>commentary to=", ("<|call|>",)),
    ("<function=", ("</function>",)),
)
# Openers followed by a JSON value and no closing tag: unclosed when that value is incomplete.
_JSON_AFTER: tuple[str, ...] = ("<|python_tag|>", "[TOOL_CALLS]", "<|tool_call|>", "[ARGS]")

_OPENERS = tuple(o for o, _ in _PAIRED) + _JSON_AFTER

#: The closers of chat-template call blocks: a stop sequence among them ends a call after its
#: arguments, never inside them (`collector.providers.servercut`).
CALL_CLOSERS = frozenset(closer for _, closers in _PAIRED for closer in closers)


def has_template_opener(text: str) -> bool:
    """True when the text holds any chat-template tool-call opener (a call not parsed server-side)."""
    if "<" not in text and "[" not in text:
        return False
    return any(o in text for o in _OPENERS)


def _json_value_complete(tail: str) -> bool:
    body = tail.lstrip()
    for i, ch in enumerate(body):
        if ch in "{[":
            body = body[i:]
            break
    else:
        return False
    try:
        _DECODER.raw_decode(body)
    except (ValueError, RecursionError):
        return False
    return True


def unclosed_template(text: str) -> str | None:
    """The opener of a chat-template tool-call block left open in `text`, or None.

    Paired templates (Hermes `<tool_call>`, Gemma 4 `<|tool_call>`, DeepSeek, Kimi, ...) are
    open when their last opener follows their last closer; opener-then-JSON templates (Llama
    `<|python_tag|>`, Mistral `[TOOL_CALLS]`, Granite `<|tool_call|>`) are open when the JSON
    after the last opener is incomplete.
    """
    if "<" not in text and "[" not in text:
        return None
    for opener, closers in _PAIRED:
        last_open = text.rfind(opener)
        if last_open < 0:
            continue
        last_close = max(text.rfind(c) for c in closers)
        if last_close < last_open:
            return opener
    for opener in _JSON_AFTER:
        last_open = text.rfind(opener)
        if last_open < 0:
            continue
        tail = text[last_open + len(opener) :]
        if opener == "[TOOL_CALLS]" and "[ARGS]" in tail:
            continue  # Mistral v11 `[TOOL_CALLS]name[ARGS]{...}`: judged at its `[ARGS]`.
        if not _json_value_complete(tail):
            return opener
    return None

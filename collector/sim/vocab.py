"""The simulator's vocabulary: every token id has one text, so ids detokenize exactly.

The simulated template (`collector.sim.tokens`) writes text a tokenizer can take back:
llama.cpp's `/tokenize` and `/detokenize` (`collector.sim.completion`) need ids that map to
text and back, and a token-in prompt is only checkable if its ids decode to the conversation.

Id ranges (all below 2**31, so an int32 consumer holds them):

- 1..11, the template's markup (`SPECIALS`): role markers, `<|end|>`, `<tool_call>`, the call
  closer `}</tool_call>` (it also closes the `{"name": ..., "arguments": ...}` object the call
  header opens, so a call is one Hermes-style block of valid JSON), the tool-definition marker,
  the re-render whitespace and the think filler;
- `ASCII_BASE` up: a piece of 1 to 4 ASCII characters, encoded base 128 (a bijection: the id
  is computed from the text and the text from the id, in any process);
- `HASHED_BASE` up: anything else, hashed: a non-ASCII piece, a call header
  (`{"name": "refund", "arguments": `, one id per tool name), a tool definition's name.
  These are kept in a table as they are handed out, so they detokenize exactly in the
  process that produced them (the server); two texts whose hashes collide (about 1 in 2**30
  per pair) get neighbouring ids, in the order they were first seen.

The tokenizer (`tokenize`) splits text at markup (when `parse_special`), and cuts every other
run into pieces of `CHARS_PER_TOKEN` characters, except by context: the run after
`<|tool_def|>` is one name token, a run after `<tool_call>` starts with one header token, and
a newline right after `<|assistant|>` is the re-render whitespace token. That is exactly how
`collector.sim.tokens` lays out a prompt, so tokenizing the rendered text gives its ids.

Tests: tests/sim/test_completion.py.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from functools import lru_cache

from collector.sim.tokenizer import CHARS_PER_TOKEN

BEGIN, SYSTEM, USER, ASSISTANT, TOOL, END, CALL_OPEN, CALL_CLOSE, TOOL_DEF, SPACE, THINK = range(1, 12)
SPECIALS = {BEGIN: "<|begin|>", SYSTEM: "<|system|>", USER: "<|user|>", ASSISTANT: "<|assistant|>",
            TOOL: "<|tool|>", END: "<|end|>", CALL_OPEN: "<tool_call>", CALL_CLOSE: "}</tool_call>",
            TOOL_DEF: "<|tool_def|>", SPACE: "\n", THINK: " "}
"""Markup ids and their text. SPACE and THINK are written only by context (never parsed as
markup: a newline or a space inside content is content)."""

ASCII_BASE = 1000
_ASCII_OFFSETS = (0, 0, 128, 128 + 128 ** 2, 128 + 128 ** 2 + 128 ** 3)
"""Ids used by the ASCII pieces shorter than the index: a length-L piece starts after them."""
HASHED_BASE = 1 << 29
_HASHED_SPAN = 1 << 30
assert ASCII_BASE + _ASCII_OFFSETS[4] + 128 ** 4 < HASHED_BASE

_MARKUP = {text: token_id for token_id, text in SPECIALS.items() if token_id not in (SPACE, THINK)}
_SPLIT = re.compile("(" + "|".join(re.escape(t) for t in sorted(_MARKUP, key=len, reverse=True)) + ")")
_HEADER = re.compile(r'\{"name": ("(?:[^"\\]|\\.)*"), "arguments": ')

_hashed: dict[int, str] = {}
_hashed_keys: dict[int, str] = {}
_hashed_ids: dict[str, int] = {}
_lock = threading.Lock()


def _hashed_id(key: str, text: str) -> int:
    """The id of a hashed entry (`key` names it, `text` is what it detokenizes to)."""
    found = _hashed_ids.get(key)
    if found is not None:
        return found
    h = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") % _HASHED_SPAN
    with _lock:
        while True:
            token_id = HASHED_BASE + h
            owner = _hashed_keys.get(token_id)
            if owner is None or owner == key:
                _hashed[token_id], _hashed_keys[token_id], _hashed_ids[key] = text, key, token_id
                return token_id
            h = (h + 1) % _HASHED_SPAN


@lru_cache(maxsize=65536)
def piece_id(text: str) -> int:
    """The id of one piece of content text (stable across processes for ASCII pieces)."""
    if 1 <= len(text) <= CHARS_PER_TOKEN and text.isascii():
        code = 0
        for ch in reversed(text):
            code = code * 128 + ord(ch)
        return ASCII_BASE + _ASCII_OFFSETS[len(text)] + code
    return _hashed_id("piece\0" + text, text)


def header_text(name: str) -> str:
    """What a call's second token says: the opening of its `{"name", "arguments"}` object."""
    return '{"name": ' + json.dumps(name) + ', "arguments": '


@lru_cache(maxsize=4096)
def header_id(name: str) -> int:
    """The id of a call header for tool `name`."""
    return _hashed_id("header\0" + name, header_text(name))


@lru_cache(maxsize=4096)
def tool_def_id(name: str) -> int:
    """The id of a tool's name in the tool definitions."""
    return _hashed_id("tool\0" + name, name)


def token_text(token_id: int) -> str | None:
    """The text of one id, None when no token has it."""
    special = SPECIALS.get(token_id)
    if special is not None:
        return special
    if token_id >= HASHED_BASE:
        return _hashed.get(token_id)
    code = token_id - ASCII_BASE
    if code < 0:
        return None
    length = 4
    while length > 1 and code < _ASCII_OFFSETS[length]:
        length -= 1
    code -= _ASCII_OFFSETS[length]
    if code >= 128 ** length:
        return None
    chars = []
    for _ in range(length):
        code, ch = divmod(code, 128)
        chars.append(chr(ch))
    return "".join(chars)


def detokenize(ids: list[int]) -> str:
    """The text of `ids`; `ValueError` names the first id no token has."""
    out = []
    for token_id in ids:
        text = token_text(token_id)
        if text is None:
            raise ValueError(f"token id {token_id} is not in the vocabulary")
        out.append(text)
    return "".join(out)


def pieces(text: str) -> list[int]:
    """Content text as piece ids: runs of `CHARS_PER_TOKEN` characters."""
    return [piece_id(text[i:i + CHARS_PER_TOKEN]) for i in range(0, len(text), CHARS_PER_TOKEN)]


def tokenize(text: str, parse_special: bool = True) -> list[int]:
    """`text` as ids (see the module docstring); without `parse_special`, markup is content."""
    if not parse_special:
        return pieces(text)
    ids: list[int] = []
    before: int | None = None
    for part in _SPLIT.split(text):
        markup = _MARKUP.get(part)
        if markup is not None:
            ids.append(markup)
            before = markup
            continue
        if not part:
            continue
        if before == TOOL_DEF:
            ids.append(tool_def_id(part))
        else:
            if before == CALL_OPEN:
                found = _HEADER.match(part)
                if found:
                    ids.append(header_id(json.loads(found.group(1))))
                    part = part[found.end():]
            elif before == ASSISTANT and part.startswith("\n"):
                ids.append(SPACE)
                part = part[1:]
            ids += pieces(part)
        before = None
    return ids

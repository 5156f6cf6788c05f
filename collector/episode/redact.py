"""What of an episode may be stored, and in what form: redaction on the way to the record.

The model's history (what the provider sees) is never touched; only the `Episode` record
written to shards goes through here. The rules, and why:

- Tool-call arguments are stored as the *parsed* object, with the value of every key that
  looks secret replaced by ``"[REDACTED]"``. Nested objects and lists are walked, and the
  whole value under a secret key goes (``{"credentials": {...}}`` hides everything inside).
  Matching is by *word parts* (`key_words`): a key is split at ``_``, ``-``, ``.``, spaces
  and other punctuation, at camelCase humps (``authToken``, ``APIKey``) and between letters
  and digits, and lower-cased; a configured name is split the same way. The key is secret
  when the name's words occur in it as consecutive words, where the name's words may be
  written together (``api_key`` matches ``apikey`` and ``x-api-key``), the first may have
  letters glued in front (``token`` matches ``accesstoken``, ``auth`` matches ``oauth``) and
  the last may take a plural ``s`` (``tokens``, ``credentials``). So ``auth`` hides
  ``auth``, ``authToken`` and ``X-Auth-Token`` but not ``author``; no name hides
  ``keyboard``; ``token`` hides ``max_tokens`` too (we err on the side of hiding) but not
  ``tokenizer``. Word parts replace the substring rule of earlier versions, which hid
  ``author`` under ``auth`` and could not be widened without hiding ordinary arguments.
- Credential *values*: every credential the run was given, in every form it is sent (the
  key from ``api_key_env``, a ``user:pass@`` of the base URL, its ``Basic`` base64 form, a
  key in the base URL's query; `credential_values`), is replaced by
  ``"[redacted credential]"`` wherever it appears in the finished record (`Redactor.scrub`:
  every string of the episode, text, arguments, tool names, error messages, turn fields),
  whatever key, if any, it sits under. A model that echoes its key back cannot store it.
- An argument fragment that did not parse is never stored: only its length in characters
  (`ToolCallRecord.unparsed_chars`). Key-based redaction cannot see inside a fragment, so a
  fragment such as ``{"token": "abc`` would otherwise leak (Heym PR #911). The opt-in debug
  setting `keep_raw_fragments` keeps it in `raw_fragment`, a field a trainer never reads.
- A chat-template tool-call block that a gateway left in an assistant message's text
  (``<tool_call>{"name": "refund", "arguments": {"amount":`` and the like: the turn's
  `unparsed_tool_call`, or a length signal `unclosed_template`) is a fragment too, so it is
  treated the same way: the text is stored up to the first template opener
  (`collector.providers.arguments.has_template_opener`'s table), followed by
  ``[unparsed tool-call block: N chars]``; the block itself goes to `MessageRecord.raw_text`
  only with `keep_raw_fragments`. Prose that merely quotes an opener is cut as well: we err on
  the side of hiding.
- Free text (message text, tool results, prompts) goes through `redact_text`: text that is
  a JSON object or array gets the same key-based redaction; other text gets a pattern pass
  that hides the value in ``key=value`` / ``key: value`` / ``"key": "value"`` pairs whose key
  is secret-like (the same word-part rule), and ``Bearer ...`` and ``Basic <base64>``
  credentials.

- Stored reasoning (`TurnRecord.reasoning_text`, every string inside `reasoning_items`):
  a model's thinking repeats tool arguments verbatim, so every value the rules above hid
  anywhere in the episode (under a secret key in a call's arguments or a JSON result, in a
  secret ``key=value`` pair, a ``Bearer``/``Basic`` credential) is replaced there too, by
  exact value (`Redactor.scrub` with the episode's messages; values shorter than
  `MIN_SCRUBBED_CHARS` are left, they would hide ordinary words). A stored item that changed
  no longer matches its signature: it gets ``"collector_redacted": true`` so nobody replays
  it from a shard expecting a valid one. The live replay keeps the original items.

What is *not* redacted: a secret the run was not given, in prose with no key beside it
("my code is hunter2") or under an innocent key (``{"note": "sk-..."}``). Environments
that handle real credentials should keep them out of tool results in the first place.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any
from urllib.parse import quote

from collector.providers.arguments import has_template_opener
from collector.record.episode import Episode, MessageRecord, ToolCallRecord
from collector.turn import (
    REDACTED_CREDENTIAL,
    ArgStatus,
    AssistantMessage,
    Message,
    ToolCall,
    ToolResultMessage,
)

REDACTED = "[REDACTED]"


#: Marks a stored reasoning item whose content redaction changed (its signature no longer fits).
REDACTED_ITEM_KEY = "collector_redacted"

#: Redacted values shorter than this are not scrubbed from stored reasoning (a 2-letter
#: value would hide ordinary words of the thinking text).
MIN_SCRUBBED_CHARS = 4

#: Keys of reasoning items whose string values are the model's thinking text: these get the
#: free-text pass too (`redact_text`), the other strings (signatures) only the exact scrub.
_THINKING_TEXT_KEYS = frozenset({"text", "thinking"})

#: What replaces an unparsed tool-call block in stored assistant text.
UNPARSED_MARKER = "[unparsed tool-call block: {chars} chars]"

#: Names matched by word parts (see the module docstring and `key_words`). Kept equal to
#: `collector.config.RedactionConfig.secret_keys` (the config layer cannot import this one).
DEFAULT_SECRET_KEYS: tuple[str, ...] = (
    "token", "password", "passwd", "pwd", "passphrase", "secret", "api_key", "access_key",
    "private_key", "authorization", "auth", "credential", "cookie", "session_id", "jwt",
)  # fmt: skip

_SEPARATORS = re.compile(r"[\W_]+")
# camelCase humps (`authToken`, `APIKey` -> API, Key) and letter/digit boundaries (`oauth2`).
_HUMPS = re.compile(
    r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])|(?<=[A-Za-z])(?=[0-9])|(?<=[0-9])(?=[A-Za-z])"
)


def key_words(key: str) -> list[str]:
    """The lower-cased word parts of a key: `X-Api-Key` and `xApiKey` -> ["x", "api", "key"]."""
    return [w.lower() for chunk in _SEPARATORS.split(key) if chunk for w in _HUMPS.split(chunk) if w]


def _name_pattern(words: Sequence[str]) -> str:
    # Over the key's words joined by "_": the name's words, consecutive (or written together),
    # the first with letters allowed in front, the last with a plural "s" allowed.
    inner = "_?".join(re.escape(w) for w in words)
    return r"(?:^|_)[^_]*" + inner + r"s?(?:_|$)"


class Redactor:
    """Key-based redaction with a per-key verdict cache (keys repeat across turns), and the
    exact-value scrub of the run's credentials (`scrub`)."""

    __slots__ = (
        "_ascii_needles", "_cache", "_credential_pattern", "_key_pattern", "_needles", "keep_raw_fragments",
    )  # fmt: skip

    def __init__(
        self,
        secret_keys: Iterable[str] = DEFAULT_SECRET_KEYS,
        keep_raw_fragments: bool = False,
        credentials: Iterable[str] = (),
    ) -> None:
        names = [words for words in (key_words(k) for k in secret_keys) if words]
        # Each name written together ("apikey"): a key matching the name contains it once its
        # separators are dropped, which is what the shortcut in `redact_text` relies on.
        self._needles = tuple(sorted({"".join(words) for words in names}))
        self._ascii_needles = all(n.isascii() for n in self._needles)
        # Ignoring case beyond `lower()`: a configured "ſecret" (long s) matches "secret".
        alternatives = "|".join(_name_pattern(w) for w in names)
        self._key_pattern = re.compile(alternatives, re.IGNORECASE) if names else None
        self._cache: dict[str, bool] = {}
        self.keep_raw_fragments = keep_raw_fragments
        forms = sorted({f for c in credentials for f in _stored_forms(c)}, key=len, reverse=True)
        # Longest first, so that `user:pass` goes whole before `pass` alone would match in it.
        self._credential_pattern = re.compile("|".join(map(re.escape, forms))) if forms else None

    def is_secret_key(self, key: str) -> bool:
        verdict = self._cache.get(key)
        if verdict is None:
            pattern = self._key_pattern
            verdict = pattern is not None and pattern.search("_".join(key_words(key))) is not None
            if len(self._cache) < 4096:  # bounded: keys come from model output
                self._cache[key] = verdict
        return verdict

    def redact_value(self, value: Any) -> Any:
        """A copy of a JSON-like value with every secret-keyed value replaced."""
        if isinstance(value, dict):
            return {
                k: (REDACTED if isinstance(k, str) and self.is_secret_key(k) else self.redact_value(v))
                for k, v in value.items()
            }
        if isinstance(value, list):
            return [self.redact_value(v) for v in value]
        return value

    def arguments_json(self, arguments: dict[str, Any]) -> str:
        """Parsed arguments, redacted, as compact JSON (what the record stores)."""
        redacted = self.redact_value(arguments)
        return json.dumps(redacted, ensure_ascii=False, separators=(",", ":"), default=str)

    def redact_text(self, text: str) -> str:
        """Free text for the record: JSON gets key-based redaction, other text a pattern pass."""
        if not text:
            return text
        head = text.lstrip()[:1]
        if head in ("{", "["):
            try:
                parsed = json.loads(text)
            except ValueError:
                pass
            else:
                if isinstance(parsed, dict | list):
                    redacted = self.redact_value(parsed)
                    if redacted == parsed:
                        return text
                    return json.dumps(redacted, ensure_ascii=False)
        if self._ascii_needles and text.isascii():
            # An exact shortcut (the patterns are ASCII, so for ASCII text lowering is what
            # `(?i)` does): a secret key in the text, its separators dropped, contains a
            # needle; the credential patterns need "bearer" or "basic". Most text has none,
            # and the key pass is the costliest step of recording a turn (bench/overhead.py).
            folded = text.lower()
            squeezed = folded.replace("-", "").replace("_", "").replace(".", "")
            if (
                "bearer" not in folded
                and "basic" not in folded
                and not any(n in squeezed for n in self._needles)
            ):
                return text
        if self._key_pattern is not None:
            text = self._redact_pairs(text)
        return _BASIC.sub(r"\1" + REDACTED, _BEARER.sub(r"\1" + REDACTED, text))

    def _redact_pairs(self, text: str) -> str:
        """Hide the value of every `key=value` / `key: value` / `"key": "value"` whose key is secret.

        A head (`key:`) whose key is not secret consumes only itself, so a secret pair inside
        an innocent pair's value (`note: password=x`) is still found.
        """
        out: list[str] = []
        done = search_from = 0
        while (head := _PAIR_HEAD.search(text, search_from)) is not None:
            search_from = head.end()
            if self.is_secret_key(head.group(1)):
                value = _PAIR_VALUE.match(text, head.end())
                if value is not None:
                    out += (text[done : head.end()], REDACTED)
                    done = search_from = value.end()
        if not out:
            return text
        out.append(text[done:])
        return "".join(out)

    def scrub(self, episode: Episode, messages: Sequence[Message] = ()) -> bool:
        """Replace every form of every credential the run was given, in place; True when
        anything of the record changed.

        Walks every string of the record (message text, arguments, tool names and ids, turn
        fields, the error message), so no path from the provider or an environment to the
        record can carry a credential's exact value, whatever key it is under. The stored
        reasoning also loses every value redaction hid in `messages` (the episode's history,
        unredacted), and each reasoning item that changed is marked `REDACTED_ITEM_KEY`.
        The verdict is what the token-id rule reads (`collector.episode.tokens`): ids decode
        to the text as sampled, so an episode whose record lost anything here keeps none.
        """
        changed = False
        if any(t.reasoning_text or t.reasoning_items for t in episode.turns):
            # Only then: collecting the values walks the history again (bench/overhead.py).
            changed = self._scrub_reasoning(episode, self.redacted_values(messages))
        if self._credential_pattern is not None:
            hits = [0]
            self._scrub_fields(episode, hits)
            changed = changed or hits[0] > 0
        return changed

    def redacted_values(self, messages: Sequence[Message]) -> set[str]:
        """Every value the record's redaction hides in `messages`: the leaves under secret keys
        of call arguments and JSON text, the values of secret ``key=value`` pairs and
        ``Bearer``/``Basic`` credentials in free text (at least `MIN_SCRUBBED_CHARS` long)."""
        found: set[str] = set()
        for m in messages:
            if isinstance(m, AssistantMessage):
                self._text_values(m.text, found)
                for c in m.tool_calls:
                    for value in (c.arguments, c.raw_object):
                        if value is not None:
                            self._keyed_values(value, found)
                    if c.raw_arguments is not None:
                        self._text_values(c.raw_arguments, found)
            elif isinstance(m, ToolResultMessage):
                self._text_values(m.content, found)
            else:
                self._text_values(getattr(m, "text", ""), found)
        return {v for v in found if len(v) >= MIN_SCRUBBED_CHARS}

    def _keyed_values(self, value: Any, found: set[str]) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                if isinstance(k, str) and self.is_secret_key(k):
                    found.update(_leaves(v))
                else:
                    self._keyed_values(v, found)
        elif isinstance(value, list):
            for v in value:
                self._keyed_values(v, found)

    def _text_values(self, text: str, found: set[str]) -> None:
        """What `redact_text` hides in `text`, collected instead of replaced."""
        if not text or self.redact_text(text) == text:
            return
        if text.lstrip()[:1] in ("{", "["):
            with contextlib.suppress(ValueError):
                self._keyed_values(json.loads(text), found)
        search_from = 0
        while self._key_pattern is not None and (head := _PAIR_HEAD.search(text, search_from)) is not None:
            search_from = head.end()
            if self.is_secret_key(head.group(1)):
                value = _PAIR_VALUE.match(text, head.end())
                if value is not None:
                    found.add(value.group(0).strip("\"'"))
                    search_from = value.end()
        for pattern in (_BEARER, _BASIC):
            found.update(m.group(0)[len(m.group(1)):] for m in pattern.finditer(text))

    def _scrub_reasoning(self, episode: Episode, values: set[str]) -> bool:
        """Scrub the stored reasoning in place; True when any of it changed."""
        forms = sorted({f for v in values for f in _stored_forms(v)}, key=len, reverse=True)
        hidden = re.compile("|".join(map(re.escape, forms))) if forms else None

        def scrub(text: str) -> str:
            if hidden is not None:
                text = hidden.sub(REDACTED, text)
            if self._credential_pattern is not None:
                text = self._credential_pattern.sub(REDACTED_CREDENTIAL, text)
            return text

        changed = False
        for turn in episode.turns:
            if turn.reasoning_text:
                text = scrub(turn.reasoning_text)
                changed = changed or text != turn.reasoning_text
                turn.reasoning_text = text
            if turn.reasoning_items:
                items = json.loads(turn.reasoning_items)
                stored = []
                for item in items:
                    redacted = self._scrub_item(item, scrub)
                    if redacted != item and isinstance(redacted, dict):
                        redacted[REDACTED_ITEM_KEY] = True
                    stored.append(redacted)
                if stored != items:
                    changed = True
                    turn.reasoning_items = json.dumps(stored, ensure_ascii=False)
        return changed

    def _scrub_item(self, value: Any, scrub: Callable[[str], str], key: str | None = None) -> Any:
        """A copy of a reasoning item with every string scrubbed (thinking text also redacted)."""
        if isinstance(value, str):
            return scrub(self.redact_text(value) if key in _THINKING_TEXT_KEYS else value)
        if isinstance(value, dict):
            return {k: self._scrub_item(v, scrub, k) for k, v in value.items()}
        if isinstance(value, list):
            return [self._scrub_item(v, scrub, key) for v in value]
        return value

    def _scrub_fields(self, record: Any, hits: list[int]) -> None:
        """Scrub a record's fields in place; `hits[0]` counts the replacements (a counter the
        caller owns: this redactor is shared by every episode of a worker)."""
        for f in dataclasses.fields(record):
            value = getattr(record, f.name)
            scrubbed = self._scrub(value, hits)
            if scrubbed is not value:
                setattr(record, f.name, scrubbed)

    def _scrub(self, value: Any, hits: list[int]) -> Any:
        if type(value) is str:  # exactly str: an enum value (StopReason) is left as it is
            assert self._credential_pattern is not None
            text, n = self._credential_pattern.subn(REDACTED_CREDENTIAL, value)
            hits[0] += n
            return text
        if isinstance(value, list):
            return [self._scrub(v, hits) for v in value]
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            self._scrub_fields(value, hits)
        return value

    def call_record(self, call: ToolCall) -> ToolCallRecord:
        """How one tool call is stored: parsed and redacted, or only the fragment's length."""
        if call.status is not ArgStatus.MALFORMED and call.arguments is not None:
            stored = self.arguments_json(call.arguments)
            return ToolCallRecord(id=call.id, name=call.name, arguments_json=stored, status=call.status.value)
        fragment = _fragment(call)
        return ToolCallRecord(
            id=call.id,
            name=call.name,
            arguments_json=None,
            status=ArgStatus.MALFORMED.value,
            unparsed_chars=len(fragment),
            raw_fragment=fragment if self.keep_raw_fragments else None,
        )

    def message_record(self, message: Message, turn_index: int | None) -> MessageRecord:
        """One transcript message as stored (text redacted, calls via `call_record`)."""
        if isinstance(message, AssistantMessage):
            text, block = _split_unparsed(message.text)
            if block is not None:
                text = self.redact_text(text) + UNPARSED_MARKER.format(chars=len(block))
            else:
                text = self.redact_text(text)
            return MessageRecord(
                role="assistant",
                text=text,
                raw_text=block if self.keep_raw_fragments else None,
                tool_calls=[self.call_record(c) for c in message.tool_calls],
                turn_index=turn_index,
            )
        if isinstance(message, ToolResultMessage):
            return MessageRecord(
                role="tool",
                text=self.redact_text(message.content),
                call_id=message.call_id,
                name=message.name,
                is_error=message.is_error,
                turn_index=turn_index,
            )
        return MessageRecord(role=message.role, text=self.redact_text(message.text), turn_index=turn_index)

    def message_records(self, messages: Sequence[Message], turn_index: int | None) -> list[MessageRecord]:
        return [self.message_record(m, turn_index) for m in messages]


_BEARER = re.compile(r"(?i)(\bbearer\s+)[A-Za-z0-9._~+/=-]{8,}")
# `Basic <base64>`: the run must hold a digit, `+`, `/` or `=`, so that prose ("basic
# arithmetic") is left alone.
_BASIC = re.compile(r"(?i)(\bbasic\s+)(?=[A-Za-z]*[0-9+/=])[A-Za-z0-9+/]{8,}={0,2}")
# A key and its separator (the value is matched after it): a quoted or bare key of word
# characters, dots and dashes, then `:` or `=`.
_PAIR_HEAD = re.compile(r"(?<![\w.-])\"?([\w.-]+)\"?\s*[:=]\s*")
_PAIR_VALUE = re.compile(r"\"(?:[^\"\\]|\\.)*\"|'[^']*'|(?i:(?:bearer|basic)\s+)?[^\s,;&}\]]+")


def credential_values(
    api_key: str | None,
    basic_auth: tuple[str, str] | None = None,
    query: Sequence[tuple[str, str]] = (),
) -> tuple[str, ...]:
    """Every value an endpoint sends that is a credential, in every form it is sent.

    The key itself (in an `Authorization: Bearer`, `x-api-key` or `x-goog-api-key` header);
    for credentials written in the base URL, the password (or the user, when there is no
    password: a token in the user part), `user:pass`, its base64 (the `Basic` header) and
    the URL-encoded forms as written; for a query parameter named `key` or with a secret-like
    name (`token`, `api_key`, ...), its value. A user name beside a password is not treated
    as a credential (it would hide every "admin" in the transcripts).
    """
    found: list[str] = []
    if api_key:
        found.append(api_key)
    if basic_auth is not None:
        user, password = basic_auth
        pair = f"{user}:{password}"
        found += [password or user, pair, base64.b64encode(pair.encode()).decode()]
        found += [quote(password or user, safe=""), f"{quote(user, safe='')}:{quote(password, safe='')}"]
    keys = Redactor()
    for name, value in query:
        if value and (name.lower() == "key" or keys.is_secret_key(name)):
            found += [value, quote(value, safe="")]
    return tuple(dict.fromkeys(v for v in found if v))


def _leaves(value: Any) -> Iterable[str]:
    """The scalar values inside a redacted value, as the text a model would write them."""
    if isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    elif isinstance(value, list):
        for v in value:
            yield from _leaves(v)
    elif isinstance(value, str):
        yield value
    elif isinstance(value, int | float) and not isinstance(value, bool):
        yield str(value)


def _stored_forms(credential: str) -> set[str]:
    """The credential as it may appear in a stored string: raw, escaped inside JSON text, and
    as Python's repr writes it (tool errors quote an unknown tool name with `!r`)."""
    if not credential:
        return set()
    escaped = json.dumps(credential, ensure_ascii=False)[1:-1]
    ascii_escaped = json.dumps(credential)[1:-1]
    return {credential, escaped, ascii_escaped, repr(credential)[1:-1]}


def _fragment(call: ToolCall) -> str:
    """The argument text as received, for measuring (and only with the debug flag, keeping)."""
    if call.raw_arguments is not None:
        return call.raw_arguments
    if call.raw_object is not None:
        return json.dumps(call.raw_object, ensure_ascii=False)
    return ""


def _split_unparsed(text: str) -> tuple[str, str | None]:
    """(text before the first tool-call template opener, the block from it on), or (text, None).

    Only the public `has_template_opener` is used, so the opener table stays in one place.
    Whether a prefix holds an opener is monotonic in the prefix's length, and whether a
    window ending there still holds one is monotonic in its start, so two bisections find
    the first opener exactly (a dozen scans even for long text; most text has no opener
    and costs one scan).
    """
    if not has_template_opener(text):
        return text, None
    lo, hi = 1, len(text)  # the shortest prefix text[:end] that holds an opener
    while lo < hi:
        mid = (lo + hi) // 2
        if has_template_opener(text[:mid]):
            hi = mid
        else:
            lo = mid + 1
    end = lo
    lo, hi = 0, end - 1  # the latest start with an opener still inside text[start:end]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if has_template_opener(text[mid:end]):
            lo = mid
        else:
            hi = mid - 1
    return text[:lo], text[lo:]

"""What of an episode may be stored, and in what form: redaction on the way to the record.

The model's history (what the provider sees) is never touched; only the `Episode` record
written to shards goes through here. The rules, and why:

- Tool-call arguments are stored as the *parsed* object, with the value of every key that
  looks secret replaced by ``"[REDACTED]"``. Matching is by key: case-insensitive, with
  ``-`` and ``_`` ignored, a key is secret when it contains any configured name as a
  substring (``token`` catches ``access_token`` and ``X-Auth-Token``, and also
  ``max_tokens``: we err on the side of hiding). Nested objects and lists are walked.
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
  is secret-like, and ``Bearer ...`` credentials.

What is *not* redacted: a secret in prose with no key beside it ("my code is hunter2"), a
secret under an innocent key (``{"note": "sk-..."}``), and tool names. Environments that
handle real credentials should keep them out of tool results in the first place.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

from collector.data.record import MessageRecord, ToolCallRecord
from collector.providers.arguments import has_template_opener
from collector.turn import ArgStatus, AssistantMessage, Message, ToolCall, ToolResultMessage

REDACTED = "[REDACTED]"

#: What replaces an unparsed tool-call block in stored assistant text.
UNPARSED_MARKER = "[unparsed tool-call block: {chars} chars]"

DEFAULT_SECRET_KEYS: tuple[str, ...] = ("token", "password", "secret", "api_key", "authorization", "cookie")


def _norm(key: str) -> str:
    return key.lower().replace("-", "").replace("_", "")


class Redactor:
    """Key-based redaction with a per-key verdict cache (keys repeat across turns)."""

    __slots__ = ("_ascii_needles", "_cache", "_needles", "_text_pattern", "keep_raw_fragments")

    def __init__(
        self, secret_keys: Iterable[str] = DEFAULT_SECRET_KEYS, keep_raw_fragments: bool = False
    ) -> None:
        self._needles = tuple(n for n in (_norm(k) for k in secret_keys) if n)
        self._ascii_needles = all(n.isascii() for n in self._needles)
        self._cache: dict[str, bool] = {}
        self.keep_raw_fragments = keep_raw_fragments
        # The pattern pass for non-JSON text: a key containing a secret name, a separator,
        # then a quoted or bare value. The key part allows `-`/`_` anywhere so that
        # `api-key` and `X_Api_Key` match a configured `api_key`.
        alternatives = "|".join("[-_]?".join(re.escape(ch) for ch in n) for n in self._needles)
        if alternatives:
            self._text_pattern: re.Pattern[str] | None = re.compile(
                r"(?i)(\"?[\w-]*(?:" + alternatives + r")[\w-]*\"?\s*[:=]\s*)"
                r"(\"(?:[^\"\\]|\\.)*\"|'[^']*'|(?:(?:bearer|basic)\s+)?[^\s,;&}\]]+)"
            )
        else:
            self._text_pattern = None

    def is_secret_key(self, key: str) -> bool:
        verdict = self._cache.get(key)
        if verdict is None:
            norm = _norm(key)
            verdict = any(n in norm for n in self._needles)
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
            # `(?i)` does): both patterns need a secret name, with `-`/`_` allowed inside it,
            # or "bearer" in the text. Most text has neither, and the key pattern is the
            # costliest step of recording a turn (bench/overhead.py profile).
            folded = text.lower()
            squeezed = folded.replace("-", "").replace("_", "")
            if "bearer" not in folded and not any(n in squeezed for n in self._needles):
                return text
        if self._text_pattern is not None:
            text = self._text_pattern.sub(_keep_key, text)
        return _BEARER.sub(r"\1" + REDACTED, text)

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


def _keep_key(match: re.Match[str]) -> str:
    return match.group(1) + REDACTED


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

"""Token capture: what the model sampled, token by token, onto the turn records.

With `sampling.token_ids` the adapters ask each server for its ids (`collector.providers.chat`)
and put whatever came back on the `Turn`. Here, per turn, at record time:

- ids outside the vocabulary are not stored: an id that is negative, or not below the
  vocabulary size the server reported (`Turn.vocab_size`; unreported: `TOKEN_ID_LIMIT`,
  2**31), is not a token this model has, so the ids are not what was sampled. The turn then
  keeps no ids at all (output and prompt; logprobs stay), says why (`tokens_rejected =
  "id_out_of_range"`), and the next turn has no previous sequence to extend (token-in: it
  goes as text, `no_previous_ids`); the trainer view leaves the episode out (`no_token_ids`);
- the output ids and logprobs are stored as returned, and `token_counts_ok` says whether
  they are as many as the server's own output-token count (and each other). The one
  accepted shortfall is the stop-string rule: llama.cpp counts a matched `sampling.stop`
  string in usage and returns none of its ids. A turn whose finish is `stop` or `tool_calls`
  (not a cap), asked with
  stop strings, and short by at most the longest stop string's UTF-8 byte length (a bound
  any tokenizer respects: a token is at least one byte) is counted ok, the shortfall stored
  as `stop_tokens_uncounted`. Its sequence ends before the stop string: the ids are exactly
  what was sampled and returned, so the loss mask covers them and nothing else;
- the prompt ids are stored as a delta: `prompt_ids_offset` is how many leading ids the
  prompt shares with the previous turn's prompt + output, `prompt_token_ids` the rest.
  `prefix_consistent` is true when the whole previous sequence is shared: the server
  rendered history exactly as it sampled it, so the episode can be trained as one
  sequence. When it is false, `drift_offset`, `drift_expected_id` and `drift_found_id` say
  where the re-rendered prompt first differs and which id it has there instead (the drift
  report, `drift` in `collector.analysis.trainer.token_summary`, counts them). The full
  prompt of turn k is ``(prompt_k-1 + output_k-1)[:offset_k] + delta_k``
  (`collector.analysis.trainer.full_prompts`).

Token-in mode (`sampling.token_in`). The tracker also builds what a later turn's prompt
extends (`prefix`: the previous prompt ids + output ids, the stop string those ids do not
hold, and where in the history that turn's assistant message sits), which the loop puts on
the request; the adapter (`collector.providers.tokenin`) bridges it to the new messages.
Per turn it stores `prompt_sent_as_ids` and `token_in_fallback`, and, since the sent prompt
extends the previous sequence by construction, the drift fields then compare the sent ids
with the server's own re-rendering of the same history (`Turn.rerendered_prompt_ids`): the
drift a re-rendering server would have caused, measured in the mode that avoids it.

Redaction. Token ids decode back to whatever the model wrote, thought and was shown, a
secret included, and no redaction of the stored text can reach inside them. So the rule is:
when the record of the episode had anything scrubbed, the episode keeps no token ids at all
(`tokens_withheld` on every turn; logprobs, which are numbers, are kept). "Anything" is every
scrub the record gets: a value the redactor hides in the history (model text, a call's
arguments raw or parsed, a tool result, a prompt: `holds_secret`), a secret in a turn's
reasoning text or items, and any form of a credential the run was given, wherever in the
record it appears (`Redactor.scrub`, which the loop asks after building the record). The
trainer view leaves such episodes out. What the redactor does not see (a secret the run was
not given, in prose with no key beside it) is not seen here either: the same documented limits.
"""

from __future__ import annotations

from collections.abc import Sequence

from collector.episode.redact import Redactor
from collector.record.episode import TurnRecord, token_id_limit
from collector.turn import (
    AssistantMessage,
    Message,
    SystemMessage,
    TokenPrefix,
    ToolResultMessage,
    Turn,
    UserMessage,
)

__all__ = ["TokenTracker", "common_prefix", "holds_secret", "withhold"]


_STOPPED = ("stop", "tool_calls", "word", "eos")
"""Finish reasons of a turn that ended by itself (a stop string, or EOG): never a cap. A call
turn ended on a stop string is `tool_calls` on llama.cpp (measured: 31 ids of 36 counted);
`word` and `eos` are llama.cpp `/completion`'s `stop_type` for the same (token-in mode)."""


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading items `a` and `b` share."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class TokenTracker:
    """Per episode: the previous turn's full sequence, to store prompts as deltas."""

    __slots__ = ("asked_at", "previous", "requested", "stop_bytes", "stop_text", "temperature")

    def __init__(self, requested: bool, temperature: float | None, stop: Sequence[str] | None = None) -> None:
        self.requested = requested
        self.temperature = temperature
        self.stop_bytes = max((len(s.encode()) for s in stop or ()), default=0)
        """The longest stop string in UTF-8 bytes: no tokenizer makes it more tokens than that."""
        self.previous: list[int] | None = None
        """The previous turn's prompt + output ids (None: unknown, no delta possible)."""
        self.stop_text = ""
        """The stop string that ended the previous turn and that its output ids do not hold."""
        self.asked_at: int | None = None
        """The history's length when the previous turn was asked (None: no turn yet)."""

    def prefix(self, history_len: int) -> TokenPrefix | None:
        """Token-in mode: what this turn's prompt extends (None on the first turn), called
        once per turn just before the request, with the history's current length."""
        asked_at, self.asked_at = self.asked_at, history_len
        if asked_at is None:
            return None
        ids = list(self.previous) if self.previous is not None else None
        return TokenPrefix(ids, self.stop_text, asked_at)

    def fill(self, record: TurnRecord, turn: Turn) -> None:
        """Put the turn's token capture on its record (see the module docstring)."""
        ids, logprobs, prompt = turn.token_ids, turn.logprobs, turn.prompt_token_ids
        record.tokens_requested = self.requested
        record.temperature = self.temperature
        record.token_vocab_size = turn.vocab_size
        limit = token_id_limit(turn.vocab_size)
        # min/max run in C: the whole prompt is checked every turn, and prompts grow long.
        if any(min(seq) < 0 or max(seq) >= limit for seq in (ids, prompt, turn.rerendered_prompt_ids) if seq):
            record.output_logprobs = logprobs
            record.tokens_rejected = "id_out_of_range"
            record.prompt_sent_as_ids = turn.prompt_sent_as_ids
            record.token_in_fallback = turn.token_in_fallback
            self.stop_text = ""
            self.previous = None  # nothing to extend: the next turn's prompt is not a delta
            return
        record.output_token_ids = ids
        record.output_logprobs = logprobs
        if ids is not None and turn.usage.known:
            # With no usable count from the server there is nothing to compare the ids with:
            # None ("not known"), never a mismatch that would drop the episode from training.
            missing = turn.usage.output_tokens - len(ids)
            if 0 < missing <= self.stop_bytes and turn.raw_finish_reason in _STOPPED:
                # The stop-string rule: the turn ended on a stop string the server counted but
                # returned no ids for; the ids end before it, so nothing sampled is missing.
                record.stop_tokens_uncounted = missing
                missing = 0
            record.token_counts_ok = missing == 0 and (logprobs is None or len(logprobs) == len(ids))
        previous = self.previous
        record.prompt_sent_as_ids = turn.prompt_sent_as_ids
        record.token_in_fallback = turn.token_in_fallback
        self.stop_text = turn.unreturned_stop or ""
        if prompt is None:
            self.previous = None
            return
        if previous is not None:
            offset = common_prefix(previous, prompt)
            record.prefix_consistent = offset == len(previous)
            if offset < len(previous):
                # The drift diagnostic: the first id the server rendered differently. Ids
                # only (no text), and `withhold` drops them with the rest.
                record.drift_offset = offset
                record.drift_expected_id = previous[offset]
                record.drift_found_id = prompt[offset] if offset < len(prompt) else None
        else:
            offset = 0
        rerendered = turn.rerendered_prompt_ids
        if rerendered is not None and record.drift_offset is None and previous is not None:
            # Token-in: where the server's own re-rendering first departs from the ids sent.
            at = common_prefix(prompt, rerendered)
            if at < len(prompt) or at < len(rerendered):
                record.drift_offset = at
                record.drift_expected_id = prompt[at] if at < len(prompt) else None
                record.drift_found_id = rerendered[at] if at < len(rerendered) else None
        record.prompt_ids_offset = offset
        record.prompt_token_ids = prompt[offset:]
        self.previous = prompt + ids if ids is not None else None


def holds_secret(redactor: Redactor, history: Sequence[Message]) -> bool:
    """True when the redactor would hide something in any of these messages."""
    for m in history:
        if isinstance(m, AssistantMessage):
            if redactor.redact_text(m.text) != m.text:
                return True
            for call in m.tool_calls:
                raw = call.raw_arguments
                if raw is not None and redactor.redact_text(raw) != raw:
                    return True
                for value in (call.arguments, call.raw_object):
                    if value is not None and redactor.redact_value(value) != value:
                        return True
        elif isinstance(m, ToolResultMessage):
            if redactor.redact_text(m.content) != m.content:
                return True
        elif isinstance(m, UserMessage | SystemMessage) and redactor.redact_text(m.text) != m.text:
            return True
    return False


def withhold(turns: Sequence[TurnRecord]) -> None:
    """Drop every token id of the episode (the redaction rule); logprobs stay."""
    for t in turns:
        t.output_token_ids = None
        t.prompt_token_ids = None
        t.prompt_ids_offset = 0
        t.token_counts_ok = None
        t.prefix_consistent = None
        t.drift_offset = t.drift_expected_id = t.drift_found_id = t.stop_tokens_uncounted = None
        t.tokens_withheld = True

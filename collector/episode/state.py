"""The mutable state of one running episode: its history, its record, its counters.

`EpisodeState` is what `collector.episode.loop` drives turn by turn: it records each turn
(`add_turn`: the turn's record, its redacted messages, its token capture), renames repeated
call ids, settles every call exactly once (`answer`, `settle`) and runs a turn's calls in the
check order's steps 3-5 (`dispatch`, `execute`). `Failure` ends an episode as `error` with a
record that is already secret-free.

Tests: tests/episode/test_loop.py, tests/episode/test_call_ids.py, tests/episode/test_property.py
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from collector.config import LoopConfig, RedactionConfig
from collector.envs.base import EpisodeContext, Task, Tool, ToolCallContext
from collector.envs.toolkit import run_tool
from collector.episode.notices import duplicate, held, malformed
from collector.episode.redact import Redactor
from collector.episode.tokens import TokenTracker
from collector.errors import EnvironmentFailure
from collector.record.episode import EpisodeError, ExecutedToolCall, MessageRecord, TurnRecord
from collector.turn import (
    ArgStatus,
    AssistantMessage,
    FinishClass,
    Message,
    ToolCall,
    ToolResultMessage,
    Turn,
    UserMessage,
)

__all__ = ["CHARS_PER_TOKEN", "EpisodeState", "Failure", "env_failure", "invisible", "redactor_for"]

CHARS_PER_TOKEN = 4
"""The prompt estimate's exchange rate (English text and JSON, BPE tokenizers): conservative
enough with the provider's own count of everything up to the last turn."""

#: Raw finish reasons meaning "the model tried to call a tool and the server could not read
#: it" on turns that carry no call at all (Gemini drops the call and says so).
_FAILED_CALL_REASONS = frozenset({"MALFORMED_FUNCTION_CALL"})


def invisible(turn: Turn, calls: list[ToolCall]) -> bool:
    """Output tokens spent on nothing the record can show (step 3 of the check order)."""
    return (
        turn.usage.output_tokens > 0
        and not turn.is_length
        and not turn.text
        and not calls
        and turn.refusal is None
        and not turn.reasoning
        and turn.finish_class is not FinishClass.CONTENT_FILTER
    )


class Failure(Exception):
    """Ends the episode as `error` with an already secret-free record."""

    def __init__(self, error: EpisodeError) -> None:
        super().__init__(error.type)
        self.error = error


_REDACTORS: dict[tuple[tuple[str, ...], bool, tuple[str, ...]], Redactor] = {}


def redactor_for(config: RedactionConfig, credentials: tuple[str, ...] = ()) -> Redactor:
    key = (tuple(config.secret_keys), config.keep_raw_fragments, credentials)
    found = _REDACTORS.get(key)
    if found is None:
        found = _REDACTORS[key] = Redactor(config.secret_keys, config.keep_raw_fragments, credentials)
    return found


def env_failure(phase: str, exc: Exception, redactor: Redactor) -> Failure:
    text = redactor.redact_text(str(exc))[:300]
    message = f"{phase}: {type(exc).__name__}: {text}" if text else f"{phase}: {type(exc).__name__}"
    # A typed environment failure (a verifier timeout, an image that did not build) keeps its
    # own name as the recorded cause, so `collector stats` can tell infrastructure apart.
    cause = type(exc).__name__ if isinstance(exc, EnvironmentFailure) else EnvironmentFailure.__name__
    return Failure(EpisodeError(cause, message))


class EpisodeState:
    """The mutable state of one running episode: history, records, counters."""

    __slots__ = (
        "context",
        "duplicates",
        "executed",
        "final_text",
        "history",
        "open_calls",
        "open_index",
        "output_used",
        "records",
        "redactor",
        "reported_at",
        "reported_prompt",
        "results",
        "retries",
        "scrubbed",
        "settings",
        "tokens",
        "tool_errors",
        "turns",
        "wire_cache",
    )

    def __init__(self, task: Task, settings: LoopConfig, redactor: Redactor) -> None:
        prompt: list[Message]
        prompt = [UserMessage(task.prompt)] if isinstance(task.prompt, str) else list(task.prompt)
        self.history = prompt
        self.wire_cache: dict[str, Any] = {}  # the adapter's encoded history, turn to turn
        self.records: list[MessageRecord] = redactor.message_records(prompt, None)
        self.settings = settings
        self.redactor = redactor
        self.turns: list[TurnRecord] = []
        self.executed: list[ExecutedToolCall] = []
        self.tool_errors = 0
        self.output_used = 0
        self.final_text: str | None = None
        self.open_calls: list[ToolCall] = []
        self.open_index = 0
        self.results: dict[str, ToolResultMessage] = {}
        self.duplicates: dict[str, str] = {}
        """This turn's renamed calls: new id -> the id it repeated."""
        self.context: EpisodeContext | None = None
        self.retries: list[str] = []
        """Causes of every retried request of the episode (`Episode.retries`)."""
        self.tokens = TokenTracker(False, None)
        self.reported_prompt = 0
        """Input + output tokens of the last turn, as the provider counted them (step 0b)."""
        self.reported_at = 0
        """How much of `history` that count covers."""
        self.scrubbed = False
        """Redaction hid something of a turn's reasoning text as it was recorded (the token
        rule needs it: the raw reasoning is in no message of the history)."""

    def extend_prompt(self, text: str) -> None:
        """Append `text` to the prompt's last user message (a new user message when it has none),
        before the first turn: how a world's `initial_observation` reaches the model."""
        for i in range(len(self.history) - 1, -1, -1):
            message = self.history[i]
            if isinstance(message, UserMessage):
                self.history[i] = UserMessage(message.text + text)
                break
        else:
            self.history.append(UserMessage(text))
        self.records = self.redactor.message_records(self.history, None)

    def prompt_estimate(self) -> int:
        """Tokens the next request's messages will take: the provider's own count of the last
        turn (its prompt and its output) plus what was added since at ~4 characters a token;
        before any turn, the whole history that way."""
        added = self.history[self.reported_at:] if self.reported_prompt else self.history
        chars = 0
        for m in added:
            chars += len(getattr(m, "text", "") or getattr(m, "content", ""))
            for c in getattr(m, "tool_calls", ()):
                chars += len(c.name) + len(json.dumps(c.arguments or {}))
        return (self.reported_prompt if self.reported_prompt else 0) + chars // CHARS_PER_TOKEN

    def add_turn(self, turn: Turn, cap: int, tools_offered: bool = False) -> TurnRecord:
        index = len(self.turns)
        calls = self.unique_ids(turn.tool_calls)
        reasoning = None
        if turn.reasoning_text:
            reasoning = self.redactor.redact_text(turn.reasoning_text)
            self.scrubbed = self.scrubbed or reasoning != turn.reasoning_text
        unparsed = turn.unparsed_tool_call or (not calls and turn.raw_finish_reason in _FAILED_CALL_REASONS)
        record = TurnRecord(
            index=index,
            raw_finish_reason=turn.raw_finish_reason,
            finish_class=turn.finish_class.value,
            length_signals=[s.value for s in turn.length_signals],
            incomplete_reason=turn.incomplete_reason,
            output_tokens=turn.usage.output_tokens,
            input_tokens=turn.usage.input_tokens,
            usage_known=turn.usage.known,
            max_output_tokens=cap,
            latency_s=turn.latency_s,
            repairs=[c.repair for c in calls if c.repair],
            num_tool_calls=len(calls),
            malformed_calls=sum(1 for c in calls if c.status is ArgStatus.MALFORMED),
            discarded=False,
            unparsed_tool_call=unparsed,
            response_model=turn.response_model,
            system_fingerprint=turn.system_fingerprint,
            invisible_output=tools_offered and not unparsed and invisible(turn, calls),
            retries=list(turn.retries),
            reasoning_text=reasoning,
            reasoning_tokens=turn.reasoning_tokens,
            reasoning_items=json.dumps(turn.reasoning_items, ensure_ascii=False)
            if turn.reasoning_items
            else None,
            policy_version=turn.policy_version,
            policy_version_source=turn.policy_version_source,
        )
        self.retries.extend(turn.retries)
        self.tokens.fill(record, turn)
        self.turns.append(record)
        self.output_used += turn.usage.output_tokens
        message = AssistantMessage(turn.text, calls, reasoning_items=turn.reasoning_items)
        if turn.text or calls:
            # An empty turn (a cap spent on thinking, or on nothing) stays in the record but is
            # never replayed: chat would send `content: null`, Anthropic an empty text block,
            # Gemini an empty part, all rejected by strict backends.
            self.history.append(message)
        self.records.append(self.redactor.message_record(message, index))
        self.reported_prompt = turn.usage.input_tokens + turn.usage.output_tokens
        self.reported_at = len(self.history)
        self.open_calls = calls
        self.open_index = index
        self.results = {}
        for call in calls:
            original = self.duplicates.get(call.id)
            if original is not None:
                self.answer(call, duplicate(original), True)
        return record

    def unique_ids(self, calls: list[ToolCall]) -> list[ToolCall]:
        """The turn's calls, a repeated id renamed ``{id}_dup{n}`` (see the module docstring)."""
        self.duplicates = {}
        if len(calls) < 2 or len({c.id for c in calls}) == len(calls):
            return calls
        taken = {c.id for c in calls}
        seen: set[str] = set()
        out: list[ToolCall] = []
        for call in calls:
            if call.id in seen:
                n = 1
                while f"{call.id}_dup{n}" in taken:
                    n += 1
                renamed = f"{call.id}_dup{n}"
                taken.add(renamed)
                self.duplicates[renamed] = call.id
                call = dataclasses.replace(call, id=renamed)
            seen.add(call.id)
            out.append(call)
        return out

    def answer(self, call: ToolCall, content: str, is_error: bool) -> None:
        if call.id not in self.results:
            self.results[call.id] = ToolResultMessage(call.id, call.name, content, is_error)

    def settle(self, fallback: str) -> None:
        """Close the open turn: every call gets its result (or `fallback`), in call order."""
        results = self.results
        for call in self.open_calls:
            result = results.get(call.id)
            if result is None:
                result = ToolResultMessage(call.id, call.name, fallback, True)
            if result.is_error:
                self.tool_errors += 1
            self.history.append(result)
            self.records.append(self.redactor.message_record(result, self.open_index))
        self.open_calls = []
        self.results = {}

    def notice(self, text: str) -> None:
        message = UserMessage(text)
        self.history.append(message)
        self.records.append(self.redactor.message_record(message, self.open_index))

    async def dispatch(self, calls: list[ToolCall], tools: dict[str, Tool]) -> None:
        """Steps 3 (continuing), 4 and 5 of the check order for one turn's calls."""
        runnable: list[ToolCall] = []
        held_by: str | None = None
        for call in calls:
            tool_ = tools.get(call.name)
            if call.id in self.duplicates:  # already answered; a gate that does not go through holds
                if tool_ is not None and tool_.gate:
                    held_by = held_by or call.name
            elif call.status is ArgStatus.MALFORMED or call.arguments is None:
                self.answer(call, malformed(call), True)
                if tool_ is not None and tool_.gate:
                    held_by = held_by or call.name
            elif tool_ is None:
                self.answer(call, f"error: there is no tool named {call.name[:64]!r}; nothing was run", True)
            else:
                runnable.append(call)
        gates = [c for c in runnable if tools[c.name].gate]
        for call in gates:
            if held_by is None and await self.execute(call, tools[call.name]):
                held_by = call.name
        for call in runnable:
            if call.id in self.results:
                continue
            if held_by is not None:
                self.answer(call, held(held_by), True)
            else:
                await self.execute(call, tools[call.name])

    async def execute(self, call: ToolCall, tool_: Tool) -> bool:
        """Run one call; True when its result is an error."""
        assert call.arguments is not None
        context = None
        if tool_.context_parameter is not None and self.context is not None:
            context = ToolCallContext(self.context, call.id, self.open_index)
        def record_executed(is_error: bool) -> None:
            assert call.arguments is not None
            self.executed.append(ExecutedToolCall(
                turn_index=self.open_index, call_id=call.id, name=call.name,
                arguments_json=self.redactor.arguments_json(call.arguments), is_error=is_error,
            ))

        try:
            outcome = await run_tool(
                tool_, call.arguments, self.settings.tool_timeout_s, context=context,
                max_result_bytes=self.settings.max_tool_result_bytes,
            )
        except EnvironmentFailure as exc:
            # The world broke under the call (its tool server died): the call was sent, so it
            # is recorded as run, and the episode ends as `error` naming the cause.
            record_executed(is_error=True)
            raise env_failure(f"tool {call.name[:64]}", exc, self.redactor) from exc
        if outcome.ran:
            record_executed(outcome.is_error)
        self.answer(call, outcome.content, outcome.is_error)
        return outcome.is_error


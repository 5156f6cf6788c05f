"""Pieces every adapter shares: tool-call construction, the length checks, and replay of arguments.

`finish_turn` is the single place where a turn becomes a length turn. It applies the checks in
the order documented in `collector.turn` and records every one that holds:

1. FINISH_REASON   the adapter says the transport's own vocabulary reported the cap;
2. CAP_REACHED     `usage.output_tokens >= max_output_tokens`, usage known (servers that say
                   `tool_calls` for a call cut at the cap: vllm #58228, llama.cpp; llama-server's
                   Responses route, which never says `incomplete`);
3. STREAM_CUT      the terminal event arrived with the output left open (a tool call never
                   closed, or no finish reason); a stream without its terminal event never
                   gets here: the adapter raises `ProviderUnavailable` and it is retried;
4. UNCLOSED_TEMPLATE  the text holds an opened, unclosed chat-template tool-call block,
                   unless the turn ended naturally (finish `stop`) with its output tokens
                   counted and under the cap: then a stop sequence or the end-of-turn token
                   cut the block, not the cap, and it is an unparsed tool call, not a cut
                   (llama-server with a stop word that matched inside a call: streamed,
                   the same generation arrives empty; both must end alike).
5. REASONING       the turn thought and shows no text and no call, and is cut by 1-4 or
                   spent 90% of the cap on reasoning tokens: "the cap went to thinking";

Keeping this in one function means the four transports cannot disagree about what "cut" is.

Unknown usage. A server may report no usable token count: no usage object (a Chat stream that
ignores `include_usage`), all zeros (LiteLLM's Gemini stream sends `usageMetadata` with every
count 0), or 0 output tokens for a turn that shows text, a call or reasoning. A prompt always
has at least one token and visible output at least one, so none of these is a measurement:
`finish_turn` marks such a turn's usage `known=False` (per turn, by `usage_known`) instead of
recording a count of 0. What the rules can still see then: FINISH_REASON (the transport's own
vocabulary: LiteLLM's Gemini still says `MAX_TOKENS` for a cut), STREAM_CUT, UNCLOSED_TEMPLATE
(stricter: without a count, the "stopped under the cap" exception cannot apply, so every
unclosed block is a cut) and REASONING when another signal holds. What they cannot see:
CAP_REACHED, so a complete call that ended exactly on the cap and is reported `STOP` runs
(LiteLLM's Gemini stream: every other wire calls that turn `length`), and REASONING by the
90% share of reasoning tokens. A cut call does not run even then on that route: LiteLLM emits a
streamed call only once its arguments parse, and the turn says `MAX_TOKENS`.

Tests: tests/providers/test_scenarios.py, tests/providers/test_limits.py,
tests/providers/test_real_servers.py.
"""

from __future__ import annotations

import json
import math
from typing import Any

from collector.providers.arguments import has_template_opener, parse_arguments, unclosed_template
from collector.turn import (
    ArgStatus,
    FinishClass,
    JSONObject,
    LengthSignal,
    ToolCall,
    Turn,
    Usage,
)

__all__ = [
    "as_int",
    "call_from_object",
    "call_from_text",
    "encode_body",
    "finish_turn",
    "logprob_or_nan",
    "merge_extra",
    "replay_object",
    "replay_text",
    "usage_known",
]


def encode_body(body: JSONObject) -> bytes:
    """The request body, encoded once per call (retries reuse the bytes)."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def merge_extra(body: JSONObject, extra: JSONObject) -> None:
    """Merge `extra_body` into a request body, last: objects merge key by key, anything else replaces.

    Merging objects lets a user add `generationConfig.thinkingConfig` (Gemini) or
    `stream_options.include_obfuscation` without restating the fields the adapter set.
    """
    for key, value in extra.items():
        current = body.get(key)
        if isinstance(current, dict) and isinstance(value, dict):
            merged = dict(current)
            merge_extra(merged, value)
            body[key] = merged
        else:
            body[key] = value


def logprob_or_nan(value: Any) -> float:
    """A reply's logprob as a float, NaN where it is missing or not a number (a list of them
    stays aligned with the tokens)."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else math.nan


def as_int(value: Any) -> int:
    """A token count from the wire; anything that is not a plain int counts as 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _text(value: Any) -> str:
    # A non-conforming server may send any JSON as a call id or name; the loop keys results
    # by id, so anything that is not a string becomes one rather than crash it (fuzzing).
    return value if isinstance(value, str) else json.dumps(value, default=str)


def call_from_text(call_id: str, name: str, raw: Any, had_wire_id: bool = True) -> ToolCall:
    """A call whose arguments arrive as JSON text (OpenAI families, Anthropic streams)."""
    call_id, name = _text(call_id), _text(name)
    if isinstance(raw, str):
        value, status, repair = parse_arguments(raw)
        return ToolCall(
            call_id, name, value, status, raw_arguments=raw, repair=repair, had_wire_id=had_wire_id
        )
    if isinstance(raw, dict):
        # A non-conforming server sent an object where the wire says string: keep it as an object.
        return ToolCall(call_id, name, raw, ArgStatus.OK, raw_object=raw, had_wire_id=had_wire_id)
    return ToolCall(call_id, name, None, ArgStatus.MALFORMED, had_wire_id=had_wire_id)


def call_from_object(call_id: str, name: str, raw: Any, had_wire_id: bool = True) -> ToolCall:
    """A call whose arguments arrive as an object (Anthropic `input`, Gemini `args`).

    An object is OK as far as parsing goes; whether the call may run is decided by the turn's
    length status, never by the fact that it parsed.
    """
    call_id, name = _text(call_id), _text(name)
    if raw is None:
        raw = {}  # Gemini omits `args` for a call without parameters.
    if isinstance(raw, dict):
        return ToolCall(call_id, name, raw, ArgStatus.OK, raw_object=raw, had_wire_id=had_wire_id)
    return ToolCall(call_id, name, None, ArgStatus.MALFORMED, had_wire_id=had_wire_id)


def replay_text(call: ToolCall) -> str:
    """Argument text to send back: the model's own text when it parsed, `"{}"` when it did not.

    A repaired call is replayed as the repaired object, never with the leaked delimiter that
    some backends (Qwen on vLLM) would re-parse and reject with a 500.
    """
    if call.status is ArgStatus.MALFORMED or call.arguments is None:
        return "{}"
    if call.status is ArgStatus.OK and call.raw_arguments is not None:
        return call.raw_arguments
    return json.dumps(call.arguments, ensure_ascii=False, separators=(",", ":"))


def replay_object(call: ToolCall) -> JSONObject:
    """Argument object to send back (dialects that take objects); `{}` for a malformed call."""
    if call.status is ArgStatus.MALFORMED or call.arguments is None:
        return {}
    return call.arguments


def usage_known(usage: Usage, shows_output: bool) -> bool:
    """Whether `usage` is the server's measure (see "Unknown usage" in the module docstring)."""
    if not usage.known:
        return False
    if usage.output_tokens > 0:
        return True
    # 0 output tokens: a measure only for a turn with nothing to show and a counted prompt.
    return usage.input_tokens > 0 and not shows_output


def finish_turn(
    *,
    text: str,
    tool_calls: list[ToolCall],
    raw_finish_reason: str | None,
    mapped: FinishClass,
    says_length: bool,
    usage: Usage,
    max_output_tokens: int,
    latency_s: float,
    stream_cut: bool = False,
    incomplete_reason: str | None = None,
    refusal: str | None = None,
    token_ids: list[int] | None = None,
    logprobs: list[float] | None = None,
    response_id: str | None = None,
    response_model: str | None = None,
    system_fingerprint: str | None = None,
    reasoning: bool = False,
    prompt_token_ids: list[int] | None = None,
    reasoning_text: str | None = None,
    reasoning_tokens: int = 0,
    reasoning_items: list[JSONObject] | None = None,
) -> Turn:
    """Apply the length checks in their documented order and build the `Turn`."""
    shows_output = bool(text or tool_calls or refusal or reasoning or reasoning_text or reasoning_items)
    if not usage_known(usage, shows_output):
        usage = Usage(usage.input_tokens, usage.output_tokens, known=False)
    signals: list[LengthSignal] = []
    if says_length:
        signals.append(LengthSignal.FINISH_REASON)
    if usage.known and max_output_tokens > 0 and usage.output_tokens >= max_output_tokens:
        signals.append(LengthSignal.CAP_REACHED)
    if stream_cut:
        signals.append(LengthSignal.STREAM_CUT)
    stopped_short = mapped is FinishClass.STOP and 0 < usage.output_tokens < max_output_tokens
    if text and not stopped_short and unclosed_template(text) is not None:
        signals.append(LengthSignal.UNCLOSED_TEMPLATE)
    thought = reasoning or bool(reasoning_text) or bool(reasoning_items) or reasoning_tokens > 0
    if thought and not text and not tool_calls and (
        signals or (max_output_tokens > 0 and reasoning_tokens * 10 >= max_output_tokens * 9)
    ):
        signals.append(LengthSignal.REASONING)
    # Stored as string columns: a server's finish reason of any other JSON type is kept as text.
    if raw_finish_reason is not None:
        raw_finish_reason = _text(raw_finish_reason)
    if incomplete_reason is not None:
        incomplete_reason = _text(incomplete_reason)
    return Turn(
        text=text if isinstance(text, str) else _text(text),
        tool_calls=tool_calls,
        raw_finish_reason=raw_finish_reason,
        finish_class=FinishClass.LENGTH if signals else mapped,
        usage=usage,
        max_output_tokens=max_output_tokens,
        latency_s=latency_s,
        incomplete_reason=incomplete_reason,
        length_signals=tuple(signals),
        unparsed_tool_call=bool(text) and has_template_opener(text),
        refusal=refusal,
        token_ids=token_ids,
        logprobs=logprobs,
        prompt_token_ids=prompt_token_ids,
        response_id=response_id,
        response_model=response_model if isinstance(response_model, str) else None,
        system_fingerprint=system_fingerprint if isinstance(system_fingerprint, str) else None,
        reasoning=reasoning or bool(reasoning_text) or bool(reasoning_items),
        reasoning_text=reasoning_text or None,
        reasoning_tokens=reasoning_tokens,
        reasoning_items=reasoning_items or [],
    )

"""The provider-neutral vocabulary: messages, tool calls, and one normalized model turn.

Every provider adapter turns its wire format into a `Turn` and turns a list of `Message`
back into its own dialect. The episode loop, the episode record and the shard writer only
ever see these types, so a cut or broken call looks the same whatever transport it came from.

These are plain slotted dataclasses, not pydantic models: they sit on the per-turn hot path
and cross Ray boundaries, so they must be cheap to build and to pickle.

Length detection. A turn is a *length turn* when any of the `LengthSignal`s holds; the
adapters check them in this order and record every one that applies:

1. `FINISH_REASON`: the transport's own vocabulary says the cap was hit
   (`finish_reason: "length"`, `stop_reason: "max_tokens"`, Responses `status: "incomplete"`
   with reason `max_output_tokens`, `finishReason: "MAX_TOKENS"`);
2. `CAP_REACHED`: output tokens reached the requested cap, whatever the finish reason says
   (vLLM and llama.cpp report `tool_calls` for a call cut at the cap);
3. `STREAM_CUT`: a stream *reached* its terminal event (Chat `[DONE]`, Responses
   `response.completed`/`.incomplete`, Anthropic `message_stop`) with its output left open:
   a tool call never closed (Anthropic `tool_use` without `content_block_stop`, Responses
   `function_call` item without `output_item.done`) or no finish reason at all (Chat choice
   without `finish_reason`, Anthropic without a `message_delta` stop reason). Gemini streams
   have no terminal event, so they never carry it. A stream that *ends before* its terminal
   event is not a length turn: it is a dropped stream, retried and, past the retries,
   `ProviderUnavailable`;
4. `UNCLOSED_TEMPLATE`: the text holds an opened but unclosed chat-template tool-call block,
   unless the server says the turn stopped naturally with fewer output tokens than the cap
   (a stop sequence matched inside the call): that turn is an unparsed tool call, not a cut;
5. `REASONING`: the cap was spent on thinking: the turn reasoned, shows no text and no call,
   and either another signal holds or its reasoning tokens reached 90% of the cap (a server
   that says `stop` for a turn that only thought). Recorded beside the signal that caught the
   cut, so `collector stats` can count "cut while thinking" apart.

The raw finish reason is kept beside the derived `finish_class`, never replaced by it.

Tests: tests/providers/test_scenarios.py, tests/providers/test_properties.py, tests/episode/test_loop.py
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

#: What replaces the value of a credential the run was given wherever it would be stored or
#: shown (a turn's text, a tool's result, an MCP server's log line, a grader's error): one
#: marker for every layer, so a reader searching for it finds every scrubbed place.
REDACTED_CREDENTIAL = "[redacted credential]"

JSONObject = dict[str, Any]


class FinishClass(StrEnum):
    """The normalized, *derived* finish class of a turn (length detection applied)."""

    STOP = "stop"
    """A natural end: final text, a stop sequence, or a refusal."""
    TOOL_CALLS = "tool_calls"
    """The model asked for tools and the turn is complete."""
    LENGTH = "length"
    """The turn was cut by the output cap (any `LengthSignal`)."""
    CONTENT_FILTER = "content_filter"
    """The provider withheld content (safety, recitation, blocked prompt)."""
    OTHER = "other"
    """Anything else, including unknown finish reasons: kept raw on the turn."""


class LengthSignal(StrEnum):
    """Which evidence marked a turn as cut by the output cap (see the module docstring)."""

    FINISH_REASON = "finish_reason"
    """The transport's own finish vocabulary says the output cap was hit."""
    CAP_REACHED = "cap_reached"
    """Output tokens reached the requested cap, whatever the finish reason says."""
    STREAM_CUT = "stream_cut"
    """The stream got its terminal event with a tool call left open or no finish reason (a
    stream without its terminal event is a dropped stream, retried, never this)."""
    UNCLOSED_TEMPLATE = "unclosed_template"
    """The text holds an opened but unclosed chat-template tool-call block."""
    REASONING = "reasoning"
    """The cap was spent on reasoning: no visible text, no call (see the module docstring)."""


class ArgStatus(StrEnum):
    """How a tool call's arguments were obtained."""

    OK = "ok"
    """Strict JSON parsing gave an object (or the transport sent an object)."""
    REPAIRED = "repaired"
    """Strict parsing failed; one conservative repair (named in `ToolCall.repair`) gave an object."""
    MALFORMED = "malformed"
    """Nothing gave a JSON object; `ToolCall.arguments` is None and the call must never run."""


@dataclass(slots=True)
class ToolCall:
    """One tool call as the model made it, with how its arguments were parsed.

    `raw_arguments` is the argument text exactly as received (OpenAI families); `raw_object`
    is the object exactly as received (Anthropic `input`, Gemini `args`). Both are raw model
    output and may hold secrets or fragments: the episode record never stores them as-is.
    """

    id: str
    name: str
    arguments: JSONObject | None
    status: ArgStatus
    raw_arguments: str | None = None
    raw_object: JSONObject | None = None
    repair: str | None = None
    """Name of the repair that applied when `status` is REPAIRED (e.g. "strip_delimiters")."""
    had_wire_id: bool = True
    """False when the transport sent no id (Gemini 2.x) and the adapter made one up; such an
    id is never sent back to the provider."""
    signature: str | None = None
    """An opaque token the provider wants back with this call on replay (Gemini 3
    `thoughtSignature`, else 400 "Function call is missing a thought_signature")."""


@dataclass(slots=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    known: bool = True
    """False when the server reported no usable count (no usage, all zeros, or 0 output tokens
    for a turn that shows output): the counts are then 0 for "unknown", not measured, and
    `CAP_REACHED` cannot be checked (`collector.providers.common.usage_known`)."""


@dataclass(slots=True)
class Turn:
    """One model call, normalized. The same shape for every transport and both modes."""

    text: str
    tool_calls: list[ToolCall]
    raw_finish_reason: str | None
    """The transport's own reason, verbatim (`length`, `max_tokens`, `MAX_TOKENS`, `incomplete`...)."""
    finish_class: FinishClass
    """Derived: LENGTH whenever `length_signals` is non-empty, else the mapped raw reason."""
    usage: Usage
    max_output_tokens: int
    """The output cap that was requested for this turn."""
    latency_s: float
    incomplete_reason: str | None = None
    """Responses `incomplete_details.reason`, or the equivalent detail where a transport has one."""
    length_signals: tuple[LengthSignal, ...] = ()
    unparsed_tool_call: bool = False
    """The text holds a chat-template tool-call block the server did not parse into a call."""
    refusal: str | None = None
    token_ids: list[int] | None = None
    """The sampled output token ids, where the server returned them (vLLM/SGLang `token_ids`,
    llama.cpp `logprobs.content[].id`)."""
    logprobs: list[float] | None = None
    """Output log-probabilities, one per sampled token (`logprobs.content[].logprob`)."""
    prompt_token_ids: list[int] | None = None
    """The prompt as the server tokenized it (vLLM top-level / first chunk, SGLang per choice);
    in token-in mode the ids sent (`collector.providers.tokenin`)."""
    # --- token-in mode (issue 26): how the prompt went, and the server's own re-rendering ---
    prompt_sent_as_ids: bool | None = None
    """Token-in mode: True when the prompt went as ids, False when the turn fell back to text
    (`token_in_fallback` says why); None outside token-in mode."""
    token_in_fallback: str | None = None
    """Token-in mode: why this turn's prompt went as text (a short reason such as
    `suffix_unproven`); None when it went as ids."""
    rerendered_prompt_ids: list[int] | None = None
    """Token-in mode: the server's own rendering of the whole history, tokenized: what a
    re-rendering server would have seen (the drift diagnostic compares the sent ids with it)."""
    vocab_size: int | None = None
    """The model's vocabulary size as the server reports it (token-in mode: llama.cpp's model
    metadata), which every id it returns must be below; None: not reported."""
    unreturned_stop: str | None = None
    """The matched stop string the output ids do not hold (llama.cpp trims its ids): the
    closing text a token-in bridge must add before the next messages."""
    response_id: str | None = None
    """The provider's id for this response (`chatcmpl-…`, `resp_…`, `msg_…`), for tracing."""
    # --- what answered, and what was not shown (issue 15) ---
    response_model: str | None = None
    """The model the reply says answered (`model`, Gemini `modelVersion`): llama-server answers
    any name with its own alias, hosted APIs with a dated snapshot (`gpt-4o-2024-08-06`)."""
    system_fingerprint: str | None = None
    """Chat Completions `system_fingerprint` where the server sends one."""
    reasoning: bool = False
    """The reply carried reasoning the record does not keep (`reasoning_content`, thinking
    blocks, thought parts, reasoning items): output that was visible, just not stored."""
    retries: tuple[str, ...] = ()
    """Causes of the requests retried before this reply (`collector.providers.http.retry_cause`)."""
    # --- reasoning (issue 16): what the model thought, and what must go back with its calls ---
    reasoning_text: str | None = None
    """The reasoning text where the provider returns it (Chat `reasoning`/`reasoning_content`,
    Responses summaries, Anthropic `thinking`, Gemini thought parts), joined in order."""
    reasoning_tokens: int = 0
    """Output tokens the provider says went to reasoning (part of `usage.output_tokens`)."""
    reasoning_items: list[JSONObject] = field(default_factory=list)
    """The opaque reasoning items, in the adapter's own wire shape and order, exactly as
    received: replayed verbatim with the turn (Anthropic thinking blocks with `signature`,
    Responses `reasoning` items, Gemini thought parts). Chat Completions has none."""
    # --- issue 27: which weights sampled this turn ---
    policy_version: str | None = None
    """The weight / policy version that answered, where known: the server's (SGLang's
    `metadata.weight_version` on a Chat reply) or the one the run declares
    (`provider.policy_version*`, `collector.run.policyversion`). None: not known."""
    policy_version_source: str | None = None
    """Where `policy_version` came from: `server` or `declared` (a server's wins)."""

    @property
    def is_length(self) -> bool:
        """True when the turn was cut by the output cap: nothing from it may ever run."""
        return bool(self.length_signals)


# --- Conversation history, provider-neutral. Adapters translate it to each dialect. ---


@dataclass(slots=True)
class SystemMessage:
    text: str
    role: Literal["system"] = "system"


@dataclass(slots=True)
class UserMessage:
    text: str
    role: Literal["user"] = "user"


@dataclass(slots=True)
class AssistantMessage:
    """An assistant turn as replayed to the provider.

    A call whose `status` is MALFORMED is replayed as `"{}"` (or `{}` where the dialect takes
    objects), never as the raw fragment: some backends re-parse history and 500 on it.
    """

    text: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    role: Literal["assistant"] = "assistant"
    reasoning_items: list[JSONObject] = field(default_factory=list)
    """`Turn.reasoning_items` of the turn, replayed verbatim by the adapter that made them,
    before the turn's text and calls (the APIs refuse a call replayed without them)."""


@dataclass(slots=True)
class ToolResultMessage:
    """The result of one tool call; exactly one per call id, right after its assistant turn."""

    call_id: str
    name: str
    content: str
    is_error: bool = False
    role: Literal["tool"] = "tool"


Message = SystemMessage | UserMessage | AssistantMessage | ToolResultMessage


@dataclass(slots=True, frozen=True)
class ToolSpec:
    """A tool as offered to the model: name, description and a JSON Schema for arguments."""

    name: str
    description: str
    parameters: JSONObject


@dataclass(slots=True)
class SamplingParams:
    """Request parameters passed through to each dialect where the transport has them."""

    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: list[str] | None = None
    tool_choice: str | None = None
    """"auto", "none", "required", or a tool name (forced call)."""
    logprobs: bool = False
    top_logprobs: int | None = None
    token_ids: bool = False
    """Ask for sampled token ids (and prompt ids, and logprobs) where the wire has them."""
    token_in: str | None = None
    """Token-in mode: the server dialect ("llama.cpp") whose token endpoints each later
    turn's prompt is sent to as ids (`collector.providers.tokenin`); None: messages."""
    extra_body: JSONObject = field(default_factory=dict)
    """Free server-specific fields merged into the request body (vLLM, llama.cpp)."""
    reasoning_effort: str | None = None
    """Chat `reasoning_effort`, Responses `reasoning.effort`, Gemini `thinkingLevel`."""
    thinking_budget: int | None = None
    """Anthropic `thinking.budget_tokens`, Gemini `thinkingConfig.thinkingBudget`."""
    extra_headers: dict[str, str] = field(default_factory=dict)
    """HTTP headers added to this request only (never logged or stored). The job sets the
    simulator's `x-sim-seed` here, so that samples of one task differ on transports whose
    body has no seed field (Anthropic, Responses)."""


@dataclass(slots=True, frozen=True)
class TokenPrefix:
    """Token-in mode: the ids a later turn's prompt extends (`collector.providers.tokenin`)."""

    ids: list[int] | None
    """The previous turn's prompt ids + its output ids; None: that turn returned no ids, so
    no bridge is possible (the turn falls back to text)."""
    stop_text: str
    """The stop string that ended the previous turn and that its ids do not hold ("" none)."""
    assistant_at: int
    """Index in `TurnRequest.messages` where the previous turn's assistant message is (the
    history's length when that turn was asked)."""


@dataclass(slots=True)
class TurnRequest:
    """Everything an adapter needs for one model call."""

    model: str
    messages: list[Message]
    tools: list[ToolSpec]
    max_output_tokens: int
    params: SamplingParams = field(default_factory=SamplingParams)
    wire_cache: dict[str, Any] = field(default_factory=dict)
    """Scratch an adapter keeps across the turns of one episode (the loop passes the same dict
    every turn): the encoded history items (`collector.providers.splice`). Never recorded."""
    token_prefix: TokenPrefix | None = None
    """Token-in mode, every turn after the first: what the episode already sent and sampled
    (the loop's `TokenTracker` builds it; the adapter stays stateless per episode)."""

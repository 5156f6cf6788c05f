"""The episode record: what one finished episode becomes, and what one shard row holds.

The episode loop produces an `Episode`; the shard writer turns it into one Arrow row
(`collector.record.shards`) and back. Values that can be derived (token totals, counts, whether
the episode is truncated) are properties, computed once at write time, never stored twice
in memory.

Nothing here holds raw model output that could carry a secret: tool-call arguments are
stored as parsed objects with secret-like keys redacted; an argument fragment that did not
parse, and a tool-call block left unparsed in a message's text, are stored only as their
length in characters (`collector.episode.redact`).

Tests: tests/record/test_shards.py (the record through Arrow and back).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from collector.stop import StopReason

#: Bumped whenever a column is added, removed or changes meaning. Stored in file metadata.
SCHEMA_VERSION = 3
"""2: `messages.raw_text` added; `trainable` false for `timeout` episodes too.
3: the chat-template block: `system_prompt`, `chat`, `tools`; and `turns.response_model`,
`turns.system_fingerprint`, `turns.invisible_output`, `turns.retries` and the episode's
`retries`; the token capture fields on `turns` (the block at the end of `TurnRecord`)
(version-2 shards stay readable)."""


def policy_span(turns: list[TurnRecord]) -> tuple[str | None, str | None, int]:
    """(first, last, distinct count) of the turns' known policy versions, in turn order."""
    versions = [t.policy_version for t in turns if t.policy_version is not None]
    if not versions:
        return None, None, 0
    return versions[0], versions[-1], len(set(versions))


def episode_id(run_id: str, task_id: str, sample: int, model: str, budget: int) -> str:
    """Deterministic id: the same run, task, sample, model and budget give the same id.

    This is what makes resume-by-set-difference and drop-duplicates-at-commit possible.
    """
    key = "\x1f".join((run_id, task_id, str(sample), model, str(budget)))
    return hashlib.blake2b(key.encode(), digest_size=12).hexdigest()


#: The largest token count a turn's record holds. A provider's usage is taken as sent, but a
#: reply claiming more than any model can read or write (10**30 output tokens) would overflow
#: the shard's int64 columns and block every commit: counts are clamped to 0..MAX_TOKEN_COUNT.
MAX_TOKEN_COUNT = 2**31 - 1


#: Every token id is below this, whatever the model: no tokenizer has 2**31 tokens, and trainers
#: hold ids as int32. An id at or past it (or past the server's reported vocabulary, or
#: negative) is not a token the model sampled (`collector.episode.tokens`, `collector check`).
TOKEN_ID_LIMIT = 2**31


def token_id_limit(vocab_size: int | None) -> int:
    """The bound a turn's ids must be below: the reported vocabulary, else `TOKEN_ID_LIMIT`."""
    return vocab_size if vocab_size is not None and 0 < vocab_size < TOKEN_ID_LIMIT else TOKEN_ID_LIMIT


def clamp_tokens(value: int) -> int:
    """A token count as stored: within 0..MAX_TOKEN_COUNT (anything else is not a count)."""
    return min(max(value, 0), MAX_TOKEN_COUNT)


@dataclass(slots=True)
class TurnRecord:
    """One model call of the episode, as stored in the `turns` list column."""

    index: int
    raw_finish_reason: str | None
    finish_class: str
    """The derived `FinishClass` value (length detection applied)."""
    length_signals: list[str]
    incomplete_reason: str | None
    output_tokens: int
    input_tokens: int
    max_output_tokens: int
    latency_s: float
    repairs: list[str]
    """Repairs applied to this turn's tool-call arguments (e.g. "strip_delimiters")."""
    num_tool_calls: int
    malformed_calls: int
    discarded: bool
    """True when the turn's output was thrown away: it was cut, or it ended the episode as
    malformed, so nothing from it ran. Its output tokens count as wasted."""
    unparsed_tool_call: bool = False
    # --- issue 15 (data truth): who answered, what was invisible, what was retried ---
    response_model: str | None = None
    """The model the reply says answered (`model`, Gemini `modelVersion`), as sent."""
    system_fingerprint: str | None = None
    """Chat Completions `system_fingerprint`, where the server sends one."""
    # Nullable like every field added in version 3, so that a version-2 shard (which has none
    # of them) still reads: None there means "not recorded".
    invisible_output: bool | None = False
    """Output tokens were spent with nothing visible (no text, no call, no refusal, no
    reasoning) while tools were offered: a call the server swallowed, never a final answer."""
    retries: list[str] | None = field(default_factory=list)
    """One cause per retried request of this turn: `429`, `5xx`, `timeout`, `dropped`
    (a stream or connection that broke off), `other` (a 200 reply not in the wire format...)."""
    # --- issue 16 (reasoning), schema version 3 ---
    reasoning_text: str | None = None
    """The reasoning text where the provider returned it (redacted like message text)."""
    reasoning_tokens: int | None = 0
    """Output tokens the provider says went to reasoning (included in `output_tokens`; None in
    a version-2 shard, which predates it: nullable like every field version 3 added)."""
    reasoning_items: str | None = None
    """The opaque reasoning items replayed with the turn, as a JSON list in the provider's
    wire shape (Anthropic thinking blocks with signatures, Responses reasoning items with
    `encrypted_content`, Gemini thought parts); None when the turn had none."""

    def __post_init__(self) -> None:
        self.output_tokens = clamp_tokens(self.output_tokens)
        self.input_tokens = clamp_tokens(self.input_tokens)

    # --- Token capture (schema 3; `sampling.token_ids`, collector.episode.tokens) -----------
    # What the model sampled, token by token, as the server returned it. Every field is
    # nullable so that version-2 shards (which lack them) cast to this schema: read back from
    # one, each field is None or its default (nothing captured).
    tokens_requested: bool | None = False
    """Token ids were asked for (`sampling.token_ids`). With `output_token_ids` None and
    `tokens_withheld` false: asked for, and the server did not return them."""
    output_token_ids: list[int] | None = None
    """The sampled output token ids, exactly as returned (None: not returned, or withheld)."""
    output_logprobs: list[float] | None = None
    """One log-probability per output token (NaN where the server sent an entry without one)."""
    prompt_ids_offset: int | None = 0
    """`prompt_token_ids` starts at this position of the turn's full prompt: the tokens before
    it are the first `prompt_ids_offset` of the previous turn's prompt + output ids (0 on the
    first turn, or when the previous turn has no ids). Avoids O(turns^2) storage."""
    prompt_token_ids: list[int] | None = None
    """The turn's prompt ids from `prompt_ids_offset` on (None: not returned, or withheld)."""
    temperature: float | None = None
    """The sampling temperature requested (None: the server's default)."""
    token_counts_ok: bool | None = None
    """len(output ids) == usage output tokens, and the logprobs (if any) are as many as the
    ids. None when no ids were returned."""
    prefix_consistent: bool | None = None
    """This turn's prompt ids start with the previous turn's prompt + output ids. False: the
    server re-rendered history; the episode is not one sequence. None: not known (first
    turn, or ids missing)."""
    tokens_withheld: bool | None = False
    """The episode held a value the redactor hides, so its token ids were dropped (README,
    "What is never stored")."""
    # --- issue 31: a server that reports no usable usage (still schema version 3) ---
    usage_known: bool | None = True
    """False when the server reported no usable token counts for this turn (no usage, all
    zeros as LiteLLM's Gemini stream sends, or 0 output tokens for visible output): its
    `output_tokens` / `input_tokens` are then 0 for "unknown", not measured, and the cap
    rule (`cap_reached`) could not be checked (`collector.providers.common`). None in a
    shard written before the field existed."""
    # --- issue 26: where a re-rendered prompt first disagrees (still schema version 3) ---
    drift_offset: int | None = None
    """On a turn that is not prefix-consistent: the position of the first id where this
    prompt differs from the previous turn's prompt + output (== `prompt_ids_offset`). None:
    consistent, unknown, or a shard written before the field existed."""
    drift_expected_id: int | None = None
    """The previous prompt + output's id at `drift_offset` (what a faithful server sends)."""
    drift_found_id: int | None = None
    """This prompt's id at `drift_offset`; None when the prompt ended there (it is shorter)."""
    # --- issue 26: token-in mode (still schema version 3) ---
    prompt_sent_as_ids: bool | None = None
    """Token-in mode (`sampling.token_in`): True when this turn's prompt went to the server as
    ids (the previous prompt + output ids + the tokenized rest), False when it fell back to
    text (`token_in_fallback`). None: not token-in mode, or a shard written before the field.
    In token-in mode the drift fields compare the ids sent with the server's own
    re-rendering of the same history (what re-render mode would have sent)."""
    token_in_fallback: str | None = None
    """Token-in mode: why this turn went as text (`no_previous_ids`, `assistant_not_replayed`,
    `render_failed`, `suffix_unproven`, `stop_text_unproven`; docs/tokens.md). None: as ids."""
    stop_tokens_uncounted: int | None = None
    """Output tokens the server counted in usage but returned no ids for, accounted to the stop
    string that ended the turn (llama.cpp counts a matched `stop` string and returns none of
    its ids; `collector.episode.tokens`). None: no such shortfall."""
    tokens_rejected: str | None = None
    """Why the ids the server returned for this turn were not kept: `id_out_of_range` (an id
    negative, or not below the vocabulary size: not a token of this model, so not what was
    sampled; `collector.episode.tokens`). None: kept, or none returned."""
    token_vocab_size: int | None = None
    """The vocabulary size the turn's ids were checked against, as the server reported it
    (llama.cpp's model metadata); None: not reported (then `TOKEN_ID_LIMIT`, 2**31, bounds
    them). `collector check` flags any stored id outside it."""
    # --- issue 27: which weights sampled the turn (still schema version 3) ---
    policy_version: str | None = None
    """The weight / policy version that answered this turn: the server's (SGLang's
    `weight_version`) or the run's declared one (`provider.policy_version*`). None: unknown."""
    policy_version_source: str | None = None
    """`server` or `declared`: where `policy_version` came from (a server's wins)."""
    # --- a harness's episode (collector.harness; still schema version 3, nullable) ---
    harness_asked_cap: int | None = None
    """The output cap the harness asked for in this request (`max_output_tokens` is what the
    gateway sent: the cell's budget). None: not a harness episode, or the harness asked none."""
    calls_withheld: int | None = None
    """Calls of this turn the gateway did not return to the harness (a cut or malformed turn
    under the stop rules); the other `num_tool_calls - calls_withheld` were returned. None: not
    a harness episode."""
    history_rewritten: bool | None = None
    """The harness's request for this turn did not extend what it sent before plus the turn it
    was returned (it compacted or rewrote its history): this turn starts a new sequence, and a
    trainer must not stitch it to the turns before. None: not a harness episode."""
    # --- the time outside the model (still schema version 3) ---
    tool_s: float | None = None
    """Seconds this turn's tool calls took to run (validation and execution, in the model's
    order); None: the turn ran no call, or a shard written before the field."""


@dataclass(slots=True)
class ToolCallRecord:
    """A tool call inside a stored assistant message; arguments redacted, never raw."""

    id: str
    name: str
    arguments_json: str | None
    """The parsed arguments as JSON with secret-like values replaced; None if unparseable."""
    status: str
    """The `ArgStatus` value: ok, repaired, malformed."""
    unparsed_chars: int | None = None
    """For a malformed call: the length of the fragment in characters (the fragment is never kept)."""
    raw_fragment: str | None = None
    """Only with the opt-in debug setting: the unparseable fragment, as received."""


@dataclass(slots=True)
class MessageRecord:
    """One message of the transcript (`messages` list column)."""

    role: str
    """system | user | assistant | tool"""
    text: str
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    call_id: str | None = None
    """For a tool result: the id of the call it settles."""
    name: str | None = None
    is_error: bool = False
    turn_index: int | None = None
    """For assistant messages and tool results: the turn they belong to."""
    raw_text: str | None = None
    """Only with the opt-in debug setting: the unparsed tool-call block cut from `text`."""


@dataclass(slots=True)
class ExecutedToolCall:
    """A tool call that actually ran against the environment (`executed_tool_calls` column)."""

    turn_index: int
    call_id: str
    name: str
    arguments_json: str
    """Redacted arguments, as JSON."""
    is_error: bool


@dataclass(slots=True)
class EpisodeTiming:
    """Where an episode's wall time went (`Episode.timing`): the model, the tools, the sandbox.

    `model_s` is the turns' `latency_s` added up, `tools_s` their `tool_s`. The sandbox fields
    are those of an environment that runs one (`collector.envs.harbor`), else None; what is
    left of `duration_s` is the loop's own time (history, records, grading a plain world)."""

    model_s: float
    tools_s: float
    image_build_s: float | None = None
    """Building the task's image, or finding it built (`image_cached`)."""
    image_cached: bool | None = None
    sandbox_start_s: float | None = None
    sandbox_stop_s: float | None = None
    verifier_s: float | None = None


@dataclass(slots=True)
class EpisodeError:
    """Why an `error` episode failed: an exception type and a secret-free message."""

    type: str
    message: str


# --- the chat-template view (schema version 3) ---------------------------------------------
# The transcript again, in the OpenAI chat shape that tokenizer chat templates and SFT
# trainers consume; built from `messages` by `collector.record.chat` (what it holds for a cut
# or malformed turn is documented there).


@dataclass(slots=True)
class ChatFunction:
    name: str
    arguments: str
    """The call's arguments as a JSON string (OpenAI), redacted; ``"{}"`` for a malformed call."""


@dataclass(slots=True)
class ChatToolCall:
    id: str
    type: str
    """Always ``"function"``."""
    function: ChatFunction


@dataclass(slots=True)
class ChatMessage:
    """One message of the `chat` column: role, content, tool_calls, tool_call_id, name."""

    role: str
    content: str
    tool_calls: list[ChatToolCall] = field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None


@dataclass(slots=True)
class Episode:
    """One finished episode: one row of a shard."""

    episode_id: str
    run_id: str
    model: str
    provider: str
    budget: int
    """The per-turn output-token cap this episode ran with."""
    env: str
    task_id: str
    sample: int
    seed: int
    stop_reason: StopReason
    trainable: bool
    reward: float
    """The training reward: 0.0 for the stop_on reasons and for errors, else the graded value."""
    graded_reward: float | None
    """The grader's value where it ran (also for cut episodes if the config asks to grade them)."""
    duration_s: float
    turns: list[TurnRecord]
    messages: list[MessageRecord]
    executed_tool_calls: list[ExecutedToolCall]
    tool_errors: int
    """Tool results that were errors (validation, exceptions, timeouts, refusals to run)."""
    error: EpisodeError | None = None
    worker: str | None = None
    """Which worker ran it (diagnostics only)."""
    # --- chat-template block (schema version 3; defaults let version-2 shards load) ---
    system_prompt: str | None = None
    """The system message the episode started with (redacted), or None."""
    chat: list[ChatMessage] = field(default_factory=list)
    """Every message of `messages` in the OpenAI chat shape, system prompt first."""
    tools: str = "[]"
    """The tool schemas offered to the model: a JSON list in the OpenAI function format."""
    # --- issue 15: every retried request of the episode, the failed last call's included ---
    retries: list[str] = field(default_factory=list)
    """Causes as in `TurnRecord.retries`, over all turns plus the retries of a model call that
    failed for good (an `error` episode's last call has no turn to hold them)."""
    # --- issue 16: the sweep's reasoning axis (still schema version 3, unreleased) ---
    reasoning: str | None = None
    """The reasoning setting of the episode's sweep cell (`effort=low`, `budget=2048`, `none`),
    None when the sweep has no reasoning axis."""
    # --- issue 27: the policy versions the episode was sampled with (still version 3) ---
    policy_version_first: str | None = None
    """The policy version of the first turn whose version is known (None: none known)."""
    policy_version_last: str | None = None
    """The policy version of the last turn whose version is known."""
    policy_versions: int | None = 0
    """How many distinct policy versions answered its turns: above 1, the episode straddles
    a weight update (an off-policy mix a trainer may drop or weight); 0: none known. None
    in a shard written before the field existed."""
    # --- the time outside the model (still schema version 3) ---
    timing: EpisodeTiming | None = None
    """Where the wall time went (`EpisodeTiming`); None in a shard written before the field."""
    # --- where it ran (still schema version 3) ---
    node: str | None = None
    """The machine that ran it: ``host:ray-node-id`` on a Ray cluster, the host name alone with
    the in-process pool (None: written before the field existed). Shows that every node of a
    cluster worked, without reading Ray's logs."""

    @property
    def is_truncated(self) -> bool:
        return self.stop_reason is StopReason.LENGTH or any(
            t.finish_class == "length" for t in self.turns
        )

    @property
    def thinking_cut(self) -> bool:
        """Some turn spent its cap on reasoning (`LengthSignal.REASONING`, issue 16)."""
        return any("reasoning" in t.length_signals for t in self.turns)

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    @property
    def num_tool_calls(self) -> int:
        return sum(t.num_tool_calls for t in self.turns)

    @property
    def input_tokens(self) -> int:
        return sum(t.input_tokens for t in self.turns)

    @property
    def output_tokens(self) -> int:
        return sum(t.output_tokens for t in self.turns)

    @property
    def wasted_output_tokens(self) -> int:
        """Output tokens spent on turns whose output was cut or thrown away (never executed)."""
        return sum(t.output_tokens for t in self.turns if t.discarded)

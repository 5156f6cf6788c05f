"""Simulated models: one frozen `ModelPreset` per model name, each knob documented.

A preset decides how a simulated model behaves, never what it says: the policy
(`collector.sim.policy`) decides the calls and answers, the preset decides how much text
comes before them, how the arguments are serialized, and which faults are injected.

Lengths are *discrete distributions in tokens* (`LengthDist`) so the ground truth
(`collector.sim.truth`) can be computed exactly from the same tables the generator samples
from: the generator draws a length by inverting the tabulated CDF, the truth module sums
the tabulated PMF. Smooth, heavy-ish tails (a clipped log-normal) make the truncation rate
fall gradually as the output budget grows, as it does for real models.

Faults never change a turn's token count (see `collector.sim.tokenizer`): leaked
delimiters were counted as template tokens anyway, malformed arguments and wrong arguments
are length-preserving edits. So a preset's cut probability depends only on its length
distributions and the task's call size, and stays exact whatever fault knobs are set.

Tests: tests/sim/test_truth.py, tests/sim/test_llama_responses.py.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass, field, replace
from functools import cache
from typing import Any, Literal

from collector.sim.capacity import Capacity

LeakFamily = Literal["trailing", "wrapped", "concatenated", "hermes_content", "swallowed"]
"""Chat-template delimiter leaks (provider-protocols.md section 6):

- ``trailing``: Gemma 4's closer `<tool_call|>` left after the JSON arguments;
- ``wrapped``: Hermes `<tool_call>` ... `</tool_call>` around the JSON arguments;
- ``concatenated``: the arguments, `<tool_call|>`, then a second JSON fragment;
- ``hermes_content``: vLLM non-streaming truncation: when a call is cut, the raw Hermes block
  lands in `content` with `tool_calls: []` and `finish_reason: "length"`;
- ``swallowed``: llama-server when a stop word matched inside the (first) call of an uncut
  call turn: unstreamed, the Hermes block up to there, unclosed, lands in `content` with
  `tool_calls: []` and `finish_reason: "stop"`; streamed, the markup it held back while
  waiting to parse is dropped: no content, no call, `"stop"`, the tokens still counted.
The last two apply to Chat Completions only; the first three to string-argument transports
(Chat Completions, Responses).
"""

ArgStyle = Literal["compact", "spaced"]

TokenWire = Literal["vllm", "sglang", "llamacpp"]
"""Where a Chat Completions reply puts token ids when asked (collector.sim.tokens)."""


@dataclass(frozen=True, slots=True)
class LengthDist:
    """A length in tokens: 0 with probability `zero_prob`, else ``1 + floor(X)`` with
    ``X ~ LogNormal(ln(median), sigma)``, clipped at `max_tokens` (the clipped tail mass sits
    on `max_tokens`). ``sigma == 0`` makes the non-zero part the constant ``1 + floor(median)``.
    """

    zero_prob: float = 1.0
    median: float = 1.0
    sigma: float = 0.0
    max_tokens: int = 2048

    def pmf(self) -> tuple[float, ...]:
        """P(length == k) for k in 0..max_tokens (exact for the sampler below)."""
        return _tables(self)[0]

    def survival(self, k: int) -> float:
        """P(length >= k)."""
        if k <= 0:
            return 1.0
        cdf = _tables(self)[1]
        if k > self.max_tokens:
            return 0.0
        return max(0.0, 1.0 - cdf[k - 1])

    def sample(self, u: float) -> int:
        """The length at uniform draw `u` in [0, 1): the inverse of the tabulated CDF."""
        cdf = _tables(self)[1]
        return min(bisect_right(cdf, u), self.max_tokens)


@cache
def _tables(dist: LengthDist) -> tuple[tuple[float, ...], tuple[float, ...]]:
    n = dist.max_tokens
    pmf = [0.0] * (n + 1)
    pmf[0] = dist.zero_prob
    rest = 1.0 - dist.zero_prob
    if rest > 0.0:
        if dist.sigma <= 0.0:
            pmf[min(1 + math.floor(dist.median), n)] += rest
        else:
            mu = math.log(dist.median)
            scale = dist.sigma * math.sqrt(2.0)

            def lognormal_cdf(x: float) -> float:
                return 0.0 if x <= 0.0 else 0.5 * (1.0 + math.erf((math.log(x) - mu) / scale))

            for k in range(1, n):
                pmf[k] += rest * (lognormal_cdf(k) - lognormal_cdf(k - 1))
            pmf[n] += rest * (1.0 - lognormal_cdf(n - 1))
    cdf: list[float] = []
    acc = 0.0
    for p in pmf:
        acc += p
        cdf.append(acc)
    return tuple(pmf), tuple(cdf)


@dataclass(frozen=True, slots=True)
class ModelPreset:
    """One simulated model. Every probability is per model call (per HTTP request)."""

    name: str
    description: str
    preamble: LengthDist = field(default_factory=LengthDist)
    """Tokens of text the model writes before its tool call(s) in a call turn."""
    answer_preamble: LengthDist = field(default_factory=LengthDist)
    """Tokens of text the model writes before the answer itself in a final-answer turn."""
    arg_style: ArgStyle = "spaced"
    """Argument size: "compact" JSON (`{"a":1,"b":2}`) or "spaced" (`{"a": 1, "b": 2}`)."""
    error_rate: float = 0.0
    """Probability that a call turn gets one wrong argument (a one-character edit: a digit
    bumped, a letter's case flipped), so rewards mean something."""
    leak_prob: float = 0.0
    """Probability that a call turn shows a leaked chat-template delimiter."""
    leak_families: tuple[LeakFamily, ...] = ()
    """Which leak a leaking turn shows (uniform over the tuple)."""
    malformed_prob: float = 0.0
    """Probability that a call turn's arguments are not valid JSON (a same-length edit:
    `'` for a key's `"`, `]` for the final `}`, `=` for a `:`). Chat and Responses carry the
    broken string; Gemini answers `MALFORMED_FUNCTION_CALL`; Anthropic is unaffected (its
    server always returns an object)."""
    hidden_cut_prob: float = 0.0
    """Probability that a Chat Completions turn cut inside a call reports
    `finish_reason: "tool_calls"` instead of `"length"` (vLLM streaming, llama.cpp)."""
    rate_limit_prob: float = 0.0
    """Probability of a 429 (with `retry-after: retry_after_s`) instead of a reply."""
    overload_prob: float = 0.0
    """Probability of an overload: Anthropic 529 `overloaded_error`, others 503."""
    server_error_prob: float = 0.0
    """Probability of a 500 in the provider's shape."""
    stream_drop_prob: float = 0.0
    """Probability that a stream ends midway, without its terminal marker."""
    retry_after_s: int = 0
    """The `retry-after` header of injected 429s (0 so that tests do not wait)."""
    latency_ms_median: float = 0.0
    """Median latency before the reply (0: none). Overridden per request by `x-sim-latency-ms`."""
    latency_sigma: float = 0.0
    """Log-normal spread of the latency (0: always the median)."""
    # Token capture (Chat Completions only; collector.sim.tokens): how ids are returned.
    token_wire: TokenWire = "vllm"
    """vLLM (`return_token_ids`: top-level / first-chunk `prompt_token_ids`, per-choice
    `token_ids`), SGLang (per-choice ids, non-streaming only) or llama.cpp (ids only inside
    `logprobs.content[].id`, no prompt ids; a streamed request with tools and `logprobs` is a
    400 "logprobs is not supported with tools + stream", as the real server answers)."""
    rerender_history: bool = False
    """The template re-renders replayed assistant turns (a whitespace token, re-serialized
    arguments), so a turn's prompt ids do not start with the previous prompt + output."""
    template_drift: bool = False
    """The template re-renders history the way real ones drift (`collector.sim.tokens`):
    `tojson`-re-serialized arguments and a content/newline seam merge; with `thinking`, the
    replayed turns' reasoning is gone too. Token-in prompts (ids sent) are untouched."""
    stream_drops_token_ids: bool = False
    """Streams carry no `token_ids` (vLLM with a tool parser: vllm #27482, #28256)."""
    thinking: LengthDist | None = None
    """Reasoning tokens per turn (None: the model does not think). They come first and out of
    the same output cap, so a turn whose thinking reaches the cap shows nothing else
    (`collector.sim.thinking`). Keep `zero_prob` at 0: a thinking model thinks every turn."""
    context_window: int | None = None
    """Prompt tokens the model can read (None: unlimited). A longer prompt is refused with the
    dialect's own context-length error (`collector.sim.errors.context_overflow`)."""
    responses_server: Literal["openai", "llamacpp"] = "openai"
    """Responses: OpenAI's shapes, or llama-server's (measured, ../shared/tools/real-gateway):
    stream events without `output_index` (items named by `item_id` only), a cut turn still
    `completed` (never `incomplete`: only the output count shows the cap), and an assistant
    item in the short `{"role", "content"}` form refused with 400 "Cannot determine type of
    'item'" (it wants `type: "message"`; OpenAI takes both)."""
    reasoning_field: Literal["reasoning", "reasoning_content"] = "reasoning"
    """Chat Completions: the message field the reasoning text goes in (vLLM's new name, or
    the older one SGLang, llama.cpp and DeepSeek still send)."""
    argument_padding: tuple[tuple[str, LengthDist], ...] = ()
    """Per tool name: tokens of whitespace the model writes inside that tool's arguments
    (pretty-printing before the closing brace: the object is unchanged, its length is not).
    Each call draws its own length, so each tool's call size has a known distribution and
    the per-tool cut rate and budget are exact (`collector.sim.truth.tool_cut_probability`)."""
    capacity: Capacity | None = None
    """How much load the server takes (`collector.sim.capacity`): slots, a queue whose wait
    is latency, refusals past it, a tokens-per-minute budget. None: unlimited, every request
    served at once (the suite's default, so no test depends on load)."""

    def padding_for(self, tool: str) -> LengthDist | None:
        """The whitespace-length distribution of `tool`'s arguments (None: no padding)."""
        return next((dist for name, dist in self.argument_padding if name == tool), None)

    @property
    def fault_prob(self) -> float:
        """Probability that a request gets a transient error instead of a reply."""
        return self.rate_limit_prob + self.overload_prob + self.server_error_prob + self.stream_drop_prob


_NO_TEXT = LengthDist()

HOSTED_TOKENS_PER_MINUTE = 4_000_000
"""sim-hosted's budget (prompt + cap per request, charged at arrival)."""
GPU_KV_TOKENS = 16_000
"""sim-gpu's KV cache in tokens (prompt + output of the running sequences)."""

_TERSE = ModelPreset(
    name="sim-terse",
    description="Short preambles (often none); a few wrong arguments.",
    preamble=LengthDist(zero_prob=0.35, median=10.0, sigma=0.9),
    answer_preamble=LengthDist(zero_prob=0.5, median=6.0, sigma=0.8),
    arg_style="compact",
    error_rate=0.05,
)


def _like_terse(name: str, description: str, **changes: Any) -> ModelPreset:
    """sim-terse's lengths and errors with one server behaviour changed (token shapes, streams)."""
    return replace(_TERSE, name=name, description=description, **changes)


PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in (
        ModelPreset(
            name="sim-perfect",
            description="No text before calls, bare answers, no faults, no errors: for deterministic tests.",
            preamble=_NO_TEXT,
            answer_preamble=_NO_TEXT,
        ),
        _TERSE,
        ModelPreset(
            name="sim-verbose",
            description="Long reasoning-like preambles before every call and answer.",
            preamble=LengthDist(zero_prob=0.05, median=70.0, sigma=0.7),
            answer_preamble=LengthDist(zero_prob=0.1, median=40.0, sigma=0.7),
            error_rate=0.05,
        ),
        ModelPreset(
            name="sim-leaky",
            description="An OpenAI-compatible gateway that leaks chat-template delimiters.",
            preamble=LengthDist(zero_prob=0.2, median=24.0, sigma=1.0),
            answer_preamble=LengthDist(zero_prob=0.5, median=8.0, sigma=0.8),
            leak_prob=0.3,
            leak_families=("trailing", "wrapped", "concatenated", "hermes_content"),
        ),
        ModelPreset(
            name="sim-flaky",
            description="A provider under load: 429s, overloads, 500s and dropped streams.",
            preamble=LengthDist(zero_prob=0.35, median=10.0, sigma=0.9),
            answer_preamble=LengthDist(zero_prob=0.5, median=6.0, sigma=0.8),
            rate_limit_prob=0.08,
            overload_prob=0.05,
            server_error_prob=0.04,
            stream_drop_prob=0.05,
        ),
        ModelPreset(
            name="sim-hidden-cut",
            description="vLLM-style: a call cut at the cap is reported as finish_reason tool_calls.",
            preamble=LengthDist(zero_prob=0.2, median=30.0, sigma=0.9),
            answer_preamble=LengthDist(zero_prob=0.5, median=8.0, sigma=0.8),
            hidden_cut_prob=1.0,
        ),
        ModelPreset(
            name="sim-sloppy",
            description="Often writes arguments that are not valid JSON.",
            preamble=LengthDist(zero_prob=0.3, median=20.0, sigma=0.9),
            answer_preamble=LengthDist(zero_prob=0.5, median=8.0, sigma=0.8),
            malformed_prob=0.2,
            error_rate=0.05,
        ),
        ModelPreset(
            name="sim-swallow",
            description="llama-server-style: call markup left in content, or swallowed whole in streams.",
            preamble=_NO_TEXT,
            answer_preamble=_NO_TEXT,
            leak_prob=1.0,
            leak_families=("swallowed",),
        ),
        ModelPreset(
            name="sim-rambler",
            description="A base model: short calls that fit small budgets, then an answer that rambles on.",
            preamble=LengthDist(zero_prob=0.5, median=6.0, sigma=0.8),
            answer_preamble=LengthDist(zero_prob=0.0, median=400.0, sigma=0.3),
        ),
        _like_terse(
            "sim-rerender",
            "Like sim-terse, but the chat template re-renders history: prefix consistency fails.",
            rerender_history=True,
        ),
        _like_terse(
            "sim-drift",
            "A thinking model behind a template that drifts like real ones: reasoning stripped "
            "from history, tojson-re-serialized arguments, a seam merge between content and calls.",
            preamble=LengthDist(zero_prob=0.3, median=6.0, sigma=0.8),
            thinking=LengthDist(zero_prob=0.0, median=20.0, sigma=0.5, max_tokens=256),
            template_drift=True,
        ),
        _like_terse(
            "sim-stream-no-ids",
            "Like sim-terse, but streams drop token_ids (a tool-parser bug of older vLLM).",
            stream_drops_token_ids=True,
        ),
        _like_terse(
            "sim-sglang",
            "Like sim-terse, with SGLang's token-id shapes (per choice, not in streams).",
            token_wire="sglang",
        ),
        _like_terse(
            "sim-llamacpp",
            "Like sim-terse, with llama.cpp's token ids (in logprobs entries only).",
            token_wire="llamacpp",
        ),
        ModelPreset(
            name="sim-slow",
            description="Like sim-terse without errors, with about 50 ms of latency: for benchmarks.",
            preamble=LengthDist(zero_prob=0.35, median=10.0, sigma=0.9),
            answer_preamble=LengthDist(zero_prob=0.5, median=6.0, sigma=0.8),
            latency_ms_median=50.0,
            latency_sigma=0.3,
        ),
        ModelPreset(
            name="sim-hosted",
            description="A hosted API with rate limits: a tokens-per-minute budget answered with "
                        "429 + Retry-After and x-ratelimit headers; about 100 ms per reply.",
            preamble=LengthDist(zero_prob=0.35, median=10.0, sigma=0.9),
            answer_preamble=LengthDist(zero_prob=0.5, median=6.0, sigma=0.8),
            latency_ms_median=100.0,
            latency_sigma=0.3,
            capacity=Capacity(slots=1024, queue_limit=0, refuse_status=429, refuse_retry_after_s=1.0,
                              tokens_per_minute=HOSTED_TOKENS_PER_MINUTE, burst_s=1.0),
        ),
        ModelPreset(
            name="sim-gpu",
            description="A GPU server with a KV budget: 16 sequences at once, a queue of 16 whose "
                        "wait is latency, 503 past it; about 100 ms per reply alone.",
            preamble=LengthDist(zero_prob=0.35, median=10.0, sigma=0.9),
            answer_preamble=LengthDist(zero_prob=0.5, median=6.0, sigma=0.8),
            latency_ms_median=100.0,
            latency_sigma=0.3,
            capacity=Capacity(slots=16, queue_limit=16, refuse_status=503, slowdown=0.5,
                              kv_tokens=GPU_KV_TOKENS),
        ),
        ModelPreset(
            name="sim-thinker",
            description="A reasoning model: thinks before every turn, out of the same output cap.",
            preamble=LengthDist(zero_prob=0.5, median=6.0, sigma=0.8),
            answer_preamble=LengthDist(zero_prob=0.5, median=6.0, sigma=0.8),
            thinking=LengthDist(zero_prob=0.0, median=60.0, sigma=0.6, max_tokens=1024),
        ),
        ModelPreset(
            name="sim-thinker-legacy",
            description="sim-thinker behind a server that says `reasoning_content` (SGLang, llama.cpp).",
            preamble=LengthDist(zero_prob=0.5, median=6.0, sigma=0.8),
            answer_preamble=LengthDist(zero_prob=0.5, median=6.0, sigma=0.8),
            thinking=LengthDist(zero_prob=0.0, median=60.0, sigma=0.6, max_tokens=1024),
            reasoning_field="reasoning_content",
        ),
        ModelPreset(
            name="sim-tools",
            description="One short tool and one long one: lookup_order's arguments are a few "
                        "tokens, send_email's a long body, each with a known length distribution.",
            preamble=_NO_TEXT,
            answer_preamble=_NO_TEXT,
            argument_padding=(
                ("lookup_order", LengthDist(zero_prob=0.0, median=6.0, sigma=0.6, max_tokens=256)),
                ("send_email", LengthDist(zero_prob=0.0, median=90.0, sigma=0.5, max_tokens=2048)),
            ),
        ),
    )
}
"""All simulated models by name. Every preset has zero latency except `sim-slow` and the two
capacity presets (`sim-hosted`, `sim-gpu`); any request can set its own with the
`x-sim-latency-ms` header."""

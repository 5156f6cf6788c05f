"""The sweep's models: providers (wire, endpoint, retries), sampling, and the sweep's axes.

Part of `collector.config` (import from there). Tests: tests/test_config.py.

Also the shared pieces of every config model: `_Model` (unknown fields forbidden, frozen, attribute
docstrings as field descriptions) and the upper bounds (README, Reliability: "Limits").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

ProviderKind = Literal["chat", "responses", "anthropic", "gemini"]
PositiveInt = Annotated[int, Field(gt=0)]
# Finite: `inf` would mean "wait forever" for a timeout and a run that never ends.
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]

# Upper bounds (README, Reliability: "Limits"). A count that passes validation must neither
# exhaust the machine nor keep `collector validate` from answering at once.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_WORKERS = 1024
"""`ray.workers`: actors (one CPU-bound event loop each) a run starts."""
MAX_EPISODES_IN_FLIGHT = 4096
"""`ray.episodes_in_flight`: concurrent episodes on one worker's event loop."""
MAX_SAMPLES_PER_TASK = 100_000
MAX_TASKS = 1_000_000
"""Tasks a run reads from its environment (`env.tasks`, and what the environment yields)."""
MAX_EPISODES = 1_000_000
"""Episodes one run plans (samples x tasks x providers x models x budgets): the driver holds
each id in memory. Collect more as several runs (several names)."""
MAX_MODEL_NAME = 512
"""Characters of a model name (a long one gets a hashed partition directory name)."""
# Strict: "64" is not a budget (a quoted number in TOML is a typo worth naming).
Budget = Annotated[int, Field(gt=0, le=INT64_MAX, strict=True)]


class _Model(BaseModel):
    # Attribute docstrings become field descriptions (the JSON schema, and a test that every
    # field has one).
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class RetryConfig(_Model):
    max_retries: Annotated[int, Field(ge=0)] = 4
    """Retries per model call for retryable failures (429, 5xx, 529, transport, broken streams)."""
    initial_backoff_s: PositiveFloat = 0.5
    """First back-off before a retry; doubled (with jitter) on each further retry."""
    max_backoff_s: PositiveFloat = 8.0
    """Ceiling of the exponential back-off (a server's `retry-after` may ask for longer)."""
    max_retry_after_s: PositiveFloat = 120.0
    """A `retry-after` longer than this is not waited for; the call fails as unavailable."""


class ProviderConfig(_Model):
    kind: ProviderKind | Literal["sim"] = "sim"
    """Wire format. "sim" runs the built-in simulated provider (no key) over `sim_transport`."""
    sim_transport: ProviderKind = "chat"
    """With kind="sim": which wire format the simulator is spoken to in."""
    base_url: str | None = None
    """Required for real providers; ignored for "sim" (the run starts its own server)."""
    api_key_env: str | None = None
    """Name of the environment variable holding the API key. The key itself is never in config."""
    streaming: bool = False
    """Ask for server-sent events (and assemble the turn from them) instead of one JSON body."""
    request_timeout_s: PositiveFloat = 60.0
    """Per model call, an idle limit: connecting, and each wait for the next bytes of the reply
    (or to send the request). A reply that keeps arriving is never cut by it. Not in the
    fingerprint."""
    request_deadline_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    """Optional total limit per attempt of a model call, request to last byte (retried as a
    timeout). Unset: only the idle limit and `loop.episode_timeout_s` bound a call. Not in the
    fingerprint."""
    max_reply_bytes: PositiveInt = 32 * 1024 * 1024
    """Largest reply body read per attempt (32 MiB): a longer one is abandoned as a
    `ProtocolViolation` (retried, then `error`). Not in the fingerprint."""
    cap_field: Literal["max_completion_tokens", "max_tokens"] | None = None
    """Chat Completions: which field carries the output cap (OSS servers often want max_tokens)."""
    http_client: Literal["fast", "httpx"] = "fast"
    """"fast": the collector's own HTTP/1.1 transport (lowest CPU per turn; ignores proxy
    variables). "httpx": httpx's default transport, which honours HTTP_PROXY / HTTPS_PROXY /
    ALL_PROXY / NO_PROXY, split over many small clients. Not in the fingerprint."""
    requests_per_minute: PositiveFloat | None = None
    """Declared request budget: with `ray.admission = "adaptive"`, enforced by a token bucket,
    split evenly over `ray.workers`. Not in the fingerprint."""
    tokens_per_minute: PositiveFloat | None = None
    """Declared token budget (prompt estimate + output cap per request, as rate limiters
    count), enforced like `requests_per_minute`. Not in the fingerprint."""
    server_metrics: Literal["none", "vllm", "sglang"] = "none"
    """With `ray.admission = "adaptive"`: also read the engine's own load from its Prometheus
    `/metrics` (requests queued, KV cache in use, preemptions; `collector.run.servermetrics`),
    at most once a second per worker and model. A server without the endpoint costs a few
    failed scrapes and one warning. Not in the fingerprint."""
    metrics_url: Annotated[str, Field(pattern=r"^https?://")] | None = None
    """Where `server_metrics` are read; default the base URL's root + `/metrics` (vLLM and
    SGLang serve it beside `/v1`). Not in the fingerprint."""
    retry: RetryConfig = RetryConfig()
    """How failed model calls are retried (not in the fingerprint)."""
    label: str | None = None
    """Stored in the `provider` column; defaults to the kind. Must differ between swept providers."""
    context_window: PositiveInt | None = None
    """The model's context window in tokens. Set, each turn's cap is clamped to what the window
    leaves after the (estimated) prompt, and a turn that cannot fit ends the episode as
    `context_overflow` without a request. Unset: only the provider's own error says so."""
    extra_body: dict[str, object] = {}
    """Server-specific request fields for this provider only, merged over `sampling.extra_body`
    (objects key by key, anything else replaces): in a sweep over providers of different
    wires (`sweep.providers`), each gets its own (vLLM's `top_k` for one, Gemini's
    `generationConfig` for another). In the fingerprint when set."""
    allow_model_alias: bool = False
    """Skip the check, before the sweep, that this server serves each model of `sweep.models`
    (its `/models` list, or the `model` of one small reply). For a server that answers every
    name with its own alias on purpose (llama-server's `-a`); the reply's model is still
    recorded per turn. Not in the fingerprint."""
    # --- issue 27: the policy version a run declares (`collector.run.policyversion`) ---
    policy_version: Annotated[str, Field(min_length=1, max_length=200)] | None = None
    """The weight / policy version every turn was sampled with (a run against one checkpoint).
    Recorded per turn where the server reports none (a server's own version wins). At most one
    of the three `policy_version*` fields. Not in the fingerprint."""
    policy_version_file: Annotated[str, Field(min_length=1)] | None = None
    """A file holding the current version, rewritten by the trainer between steps: checked
    (its mtime) before each request, read when it changed. Missing or empty: unknown; not a
    regular file (a FIFO, a device): refused, unknown, never read."""
    policy_version_url: Annotated[str, Field(pattern=r"^https?://")] | None = None
    """A URL answering the current version (a JSON object with `weight_version`, as SGLang's
    `/model_info`, formerly `/get_weight_version`; or plain text), fetched before and after
    each request."""
    policy_version_timeout_s: PositiveFloat = 2.0
    """Bound on the whole of each `policy_version_url` fetch (connect, headers and body; the
    body is also cut past 64 KiB); a slow, huge or failed one records unknown."""

    @model_validator(mode="after")
    def _real_needs_url(self) -> ProviderConfig:
        if self.kind != "sim" and not self.base_url:
            raise ValueError(f"base_url is required for provider kind {self.kind!r}")
        declared = [
            name
            for name in ("policy_version", "policy_version_file", "policy_version_url")
            if getattr(self, name) is not None
        ]
        if len(declared) > 1:
            raise ValueError(f"set at most one of {', '.join(declared)}: each declares the version")
        return self

    @property
    def name(self) -> str:
        """What the `provider` column holds for this provider."""
        return self.label or self.kind

    def request_extra_body(self, sampling_extra: Mapping[str, object]) -> dict[str, object]:
        """The extra request fields this provider sends: `sampling.extra_body` with this
        provider's `extra_body` merged over it (objects key by key, as the adapters merge)."""
        return _merged(dict(sampling_extra), self.extra_body)

    @property
    def wire(self) -> ProviderKind:
        """The wire format actually spoken."""
        return self.sim_transport if self.kind == "sim" else self.kind

    def captures_token_ids(self, sampling: SamplingConfig) -> bool:
        """Whether requests to this provider ask for token ids: `sampling.token_ids` when set
        (token-in implies it), else on exactly where the wire carries ids (Chat Completions)."""
        if sampling.token_in:
            return True
        if sampling.token_ids is not None:
            return sampling.token_ids
        return self.wire == "chat"


class SamplingConfig(_Model):
    """Request parameters sent with every model call; unset fields are left to the server."""

    temperature: float | None = None
    """Sampling temperature; unset sends none (the provider's default)."""
    top_p: float | None = None
    """Nucleus sampling mass; unset sends none."""
    stop: list[str] | None = None
    """Stop sequences, where the wire format has them."""
    tool_choice: str | None = None
    """Tool-choice mode for the provider (e.g. `auto`, `required`, `none`); unset sends none."""
    logprobs: bool = False
    """Ask for token log-probabilities, where the wire format supports them."""
    top_logprobs: int | None = None
    """With `logprobs`: alternatives per token."""
    token_ids: bool | None = None
    """Token capture: ask each server for the sampled token ids, the prompt token ids and the
    output logprobs (chat wire: vLLM/SGLang `return_token_ids`, SGLang `return_prompt_token_ids`,
    and `logprobs`, which carries llama.cpp's ids). Unset (the default): on wherever the wire
    can carry them, the Chat Completions wire (the simulator by default, vLLM, SGLang,
    llama.cpp), off on the other wires. A server that refuses or ignores the fields does not
    fail the run: a refusal turns capture off for that worker's adapter after one rejected
    request, and each turn records that ids were asked for and not returned. Stored per turn
    in `turns`; `collector trainer-view` needs them. `false`: never ask."""
    token_in: bool = False
    """Token-in mode (implies `token_ids`): every turn after the first sends its prompt as
    ids, the previous prompt + output ids + the server-tokenized rest, so an episode is one
    sequence by construction; a turn whose bridge cannot be proven safe goes as text and
    records why (docs/tokens.md). Chat wire only."""
    token_in_server: Literal["llama.cpp", "vllm", "sglang"] = "llama.cpp"
    """With `token_in`: whose token endpoints (docs/tokens.md): llama.cpp `llama-server`
    (`/apply-template`, `/tokenize`, `/completion`), vLLM (`/tokenize` with messages,
    `/v1/completions` with a token prompt) or SGLang (`/v1/chat/completions` prompt ids,
    `/v1/tokenize`, `/generate` with `input_ids`)."""
    extra_body: dict[str, object] = {}
    """Server-specific request fields (vLLM, llama.cpp), merged into every request body."""
    reasoning_effort: str | None = None
    """Reasoning effort (`low`, `medium`, `high`...): Chat `reasoning_effort`, Responses
    `reasoning.effort` (with the encrypted reasoning asked back), Gemini `thinkingLevel`."""
    thinking_budget: PositiveInt | None = None
    """Thinking tokens allowed per turn: Anthropic `thinking.budget_tokens` (at least 1024
    and below the cap), Gemini `thinkingBudget` (which wins over `reasoning_effort`)."""


class SweepCell(_Model):
    """One explicit cell of a sweep."""

    model: str
    """A model name (for the simulator, a preset)."""
    budget: PositiveInt
    """Its per-turn output-token cap."""


class ReasoningSetting(_Model):
    """One value of the sweep's reasoning axis (issue 16), mapped per wire like
    `sampling.reasoning_effort` / `sampling.thinking_budget`, which it overrides per cell."""

    effort: str | None = None
    """Chat `reasoning_effort`, Responses `reasoning.effort`, Gemini `thinkingLevel`."""
    thinking_budget: PositiveInt | None = None
    """Anthropic `thinking.budget_tokens` (at least 1024, below the cell's budget), Gemini
    `thinkingBudget`."""

    @property
    def label(self) -> str:
        """The `reasoning` column value: `effort=low`, `budget=2048`, both, or `none`."""
        parts = [f"effort={self.effort}"] if self.effort is not None else []
        parts += [f"budget={self.thinking_budget}"] if self.thinking_budget is not None else []
        return ",".join(parts) or "none"


class SweepConfig(_Model):
    models: Annotated[list[str], Field(min_length=1)]
    """Model names. For the simulator these are preset names, listed under "Simulator presets"
    at the end of docs/configuration.md (any other name is refused by `collector validate`
    and `run`)."""
    budgets: Annotated[list[Budget], Field(min_length=1)]
    """Per-turn output-token caps to sweep (integers, 1 to 2**63-1)."""
    providers: Annotated[list[ProviderConfig], Field(min_length=1)] | None = None
    """Optional extra sweep axis; when unset, the run's single `provider` is used."""
    pairing: Literal["product", "zip"] = "product"
    """How models meet budgets: "product", every model at every budget; "zip", the i-th model
    at the i-th budget only (equal lengths; a value may then repeat on one axis)."""
    cells: Annotated[list[SweepCell], Field(min_length=1)] | None = None
    """Explicit (model, budget) cells to run instead of the product. `models` and `budgets`
    default to the values the cells use; when given, every cell must use listed values."""
    reasoning: Annotated[list[ReasoningSetting], Field(min_length=1)] | None = None
    """Optional reasoning axis: every (model, budget) cell runs once per setting, stored in
    the `reasoning` column (statistics group by it). An Anthropic thinking budget not below
    a cell's budget is refused before anything runs, naming the cell."""
    order: Literal["sample_major", "group_major"] = "sample_major"
    """The order episodes are handed out in. "sample_major" (the default): sample 0 of every
    task and cell first, then sample 1, ...: a run stopped early holds a little of every
    cell, but a group (a task's samples in one cell) completes only in the last
    1/samples_per_task of the run. "group_major": a group's samples one after another, so
    groups complete from the first commits on: for a GRPO consumer following the run with
    `collector follow --groups complete` (docs/follow.md). Episode ids, resume and
    exactly-once are the same either way; not in the fingerprint."""

    @model_validator(mode="before")
    @classmethod
    def _axes_from_cells(cls, data: Any) -> Any:
        # `cells` alone is a whole sweep: the axes are the values the cells use, in order.
        if not isinstance(data, Mapping) or not isinstance(data.get("cells"), list):
            return data
        cells = [c for c in data["cells"] if isinstance(c, Mapping)]
        filled = dict(data)
        for axis, key in (("models", "model"), ("budgets", "budget")):
            if axis not in filled:
                filled[axis] = list(dict.fromkeys(c[key] for c in cells if key in c))
        return filled

    def pairs(self) -> list[tuple[str, int]]:
        """The (model, budget) cells of the sweep, model-major for a product."""
        if self.cells is not None:
            return [(c.model, c.budget) for c in self.cells]
        if self.pairing == "zip":
            return list(zip(self.models, self.budgets, strict=True))
        return [(m, b) for m in self.models for b in self.budgets]

    @field_validator("models")
    @classmethod
    def _model_names(cls, models: list[str]) -> list[str]:
        for model in models:
            if not model or len(model) > MAX_MODEL_NAME or not model.isprintable():
                raise ValueError(f"a model name must be 1 to {MAX_MODEL_NAME} printable characters, not "
                                 f"{_describe(model)}")
        return models

    @model_validator(mode="after")
    def _distinct(self) -> SweepConfig:
        paired = self.cells is not None or self.pairing == "zip"
        if paired and self.cells is None and len(self.models) != len(self.budgets):
            raise ValueError(
                f'pairing = "zip" needs as many models as budgets ({len(self.models)} != {len(self.budgets)})'
            )
        if self.cells is not None:
            for i, cell in enumerate(self.cells):
                if cell.model not in self.models or cell.budget not in self.budgets:
                    where = f"cells.{i}: ({cell.model!r}, {cell.budget})"
                    raise ValueError(f"{where} uses a model or budget not listed")
        if paired:
            pairs = self.pairs()
            if len(set(pairs)) != len(pairs):
                raise ValueError("a (model, budget) cell is listed twice")
        for axis, values in (("models", self.models), ("budgets", self.budgets)):
            if len(set(values)) != len(values) and not (paired and self.cells is None):
                raise ValueError(f"{axis} lists a value twice")
        if self.providers is not None:
            names = [p.name for p in self.providers]
            if len(set(names)) != len(names):
                raise ValueError("swept providers need distinct labels (set provider.label)")
        return self



def _merged(base: dict[str, object], extra: Mapping[str, object]) -> dict[str, object]:
    # The adapters' `merge_extra` rule (collector.providers.common), which this layer cannot import.
    for key, value in extra.items():
        current = base.get(key)
        if isinstance(current, dict) and isinstance(value, Mapping):
            base[key] = _merged(dict(current), value)
        else:
            base[key] = value
    return base


def _describe(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."

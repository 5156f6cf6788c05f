"""Run configuration: small pydantic models, loaded from TOML, overridable from the CLI.

Every model forbids unknown fields, so a typo is an error that names the field rather than
a setting silently ignored. This module imports neither `ray` nor `numpy`: validating a
config must be cheap and possible anywhere.

TOML because the standard library reads it (`tomllib`) and the closest peers use it.
`load_config(path, overrides)` applies `--set a.b=value` overrides (values parsed as TOML)
before validation, so an override is checked exactly like the file. Every failure is one
`ConfigError` line: `configs/x.toml: sweep.budgets.0: Input should be greater than 0 (got -5)`.

Identity. `config_fingerprint` hashes only the fields that define what an episode means
(provider wire, sampling, environment, loop policy, seed, run name). The fields that only
select which episodes exist (models, budgets, samples, task count) and the ones that only
shape how the run executes (output, Ray, concurrency, the provider's request timeout and
retries) are left out: episode ids already name their cell, so a grown sweep resumes into
the same run directory, while a changed policy is refused there. The loop's timeouts
(`loop.episode_timeout_s`, `loop.tool_timeout_s`) stay in: they decide which episodes end
as `timeout` and which tool results are errors, so they shape the data.

Checks that need more than the schema (`check_run_config`: simulator model names must be
presets) run in `load_config` and again in the job before Ray starts, not in the pydantic
models, so a `RunConfig` can still be built in code for any model name.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from collector.errors import ConfigError
from collector.stop import STOP_ON_CHOICES, StopReason

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
_RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


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
    retry: RetryConfig = RetryConfig()
    """How failed model calls are retried (not in the fingerprint)."""
    label: str | None = None
    """Stored in the `provider` column; defaults to the kind. Must differ between swept providers."""
    context_window: PositiveInt | None = None
    """The model's context window in tokens. Set, each turn's cap is clamped to what the window
    leaves after the (estimated) prompt, and a turn that cannot fit ends the episode as
    `context_overflow` without a request. Unset: only the provider's own error says so."""
    allow_model_alias: bool = False
    """Skip the check, before the sweep, that this server serves each model of `sweep.models`
    (its `/models` list, or the `model` of one small reply). For a server that answers every
    name with its own alias on purpose (llama-server's `-a`); the reply's model is still
    recorded per turn. Not in the fingerprint."""

    @model_validator(mode="after")
    def _real_needs_url(self) -> ProviderConfig:
        if self.kind != "sim" and not self.base_url:
            raise ValueError(f"base_url is required for provider kind {self.kind!r}")
        return self

    @property
    def name(self) -> str:
        """What the `provider` column holds for this provider."""
        return self.label or self.kind

    @property
    def wire(self) -> ProviderKind:
        """The wire format actually spoken."""
        return self.sim_transport if self.kind == "sim" else self.kind


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
    token_ids: bool = False
    """Token capture: ask each server for the sampled token ids, the prompt token ids and the
    output logprobs (chat wire: vLLM/SGLang `return_token_ids`, SGLang `return_prompt_token_ids`,
    and `logprobs`, which carries llama.cpp's ids). A server that ignores it does not fail the
    run: the turn records that ids were asked for and not returned. Stored per turn in `turns`."""
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
    """Model names. For the simulator these are preset names: the keys of `PRESETS` in
    collector/sim/presets.py (any other name is refused by `collector validate` and `run`)."""
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


class EnvConfig(_Model):
    name: str = "arithmetic"
    """A built-in environment (`arithmetic`, `support_desk`) or `package.module:attr`."""
    tasks: Annotated[int, Field(gt=0, le=MAX_TASKS)] | None = None
    """Use the first N tasks; all when unset (at most 1,000,000)."""
    task_file: str | None = None
    """Optional JSONL or Parquet file of tasks (columns: id, prompt, metadata)."""
    options: dict[str, object] = {}
    """Passed to the environment's constructor."""
    python_path: list[str] = []
    """Directories put on `sys.path` (driver and workers) before a `module:attr` environment is
    imported, for an environment that is not installed. Relative to where `collector run` runs."""


class RewardConfig(_Model):
    policy: Literal["zero", "grade_then_clamp"] = "zero"
    """For length and malformed_tool_call episodes: "zero" stores reward 0.0; "grade_then_clamp"
    grades them and stores min(graded, 0.0) as reward. The graded value is kept either way when
    `grade_cut_episodes` is set."""
    grade_cut_episodes: bool = False
    """Run the grader on cut/malformed episodes too and keep its value in `graded_reward`."""
    grade_max_steps: bool = True
    """Grade episodes that ended at max_steps (else reward 0.0)."""


class RedactionConfig(_Model):
    secret_keys: list[str] = [
        "token", "password", "passwd", "pwd", "passphrase", "secret", "api_key", "access_key",
        "private_key", "authorization", "auth", "credential", "cookie", "session_id", "jwt",
    ]  # fmt: skip
    """Names of argument keys whose values are replaced before storage, matched by word parts
    (`auth` hides `authToken` and `X-Auth-Token`, not `author`; `collector.episode.redact`)."""
    keep_raw_fragments: bool = False
    """Debug only: keep unparseable argument fragments in a separate field. Off by default."""


class LoopConfig(_Model):
    stop_on: frozenset[StopReason] = frozenset(STOP_ON_CHOICES)
    """Turn faults that end the episode at that turn (nothing of the turn executed, reward 0)."""
    max_steps: PositiveInt = 8
    """Model turns per episode."""
    max_consecutive_faults: PositiveInt = 2
    """When a fault is not in stop_on: consecutive cut (or malformed) turns before the episode
    ends with that reason."""
    episode_timeout_s: PositiveFloat = 300.0
    """Wall time per episode before it ends as `timeout`. In the fingerprint: it shapes the data."""
    tool_timeout_s: PositiveFloat = 10.0
    """Wall time per tool call before its result is an error. In the fingerprint: it shapes the data."""
    episode_output_budget: PositiveInt | None = None
    """Optional cap on output tokens across the whole episode, beside the per-turn cap."""
    max_tool_calls_per_turn: PositiveInt = 128
    """A turn asking for more tool calls than this ends the episode as `error`
    (ProtocolViolation), and none of its calls runs."""
    max_argument_bytes: PositiveInt = 1024 * 1024
    """A tool call whose arguments are longer than this (UTF-8 bytes; 1 MiB) ends the episode
    as `error` (ProtocolViolation), and no call of its turn runs."""
    retry_cut_answers: bool = False
    """Opt-in: when a turn with no tool call (a final answer) is cut by the cap and `length`
    is not in stop_on, add a user message asking for a shorter reply and call the model again
    (up to max_consecutive_faults). Off by default: the episode ends as `length`, since that
    message is a turn the task never had."""
    reward: RewardConfig = RewardConfig()
    """What reward cut, malformed and max_steps episodes get."""
    redaction: RedactionConfig = RedactionConfig()
    """What is scrubbed from tool arguments before storage."""

    @field_validator("stop_on")
    @classmethod
    def _only_turn_faults(cls, value: frozenset[StopReason]) -> frozenset[StopReason]:
        extra = value - STOP_ON_CHOICES
        if extra:
            allowed = ", ".join(sorted(STOP_ON_CHOICES))
            raise ValueError(f"stop_on may only list {allowed}; got {', '.join(sorted(extra))}")
        return value


class RayConfig(_Model):
    address: str | None = None
    """Empty: an embedded local cluster. Else a cluster address (or set RAY_ADDRESS)."""
    workers: Annotated[int, Field(gt=0, le=MAX_WORKERS)] = 2
    """Worker actors (one event loop each; on a cluster, spread one per node first); at most 1024."""
    episodes_in_flight: Annotated[int, Field(gt=0, le=MAX_EPISODES_IN_FLIGHT)] = 64
    """Concurrent episodes per worker (at most 4096)."""
    batch_size: PositiveInt = 32
    """Episodes handed to a worker per call (one Ray call per batch, never per model call)."""
    batch_timeout_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    """How long a worker may hold a batch before the driver gives up on it (a frozen or hung
    worker), replaces the worker and runs the batch's episodes elsewhere. Unset: derived,
    `loop.episode_timeout_s x (ceil(episodes a worker holds / episodes_in_flight) + 1) + 60 s`."""
    cpus_per_worker: Annotated[float, Field(ge=0)] = 1.0
    """CPUs each worker actor reserves in Ray's scheduler (one busy event loop is one core).
    `workers x cpus_per_worker` must fit the cluster's CPUs, or the run stops before starting."""
    start_timeout_s: PositiveFloat = 60.0
    """How long a worker actor may take to be placed and become ready (also a replacement after
    a worker died), and how long `ray.address` may take to answer a TCP connect. Past it the
    run stops with one line instead of waiting forever for room or for the cluster."""
    temp_dir: str | None = None
    """Where the embedded local cluster keeps its session, Ray's logs included
    (`<temp_dir>/session_latest/logs`), e.g. `"runs/demo/ray"` to keep them with the run.
    Unset: Ray's default `/tmp/ray`, shared by every run on the machine. Ray's sockets live
    under it, so its absolute path must stay short (at most 43 characters). A cluster joined
    by address keeps its own. Either way a worker failure names the log directory."""


class OutputConfig(_Model):
    path: str = "runs/{name}"
    """The run directory. `{name}` is replaced by the run's `name`, so by default every config
    gets its own `runs/<name>` and two configs never collide on one directory."""
    format: Literal["arrow", "parquet"] = "arrow"
    """Shard file format: Arrow IPC (zstd) or Parquet."""
    rows_per_shard: PositiveInt = 512
    """Rows per shard. The driver buffers finished episodes per (model, budget) cell and
    commits a cell when it holds this many; smaller shards only at `commit_interval_s` and
    at the end of the run."""
    max_buffered_rows: PositiveInt = 4096
    """The most finished episodes the driver holds uncommitted, across all cells: past it, the
    largest cells are committed first (as smaller shards) until half of it is left. Bounds
    the driver's memory whatever the number of cells (plus one returned batch)."""
    commit_interval_s: PositiveFloat = 30.0
    """Commit whatever is buffered at least this often. A killed driver loses at most this
    much work (rerun to resume); shorter means more, smaller shards."""
    worker_writes: Literal["auto"] | bool = "auto"
    """Who writes the shards. `true`: each worker writes the shards of its batches itself
    (one per cell of a batch) and the driver commits only their names, sizes and checksums,
    so episode bytes never cross Ray; `false`: workers return episodes and the driver writes
    (shards of `rows_per_shard`). `"auto"`: workers write when `path` is in object storage
    (``s3://``), the driver otherwise. `true` with a local path declares that path a shared
    filesystem (NFS, Lustre, ...) that resolves to the same directory on every node. With
    worker-side writes a shard is one batch's rows of one cell (`ray.batch_size` sets its
    size) and `rows_per_shard` only says when a cell's pending shards are committed."""

    @field_validator("worker_writes", mode="before")
    @classmethod
    def _worker_writes_is_auto_or_a_bool(cls, value: object) -> object:
        # Strict: "yes" or 1 read as true would declare a shared filesystem by accident.
        if value == "auto" or isinstance(value, bool):
            return value
        raise ValueError('must be "auto", true or false')


class RunConfig(_Model):
    name: str = "run"
    """The run's name: the start of the run id (and of every episode id) and the default
    output directory `runs/<name>`. Letters, digits, `.`, `_` and `-`, starting with a
    letter or digit, at most 100 characters: it names a directory."""
    seed: Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX, strict=True)] = 0
    """Run seed (a 64-bit signed integer): per-episode seeds derive from it, and the
    simulator is seeded with it."""
    samples_per_task: Annotated[int, Field(gt=0, le=MAX_SAMPLES_PER_TASK)] = 1
    """Episodes per task in each sweep cell (at most 100,000)."""
    provider: ProviderConfig = ProviderConfig()
    """The model provider (the simulator by default); see `sweep.providers` for several."""
    sampling: SamplingConfig = SamplingConfig()
    """Request parameters sent with every call."""
    sweep: SweepConfig
    """The cells: models x budgets (x providers)."""
    env: EnvConfig = EnvConfig()
    """The environment whose tasks the episodes work."""
    loop: LoopConfig = LoopConfig()
    """The episode loop's policy."""
    ray: RayConfig = RayConfig()
    """Where and how wide the run executes."""
    output: OutputConfig = OutputConfig()
    """Where and how episodes are stored."""

    @field_validator("name")
    @classmethod
    def _safe_name(cls, name: str) -> str:
        # The name becomes a path (`runs/{name}`): "../x" would write outside runs/, and a
        # newline or an empty name is no directory name at all.
        if not _RUN_NAME.fullmatch(name):
            raise ValueError(
                "name must be 1 to 100 letters, digits, '.', '_' or '-', starting with a letter or "
                "digit (it names the run directory)"
            )
        return name

    @model_validator(mode="after")
    def _sweep_size(self) -> RunConfig:
        # What the sweep alone multiplies to, before any task is read; `plan_work` checks again
        # with the real task count.
        providers = len(self.sweep.providers or [self.provider])
        cells = self.samples_per_task * providers * len(self.sweep.models) * len(self.sweep.budgets)
        if cells * (self.env.tasks or 1) > MAX_EPISODES:
            raise ValueError(
                f"the sweep plans more than {MAX_EPISODES:,} episodes (samples_per_task x providers x "
                f"models x budgets x tasks); split it into several runs"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _output_path_named(cls, data: Any) -> Any:
        # Expand `{name}` before the (frozen) models are built; a mapping only: an already
        # built RunConfig has its path expanded.
        if not isinstance(data, Mapping):
            return data
        output = data.get("output", {})
        if not isinstance(output, Mapping):
            return data  # the field validation reports it
        name = data.get("name", "run")
        path = output.get("path", OutputConfig.model_fields["path"].default)
        if isinstance(path, str) and isinstance(name, str) and "{name}" in path:
            return {**data, "output": {**output, "path": path.replace("{name}", name)}}
        return data


def check_run_config(cfg: RunConfig, source: str = "<config>") -> RunConfig:
    """Checks beyond the schema; a one-line ConfigError naming `source` and the field.

    Simulator model names must be presets: the simulator answers any other name with a 404,
    which would otherwise only show once Ray is up. Imported here, lazily, so that loading
    the config module stays cheap.
    """
    providers = cfg.sweep.providers or [cfg.provider]
    if any(p.kind == "sim" for p in providers):
        from collector.sim.presets import PRESETS

        for i, model in enumerate(cfg.sweep.models):
            if model not in PRESETS:
                known = ", ".join(sorted(PRESETS))
                raise ConfigError(
                    f"{source}: sweep.models.{i}: {model!r} is not a simulator preset (known: {known})"
                )
    return cfg


# --- Loading: TOML files, `--set` overrides, one-line errors. -----------------------------


def parse_override(text: str) -> tuple[list[str], object]:
    """Split `a.b.c=value` into its field path and a value parsed as a TOML value.

    TOML gives lists, numbers, booleans and quoted strings their natural syntax
    (`sweep.budgets=[64,128]`, `loop.max_steps=4`, `name="x"`). A value that is not valid
    TOML is taken as a bare string, so `output.path=runs/x` works without quoting.
    """
    key, sep, raw = text.partition("=")
    path = [part.strip() for part in key.strip().split(".")]
    if not sep or not all(path):
        raise ConfigError(f"--set {text}: expected KEY=VALUE with a dotted key, e.g. sweep.budgets=[64,128]")
    raw = raw.strip()
    try:
        value: object = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return path, value


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Return a copy of `data` with each `a.b=value` override set (intermediate tables created)."""
    merged = copy.deepcopy(data)
    for text in overrides:
        path, value = parse_override(text)
        node = merged
        for i, part in enumerate(path[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                where = ".".join(path[: i + 1])
                raise ConfigError(f"--set {text}: {where} is a value, not a table")
            node = child
        node[path[-1]] = value
    return merged


def _describe(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _one_line(source: str, exc: ValidationError) -> str:
    """The first validation error as `source: field.path: message (got value)`."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    loc = ".".join(str(part) for part in first["loc"]) or "(top level)"
    message = first["msg"]
    # A whole table as "the value" is noise (model-level checks); name scalars and lists only.
    if first["type"] != "missing" and not isinstance(first["input"], dict):
        message += f" (got {_describe(first['input'])})"
    more = f" [+{len(errors) - 1} more]" if len(errors) > 1 else ""
    return f"{source}: {loc}: {message}{more}".replace("\n", " ")


def config_from_dict(data: Mapping[str, Any], source: str = "<config>") -> RunConfig:
    """Validate a plain mapping into a RunConfig, or raise a one-line ConfigError naming `source`."""
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_one_line(source, exc)) from None


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> RunConfig:
    """Read a TOML config, apply `--set` overrides, validate.

    Every failure is a ConfigError whose message is one line naming the file, the field path
    and the bad value.
    """
    source = str(path)
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{source}: no such config file") from None
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        # TOML is UTF-8 by definition (tomllib decodes before parsing).
        raise ConfigError(f"{source}: not valid TOML: not UTF-8 text (byte {exc.start})") from None
    return check_run_config(config_from_dict(apply_overrides(data, overrides), source), source)


# --- Identity: which fields define the data. -----------------------------------------------

#: Fields that only select *which* episodes exist, not what any one of them contains. Every
#: episode id already names its model, budget, task and sample, so growing a sweep (another
#: budget, more samples, more tasks) resumes into the same run directory and runs only the
#: new cells. Output, Ray layout, concurrency, the provider's request timeout and retries
#: never change an episode's meaning either, so they stay out as well (the loop's timeouts
#: do change it: which episodes time out, which tool results are errors; they stay in).
_SELECTION_ONLY: dict[str, Any] = {
    "samples_per_task": True,
    "sweep": {"models": True, "budgets": True, "pairing": True, "cells": True, "reasoning": True},
    "env": {"tasks": True, "python_path": True},
    "ray": True,
    "output": True,
}
#: Loop fields added after run directories existed: left out of the identity while at their
#: default, so a run directory written before they existed still resumes.
_LATER_LOOP_FIELDS = ("max_tool_calls_per_turn", "max_argument_bytes")
_PROVIDER_TRANSPORT_ONLY = {
    "request_timeout_s", "request_deadline_s", "max_reply_bytes", "retry", "api_key_env", "http_client",
    "allow_model_alias",
}


def _provider_identity(provider: ProviderConfig) -> dict[str, Any]:
    data = provider.model_dump(mode="json", exclude=_PROVIDER_TRANSPORT_ONLY)
    if provider.kind == "sim":
        # The simulator gets a fresh loopback port per run; its address means nothing.
        data.pop("base_url", None)
    if data.get("context_window") is None:  # issue 16: unset keeps existing run ids
        data.pop("context_window", None)
    return data


def data_identity(cfg: RunConfig) -> dict[str, Any]:
    """The part of a config that defines what the collected data means (JSON-ready)."""
    data = cfg.model_dump(mode="json", exclude=_SELECTION_ONLY)
    data["provider"] = _provider_identity(cfg.provider)
    if cfg.sweep.providers is not None:
        data["sweep"]["providers"] = [_provider_identity(p) for p in cfg.sweep.providers]
    # frozenset dumps in hash order: sort it so the fingerprint is stable across processes.
    data["loop"]["stop_on"] = sorted(data["loop"]["stop_on"])
    for name in _LATER_LOOP_FIELDS:
        if data["loop"][name] == LoopConfig.model_fields[name].default:
            del data["loop"][name]
    for name in ("reasoning_effort", "thinking_budget"):  # issue 16: unset keeps existing run ids
        if data["sampling"][name] is None:
            del data["sampling"][name]
    return data


def config_fingerprint(cfg: RunConfig) -> str:
    """A stable hash of `data_identity(cfg)`: equal exactly when two configs collect the same data."""
    canonical = json.dumps(data_identity(cfg), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def run_id(cfg: RunConfig) -> str:
    """The run's id, part of every episode id: the run name plus a short fingerprint.

    Two runs that collect different data never share episode ids, even under the same name,
    so shards from several runs can be concatenated for a trainer without collisions.
    """
    return f"{cfg.name}-{config_fingerprint(cfg)[:8]}"


def with_absolute_paths(cfg: RunConfig, base: str | Path | None = None) -> RunConfig:
    """The config with its file paths (task file, python_path) made absolute against `base`.

    Workers do not share the driver's working directory, so paths are pinned down in the
    driver before the config crosses to them. Not used for the fingerprint, which must not
    depend on where the command was started.
    """
    root = Path(base) if base is not None else Path.cwd()
    env = cfg.env
    task_file = str(root / env.task_file) if env.task_file is not None else None
    paths = [str(root / p) for p in env.python_path]
    return cfg.model_copy(
        update={"env": env.model_copy(update={"task_file": task_file, "python_path": paths})}
    )


def public_url(url: str) -> str:
    """`url` without user info, query or fragment: where credentials hide in a base URL
    (`https://user:pass@host/v1`, `...?key=...`). Used for anything stored or printed."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"  # an IPv6 literal keeps its brackets
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ""  # a malformed port: drop it rather than fail while making a safe copy
    return f"{parts.scheme}://{host}{port}{parts.path}" if parts.scheme else parts.path


def resolved_config(cfg: RunConfig) -> dict[str, Any]:
    """The fully resolved config as JSON-ready data, saved beside the output.

    It holds the *name* of the API-key variable, never its value, and base URLs without
    user info or query string (`public_url`), so credentials put in a URL are not saved.
    """
    data = cfg.model_dump(mode="json")
    data["loop"]["stop_on"] = sorted(data["loop"]["stop_on"])
    providers = [data["provider"], *(data["sweep"].get("providers") or [])]
    for provider in providers:
        if provider.get("base_url"):
            provider["base_url"] = public_url(provider["base_url"])
    return data

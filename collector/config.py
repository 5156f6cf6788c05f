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
shape how the run executes (output, Ray, concurrency, timeouts, retries) are left out:
episode ids already name their cell, so a grown sweep resumes into the same run directory,
while a changed policy is refused there.
"""

from __future__ import annotations

import copy
import hashlib
import json
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from collector.errors import ConfigError
from collector.stop import STOP_ON_CHOICES, StopReason

ProviderKind = Literal["chat", "responses", "anthropic", "gemini"]
PositiveInt = Annotated[int, Field(gt=0)]
PositiveFloat = Annotated[float, Field(gt=0)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RetryConfig(_Model):
    max_retries: Annotated[int, Field(ge=0)] = 4
    """Retries per model call for retryable failures (429, 5xx, 529, transport, broken streams)."""
    initial_backoff_s: PositiveFloat = 0.5
    max_backoff_s: PositiveFloat = 8.0
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
    request_timeout_s: PositiveFloat = 60.0
    cap_field: Literal["max_completion_tokens", "max_tokens"] | None = None
    """Chat Completions: which field carries the output cap (OSS servers often want max_tokens)."""
    retry: RetryConfig = RetryConfig()
    label: str | None = None
    """Stored in the `provider` column; defaults to the kind. Must differ between swept providers."""

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
    temperature: float | None = None
    top_p: float | None = None
    stop: list[str] | None = None
    tool_choice: str | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    extra_body: dict[str, object] = {}
    """Server-specific request fields (vLLM, llama.cpp), merged into every request body."""


class SweepConfig(_Model):
    models: Annotated[list[str], Field(min_length=1)]
    """Model names. For the simulator these are preset names (see `collector sim --list`)."""
    budgets: Annotated[list[PositiveInt], Field(min_length=1)]
    """Per-turn output-token caps to sweep."""
    providers: list[ProviderConfig] | None = None
    """Optional extra sweep axis; when unset, the run's single `provider` is used."""

    @model_validator(mode="after")
    def _distinct(self) -> SweepConfig:
        for axis, values in (("models", self.models), ("budgets", self.budgets)):
            if len(set(values)) != len(values):
                raise ValueError(f"{axis} lists a value twice")
        if self.providers is not None:
            names = [p.name for p in self.providers]
            if len(set(names)) != len(names):
                raise ValueError("swept providers need distinct labels (set provider.label)")
        return self


class EnvConfig(_Model):
    name: str = "arithmetic"
    """A built-in environment (`arithmetic`, `support_desk`) or `package.module:attr`."""
    tasks: PositiveInt | None = None
    """Use the first N tasks; all when unset."""
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
    secret_keys: list[str] = ["token", "password", "secret", "api_key", "authorization", "cookie"]
    """Argument keys (case-insensitive substrings) whose values are replaced before storage."""
    keep_raw_fragments: bool = False
    """Debug only: keep unparseable argument fragments in a separate field. Off by default."""


class LoopConfig(_Model):
    stop_on: frozenset[StopReason] = frozenset(STOP_ON_CHOICES)
    max_steps: PositiveInt = 8
    """Model turns per episode."""
    max_consecutive_faults: PositiveInt = 2
    """When a fault is not in stop_on: consecutive cut (or malformed) turns before the episode
    ends with that reason."""
    episode_timeout_s: PositiveFloat = 300.0
    tool_timeout_s: PositiveFloat = 10.0
    episode_output_budget: PositiveInt | None = None
    """Optional cap on output tokens across the whole episode, beside the per-turn cap."""
    reward: RewardConfig = RewardConfig()
    redaction: RedactionConfig = RedactionConfig()

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
    workers: PositiveInt = 2
    episodes_in_flight: PositiveInt = 64
    """Concurrent episodes per worker."""
    batch_size: PositiveInt = 32
    """Episodes handed to a worker per call (one Ray call per batch, never per model call)."""
    cpus_per_worker: Annotated[float, Field(ge=0)] = 1.0
    """CPUs each worker actor reserves in Ray's scheduler (one busy event loop is one core)."""


class OutputConfig(_Model):
    path: str = "runs/demo"
    format: Literal["arrow", "parquet"] = "arrow"
    rows_per_shard: PositiveInt = 512


class RunConfig(_Model):
    name: str = "run"
    seed: int = 0
    samples_per_task: PositiveInt = 1
    provider: ProviderConfig = ProviderConfig()
    sampling: SamplingConfig = SamplingConfig()
    sweep: SweepConfig
    env: EnvConfig = EnvConfig()
    loop: LoopConfig = LoopConfig()
    ray: RayConfig = RayConfig()
    output: OutputConfig = OutputConfig()


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
    return config_from_dict(apply_overrides(data, overrides), source)


# --- Identity: which fields define the data. -----------------------------------------------

#: Fields that only select *which* episodes exist, not what any one of them contains. Every
#: episode id already names its model, budget, task and sample, so growing a sweep (another
#: budget, more samples, more tasks) resumes into the same run directory and runs only the
#: new cells. Output, Ray layout, concurrency, timeouts and retries never change an episode's
#: meaning either, so they stay out as well.
_SELECTION_ONLY: dict[str, Any] = {
    "samples_per_task": True,
    "sweep": {"models": True, "budgets": True},
    "env": {"tasks": True, "python_path": True},
    "ray": True,
    "output": True,
}
_PROVIDER_TRANSPORT_ONLY = {"request_timeout_s", "retry", "api_key_env"}


def _provider_identity(provider: ProviderConfig) -> dict[str, Any]:
    data = provider.model_dump(mode="json", exclude=_PROVIDER_TRANSPORT_ONLY)
    if provider.kind == "sim":
        # The simulator gets a fresh loopback port per run; its address means nothing.
        data.pop("base_url", None)
    return data


def data_identity(cfg: RunConfig) -> dict[str, Any]:
    """The part of a config that defines what the collected data means (JSON-ready)."""
    data = cfg.model_dump(mode="json", exclude=_SELECTION_ONLY)
    data["provider"] = _provider_identity(cfg.provider)
    if cfg.sweep.providers is not None:
        data["sweep"]["providers"] = [_provider_identity(p) for p in cfg.sweep.providers]
    # frozenset dumps in hash order: sort it so the fingerprint is stable across processes.
    data["loop"]["stop_on"] = sorted(data["loop"]["stop_on"])
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


def resolved_config(cfg: RunConfig) -> dict[str, Any]:
    """The fully resolved config as JSON-ready data, saved beside the output.

    It holds the *name* of the API-key variable, never its value.
    """
    data = cfg.model_dump(mode="json")
    data["loop"]["stop_on"] = sorted(data["loop"]["stop_on"])
    return data

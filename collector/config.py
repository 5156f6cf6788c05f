"""Run configuration: small pydantic models, loaded from TOML, overridable from the CLI.

Every model forbids unknown fields, so a typo is an error that names the field rather than
a setting silently ignored. This module imports neither `ray` nor `numpy`: validating a
config must be cheap and possible anywhere.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

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


class EnvConfig(_Model):
    name: str = "arithmetic"
    """A built-in environment (`arithmetic`, `support_desk`) or `package.module:attr`."""
    tasks: PositiveInt | None = None
    """Use the first N tasks; all when unset."""
    task_file: str | None = None
    """Optional JSONL or Parquet file of tasks (columns: id, prompt, metadata)."""
    options: dict[str, object] = {}
    """Passed to the environment's constructor."""


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

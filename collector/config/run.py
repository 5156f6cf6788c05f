"""The run's own models: environment, loop policy, Ray layout, output, and `RunConfig`.

Part of `collector.config` (import from there). Tests: tests/test_config.py.
`check_run_config` holds the checks that need more than the schema (simulator presets).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from collector.config.models import (
    INT64_MAX,
    INT64_MIN,
    MAX_EPISODES,
    MAX_EPISODES_IN_FLIGHT,
    MAX_SAMPLES_PER_TASK,
    MAX_TASKS,
    MAX_WORKERS,
    PositiveFloat,
    PositiveInt,
    ProviderConfig,
    SamplingConfig,
    SweepConfig,
    _Model,
)
from collector.errors import ConfigError
from collector.stop import STOP_ON_CHOICES, StopReason

_RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


class EnvConfig(_Model):
    name: str = "arithmetic"
    """A built-in environment (`arithmetic`, `support_desk`), `package.module:attr`, or a TRL
    environment class as `trl:package.module:Class` (its reward functions in
    `options.reward`; docs/environments.md)."""
    tasks: Annotated[int, Field(gt=0, le=MAX_TASKS)] | None = None
    """Use the first N tasks; all when unset (at most 1,000,000)."""
    task_file: str | None = None
    """Optional JSONL or Parquet file of tasks (columns: id, prompt, metadata). In a config file,
    a relative path is relative to the file's directory (`collector run proj/config.toml` finds
    `proj/tasks.jsonl`); given with `--set`, relative to the working directory."""
    # The noqa: RUF012 here: pydantic copies field defaults per instance (ruff cannot see
    # that `_Model`, defined in another module, is a pydantic model).
    options: dict[str, object] = {}  # noqa: RUF012
    """Passed to the environment's constructor."""
    python_path: list[str] = []  # noqa: RUF012
    """Directories put on `sys.path` (driver and workers) before a `module:attr` environment is
    imported, for an environment that is not installed. In a config file, relative to the
    file's directory (like `task_file`); given with `--set`, relative to the working directory."""
    # `task_file` as the config file wrote it, beside the absolute path `load_config` made of
    # it: the fingerprint hashes the written form, so moving the project (or starting from
    # another directory) is not "another config". Private: not a setting, never dumped.
    _task_file_written: tuple[str, str] | None = PrivateAttr(default=None)

    def task_file_as_written(self) -> str | None:
        """`task_file` as its config file wrote it (relative to the file), or as set."""
        written = self._task_file_written
        if written is not None and written[0] == self.task_file:
            return written[1]
        return self.task_file


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
    secret_keys: list[str] = [  # noqa: RUF012
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
    max_tool_result_bytes: PositiveInt = 1024 * 1024
    """A tool result longer than this (UTF-8 bytes; 1 MiB) is dropped and the call's result is
    an error saying so (the model reads it; the episode goes on). Results are stored and sent
    again on every later turn, so an unbounded one (a 16 MB MCP answer) costs every step."""
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
    pool: Literal["ray", "in_process"] = "ray"
    """Where the workers run. "ray": actors on an embedded local Ray cluster or the one
    `address` names. "in_process": event-loop threads in the driver's own process, no Ray at
    all (`collector run --in-process`): a small sweep, a notebook or a new environment runs in
    the time of its episodes instead of Ray's start-up (seconds), with the same commits,
    resume and exactly-once guarantees, but the workers share one core and no cluster is
    joined. A run directory written either way is the same and resumes either way."""
    address: str | None = None
    """Empty: an embedded local cluster. Else a cluster address (or set RAY_ADDRESS)."""
    workers: Annotated[int, Field(gt=0, le=MAX_WORKERS)] = 2
    """Worker actors (one event loop each; on a cluster, spread one per node first); at most 1024."""
    episodes_in_flight: Annotated[int, Field(gt=0, le=MAX_EPISODES_IN_FLIGHT)] = 64
    """Concurrent episodes per worker (at most 4096); with `admission = "adaptive"`, the
    ceiling of the requests in flight per provider and model."""
    admission: Literal["static", "adaptive"] = "static"
    """"static": every episode slot sends when it is ready. "adaptive": requests in flight per
    (provider, model) adapt to what the server takes, up to `episodes_in_flight`: additive
    increase while replies are healthy, multiplicative decrease on 429 / 503 / 529 /
    timeouts / rising latency, pauses on `Retry-After` and rate-limit headers, and the
    provider's declared budgets enforced (`collector.run.admission`; needs the default
    `provider.http_client = "fast"`)."""
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
    gets its own `runs/<name>` and two configs never collide on one directory. A relative path
    is relative to the working directory, not to the config file (unlike `env.task_file`):
    the data goes where the command runs, and a run resumes wherever the config is kept."""
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
    much work (rerun to resume); shorter means more, smaller shards. It is also how late a
    live follower (`collector follow`) sees episodes: ask for a few seconds when a trainer
    consumes the run as it is collected (docs/follow.md)."""
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


class WandbConfig(_Model):
    project: str = Field(min_length=1)
    """The W&B project the run is logged to."""
    entity: str | None = None
    """The W&B team or user; unset: the API key's default entity."""
    mode: Literal["online", "offline"] | None = None
    """`offline` writes the run under `dir` only (sync it later with `wandb sync`); unset:
    `WANDB_MODE`, else online. The API key is never in config: `WANDB_API_KEY` or `wandb login`."""
    name: str | None = None
    """The W&B run's name; unset: the collector's run id (`name-fingerprint`)."""
    dir: str | None = None
    """Where W&B writes its local files (`<dir>/wandb/`); unset: `WANDB_DIR`, else the working directory."""
    tags: list[str] = []  # noqa: RUF012
    """Tags of the W&B run."""


class MlflowConfig(_Model):
    tracking_uri: str | None = None
    """The MLflow tracking server (`http://host:5000`) or a local store (`file:///path/mlruns`,
    which MLflow 3 keeps only with `MLFLOW_ALLOW_FILE_STORE`, set for it); unset:
    `MLFLOW_TRACKING_URI`, else MLflow's default. Credentials in it are never stored or logged."""
    experiment: str = Field(default="collector", min_length=1)
    """The MLflow experiment (created when missing)."""
    run_name: str | None = None
    """The MLflow run's name; unset: the collector's run id."""


class TrackingConfig(_Model):
    wandb: WandbConfig | None = None
    """Log the run to Weights & Biases (the `wandb` extra: `pip install 'collector[wandb]'`)."""
    mlflow: MlflowConfig | None = None
    """Log the run to MLflow (the `mlflow` extra: `pip install 'collector[mlflow]'`)."""
    log_interval_s: PositiveFloat = 10.0
    """Progress is logged on a commit at most this often (and once at the end)."""
    call_timeout_s: PositiveFloat = 60.0
    """A tracker call still running after this long disables that tracker (one warning; the
    run goes on without it)."""
    finish_timeout_s: PositiveFloat = 120.0
    """How long the end of a run waits for the trackers to log the summary and close."""
    transcripts: Annotated[int, Field(ge=0, le=1000)] = 50
    """Episodes in the transcript sample table (cut ones first, as in `collector report`)."""


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
    tracking: TrackingConfig = TrackingConfig()
    """Experiment trackers the run is logged to as it goes (opt-in; none by default)."""

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
    def _token_in_wire(self) -> RunConfig:
        # Token-in speaks the chat server's own token endpoints: no other wire has them.
        for p in self.sweep.providers or [self.provider]:
            if self.sampling.token_in and p.wire != "chat":
                raise ValueError(
                    f"sampling.token_in needs the chat wire; provider {p.name!r} speaks {p.wire!r}")
        return self

    @model_validator(mode="after")
    def _server_metrics_need_adaptive(self) -> RunConfig:
        # The engine's metrics only steer the adaptive gate; with a static setting nothing would
        # read them, and a user who set them expects them to act.
        for p in self.sweep.providers or [self.provider]:
            if p.server_metrics != "none" and self.ray.admission != "adaptive":
                raise ValueError(
                    f"provider {p.name!r}: server_metrics = {p.server_metrics!r} needs "
                    f"ray.admission = \"adaptive\"")
        return self

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


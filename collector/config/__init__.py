"""Run configuration: small pydantic models, loaded from TOML, overridable from the CLI.

Every model forbids unknown fields, so a typo is an error that names the field rather than
a setting silently ignored. This module imports neither `ray` nor `numpy`: validating a
config must be cheap and possible anywhere.

TOML because the standard library reads it (`tomllib`) and the closest peers use it.
`load_config(path, overrides)` applies `--set a.b=value` overrides (values parsed as TOML)
before validation, so an override is checked exactly like the file. Every failure is one
`ConfigError` line: `configs/x.toml: sweep.budgets.0: Input should be greater than 0 (got -5)`.

Paths. In a config file, `env.task_file` and `env.python_path` are relative to the file's
directory; with `--set`, to the working directory; `output.path` always to the working
directory.

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

Layout (one concept a module, each public name re-exported here, so `from collector.config
import X` is the one import path): `collector.config.models` (providers, sampling, the
sweep; the shared `_Model` and limits), `collector.config.run` (environment, loop, Ray,
output, `RunConfig`, `check_run_config`), `collector.config.loading` (TOML, `--set`,
one-line errors, paths relative to the file), `collector.config.identity` (fingerprint, run
id, resolved config, paths), `collector.config.urls` (credentials in URLs). All are tested
in tests/test_config.py (file-relative paths also in tests/envs/test_loading.py).
"""

from __future__ import annotations

from collector.config.identity import (
    config_fingerprint,
    data_identity,
    resolved_config,
    run_id,
    with_absolute_paths,
)
from collector.config.loading import (
    apply_overrides,
    config_from_dict,
    load_config,
    parse_override,
)
from collector.config.models import (
    INT64_MAX,
    INT64_MIN,
    MAX_EPISODES,
    MAX_EPISODES_IN_FLIGHT,
    MAX_MODEL_NAME,
    MAX_SAMPLES_PER_TASK,
    MAX_TASKS,
    MAX_WORKERS,
    Budget,
    PositiveFloat,
    PositiveInt,
    ProviderConfig,
    ProviderKind,
    ReasoningSetting,
    RetryConfig,
    SamplingConfig,
    SweepCell,
    SweepConfig,
)
from collector.config.run import (
    EnvConfig,
    LoopConfig,
    MlflowConfig,
    OutputConfig,
    RayConfig,
    RedactionConfig,
    RewardConfig,
    RunConfig,
    TrackingConfig,
    WandbConfig,
    check_run_config,
)
from collector.config.urls import (
    public_url,
    secret_query_name,
    url_credentials,
    without_url_credentials,
)

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "MAX_EPISODES",
    "MAX_EPISODES_IN_FLIGHT",
    "MAX_MODEL_NAME",
    "MAX_SAMPLES_PER_TASK",
    "MAX_TASKS",
    "MAX_WORKERS",
    "Budget",
    "EnvConfig",
    "LoopConfig",
    "MlflowConfig",
    "OutputConfig",
    "PositiveFloat",
    "PositiveInt",
    "ProviderConfig",
    "ProviderKind",
    "RayConfig",
    "ReasoningSetting",
    "RedactionConfig",
    "RetryConfig",
    "RewardConfig",
    "RunConfig",
    "SamplingConfig",
    "SweepCell",
    "SweepConfig",
    "TrackingConfig",
    "WandbConfig",
    "apply_overrides",
    "check_run_config",
    "config_fingerprint",
    "config_from_dict",
    "data_identity",
    "load_config",
    "parse_override",
    "public_url",
    "resolved_config",
    "run_id",
    "secret_query_name",
    "url_credentials",
    "with_absolute_paths",
    "without_url_credentials",
]  # fmt: skip

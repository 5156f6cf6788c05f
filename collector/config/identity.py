"""A config's identity and its stored form: fingerprint, run id, resolved config, paths.

Part of `collector.config` (import from there). Tests: tests/test_config.py.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from collector.config.models import ProviderConfig
from collector.config.run import LoopConfig, RunConfig
from collector.config.urls import public_url, without_url_credentials

#: Fields that only select *which* episodes exist, not what any one of them contains. Every
#: episode id already names its model, budget, task and sample, so growing a sweep (another
#: budget, more samples, more tasks) resumes into the same run directory and runs only the
#: new cells. Output, Ray layout, concurrency, the provider's request timeout and retries
#: never change an episode's meaning either, so they stay out as well (the loop's timeouts
#: do change it: which episodes time out, which tool results are errors; they stay in).
_SELECTION_ONLY: dict[str, Any] = {
    "samples_per_task": True,
    "sweep": {"models": True, "budgets": True, "pairing": True, "cells": True, "reasoning": True,
              "order": True},
    "env": {"tasks": True, "python_path": True},
    "ray": True,
    "output": True,
    # Where the run is reported to never changes what an episode holds.
    "tracking": True,
}
#: Loop fields added after run directories existed: left out of the identity while at their
#: default, so a run directory written before they existed still resumes.
_LATER_LOOP_FIELDS = ("max_tool_calls_per_turn", "max_argument_bytes", "max_tool_result_bytes")
_PROVIDER_TRANSPORT_ONLY = {
    "request_timeout_s", "request_deadline_s", "max_reply_bytes", "retry", "api_key_env", "http_client",
    "allow_model_alias", "requests_per_minute", "tokens_per_minute", "server_metrics", "metrics_url",
    # issue 27: a declared policy version is recorded per turn, not what the run is.
    "policy_version", "policy_version_file", "policy_version_url", "policy_version_timeout_s",
}


def _provider_identity(provider: ProviderConfig) -> dict[str, Any]:
    data = provider.model_dump(mode="json", exclude=_PROVIDER_TRANSPORT_ONLY)
    if provider.kind == "sim":
        # The simulator gets a fresh loopback port per run; its address means nothing.
        data.pop("base_url", None)
    if data.get("context_window") is None:  # issue 16: unset keeps existing run ids
        data.pop("context_window", None)
    if not data.get("extra_body"):  # issue 31: unset keeps existing run ids
        data.pop("extra_body", None)
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
    # Unset token capture (on where the wire carries ids) hashes as the old default, false: a
    # run directory collected before capture was the default resumes, its new turns with ids.
    if data["sampling"]["token_ids"] is None:
        data["sampling"]["token_ids"] = False
    if not data["sampling"]["token_in"]:  # issue 26: ids sent change what a turn saw; off keeps ids
        del data["sampling"]["token_in"]
        del data["sampling"]["token_in_server"]
    # A tool server's URL names what the tools are, its credentials only who may call them:
    # rotating a key must resume the same run (a URL without credentials hashes as before).
    _rewrite_server_url(data["env"], without_url_credentials)
    # Where the project lives is not what the data means: the task file as the config wrote it.
    data["env"]["task_file"] = cfg.env.task_file_as_written()
    return data


def _rewrite_server_url(env: dict[str, Any], rewrite: Callable[[str], str]) -> None:
    """Apply `rewrite` to `env.options.server` when it is a URL (the `mcp` environment's, or
    a user environment's option of that name): the one place a config holds a tool server's
    credentials."""
    options = env.get("options")
    server = options.get("server") if isinstance(options, dict) else None
    if isinstance(options, dict) and isinstance(server, str) and "://" in server:
        options["server"] = rewrite(server)


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

    It holds the *name* of the API-key variable, never its value, and base URLs (a
    provider's, an MCP server's `env.options.server`) without user info or query string
    (`public_url`), so credentials put in a URL are not saved; the same for an MLflow
    `tracking.mlflow.tracking_uri`.
    """
    data = cfg.model_dump(mode="json")
    data["loop"]["stop_on"] = sorted(data["loop"]["stop_on"])
    providers = [data["provider"], *(data["sweep"].get("providers") or [])]
    for provider in providers:
        if provider.get("base_url"):
            provider["base_url"] = public_url(provider["base_url"])
    _rewrite_server_url(data["env"], public_url)
    mlflow = data["tracking"].get("mlflow")
    if mlflow and mlflow.get("tracking_uri") and "://" in mlflow["tracking_uri"]:
        mlflow["tracking_uri"] = public_url(mlflow["tracking_uri"])
    return data

"""Reading Harbor task directories: `instruction.md`, `task.toml`, `environment/`, `tests/`.

A Harbor task is a directory (the format Terminal-Bench 2.0 and most public task corpora ship):

- `instruction.md`: the prompt, given to the model as it is;
- `task.toml`: timeouts, resources and free-form metadata;
- `environment/Dockerfile`: the sandbox's image (its directory is the build context);
- `tests/test.sh`: the verifier, run in the same sandbox after the agent finishes; it writes
  the reward to `/logs/verifier/reward.txt` (a number) or `reward.json`;
- `solution/solve.sh` (optional): the oracle `collector validate-tasks` runs.

`read_task(path)` reads one directory; `read_tasks(path)` reads a task directory or a
directory of task directories (sorted by name). Every problem is a `ConfigError` of one line
naming the task directory and the cause: a missing file, a `task.toml` that is not TOML, a
key this reader does not know (a typo such as `timeout_secs` would otherwise silently give a
task the default timeout), or a value of the wrong type.

Which `task.toml` keys are honoured and which are read but ignored is the table in
docs/harbor.md; `HONOURED` and `IGNORED` below are that table's source. `[metadata]` and
`[task]` are free-form and land in the task's metadata.

`HarborTask.content_key` is a digest of the `environment/` directory's files (paths and
bytes): the image cache key, so an edited Dockerfile or build file gets a new image and an
unchanged one is built once.

Tests: tests/envs/test_harbor_task.py.
"""

from __future__ import annotations

import hashlib
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collector.errors import ConfigError

#: Keys whose values change what the collector does, per table ("" is the top level).
HONOURED: Mapping[str, frozenset[str]] = {
    "agent": frozenset({"timeout_sec"}),
    "verifier": frozenset({"timeout_sec", "env"}),
    "environment": frozenset({"build_timeout_sec", "cpus", "memory_mb", "allow_internet", "env"}),
}
#: Keys Harbor defines that are read, checked for nothing, and have no effect here.
IGNORED: Mapping[str, frozenset[str]] = {
    "": frozenset({"version", "schema_version", "source", "artifacts", "task", "metadata", "solution"}),
    "agent": frozenset({"network_mode", "user"}),
    "verifier": frozenset({"network_mode", "user", "environment_mode"}),
    "environment": frozenset(
        {
            "storage_mb",
            "gpus",
            "gpu_types",
            "mcp_servers",
            "os",
            "docker_image",
            "network_mode",
            "healthcheck",
        }
    ),
}
_TABLES = ("agent", "verifier", "environment")

#: Harbor's defaults where `task.toml` is silent.
DEFAULT_AGENT_TIMEOUT_S = 600.0
DEFAULT_VERIFIER_TIMEOUT_S = 600.0
DEFAULT_BUILD_TIMEOUT_S = 600.0

REQUIRED_FILES = ("instruction.md", "task.toml", "environment/Dockerfile", "tests/test.sh")


@dataclass(slots=True, frozen=True)
class HarborTask:
    """One task directory, read and checked."""

    name: str
    """The directory's name: the task id in every record."""
    path: Path
    instruction: str
    agent_timeout_s: float = DEFAULT_AGENT_TIMEOUT_S
    verifier_timeout_s: float = DEFAULT_VERIFIER_TIMEOUT_S
    build_timeout_s: float = DEFAULT_BUILD_TIMEOUT_S
    cpus: float | None = None
    memory_mb: int | None = None
    allow_internet: bool = False
    verifier_env: Mapping[str, str] = field(default_factory=dict)
    environment_env: Mapping[str, str] = field(default_factory=dict)
    workdir: str = "/"
    """The Dockerfile's last `WORKDIR` (where commands start), `/` without one."""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    content_key: str = ""
    """Digest of `environment/` (paths and bytes): the image cache key."""

    @property
    def environment_dir(self) -> Path:
        return self.path / "environment"

    @property
    def tests_dir(self) -> Path:
        return self.path / "tests"

    @property
    def solution_dir(self) -> Path:
        return self.path / "solution"

    @property
    def has_solution(self) -> bool:
        return (self.solution_dir / "solve.sh").is_file()


def read_tasks(path: str | Path) -> list[HarborTask]:
    """The task at `path`, or every task directory directly under it (sorted by name)."""
    root = Path(path)
    if not root.is_dir():
        raise ConfigError(f"env.options.path: {str(root)[:200]!r} is not a directory")
    if (root / "task.toml").exists() or (root / "instruction.md").exists():
        return [read_task(root)]
    found = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not found:
        raise ConfigError(f"env.options.path: {str(root)[:200]!r} holds no task directory")
    return [read_task(p) for p in found]


def read_task(path: str | Path) -> HarborTask:
    """One task directory, checked (see the module docstring for what is refused)."""
    root = Path(path)
    name = root.name
    for required in REQUIRED_FILES:
        if not (root / required).is_file():
            raise ConfigError(f"harbor task {name}: {required} is missing ({str(root)[:200]})")
    try:
        config = tomllib.loads((root / "task.toml").read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"harbor task {name}: task.toml is not TOML: {str(exc)[:200]}") from None
    if "steps" in config:
        raise ConfigError(f"harbor task {name}: task.toml: multi-step tasks ([[steps]]) are not supported")
    _check_keys(name, config)
    agent = _table(name, config, "agent")
    verifier = _table(name, config, "verifier")
    environment = _table(name, config, "environment")
    metadata: dict[str, Any] = dict(_table(name, config, "metadata"))
    if "task" in config:
        metadata["task"] = config["task"]
    instruction = (root / "instruction.md").read_text(encoding="utf-8").strip()
    if not instruction:
        raise ConfigError(f"harbor task {name}: instruction.md is empty")
    return HarborTask(
        name=name,
        path=root.resolve(),
        instruction=instruction,
        agent_timeout_s=_seconds(name, agent, "agent", DEFAULT_AGENT_TIMEOUT_S),
        verifier_timeout_s=_seconds(name, verifier, "verifier", DEFAULT_VERIFIER_TIMEOUT_S),
        build_timeout_s=_seconds(
            name, environment, "environment", DEFAULT_BUILD_TIMEOUT_S, "build_timeout_sec"
        ),
        cpus=_number(name, environment, "cpus"),
        memory_mb=_integer(name, environment, "memory_mb"),
        allow_internet=_flag(name, environment, "allow_internet"),
        verifier_env=_variables(name, verifier, "verifier"),
        environment_env=_variables(name, environment, "environment"),
        workdir=_workdir(root / "environment" / "Dockerfile"),
        metadata=metadata,
        content_key=content_key(root / "environment"),
    )


def content_key(directory: Path) -> str:
    """A digest of every file under `directory`: relative path and bytes, in sorted order."""
    digest = hashlib.sha256()
    for file in sorted(p for p in directory.rglob("*") if p.is_file()):
        digest.update(file.relative_to(directory).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(file.read_bytes()).digest())
    return digest.hexdigest()[:16]


def _check_keys(name: str, config: Mapping[str, Any]) -> None:
    known_top = IGNORED[""] | set(_TABLES)
    for key in config:
        if key not in known_top:
            raise ConfigError(f"harbor task {name}: task.toml: unknown key {key[:60]!r}")
    for table in _TABLES:
        values = config.get(table, {})
        if not isinstance(values, dict):
            raise ConfigError(f"harbor task {name}: task.toml: [{table}] must be a table")
        known = HONOURED.get(table, frozenset()) | IGNORED.get(table, frozenset())
        for key in values:
            if key not in known:
                raise ConfigError(f"harbor task {name}: task.toml: unknown key {table}.{key[:60]}")


def _table(name: str, config: Mapping[str, Any], table: str) -> Mapping[str, Any]:
    values = config.get(table, {})
    if not isinstance(values, dict):
        raise ConfigError(f"harbor task {name}: task.toml: [{table}] must be a table")
    return values


def _number(name: str, table: Mapping[str, Any], key: str) -> float | None:
    value = table.get(key)
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ConfigError(
            f"harbor task {name}: task.toml: {key} must be a positive number (got {value!r:.40})"
        )
    return float(value)


def _seconds(
    name: str, table: Mapping[str, Any], where: str, default: float, key: str = "timeout_sec"
) -> float:
    try:
        value = _number(name, table, key)
    except ConfigError:
        raise ConfigError(
            f"harbor task {name}: task.toml: {where}.{key} must be a positive number of "
            f"seconds (got {table.get(key)!r:.40})"
        ) from None
    return default if value is None else value


def _integer(name: str, table: Mapping[str, Any], key: str) -> int | None:
    value = table.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(
            f"harbor task {name}: task.toml: {key} must be a positive integer (got {value!r:.40})"
        )
    return value


def _flag(name: str, table: Mapping[str, Any], key: str) -> bool:
    value = table.get(key, False)
    if not isinstance(value, bool):
        raise ConfigError(f"harbor task {name}: task.toml: {key} must be true or false (got {value!r:.40})")
    return value


def _variables(name: str, table: Mapping[str, Any], where: str) -> dict[str, str]:
    value = table.get("env", {})
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ConfigError(f"harbor task {name}: task.toml: {where}.env must be a table of strings")
    return dict(value)


def _workdir(dockerfile: Path) -> str:
    """The last `WORKDIR` of the Dockerfile (absolute paths only), else `/`."""
    workdir = "/"
    for line in dockerfile.read_text(encoding="utf-8", errors="replace").splitlines():
        parts = line.strip().split(None, 1)
        if len(parts) == 2 and parts[0].upper() == "WORKDIR" and parts[1].strip().startswith("/"):
            workdir = parts[1].strip()
    return workdir

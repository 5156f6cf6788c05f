"""The sandbox interface: where a Harbor task's commands, files and verifier run.

Four operations, so that a backend (Docker here; e2b, Modal, Daytona or k8s later) plugs in
without the loop or the environment knowing which it is:

- `exec(command, timeout_s, env)`: run a shell command in the task's working directory;
  output (stdout and stderr together) is held to `max_output_bytes` (the head and the tail,
  with a line saying how much was left out), the exit status and whether the timeout ended
  it are reported. A command that outlives its timeout is killed, never left running;
- `write(path, data)` / `read(path)`: a file inside the sandbox (`read` gives None for a file
  that is not there);
- `stop()`: remove the sandbox; idempotent, and called however the episode ended.

A `SandboxBackend` starts sandboxes: `start(task, labels)` builds (or reuses) the task's image
and starts one sandbox labelled with the run and episode ids, returning it with the time the
build and the start took (`StartTimes`); `remove_labelled(labels)` removes whatever still
carries the labels (the leftovers of a killed run, on resume). Failures are typed
(`collector.errors`): `ImageBuildFailed`, `SandboxStartFailed`, `SandboxLost`.

Backends: `docker` (`collector.envs.docker_sandbox`, the default) and `local_no_isolation`
(`collector.envs.local_sandbox`), which has no isolation at all and is never chosen unless named.

Tests: tests/envs/test_harbor.py, tests/system/harbor/test_docker.py.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass

from collector.envs.harbor_task import HarborTask

#: The most output one command returns by default (`env.options.max_output_bytes`).
DEFAULT_MAX_OUTPUT_BYTES = 16 * 1024


@dataclass(slots=True, frozen=True)
class ExecResult:
    """What one command did."""

    exit_code: int
    """Its exit status (-1 when the timeout killed it)."""
    output: str
    """stdout and stderr interleaved, bounded (`bound_output`)."""
    timed_out: bool = False
    duration_s: float = 0.0


@dataclass(slots=True, frozen=True)
class StartTimes:
    """Where a sandbox's start went: building (or finding) the image, then starting it."""

    image_build_s: float
    image_cached: bool
    """The image was already built for this content key: `image_build_s` is the look-up."""
    start_s: float


class Sandbox(ABC):
    """One episode's sandbox (see the module docstring)."""

    @abstractmethod
    async def exec(
        self, command: str, timeout_s: float, env: Mapping[str, str] | None = None
    ) -> ExecResult: ...

    @abstractmethod
    async def write(self, path: str, data: bytes) -> None: ...

    @abstractmethod
    async def read(self, path: str) -> bytes | None: ...

    @abstractmethod
    async def stop(self) -> None: ...


class SandboxBackend(ABC):
    """Starts sandboxes for tasks."""

    name: str
    isolated: bool
    """False for a backend whose commands run on the host itself."""

    @abstractmethod
    async def start(
        self, task: HarborTask, labels: Mapping[str, str], allow_network: bool = False
    ) -> tuple[Sandbox, StartTimes]: ...

    async def remove_labelled(self, labels: Mapping[str, str]) -> int:
        """Remove every sandbox carrying all of `labels`; how many were removed."""
        return 0


def bound_output(data: bytes, limit: int) -> str:
    """`data` as text, held to `limit` bytes: its head and tail around a line saying what was cut."""
    if len(data) <= limit:
        return data.decode("utf-8", "replace")
    half = max(limit // 2, 1)
    left_out = len(data) - 2 * half
    return (
        data[:half].decode("utf-8", "replace")
        + f"\n[... {left_out:,} bytes of output left out ...]\n"
        + data[-half:].decode("utf-8", "replace")
    )

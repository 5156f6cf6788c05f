"""`harbor`: Harbor task directories as an environment, tools run inside each task's sandbox.

Configure it with `[env] name = "harbor"` and `[env.options]`:

- `path`: a task directory, or a directory of task directories (`collector.envs.harbor_task`);
  relative to the working directory;
- `backend`: `docker` (the default: one container per episode, `collector.envs.docker_sandbox`)
  or `local_no_isolation` (no isolation at all, `collector.envs.local_sandbox`);
- `allow_network` (default false): a task whose `task.toml` sets `allow_internet` gets a
  network only when the run allows it too;
- `max_output_bytes` (default 16 KiB): what one `bash` call returns at most (head and tail);
- `verify_timed_out` (default false): run the verifier after an episode that hit its time
  limit anyway, for diagnosis; its verdict goes to `graded_reward`, the reward stays 0.

Each task's `instruction.md` is the prompt. Two tools, run in the episode's own sandbox:
`bash` (`command`, optional `timeout` in seconds; the output and the exit status come back,
and a command cut by its timeout says so) and `write_file` (`path`, `content`: the file is
written whole, its directories made). A cut or malformed turn never reaches them (the loop's
rule), so nothing of a half-written `write_file` lands in the sandbox.

The time limit is the task's `[agent] timeout_sec` (or the loop's `episode_timeout_s` when
smaller): past it the episode is `timeout` with reward 0, whatever the verifier would say.
After an episode that ends `done` the verifier runs in the same sandbox: `tests/` is copied to
`/tests`, `bash /tests/test.sh` runs under `[verifier] timeout_sec` with `[verifier] env`, and
the reward is `/logs/verifier/reward.txt` (a number) or `reward.json` (`{"reward": x}`, or the
first number of its values). What goes wrong there is typed (`collector.errors`) and ends the
episode as `error` with that cause: `VerifierTimeout`, `VerifierCrashed` (non-zero exit, no
reward), `RewardMissing`, `RewardUnparsable` (text, NaN, outside [0, 1]); so are
`ImageBuildFailed` and `SandboxStartFailed` at the start. The sandbox is stopped however the
episode ended (`close`).

Containers carry `collector.run_id` and `collector.episode_id` labels. The run's driver calls
`remove_leftovers(run_id)` when it starts, which removes whatever a killed earlier attempt of
that run left behind, and again when it ends, once its workers are stopped: a container whose
creation was still in the daemon's hands when that attempt died lands after the first sweep,
and no container of a run outlives the run that finishes it.

Tests: tests/envs/test_harbor.py, tests/system/harbor/test_docker.py,
tests/system/harbor/test_docker_resume.py.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from collector.envs.base import Environment, EpisodeContext, EpisodeWorld, Task, Tool
from collector.envs.harbor_task import HarborTask, read_tasks
from collector.envs.sandbox import DEFAULT_MAX_OUTPUT_BYTES, Sandbox, SandboxBackend
from collector.envs.toolkit import tool
from collector.errors import (
    ConfigError,
    RewardMissing,
    RewardUnparsable,
    SandboxStartFailed,
    VerifierCrashed,
    VerifierTimeout,
)

#: Labels every container of an episode carries.
RUN_LABEL = "collector.run_id"
EPISODE_LABEL = "collector.episode_id"
#: The longest one `bash` call may ask for; the task's agent timeout bounds it too.
MAX_COMMAND_TIMEOUT_S = 600
DEFAULT_COMMAND_TIMEOUT_S = 60
#: A command longer than this belongs in a file (`write_file`), as a shell's own line limits say.
MAX_COMMAND_CHARS = 4000
MAX_PATH_CHARS = 1024
REWARD_TXT = "/logs/verifier/reward.txt"
REWARD_JSON = "/logs/verifier/reward.json"


@dataclass(slots=True)
class SandboxTimes:
    """Where an episode's time outside the model went (`Episode.timing`'s environment part)."""

    image_build_s: float | None = None
    image_cached: bool | None = None
    sandbox_start_s: float | None = None
    verifier_s: float | None = None
    """None when no verifier ran (a cut episode, a time-out)."""
    stop_s: float | None = None
    tool_exec_s: list[float] = field(default_factory=list)
    """Each command's or write's own time in the sandbox, in call order."""


class HarborEnvironment(Environment):
    """Harbor task directories; see the module docstring."""

    name = "harbor"

    def __init__(
        self,
        path: str,
        backend: str | SandboxBackend = "docker",
        allow_network: bool = False,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        verify_timed_out: bool = False,
    ) -> None:
        if not isinstance(path, str) or not path:
            raise ConfigError("env.options.path: the harbor environment needs a task directory")
        if (
            isinstance(max_output_bytes, bool)
            or not isinstance(max_output_bytes, int)
            or max_output_bytes < 64
        ):
            raise ConfigError(
                f"env.options.max_output_bytes: must be an integer of at least 64 "
                f"(got {max_output_bytes!r:.40})"
            )
        self.harbor_tasks = {t.name: t for t in read_tasks(Path(path))}
        self.backend = (
            backend if isinstance(backend, SandboxBackend) else load_backend(backend, max_output_bytes)
        )
        self.allow_network = bool(allow_network)
        self.verify_timed_out = bool(verify_timed_out)
        self._tasks = [
            Task(id=t.name, prompt=t.instruction, metadata={"harbor": dict(t.metadata)})
            for t in self.harbor_tasks.values()
        ]

    def tasks(self) -> Sequence[Task]:
        return self._tasks

    def check_task(self, task: Task) -> str | None:
        if task.id not in self.harbor_tasks:
            return f"no Harbor task directory named {task.id!r} under env.options.path"
        return None

    def start(self, task: Task, context: EpisodeContext) -> HarborWorld:
        harbor = self.harbor_tasks.get(task.id)
        if harbor is None:
            raise ConfigError(f"harbor: no task directory named {task.id!r}")
        labels = {RUN_LABEL: context.run_id, EPISODE_LABEL: context.episode_id}
        return HarborWorld(
            harbor, self.backend, labels, self.allow_network and harbor.allow_internet, self.verify_timed_out
        )

    async def remove_leftovers(self, run_id: str) -> int:
        """Remove the sandboxes an earlier, killed attempt of `run_id` left behind."""
        return await self.backend.remove_labelled({RUN_LABEL: run_id})


class HarborWorld(EpisodeWorld):
    """One episode: its sandbox, the two tools, and the verifier as the grader."""

    def __init__(
        self,
        task: HarborTask,
        backend: SandboxBackend,
        labels: Mapping[str, str],
        network: bool,
        verify_timed_out: bool,
    ) -> None:
        self.task = task
        self.backend = backend
        self.labels = dict(labels)
        self.network = network
        self.sandbox: Sandbox | None = None
        self.times = SandboxTimes()
        self.time_limit_s = task.agent_timeout_s
        # The loop's own bound on the grader must not cut the verifier before its timeout
        # does: the verifier's timeout is typed here (VerifierTimeout), a bit of slack after it.
        self.grade_timeout_s = task.verifier_timeout_s + 30.0
        self.grade_timed_out = verify_timed_out
        limit = int(min(task.agent_timeout_s, MAX_COMMAND_TIMEOUT_S))
        self._tools = [
            tool(
                self.bash,
                name="bash",
                timeout_s=limit + 30.0,
                parameters={
                    "type": "object",
                    "properties": {
                        "command": {
                            "type": "string",
                            "maxLength": MAX_COMMAND_CHARS,
                            "description": "A shell command (write longer scripts with write_file).",
                        },
                        "timeout": {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": limit,
                            "description": f"Seconds before the command is killed (default "
                            f"{min(DEFAULT_COMMAND_TIMEOUT_S, limit)}).",
                        },
                    },
                    "required": ["command"],
                    "additionalProperties": False,
                },
                description="Run a shell command in the task's sandbox; returns its exit status and output.",
            ),
            tool(
                self.write_file,
                name="write_file",
                timeout_s=60.0,
                parameters={
                    "type": "object",
                    "properties": {
                        "content": {"type": "string", "description": "The whole content of the file."},
                        "path": {
                            "type": "string",
                            "maxLength": MAX_PATH_CHARS,
                            "description": "Where to write (absolute, or from the working directory).",
                        },
                    },
                    "required": ["content", "path"],
                    "additionalProperties": False,
                },
                description="Write a file in the task's sandbox (replacing it), making its directories.",
            ),
        ]

    @property
    def tools(self) -> Sequence[Tool]:
        return self._tools

    async def open(self) -> None:
        began = time.perf_counter()
        try:
            self.sandbox, started = await self.backend.start(self.task, self.labels, self.network)
        except BaseException:
            # A build that failed still spent its time: counted as building, not cached.
            self.times.image_build_s = time.perf_counter() - began
            self.times.image_cached = False
            raise
        self.times.image_build_s = started.image_build_s
        self.times.image_cached = started.image_cached
        self.times.sandbox_start_s = started.start_s

    def time_outside(self) -> Mapping[str, float | bool | None]:
        times = self.times
        return {"image_build_s": times.image_build_s, "image_cached": times.image_cached,
                "sandbox_start_s": times.sandbox_start_s, "sandbox_stop_s": times.stop_s,
                "verifier_s": times.verifier_s}

    async def close(self) -> None:
        if self.sandbox is not None:
            began = time.perf_counter()
            try:
                await self.sandbox.stop()
            finally:
                self.times.stop_s = time.perf_counter() - began
                self.sandbox = None

    def _box(self) -> Sandbox:
        if self.sandbox is None:
            raise SandboxStartFailed(f"task {self.task.name}: the sandbox is not running")
        return self.sandbox

    async def bash(self, command: str, timeout: int | None = None) -> str:  # noqa: ASYNC109 - the tool's argument
        """Run `command`; the result names its exit status and carries its bounded output."""
        limit = min(
            timeout or DEFAULT_COMMAND_TIMEOUT_S, MAX_COMMAND_TIMEOUT_S, int(self.task.agent_timeout_s)
        )
        result = await self._box().exec(command, float(limit), self.task.environment_env)
        self.times.tool_exec_s.append(result.duration_s)
        if result.timed_out:
            return f"[timed out after {limit} s and killed]\n{result.output}"
        return f"[exit status {result.exit_code}]\n{result.output}"

    async def write_file(self, path: str, content: str) -> str:
        """Write `content` to `path` whole."""
        began = time.perf_counter()
        target = path if path.startswith("/") else f"{self.task.workdir.rstrip('/')}/{path}"
        data = content.encode("utf-8")
        await self._box().write(target, data)
        self.times.tool_exec_s.append(time.perf_counter() - began)
        return f"wrote {len(data):,} bytes to {target}"

    async def grade(self, final_text: str | None) -> float:
        began = time.perf_counter()
        try:
            return await run_verifier(self._box(), self.task)
        finally:
            self.times.verifier_s = time.perf_counter() - began


async def run_verifier(box: Sandbox, task: HarborTask) -> float:
    """Copy `tests/` in, run `test.sh` under the task's verifier timeout, read the reward."""
    for file in sorted(p for p in task.tests_dir.rglob("*") if p.is_file()):
        await box.write("/tests/" + file.relative_to(task.tests_dir).as_posix(), file.read_bytes())
    await box.exec("mkdir -p /logs/verifier", 30.0)
    result = await box.exec("bash /tests/test.sh", task.verifier_timeout_s, task.verifier_env)
    if result.timed_out:
        raise VerifierTimeout(
            f"task {task.name}: the verifier ran past its {task.verifier_timeout_s:g} s timeout"
        )
    text = await box.read(REWARD_TXT)
    source = REWARD_TXT
    if text is None:
        text, source = await box.read(REWARD_JSON), REWARD_JSON
    if text is None:
        tail = result.output.strip().splitlines()[-1:] or [""]
        if result.exit_code != 0:
            raise VerifierCrashed(
                f"task {task.name}: tests/test.sh exited {result.exit_code} without a reward "
                f"(last line: {tail[0][:160]!r})"
            )
        raise RewardMissing(f"task {task.name}: tests/test.sh wrote neither {REWARD_TXT} nor {REWARD_JSON}")
    return parse_reward(task.name, source, text)


def parse_reward(task: str, source: str, data: bytes) -> float:
    """The reward a verifier wrote: a number in [0, 1], else `RewardUnparsable` naming the task."""
    text = data.decode("utf-8", "replace").strip()
    value: object = None
    try:
        if source.endswith(".json"):
            loaded = json.loads(text)
            if isinstance(loaded, dict):
                value = loaded.get(
                    "reward", next((v for v in loaded.values() if isinstance(v, int | float)), None)
                )
            else:
                value = loaded
        else:
            value = float(text)
    except ValueError:
        value = None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 <= value <= 1
    ):
        raise RewardUnparsable(f"task {task}: {source} holds {text[:40]!r}, not a reward in [0, 1]")
    return float(value)


def load_backend(name: str, max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES) -> SandboxBackend:
    """The backend `env.options.backend` names."""
    if name == "docker":
        from collector.envs.docker_sandbox import DockerBackend

        return DockerBackend(max_output_bytes=max_output_bytes)
    if name == "local_no_isolation":
        from collector.envs.local_sandbox import LocalBackend

        return LocalBackend(max_output_bytes=max_output_bytes)
    raise ConfigError(
        f"env.options.backend: {name[:40]!r} is not a sandbox backend (docker, local_no_isolation)"
    )

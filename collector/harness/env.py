"""The `harness` environment kind: each episode is an external agent program.

`[env] name = "harness"` with `[env.options]`:

- `command` (required): the harness's command line, a list of arguments or one string split
  like a shell would (no shell runs it). Each argument is a template: `{task}` (the task's
  prompt text), `{task_id}`, `{workdir}`, `{base_url}` (the episode's own OpenAI base URL on
  the gateway, `.../e/<episode key>/v1`), `{anthropic_base_url}` (the episode's root there,
  its Anthropic base URL), `{model}`, `{budget}`, `{python}` (the worker's own interpreter,
  whose packages the harness may use) and `{metadata[KEY]}` for a field of the task's
  metadata.
- `tasks`: the tasks inline, a list of `{id, prompt, metadata}` tables; or `env.task_file`.
- `timeout_s`: the harness's wall-clock limit (default: `loop.episode_timeout_s`).
- `grace_s` (5): after SIGTERM to its process group, how long before SIGKILL.
- `reward`: `exit_status` (the default: exit 0 is 1.0, `failure_exit_status` is 0.0, any other
  status is a crash), `reward_file` (a number in the file `reward_file` of the working
  directory, default `reward.txt`) or `grader` (`grader = "module:function"`, called as
  `function(workdir=Path, final_text=str | None, task=Task)` and returning a number).
- `failure_exit_status` (1): the exit status meaning "ran fine, task failed" under `exit_status`.
- `pass_env`: names of variables copied from the worker's environment (none by default; a
  value equal to any of the run's credentials is never copied).
- `env`: variables set to fixed values.
- `host` ("127.0.0.1"): where the gateway listens; another address serves harnesses in
  containers, still behind the per-episode token.
- `workdir_root`: where the fresh working directories are made (default: the system's temp
  directory); `keep_workdir` (false) keeps them after the episode.
- `enforce_stop_rules` (true): false turns the gateway into a recording proxy, to show what the
  stop rules prevent (`collector.harness.session`).

The harness's environment is built from an allow-list (`BASE_ENV` and `pass_env`), plus
`OPENAI_BASE_URL`, `OPENAI_API_KEY`, `ANTHROPIC_BASE_URL`, `ANTHROPIC_API_KEY` set to the
gateway and the episode's token, `COLLECTOR_WORKDIR`, `COLLECTOR_TASK_ID`, and `PYTHONPATH`
set to the run's `env.python_path` (so `command = ["{python}", "-m", "my_harness"]` finds a
harness next to the config). Never the provider's key: the gateway holds it, the harness
never sees it.

Tests: tests/harness/test_harness_env.py, tests/system/harness/test_harness_run.py.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from collector.config import RunConfig
from collector.envs.base import Environment, EpisodeContext, EpisodeWorld, Task
from collector.envs.tasks import task_from_row
from collector.errors import ConfigError
from collector.turn import UserMessage

__all__ = ["BASE_ENV", "HarnessEnv", "HarnessSettings", "check_harness_config", "harness_of", "task_text"]

#: Variables a harness gets from the worker's environment without being named in `pass_env`:
#: what a program needs to find its interpreter and write text, nothing that holds a secret.
BASE_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "USER", "LOGNAME", "TERM")
_REWARDS = ("exit_status", "reward_file", "grader")


@dataclass(slots=True, frozen=True)
class HarnessSettings:
    command: tuple[str, ...]
    timeout_s: float | None
    grace_s: float
    reward: str
    reward_file: str
    grader: str | None
    failure_exit_status: int
    pass_env: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    host: str
    workdir_root: str | None
    keep_workdir: bool
    enforce_stop_rules: bool

    @property
    def label(self) -> str:
        """How the harness is named in one-line errors: its program's name."""
        return f"harness {self.command[0].rsplit('/', 1)[-1]!r}"


def _number(name: str, value: object, default: float) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigError(f"env.options.{name}: must be a positive number (got {value!r:.40})")
    return float(value)


def _names(name: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"env.options.{name}: must be a list of variable names")
    return tuple(value)


class HarnessEnv(Environment):
    """Episodes run by an external program against the gateway (see the module docstring)."""

    name = "harness"

    def __init__(self, command: str | list[str] | None = None, tasks: list[Any] | None = None,
                 timeout_s: float | None = None, grace_s: float | None = None, reward: str = "exit_status",
                 reward_file: str = "reward.txt", grader: str | None = None, failure_exit_status: int = 1,
                 pass_env: list[str] | None = None, env: Mapping[str, str] | None = None,
                 host: str = "127.0.0.1", workdir_root: str | None = None, keep_workdir: bool = False,
                 enforce_stop_rules: bool = True) -> None:
        if isinstance(command, str):
            argv = shlex.split(command)
        elif isinstance(command, list) and all(isinstance(a, str) for a in command):
            argv = list(command)
        else:
            raise ConfigError("env.options.command: the harness's command line is required "
                              "(a string, or a list of arguments)")
        if not argv:
            raise ConfigError("env.options.command: is empty")
        if reward not in _REWARDS:
            raise ConfigError(f"env.options.reward: {reward!r} is not one of {', '.join(_REWARDS)}")
        if reward == "grader" and (not isinstance(grader, str) or ":" not in grader):
            raise ConfigError("env.options.grader: reward = \"grader\" needs grader = \"module:function\"")
        fixed = dict(env or {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in fixed.items()):
            raise ConfigError("env.options.env: must map variable names to strings")
        self.settings = HarnessSettings(
            command=tuple(argv),
            timeout_s=None if timeout_s is None else _number("timeout_s", timeout_s, 0.0),
            grace_s=_number("grace_s", grace_s, 5.0),
            reward=reward, reward_file=reward_file, grader=grader,
            failure_exit_status=int(failure_exit_status),
            pass_env=_names("pass_env", pass_env or []),
            env=tuple(sorted(fixed.items())),
            host=host, workdir_root=workdir_root, keep_workdir=bool(keep_workdir),
            enforce_stop_rules=bool(enforce_stop_rules),
        )
        self._tasks = [self._task(i, row) for i, row in enumerate(tasks or [])]
        self.python_path: tuple[str, ...] = ()
        """`env.python_path` of the run (absolute), the harness's `PYTHONPATH`."""

    @staticmethod
    def _task(index: int, row: object) -> Task:
        if not isinstance(row, dict):
            raise ConfigError(f"env.options.tasks[{index}]: must be a table with id and prompt")
        return task_from_row(row, f"task-{index}", f"env.options.tasks[{index}]")

    def tasks(self) -> Sequence[Task]:
        return self._tasks

    def start(self, task: Task, context: EpisodeContext) -> EpisodeWorld:
        raise ConfigError("the harness environment has no tools of its own: its episodes are run by "
                          "the worker (collector.harness.runner), not by the episode loop")


def check_harness_config(cfg: RunConfig, env: HarnessEnv) -> None:
    """Refuse what a harness must never get or cannot do, in one line naming the setting; give
    the harness the run's `env.python_path` (its `PYTHONPATH`, for a harness run as a module)."""
    env.python_path = tuple(cfg.env.python_path)
    providers = cfg.sweep.providers or [cfg.provider]
    keys = {p.api_key_env for p in providers if p.api_key_env}
    leaked = sorted(keys.intersection(env.settings.pass_env))
    if leaked:
        raise ConfigError(f"env.options.pass_env: {leaked[0]} is the provider's key; a harness never sees it "
                          "(the gateway holds it and the harness gets its episode's token instead)")
    if cfg.sampling.token_in:
        raise ConfigError("sampling.token_in: not available with env.name = \"harness\" (the harness sends "
                          "messages, not token ids)")


def harness_of(env: Environment) -> HarnessEnv | None:
    """The `HarnessEnv` behind `env` (tasks from a file wrap it), or None."""
    inner = getattr(env, "inner", env)
    return inner if isinstance(inner, HarnessEnv) else None


def task_text(task: Task) -> str:
    """The task as one prompt string: the text, or its user messages joined."""
    if isinstance(task.prompt, str):
        return task.prompt
    return "\n\n".join(m.text for m in task.prompt if isinstance(m, UserMessage))

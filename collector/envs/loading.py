"""Finding the environment a config names: a built-in, or the user's own `package.module:attr`.

`load_environment(spec, options)`:
- `spec` is a built-in name (`arithmetic`, `support_desk`), ``trl:package.module:Class`` (a
  TRL environment class with its reward functions, `collector.envs.trl`) or ``package.module:attr``
  (``attr`` may be dotted) naming an `Environment` instance, an `Environment` subclass, or
  a factory returning one. Classes and factories are called with `options` as keyword
  arguments; an instance was built before any option could reach it, so options given to
  one are refused with a line naming the class to use instead (``my_env:UnitPricesEnv``).
- `options["task_file"]`, when present, is taken out before that call: the tasks then come
  from the JSONL/Parquet file (`collector.envs.tasks`) while worlds and grading stay the
  environment's. The built-ins build each world from the task's metadata or prompt, so any
  file of prompts in their phrasing works with them. Every task of the file goes through
  the environment's `check_task`; a task it refuses (for a built-in: a prompt not in its
  phrasing and no usable metadata) is a `ConfigError` naming the file, the task id and why.

Every failure is a one-line `ConfigError` naming what was wrong, raised before any episode
starts: a module that cannot be found, has a syntax error, raises or calls `sys.exit` while
being imported, or a constructor that fails. What an environment's `check_task` cannot see
(a user environment that keeps the default, which accepts every task) still fails at
`start`, as an `error` episode.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from collector.envs.base import Environment, EpisodeContext, EpisodeWorld, Task, start_world
from collector.envs.tasks import load_tasks
from collector.errors import ConfigError

BUILTINS: Mapping[str, str] = {
    "arithmetic": "collector.envs.arithmetic:ArithmeticEnv",
    "support_desk": "collector.envs.support_desk:SupportDeskEnv",
    "mcp": "collector.envs.mcp:MCPEnvironment",
    "harness": "collector.harness.env:HarnessEnv",
    "harbor": "collector.envs.harbor:HarborEnvironment",
    "reasoning_gym": "collector.envs.reasoning_gym:ReasoningGymEnv",
    "openenv": "collector.envs.openenv:OpenEnvEnvironment",
}


class TaskFileEnvironment(Environment):
    """An environment whose tasks come from a file; worlds and grading are the inner one's."""

    def __init__(self, inner: Environment, tasks: Sequence[Task]) -> None:
        self.inner = inner
        self.name = getattr(inner, "name", type(inner).__name__)
        self._tasks = list(tasks)

    def tasks(self) -> Sequence[Task]:
        return self._tasks

    def start(self, task: Task, context: EpisodeContext | None = None) -> EpisodeWorld:
        if context is None:  # called directly, as a one-argument environment
            legacy: Any = self.inner.start
            world: EpisodeWorld = legacy(task)
            return world
        return start_world(self.inner, task, context)

    def check_task(self, task: Task) -> str | None:
        return self.inner.check_task(task)

    def credentials(self) -> tuple[str, ...]:
        return self.inner.credentials()


def load_environment(spec: str, options: Mapping[str, Any] | None = None) -> Environment:
    """The environment named by `spec`, built with `options` (see the module docstring)."""
    opts = dict(options or {})
    task_file = opts.pop("task_file", None)
    if spec.startswith("trl:"):  # a TRL environment_factory class (collector.envs.trl)
        from collector.envs.trl import load_trl_environment

        return load_trl_environment(spec, opts, None if task_file is None else str(task_file), _resolve)
    target = BUILTINS.get(spec, spec)
    if ":" not in target:
        known = ", ".join(sorted(BUILTINS))
        raise ConfigError(f"env.name: {spec!r} is neither a built-in ({known}) nor package.module:attr")
    obj = _resolve(target, spec)
    env = _instantiate(obj, opts, spec)
    if not getattr(env, "name", None):
        env.name = spec
    if task_file is not None:
        env = TaskFileEnvironment(env, load_tasks(str(task_file)))
        for task in env.tasks():
            problem = _check(env, task, spec)
            if problem is not None:
                raise ConfigError(f"env.task_file: {task_file}: task {task.id}: {problem}")
    return env


def _check(env: Environment, task: Task, spec: str) -> str | None:
    try:
        problem = env.check_task(task)
    except Exception as exc:  # noqa: BLE001 - a crashing check is reported like a refusal, in one line
        problem = f"{spec!r} failed checking it: {type(exc).__name__}: {exc}"
    return None if problem is None else " ".join(str(problem).split())


def _resolve(target: str, spec: str, field: str = "env.name") -> Any:
    """The object ``package.module:attr`` names; one `ConfigError` line under `field` if none."""
    module_name, _, attr_path = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{field}: cannot import module {module_name!r} ({exc.msg})") from None
    except SyntaxError as exc:
        where = f"{exc.filename}:{exc.lineno}" if exc.filename else module_name
        raise ConfigError(f"{field}: {module_name!r} has a syntax error ({where}: {exc.msg})") from None
    except SystemExit as exc:
        # A module that exits on import would end the run "successfully" having done nothing.
        raise ConfigError(f"{field}: importing {module_name!r} called sys.exit({exc.code!r})") from None
    except Exception as exc:  # noqa: BLE001 - whatever the user's module raises, one line names it
        raise ConfigError(f"{field}: importing {module_name!r} raised {type(exc).__name__}: {exc}") from None
    obj: Any = module
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"{field}: {module_name!r} has no attribute {attr_path!r}") from None
    return obj


def _class_spec(instance: Environment, spec: str) -> str:
    """`package.module:Class` for an instance's class: under the name the spec's module exports
    it by when it does (``my_env:UnitPricesEnv``), else where the class is defined."""
    cls = type(instance)
    module_name = BUILTINS.get(spec, spec).partition(":")[0]
    module = sys.modules.get(module_name)
    for name, value in sorted(vars(module).items()) if module is not None else ():
        if value is cls:
            return f"{module_name}:{name}"
    return f"{cls.__module__}:{cls.__qualname__}"


def _instantiate(obj: Any, options: dict[str, Any], spec: str) -> Environment:
    if isinstance(obj, Environment):
        if options:
            raise ConfigError(
                f"env.options: {spec!r} is an environment instance, built before any option could "
                f"reach it; name its class or a factory instead: env.name = {_class_spec(obj, spec)!r}"
            )
        return obj
    if not callable(obj):
        raise ConfigError(f"env.name: {spec!r} is not an Environment, a subclass or a factory")
    try:
        env = obj(**options)
    except TypeError as exc:
        raise ConfigError(f"env.options: {spec!r} rejected the options: {exc}") from None
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - any constructor failure is a config problem, reported in one line
        raise ConfigError(f"env.name: building {spec!r} failed: {type(exc).__name__}: {exc}") from None
    except SystemExit as exc:
        raise ConfigError(f"env.name: building {spec!r} called sys.exit({exc.code!r})") from None
    if not isinstance(env, Environment):
        raise ConfigError(f"env.name: {spec!r} did not produce an Environment (got {type(env).__name__})")
    return env

"""TRL environment classes (`GRPOTrainer(environment_factory=...)`) run as collector environments.

A config names the class with the ``trl:`` prefix, its reward functions, and its tasks::

    [env]
    name = "trl:my_pkg.envs:WordleEnv"
    task_file = "tasks.jsonl"                    # or options.dataset
    [env.options]
    reward = ["my_pkg.rewards:reward_func"]      # fn(environments, **columns) -> list[float]
    # dataset = "data/wordle"                    # a `datasets` Dataset saved with save_to_disk
    # split = "train"                            # when that is a DatasetDict

The contract is TRL's, duck-typed (TRL is not imported; it pulls torch):

- the class is built with no arguments, one fresh instance per episode, and
  ``reset(**row)`` gets every column of the task's row (``prompt`` included, as TRL passes
  it). A string it returns is appended to the prompt's last user message, as TRL does;
- its tools are its public methods, by TRL's rules (`collector.envs.trlschema`); a tool's
  result is ``str(result)``; an exception it raises is an error result the model reads
  (``error: guess failed: ValueError: Game over.``) and the episode goes on, as in TRL;
- the rows: `env.task_file` (JSONL / Parquet, every column kept) or `options.dataset` (a
  `datasets.load_from_disk` directory). The task id is the `id` column when there is one,
  else ``{file or directory name}-{row number}``. A prompt is a string or a list of chat
  messages (TRL's conversational format); a row without one starts from an empty user
  message that `reset`'s observation fills;
- the reward is the sum of every reward function's value (TRL's default weights, all 1),
  plus the class's own ``get_reward()`` when it has one. Each function is called once per
  episode, after the episode, as ``fn(environments=[instance], prompts=[prompt],
  completions=[[{"role": "assistant", "content": final answer}]], **{column: [value]})``
  (every column but prompt); ``None`` means "not mine" (TRL's NaN-and-skip); a coroutine
  function is awaited. The grader runs under the tool timeout, like every grader.

Bad input, before the run (a `ConfigError` naming the environment and the cause): a class
that cannot be imported or built, has no `reset`, offers no tools, or has a tool TRL could
not describe (no docstring, an argument without a type hint or an ``Args:`` line); a reward
that is not ``module:function``, cannot be imported or is not callable; no reward at all; no
tasks, or both a task file and a dataset. During the run, the episode ends as `error`
naming the environment and the cause (never a zero reward that reads as the model's
failure): `reset` or the constructor raising, a reward function raising, returning other
than one value for the one episode, a value that is not a number, or NaN / infinity, and
every reward function returning None.

How it differs from TRL (docs/environments.md lists these too): a fresh instance per episode
where TRL pools instances and resets them; arguments are checked against the tool's schema
before the method runs (TRL passes whatever was parsed); an error result reads
``error: <tool> failed: <Type>: <message>`` where TRL sends ``{'error': '<message>'}``;
``completions`` holds the final answer only, and ``completion_ids``, ``trainer_state``,
``log_extra`` and ``log_metric`` are not passed; ``*args`` / ``**kwargs`` tools are refused;
a multi-environment dict factory and environment-owned data without rows are not supported.

Tests: tests/envs/test_trl.py.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from collector.envs.base import Environment, EpisodeContext, EpisodeWorld, Task, Tool
from collector.envs.tasks import messages_from_chat, read_rows
from collector.envs.toolkit import DEFAULT_TOOL_THREADS, tool
from collector.envs.trlschema import (
    UnusableToolMethod,
    method_tool_spec,
    tool_method_names,
    validation_schema,
)
from collector.errors import ConfigError, EnvironmentFailure

PREFIX = "trl:"
OPTIONS = ("reward", "dataset", "split")
_NOT_COLUMNS = ("prompt", "completion", "completion_ids")
"""Row columns TRL does not pass to reward functions as columns."""


@dataclass(frozen=True, slots=True)
class ToolTemplate:
    """One tool method as the class offers it: the schema the model sees, the one arguments are
    checked against."""

    name: str
    description: str
    offered: dict[str, Any]
    checked: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Reward:
    ref: str
    """`module:function` as configured (or ``Class.get_reward``): how errors name it."""
    function: Callable[..., Any]
    own: bool = False
    """The class's own `get_reward(self)`: called on the episode's instance with no arguments."""


def _as_text(result: Any) -> str:
    """TRL's tool message content: the string of the result (text parts of a content list joined)."""
    if (
        isinstance(result, list)
        and result
        and all(isinstance(p, Mapping) and p.get("type") == "text" for p in result)
    ):
        return "".join(str(p.get("text", "")) for p in result)
    return result if isinstance(result, str) else str(result)


def _bind(method: Callable[..., Any], template: ToolTemplate) -> Tool:
    """A collector tool running `method` (of this episode's instance), TRL's way."""
    if inspect.iscoroutinefunction(method):

        async def call_async(**arguments: Any) -> str:
            return _as_text(await method(**arguments))

        built = tool(
            call_async, name=template.name, description=template.description, parameters=template.checked
        )
    else:

        def call(**arguments: Any) -> str:
            return _as_text(method(**arguments))

        built = tool(call, name=template.name, description=template.description, parameters=template.checked)
    return replace(built, parameters=template.offered)


async def _on_thread(function: Callable[[], Any]) -> Any:
    """Run user code that may block (a client, a sandbox) on the collector's tool threads."""
    if inspect.iscoroutinefunction(function):
        return await function()
    result = await DEFAULT_TOOL_THREADS.run(function)
    if inspect.isawaitable(result):
        return await result
    return result


class TRLWorld(EpisodeWorld):
    """One episode: a fresh instance of the class, reset with the task's row."""

    def __init__(self, env: TRLEnvironment, task: Task) -> None:
        self.env = env
        self.task = task
        self.row = env.rows[task.id]
        self.instance: Any = None
        self.observation: str | None = None
        self._tools: list[Tool] = []

    async def open(self) -> None:
        cls = self.env.cls
        try:
            self.instance = await _on_thread(cls)
        except Exception as exc:
            raise EnvironmentFailure(
                f"{self.env.name}: building {cls.__name__}() raised {type(exc).__name__}: {exc}"
            ) from exc
        row = dict(self.row)
        try:
            observation = await _on_thread(lambda: self.instance.reset(**row))
        except Exception as exc:
            raise EnvironmentFailure(f"{self.env.name}: reset() raised {type(exc).__name__}: {exc}") from exc
        if isinstance(observation, list):
            observation = _as_text(observation)
        if observation is not None and not isinstance(observation, str):
            raise EnvironmentFailure(
                f"{self.env.name}: reset() returned {type(observation).__name__}; "
                "TRL expects a string or None"
            )
        self.observation = observation
        self._tools = [_bind(getattr(self.instance, t.name), t) for t in self.env.templates]

    @property
    def initial_observation(self) -> str | None:
        return self.observation

    @property
    def tools(self) -> Sequence[Tool]:
        return self._tools

    def _prompt(self) -> list[dict[str, Any]]:
        """The prompt as TRL hands it to reward functions: chat messages, observation appended."""
        prompt = self.row.get("prompt")
        messages = (
            [dict(m) for m in prompt]
            if isinstance(prompt, list)
            else [{"role": "user", "content": prompt if isinstance(prompt, str) else ""}]
        )
        if self.observation:
            for message in reversed(messages):
                if message.get("role") == "user" and isinstance(message.get("content"), str):
                    message["content"] += self.observation
                    break
        return messages

    async def grade(self, final_text: str | None) -> float:
        if self.instance is None:
            raise EnvironmentFailure(f"{self.env.name}: graded before its instance was built")
        columns = {k: [v] for k, v in self.row.items() if k not in _NOT_COLUMNS}
        kwargs = {
            **columns,
            "environments": [self.instance],
            "prompts": [self._prompt()],
            "completions": [[{"role": "assistant", "content": final_text or ""}]],
        }
        total = 0.0
        scored = False
        for reward in self.env.rewards:
            value = await self._score(reward, kwargs)
            if value is not None:
                total += value
                scored = True
        if not scored:
            raise EnvironmentFailure(f"{self.env.name}: every reward function returned None for the episode")
        return total

    async def _score(self, reward: Reward, kwargs: dict[str, Any]) -> float | None:
        where = f"{self.env.name}: reward {reward.ref}"
        try:
            if reward.own:
                out: Any = [await _on_thread(self.instance.get_reward)]
            else:
                out = await _on_thread(lambda: reward.function(**kwargs))
        except Exception as exc:
            raise EnvironmentFailure(f"{where} raised {type(exc).__name__}: {exc}") from exc
        if isinstance(out, str | bytes) or not isinstance(out, Sequence):
            raise EnvironmentFailure(
                f"{where} returned {type(out).__name__}, not a list of one value per episode"
            )
        if len(out) != 1:
            raise EnvironmentFailure(f"{where} returned {len(out)} values for 1 episode")
        value = out[0]
        if value is None:
            return None
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise EnvironmentFailure(f"{where} returned {type(value).__name__}, not a number") from None
        if isinstance(value, bool) or not math.isfinite(number):
            raise EnvironmentFailure(f"{where} returned {value!r:.20}, not a finite number")
        return number


class TRLEnvironment(Environment):
    """A TRL environment class with its reward functions and rows (see the module docstring)."""

    regradable = False

    def __init__(
        self,
        name: str,
        cls: type,
        templates: Sequence[ToolTemplate],
        rewards: Sequence[Reward],
        rows: Sequence[tuple[Task, Mapping[str, Any]]],
    ) -> None:
        self.name = name
        self.cls = cls
        self.templates = list(templates)
        self.rewards = list(rewards)
        self._tasks = [task for task, _ in rows]
        self.rows = {task.id: row for task, row in rows}

    def tasks(self) -> Sequence[Task]:
        return self._tasks

    def start(self, task: Task, context: EpisodeContext) -> TRLWorld:
        return TRLWorld(self, task)


# --- Loading (before the run: every problem is one ConfigError line). ---


def _templates(spec: str, instance: object) -> list[ToolTemplate]:
    names = tool_method_names(instance)
    if not names:
        raise ConfigError(
            f"env.name: {spec!r} offers no tools: TRL offers every public method but reset and "
            f"get_reward, and {type(instance).__name__} has none"
        )
    templates = []
    for name in names:
        try:
            description, parameters = method_tool_spec(getattr(instance, name))
        except UnusableToolMethod as exc:
            raise ConfigError(f"env.name: {spec!r}: {exc}") from None
        templates.append(ToolTemplate(name, description, parameters, validation_schema(parameters)))
    return templates


def _rewards(spec: str, refs: object, cls: type, resolve: Callable[[str, str, str], Any]) -> list[Reward]:
    if refs is None:
        refs = []
    if isinstance(refs, str):
        refs = [refs]
    if not isinstance(refs, list) or not all(isinstance(r, str) for r in refs):
        raise ConfigError('env.options.reward: a list of "package.module:function" strings')
    rewards = []
    for ref in refs:
        if ":" not in ref:
            raise ConfigError(f"env.options.reward: {ref!r} is not package.module:function")
        function = resolve(ref, ref, "env.options.reward")
        if not callable(function):
            raise ConfigError(f"env.options.reward: {ref!r} is not callable")
        rewards.append(Reward(ref, function))
    own = getattr(cls, "get_reward", None)
    if callable(own):
        rewards.append(Reward(f"{cls.__name__}.get_reward", own, own=True))
    if not rewards:
        raise ConfigError(
            f"env.options.reward: {spec!r} has no reward: name reward functions "
            '(reward = ["package.module:function"]) or give the class a get_reward() method'
        )
    return rewards


def _dataset_rows(path: str, split: object) -> tuple[str, list[tuple[int, Mapping[str, Any]]]]:
    try:
        import datasets
    except ImportError:
        raise ConfigError(
            "env.options.dataset: needs the `datasets` package (pip install datasets)"
        ) from None
    where = Path(path)
    if not where.is_dir():
        raise ConfigError(f"env.options.dataset: no such directory: {path}")
    try:
        loaded = datasets.load_from_disk(str(where))
    except Exception as exc:  # noqa: BLE001 - whatever `datasets` raises, one line names it
        raise ConfigError(
            f"env.options.dataset: {path}: not a dataset saved with save_to_disk ({type(exc).__name__})"
        ) from None
    if isinstance(loaded, datasets.DatasetDict):
        splits = sorted(loaded)
        chosen = (
            split
            if split is not None
            else ("train" if "train" in loaded else (splits[0] if len(splits) == 1 else None))
        )
        if chosen not in loaded:
            raise ConfigError(f"env.options.split: {path} holds splits {splits}; name one (got {chosen!r})")
        loaded = loaded[chosen]
    return where.name, [(n, dict(row)) for n, row in enumerate(loaded, start=1)]


def _task(row: Mapping[str, Any], default_id: str, where: str) -> Task:
    task_id = row.get("id")
    prompt = row.get("prompt")
    if prompt is None:
        text: str | list[Any] = ""
    elif isinstance(prompt, str):
        text = prompt
    elif isinstance(prompt, list) and prompt:
        text = messages_from_chat(prompt, f"{where}: prompt")
    else:
        raise ConfigError(f"{where}: prompt must be a string or a non-empty list of chat messages")
    metadata = {k: v for k, v in row.items() if k != "prompt"}
    return Task(default_id if task_id is None else str(task_id), text, metadata)


def load_trl_environment(
    spec: str, options: Mapping[str, Any], task_file: str | None, resolve: Callable[[str, str, str], Any]
) -> TRLEnvironment:
    """The TRL class `spec` names (``trl:package.module:Class``), with `options` and its rows.
    `resolve(target, spec, field)` imports ``module:attr`` (the loader's, for its error lines)."""
    target = spec[len(PREFIX) :]
    if ":" not in target:
        raise ConfigError(f"env.name: {spec!r} is not trl:package.module:Class")
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ConfigError(
            f"env.options: {spec!r} takes {', '.join(OPTIONS)} (TRL builds the class with no "
            f"arguments); unknown: {', '.join(unknown)}"
        )
    cls = resolve(target, spec, "env.name")
    if not isinstance(cls, type):
        raise ConfigError(f"env.name: {spec!r} is not a class (TRL's environment_factory is the class)")
    try:
        probe = cls()
    except Exception as exc:  # noqa: BLE001 - a constructor failure is a config problem, in one line
        raise ConfigError(f"env.name: building {spec!r} failed: {type(exc).__name__}: {exc}") from None
    if not callable(getattr(probe, "reset", None)):
        raise ConfigError(f"env.name: {spec!r} has no callable reset() (TRL calls reset(**row) per episode)")
    templates = _templates(spec, probe)
    rewards = _rewards(spec, options.get("reward"), cls, resolve)
    dataset = options.get("dataset")
    if dataset is not None and task_file is not None:
        raise ConfigError(
            f"env.options.dataset: {spec!r} takes its rows from env.task_file or "
            "env.options.dataset, not both"
        )
    if dataset is not None:
        stem, raw = _dataset_rows(str(dataset), options.get("split"))
        source = f"env.options.dataset: {dataset}"
    elif task_file is not None:
        stem, raw = Path(task_file).stem, list(read_rows(task_file))
        source = f"env.task_file: {task_file}"
    else:
        raise ConfigError(
            f"env.task_file: {spec!r} needs its rows: env.task_file (JSONL/Parquet) or "
            "env.options.dataset (a datasets directory)"
        )
    rows = [(_task(row, f"{stem}-{n}", f"{source}: row {n}"), row) for n, row in raw]
    if not rows:
        raise ConfigError(f"{source} holds no rows")
    ids = [task.id for task, _ in rows]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"{source}: task ids repeat (the id column must be unique)")
    return TRLEnvironment(spec, cls, templates, rewards, rows)

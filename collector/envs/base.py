"""The environment interface: tasks, tools, and a grader.

An `Environment` lists `Task`s. For each episode the loop calls `Environment.start(task)`
and gets a fresh `EpisodeWorld`: the tools bound to that episode's own state, and a grader
that reads the final state. Worlds are never shared between episodes, so concurrent
episodes cannot see each other's refunds.

A task prompt is a string or a list of chat messages (system and few-shot turns with tool
calls and results included, as RL datasets store them).

A user's own environment is loaded from `package.module:attr` in config, where `attr` is
an `Environment` instance, subclass, or a zero-argument factory returning one. An
environment that can refuse a task overrides `Environment.check_task`, so that tasks from
a file are refused at load time rather than one `error` episode at a time.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from collector.errors import ConfigError
from collector.turn import JSONObject, Message

#: The most tasks a built-in environment generates (`env.options.num_tasks`): generating is
#: eager, so the bound is what keeps `collector validate` answering at once.
MAX_GENERATED_TASKS = 10_000


def generated_task_count(value: object) -> int:
    """`num_tasks` of a generated environment, checked: an int in 1..MAX_GENERATED_TASKS."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= MAX_GENERATED_TASKS:
        raise ConfigError(f"env.options.num_tasks: must be an integer from 1 to {MAX_GENERATED_TASKS:,} "
                          f"(got {value!r:.40})")
    return value


@dataclass(slots=True, frozen=True)
class Task:
    id: str
    prompt: str | list[Message]
    metadata: Mapping[str, Any] = field(default_factory=dict)


ToolFunction = Callable[..., Any] | Callable[..., Awaitable[Any]]
ArgumentValidator = Callable[[JSONObject], tuple[tuple[Any, ...], dict[str, Any]]]


@dataclass(slots=True, frozen=True)
class Tool:
    """A tool offered to the model.

    `parameters` is the JSON Schema of the arguments; arguments are validated against it
    before `function` runs, and a validation failure is an error result, never a crash.
    A `gate` tool (approval, human review) holds its siblings: if a call to it is malformed,
    fails validation or returns an error, no other call of that turn runs. Build tools with
    `collector.envs.tools.tool()` rather than by hand: it derives the schema and the validator.
    """

    name: str
    description: str
    parameters: JSONObject
    function: ToolFunction
    gate: bool = False
    validator: ArgumentValidator | None = None
    """Turns validated arguments into the call's (args, kwargs), or raises
    `collector.envs.tools.ToolArgumentError`. `collector.envs.tools.tool()` fills it from the type
    hints; when None, arguments are checked against `parameters` and passed as keywords."""
    timeout_s: float | None = None
    """This tool's own timeout; None uses the loop's `tool_timeout_s`."""
    inline: bool = False
    """Run a plain (non-async) function on the event loop instead of a worker thread. For
    fast in-memory tools only: an inline function cannot be timed out."""


class EpisodeWorld(ABC):
    """One episode's private state: its tools and its grader."""

    @property
    @abstractmethod
    def tools(self) -> Sequence[Tool]: ...

    @abstractmethod
    def grade(self, final_text: str | None) -> float:
        """Reward in [0, 1] from the world's final state (and the final answer, if any)."""


class Environment(ABC):
    name: str

    @abstractmethod
    def tasks(self) -> Sequence[Task]: ...

    @abstractmethod
    def start(self, task: Task) -> EpisodeWorld: ...

    def check_task(self, task: Task) -> str | None:
        """Why no world can be built for `task` (one line), or None when it can (or is unknown).

        Tasks from a file (`env.task_file`) are checked at load time, before any episode
        starts, so a prompt the environment cannot read is a config error instead of an
        `error` episode per task. Cheap and side-effect free: unlike `start`, it builds
        nothing. The default accepts every task; override it when `start` can refuse one.
        """
        return None

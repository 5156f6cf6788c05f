"""The environment interface: tasks, tools, and a grader.

Tests: tests/envs/test_context.py, tests/envs/test_my_env.py, tests/analysis/test_regrade.py (`regrade`).

An `Environment` lists `Task`s. For each episode the loop calls
`Environment.start(task, context)` and gets a fresh `EpisodeWorld`: the tools bound to that
episode's own state, and a grader that reads the final state. Worlds are never shared
between episodes, so concurrent episodes cannot see each other's refunds.

`context` is the `EpisodeContext`: which episode this is (episode id, run id, model,
provider label, budget, sample, seed). The rule that keeps older environments working
(`start_world`): `start` gets the context when its signature has room for it (a second
positional parameter, ``*args``, or a keyword named ``context``); a ``start(self, task)``
is called with the task alone, as before. A tool that declares a parameter annotated
`ToolCallContext` receives its call's context (the episode's, plus call id and turn
index) instead of an argument from the model, so an environment's own logs join
`executed_tool_calls` exactly on (episode_id, call_id).

A world that holds an outside resource (a tool server's session) overrides the async
`EpisodeWorld.open` and `close`: the loop awaits `open()` right after `start` and
`close()` once at the end of the episode, however it ended. `grade` may be a coroutine.

A task prompt is a string or a list of chat messages (system and few-shot turns with tool
calls and results included, as RL datasets store them).

A user's own environment is loaded from `package.module:attr` in config, where `attr` is
an `Environment` instance, subclass, or a zero-argument factory returning one. An
environment that can refuse a task overrides `Environment.check_task`, so that tasks from
a file are refused at load time rather than one `error` episode at a time. An environment
that hands its tools a secret lists it in `Environment.credentials`, so no record stores it.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

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
    models: tuple[str, ...] | None = None
    """The models this task applies to (None: every model of the sweep). A sweep runs the
    task only in cells of these models; ids of the cells it runs in are unchanged."""


@dataclass(slots=True, frozen=True)
class EpisodeContext:
    """What an episode is, handed to `Environment.start`: the same values its record holds."""

    episode_id: str
    run_id: str
    task_id: str
    model: str
    provider: str
    """The provider's label (the record's `provider` column)."""
    budget: int
    """The per-turn output-token cap."""
    sample: int
    seed: int
    env: str = ""


@dataclass(slots=True, frozen=True)
class ToolCallContext:
    """One tool call's context, for a tool that declares a parameter annotated with this type."""

    episode: EpisodeContext
    call_id: str
    """The call's id as stored in `executed_tool_calls.call_id` (after any `_dup` renaming)."""
    turn_index: int
    """The turn the call belongs to (`executed_tool_calls.turn_index`)."""


ToolFunction = Callable[..., Any] | Callable[..., Awaitable[Any]]
ArgumentValidator = Callable[[JSONObject], tuple[tuple[Any, ...], dict[str, Any]]]


@dataclass(slots=True, frozen=True)
class Tool:
    """A tool offered to the model.

    `parameters` is the JSON Schema of the arguments; arguments are validated against it
    before `function` runs, and a validation failure is an error result, never a crash.
    A `gate` tool (approval, human review) holds its siblings: if a call to it is malformed,
    fails validation or returns an error, no other call of that turn runs. Build tools with
    `collector.envs.toolkit.tool()` rather than by hand: it derives the schema and the validator.
    """

    name: str
    description: str
    parameters: JSONObject
    function: ToolFunction
    gate: bool = False
    validator: ArgumentValidator | None = None
    """Turns validated arguments into the call's (args, kwargs), or raises
    `collector.envs.toolkit.ToolArgumentError`. `collector.envs.toolkit.tool()` fills it from the type
    hints; when None, arguments are checked against `parameters` and passed as keywords."""
    timeout_s: float | None = None
    """This tool's own timeout; None uses the loop's `tool_timeout_s`."""
    inline: bool = False
    """Run a plain (non-async) function on the event loop instead of a worker thread. For
    fast in-memory tools only: an inline function cannot be timed out."""
    context_parameter: str | None = None
    """The keyword through which `function` receives its `ToolCallContext` (None: it takes none)."""

    @property
    def execution(self) -> Literal["async", "inline", "thread"]:
        """How a call to this tool runs (`collector validate` prints it per tool):

        - ``"async"``: a coroutine function, awaited on the episode's event loop and
          cancelled at its timeout;
        - ``"inline"``: a plain function marked `inline`, called on the event loop: calls
          never overlap within a worker, and no timeout can stop one;
        - ``"thread"``: a plain function without `inline` (the default for plain functions),
          run on the collector's tool threads, so calls from concurrent episodes of a worker
          run at the same time: the function (and what it shares between calls) must be
          thread-safe, or be marked `inline`.
        """
        if inspect.iscoroutinefunction(self.function):
            return "async"
        return "inline" if self.inline else "thread"


class EpisodeWorld(ABC):
    """One episode's private state: its tools and its grader."""

    time_limit_s: float | None = None
    """This episode's own wall-clock limit (a Harbor task's agent timeout); the loop uses the
    smaller of it and `loop.episode_timeout_s`. None: the loop's alone."""
    grade_timeout_s: float | None = None
    """How long an async grader may take (a verifier with its own timeout); None: the loop's
    `tool_timeout_s`."""
    grade_timed_out: bool = False
    """Grade an episode that ended `timeout` too, for diagnosis only: the verdict is stored in
    `graded_reward`, the reward stays 0."""

    @property
    @abstractmethod
    def tools(self) -> Sequence[Tool]: ...

    @abstractmethod
    def grade(self, final_text: str | None) -> float | Awaitable[float]:
        """Reward in [0, 1] from the world's final state (and the final answer, if any)."""

    @property
    def initial_observation(self) -> str | None:
        """What the world's own reset said (a TRL class's `reset()` return, an OpenEnv reset
        observation), read once after `open`: the loop appends it to the task's last user
        message before the first turn, as TRL does. None (the default) leaves the prompt as
        the task's."""
        return None

    def time_outside(self) -> Mapping[str, float | bool | None]:
        """The world's own time outside the model and the tools, by `EpisodeTiming` field
        (`image_build_s`, `image_cached`, `sandbox_start_s`, `sandbox_stop_s`, `verifier_s`);
        read once after `close`. The default: none (a world with no sandbox)."""
        return {}

    @property
    def finished(self) -> bool:
        """The world ended the episode itself (an OpenEnv observation said ``done``): the loop
        reads it after a turn's calls are settled and ends the episode as `done`."""
        return False

    async def open(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Acquire what the world needs outside the process (a server session); the loop awaits
        it after `start`, and a failure ends the episode as `error`."""

    async def close(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release what `open` acquired; awaited once at the end of every episode that opened."""


class Environment(ABC):
    name: str
    regradable: bool = False
    """`collector regrade` may rebuild this environment's worlds from a recorded episode (a
    fresh `start`, its tools run on the recorded calls in order) and grade them again. Declare
    it only when that replay is faithful: tools deterministic in their recorded (redacted)
    arguments, no outside state. `collector regrade` refuses an environment without it."""
    grader_version: str = "1"
    """Stored with each regrade annotation: bump it when the grader changes meaning."""

    async def regrade(self, task: Task, episode: Mapping[str, Any],
                      calls: Sequence[tuple[str, str, str, int]], final_text: str | None,
                      timeout_s: float = 30.0) -> float:
        """The grader's reward for a recorded episode, without the model (`collector regrade`).

        `episode` holds the record's `EpisodeContext` fields (episode_id, run_id, task_id,
        model, provider, budget, sample, seed, env). A fresh world for `task` (`start_world`),
        its tools run on `calls` (name, call id, arguments JSON, turn index) in the recorded
        order, then `grade(final_text)`. Only
        called when `regradable` is true; an environment whose state cannot be rebuilt this
        way overrides it or leaves `regradable` false.
        """
        import json

        context = EpisodeContext(**{f: episode[f] for f in EpisodeContext.__dataclass_fields__})
        world = start_world(self, task, context)
        await world.open()
        try:
            by_name = {t.name: t for t in world.tools}
            for name, call_id, arguments, turn_index in calls:
                tool = by_name.get(name)
                if tool is None:
                    raise ConfigError(f"episode {context.episode_id}: recorded call {call_id} names tool "
                                      f"{name!r}, which environment {self.name!r} does not offer")
                await _replay_call(tool, json.loads(arguments or "{}"), timeout_s,
                                   ToolCallContext(context, call_id, turn_index))
            result = world.grade(final_text)
            if inspect.isawaitable(result):  # an async grader gets a tool's time, as in the loop
                async with asyncio.timeout(timeout_s):
                    result = await result
            # As the grader gave it: `collector regrade` checks it is a reward, naming the episode.
            return result
        finally:
            await world.close()

    @abstractmethod
    def tasks(self) -> Sequence[Task]: ...

    @abstractmethod
    def start(self, task: Task, context: EpisodeContext) -> EpisodeWorld:
        """A fresh world for one episode (see `start_world` for environments whose `start`
        takes the task alone)."""

    def check_task(self, task: Task) -> str | None:
        """Why no world can be built for `task` (one line), or None when it can (or is unknown).

        Tasks from a file (`env.task_file`) are checked at load time, before any episode
        starts, so a prompt the environment cannot read is a config error instead of an
        `error` episode per task. Cheap and side-effect free: unlike `start`, it builds
        nothing. The default accepts every task; override it when `start` can refuse one.
        """
        return None

    def credentials(self) -> tuple[str, ...]:
        """The secret values this environment holds (a tool server's key, credentials in its
        URL), in every form they may be written: the worker adds them to the run's credentials,
        which every stored record is scrubbed of (`collector.episode.redact`). Read where the
        episodes run (a value copied from the worker's environment is the worker's). The
        default holds none; an environment that hands its tools a secret overrides it."""
        return ()


async def _replay_call(tool: Tool, arguments: JSONObject, timeout_s: float, context: ToolCallContext) -> None:
    """Run one recorded call for its effect on the world's state (`Environment.regrade`).

    Not `collector.envs.toolkit.run_tool`, which imports this module: the recorded calls
    already passed validation once, so the validator only shapes the arguments here. What a
    tool raises is its result, as in the episode (a recorded error replays as one).
    """
    try:
        # A call that failed validation in the episode fails it again here and runs nothing.
        args, kwargs = tool.validator(arguments) if tool.validator is not None else ((), dict(arguments))
        if tool.context_parameter is not None:
            kwargs[tool.context_parameter] = context
        async with asyncio.timeout(tool.timeout_s if tool.timeout_s is not None else timeout_s):
            result = tool.function(*args, **kwargs)
            if inspect.isawaitable(result):
                await result
    # Broad on purpose: a tool's failure was a result for the model, never the episode's end.
    except Exception:  # noqa: BLE001
        pass


def start_world(env: Environment, task: Task, context: EpisodeContext) -> EpisodeWorld:
    """`env.start` with the context when its signature has room for it, else with the task alone."""
    how = _start_takes_context(type(env))
    if how == "positional":
        return env.start(task, context)
    if how == "keyword":
        return env.start(task, context=context)
    start: Callable[[Task], EpisodeWorld] = env.start  # type: ignore[assignment]
    return start(task)


@functools.cache
def _start_takes_context(cls: type[Environment]) -> str:
    """"positional", "keyword" or "" for `cls.start` (cached: classes do not change shape)."""
    try:
        params = list(inspect.signature(cls.start).parameters.values())[1:]  # past `self`
    except (TypeError, ValueError):
        return "positional"
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in params):
        return "positional"
    if any(p.name == "context" or p.kind is p.VAR_KEYWORD for p in params):
        return "keyword"
    return ""

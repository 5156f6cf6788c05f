"""`openenv`: an environment served by an OpenEnv server (the `openenv` package, 0.10).

Install the extra: ``pip install 'collector[openenv]'``. Configure it with `[env.options]`:

- `url`: the server's base URL (``http://127.0.0.1:8000``); or `server`: a command that
  serves it on ``{port}`` (`collector.envs.openenv_server`), started once per worker
  (`server_scope = "worker"`, the default) or once per episode (``"episode"``), with
  `startup_timeout_s` (default 60);
- `tasks`: a list of ``{id, prompt, metadata, models}`` tables (or `env.task_file`); the
  task's ``metadata.reset`` table is passed to the server's ``reset`` (a ``seed``, a task
  index: whatever the environment's `reset` takes). Without tasks, `num_tasks` (default 1)
  tasks ask `prompt` with ``reset = {seed = <task index>}``;
- `mode`: ``"tools"`` for an MCP-style environment (its tools from the ``list_tools``
  action, each call a ``call_tool`` action), ``"action"`` for a typed-action environment
  (one tool, named `action_tool`, default ``"act"``, whose parameters are the action
  model's JSON Schema from ``GET /schema``; a call's arguments are the action), or
  ``"auto"`` (the default): ``"tools"`` when the server's action model is OpenEnv's own
  `CallToolAction`/`ListToolsAction` or the bare `Action`, else ``"action"``;
- `reward`: how the episode's reward is read from the observations of its steps (the
  reset's observation does not count): ``"sum"`` (the default) of their rewards, the
  ``"last"`` reward sent, or ``"final"``: the reward of the observation that said
  ``done`` (0.0 when the server never said it); or `grade_tool`, a server tool called once
  at grading with ``{"final_text": ...}`` whose result is the reward (hidden from the
  model);
- `timeout_s` (default 30): how long any one exchange with the server may take.

One session per episode: `open` opens a WebSocket session (`collector.envs.openenv_session`),
sends ``reset`` (its observation is appended to the task's prompt, `EpisodeWorld.initial_observation`)
and reads the tools; `close` sends ``close``. An observation with ``done`` ends the episode
as `done` once its turn's calls are settled; a call after it in the same turn is not sent
(it is answered with an error result saying so, and listed in `executed_tool_calls` as an
error, since the loop ran its tool function). Tools run through the loop's `run_tool` like
any other, so nothing from a cut or malformed turn ever reaches the server.

Failures. With `url`, the server is asked for its ``/schema`` when the environment is
built: a server that is down is a one-line config error before the run. Mid-run, a server
that cannot be reached, hangs past `timeout_s`, closes the session, fails in its own
``step`` or answers outside the protocol ends the episode as `error` naming the server and
the cause (never a reward of 0). An action the server refuses as invalid is an error
result the model reads; a tool's own error (``CallToolObservation.error``) too.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from collector.config import public_url, url_credentials
from collector.envs.base import Environment, EpisodeContext, EpisodeWorld, Task, Tool
from collector.envs.openenv_server import LocalServer
from collector.envs.openenv_session import ActionRefused, Observation, OpenEnvSession, observation_text
from collector.envs.tasks import task_from_row
from collector.envs.toolkit import ToolError, tool
from collector.errors import ConfigError, EnvironmentFailure

__all__ = ["OpenEnvEnvironment", "OpenEnvWorld"]

_MODES = ("auto", "tools", "action")
_REWARDS = ("sum", "last", "final")
_SCOPES = ("worker", "episode")
#: Action models that mean "an MCP-style environment": OpenEnv's own MCP actions, or the bare
#: base class (an `MCPEnvironment` served with `Action` as its action model).
_MCP_ACTIONS = frozenset({"CallToolAction", "ListToolsAction", "Action"})
DEFAULT_PROMPT = "Solve the task the environment describes, using its tools."
DEFAULT_ACTION_DESCRIPTION = "Take one action in the environment."


def action_mode(schema: Mapping[str, Any]) -> str:
    """``"tools"`` or ``"action"`` for a server's action model (see `mode` in the docstring)."""
    return "tools" if schema.get("title") in _MCP_ACTIONS else "action"


def action_parameters(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The action tool's parameters: the action model's schema without the `metadata` every
    OpenEnv action carries for the client's own bookkeeping (not the model's to fill)."""
    parameters = {k: v for k, v in schema.items() if k not in ("title", "description")}
    properties = dict(parameters.get("properties", {}))
    properties.pop("metadata", None)
    parameters["properties"] = properties
    parameters.setdefault("type", "object")
    if "required" in parameters:
        parameters["required"] = [r for r in parameters["required"] if r != "metadata"]
    return parameters


class OpenEnvEnvironment(Environment):
    """Tasks from config, worlds served by an OpenEnv server (see the module docstring)."""

    name = "openenv"

    def __init__(
        self,
        url: str | None = None,
        server: Sequence[str] | None = None,
        server_scope: str = "worker",
        tasks: Sequence[Mapping[str, Any]] = (),
        num_tasks: int = 1,
        prompt: str = DEFAULT_PROMPT,
        mode: str = "auto",
        action_tool: str = "act",
        reward: str = "sum",
        grade_tool: str | None = None,
        timeout_s: float = 30.0,
        startup_timeout_s: float = 60.0,
    ) -> None:
        if (url is None) == (server is None):
            raise ConfigError("env.options: the openenv environment needs url or server (a command), "
                              "not both")
        if url is not None and not (isinstance(url, str) and url.startswith(("http://", "https://"))):
            raise ConfigError(f"env.options.url: {str(url)[:80]!r} is not an http(s) URL")
        if server is not None and (isinstance(server, str) or not server
                                   or not all(isinstance(p, str) for p in server)):
            raise ConfigError("env.options.server: a command must be a non-empty list of strings")
        for option, value, allowed in (("mode", mode, _MODES), ("reward", reward, _REWARDS),
                                       ("server_scope", server_scope, _SCOPES)):
            if value not in allowed:
                raise ConfigError(f"env.options.{option}: must be one of {', '.join(allowed)} "
                                  f"(got {value!r:.40})")
        self.url = url
        self.command = tuple(server) if server is not None else ()
        self.server_scope = server_scope
        self.mode = mode
        self.action_tool = action_tool
        self.reward = reward
        self.grade_tool = grade_tool
        self.timeout_s = float(timeout_s)
        self.startup_timeout_s = float(startup_timeout_s)
        self._worker_server: LocalServer | None = None
        self._worker_server_lock: asyncio.Lock | None = None
        self._schema: dict[str, Any] | None = None
        if tasks:
            self._tasks = [task_from_row(row, f"openenv-{n:04d}", where=f"env.options.tasks.{n}")
                           for n, row in enumerate(tasks)]
        else:
            self._tasks = [Task(f"openenv-{n:04d}", prompt, {"reset": {"seed": n}}) for n in range(num_tasks)]
        if url is not None:
            self._schema = self._fetch_schema_now(url)

    def _fetch_schema_now(self, url: str) -> dict[str, Any]:
        """The action schema, asked before the run: a server that is down is a config error."""
        try:
            answer = httpx.get(url.rstrip("/") + "/schema", timeout=self.timeout_s)
            answer.raise_for_status()
            schema = answer.json()["action"]
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            cause = f"{type(exc).__name__}: {str(exc)[:160]}"
            raise ConfigError(f"env.options.url: openenv server at {public_url(url)} did not give its "
                              f"action schema (GET /schema: {cause})") from None
        if not isinstance(schema, dict):
            raise ConfigError(f"env.options.url: openenv server at {public_url(url)} sent an action schema "
                              "that is not an object")
        return schema

    async def schema(self, url: str) -> dict[str, Any]:
        """The server's action schema (asked once, at build time for a URL, else at first use)."""
        if self._schema is None:
            try:
                async with httpx.AsyncClient(timeout=self.timeout_s) as client:
                    answer = await client.get(url + "/schema")
                    answer.raise_for_status()
                    schema = answer.json()["action"]
            except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
                raise EnvironmentFailure(f"openenv server at {public_url(url)}: GET /schema failed "
                                         f"({type(exc).__name__})") from None
            if not isinstance(schema, dict):
                raise EnvironmentFailure(f"openenv server at {public_url(url)}: the action schema is not "
                                         "an object")
            self._schema = schema
        return self._schema

    async def worker_server(self) -> str:
        """The worker's own server (started at its first episode, again if it died).

        The worker's first episodes open at once: one of them starts the server while the
        others wait for it; unguarded, each would spawn a server of its own and all but the
        last would run unused until the worker exits."""
        if self._worker_server_lock is None:
            self._worker_server_lock = asyncio.Lock()
        async with self._worker_server_lock:
            if self._worker_server is None:
                self._worker_server = LocalServer(self.command, self.startup_timeout_s)
            if not self._worker_server.running:
                await self._worker_server.start()
            return self._worker_server.url

    def tasks(self) -> Sequence[Task]:
        return self._tasks

    def credentials(self) -> tuple[str, ...]:
        return url_credentials(self.url) if self.url is not None else ()

    def start(self, task: Task, context: EpisodeContext | None = None) -> OpenEnvWorld:
        return OpenEnvWorld(self, task)


class OpenEnvWorld(EpisodeWorld):
    """One episode's session with the server."""

    def __init__(self, env: OpenEnvEnvironment, task: Task) -> None:
        self.env = env
        self.task = task
        self.rewards: list[float] = []
        self.final_reward: float | None = None
        self._done = False
        self._reset_observation: str | None = None
        self._tools: list[Tool] = []
        self._session: OpenEnvSession | None = None
        self._server: LocalServer | None = None
        self._lock = asyncio.Lock()  # one exchange at a time on the session

    @property
    def tools(self) -> Sequence[Tool]:
        return self._tools

    @property
    def initial_observation(self) -> str | None:
        return self._reset_observation

    @property
    def finished(self) -> bool:
        return self._done

    async def open(self) -> None:
        env = self.env
        if env.url is not None:
            url = env.url
        elif env.server_scope == "episode":
            self._server = LocalServer(env.command, env.startup_timeout_s)
            url = await self._server.start()
        else:
            url = await env.worker_server()
        schema = await env.schema(url.rstrip("/"))
        mode = env.mode if env.mode != "auto" else action_mode(schema)
        self._session = OpenEnvSession(url, env.timeout_s)
        await self._session.open()
        reset = self.task.metadata.get("reset", {})
        if not isinstance(reset, dict):
            raise EnvironmentFailure(f"task {self.task.id}: metadata.reset must be a table")
        first = await self._session.reset(reset)
        # Appended to the prompt's last user message (as every world's reset text is), set off
        # as its own paragraph: an OpenEnv observation is not written to continue a sentence.
        said = observation_text(first.fields)
        self._reset_observation = f"\n\n{said}" if said else None
        if mode == "tools":
            listed = await self._session.step({"type": "list_tools"})
            self._tools = self._mcp_tools(listed)
        else:
            self._tools = [tool(self._act, name=env.action_tool, parameters=action_parameters(schema),
                                description=str(schema.get("description") or DEFAULT_ACTION_DESCRIPTION),
                                timeout_s=env.timeout_s + 5)]

    def _mcp_tools(self, listed: Observation) -> list[Tool]:
        where = self._session.where if self._session is not None else "openenv server"
        entries = listed.fields.get("tools")
        metadata = listed.fields.get("metadata")
        error = metadata.get("error") if isinstance(metadata, dict) else None
        if error or not isinstance(entries, list):
            raise EnvironmentFailure(f"{where}: list_tools failed ({str(error or 'no tools list')[:200]})")
        tools: list[Tool] = []
        for entry in entries:
            if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                raise EnvironmentFailure(f"{where}: list_tools sent a tool without a name")
            name = entry["name"]
            if name == self.env.grade_tool:
                continue  # the grader's tool is the environment's, not the model's

            async def call(_name: str = name, **arguments: Any) -> str:
                return await self._call_tool(_name, arguments)

            try:
                tools.append(tool(call, name=name, description=str(entry.get("description") or ""),
                                  parameters=entry.get("input_schema") or {"type": "object"},
                                  timeout_s=self.env.timeout_s + 5))
            except ValueError as exc:
                raise EnvironmentFailure(f"{where}: tool {name!r} has a schema that cannot be used: "
                                         f"{exc}") from None
        return tools

    async def _send(self, action: dict[str, Any], grading: bool = False) -> Observation:
        if self._done and not grading:
            raise ToolError("not executed: the environment already ended the episode")
        assert self._session is not None
        async with self._lock:
            try:
                observation = await self._session.step(action)
            except ActionRefused as exc:
                raise ToolError(f"the environment refused the action: {exc}") from None
        if observation.reward is not None:
            self.rewards.append(observation.reward)
        if observation.done:
            self._done = True
            self.final_reward = observation.reward
        return observation

    async def _act(self, **action: Any) -> str:
        return observation_text((await self._send(dict(action))).fields)

    async def _call_tool(self, name: str, arguments: dict[str, Any], grading: bool = False) -> str:
        action = {"type": "call_tool", "tool_name": name, "arguments": arguments}
        observation = await self._send(action, grading)
        fields = observation.fields
        error = fields.get("error")
        if isinstance(error, dict):
            raise ToolError(str(error.get("message") or error.get("error_type") or "the tool failed")[:300])
        result = fields.get("result")
        if isinstance(result, dict):
            content = result.get("content")
            parts = content if isinstance(content, list) else []
            texts = [c.get("text", "") for c in parts if isinstance(c, dict)]
            text = "\n".join(t for t in texts if isinstance(t, str)) if texts else json.dumps(
                result.get("data", result), ensure_ascii=False, default=str)
            if result.get("is_error") or result.get("isError"):
                raise ToolError(text[:300])
            return text
        return observation_text(fields)

    async def grade(self, final_text: str | None) -> float:
        if self.env.grade_tool is not None:
            text = await self._call_tool(self.env.grade_tool, {"final_text": final_text or ""}, grading=True)
            try:
                return float(text)
            except ValueError:
                raise EnvironmentFailure(f"grade tool {self.env.grade_tool!r} answered {text[:60]!r}, "
                                         "not a number") from None
        if self.env.reward == "sum":
            return sum(self.rewards)
        if self.env.reward == "last":
            return self.rewards[-1] if self.rewards else 0.0
        return self.final_reward if self.final_reward is not None else 0.0

    async def close(self) -> None:
        session, self._session = self._session, None
        try:
            if session is not None:
                await session.close()
        finally:
            if self._server is not None:
                await self._server.stop()

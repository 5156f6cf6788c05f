"""`mcp`: an environment whose tools come from an MCP server (the official `mcp` Python SDK).

Install the extra: ``pip install 'collector[mcp]'``. Configure it with `[env.options]`:

- `server`: a command (a list: ``["python", "-m", "my_server"]``, spoken to over stdio) or
  an ``http(s)://`` URL (streamable HTTP). A command starting with ``python`` runs under the
  worker's own interpreter with the worker's `sys.path` (`env.python_path` included) as
  its PYTHONPATH, so a server module beside the environment imports the same way;
- `tasks`: a list of ``{id, prompt, metadata, models}`` tables (or `env.task_file`);
- `grader`: ``package.module:attr``, a callable ``(world, final_text) -> float`` (or a
  coroutine) that may call the server through ``await world.call(name, arguments)``; or
  `grade_tool`: the name of a server tool called at grading with ``{"final_text": ...}``
  whose result is the reward (hidden from the model). Without either, the reward is 1.0
  when the final answer contains ``metadata["expected"]``, else 0.0;
- `gates`: names of server tools that are approval gates (a failed call holds its siblings);
- `env`: variables for a stdio server (stored with the run's config: never a secret);
  `pass_env`: names of variables copied from the worker's own environment, the way to hand
  a stdio server a key without it entering the config;
- credentials in an ``http(s)://`` server's URL (``http://user:PASS@host/mcp?api_key=KEY``)
  are sent as written, never stored: the resolved config keeps the public URL and the
  fingerprint leaves them out (`collector.config.urls`), so a rotated key resumes the run;
- `server_log`: a file a stdio server's stderr is appended to (by default a temporary file
  whose last line is quoted when the server fails, so the cause shows in the episode's
  error); `startup_timeout_s` (default 30).

One session per episode: `open` connects (a stdio command starts a process of its own, so a
worker runs up to `ray.episodes_in_flight` server processes at once), reads
the tools from ``tools/list`` (their input schemas are validated with `jsonschema` before a
call is sent; a tool whose input or output schema cannot be compiled, such as a `$ref` to
itself or to nothing, fails `open` naming the tool, and whatever a validator still raises at
a call is that call's error result), and `close` ends the session, whatever way the episode
ended. State therefore never leaks from one episode to another. Every call carries the
episode id and call id in its request ``_meta`` (``collector/episode_id``,
``collector/call_id``), so the server's own logs join `executed_tool_calls`.

Secrets. The values of `pass_env` (at least `MIN_CREDENTIAL_CHARS` characters: a shorter one
would hide ordinary text) and the URL's credentials are this environment's `credentials()`:
the worker adds them to the run's credentials, which every record is scrubbed of. The
environment also replaces them itself, by ``[redacted credential]``, in what it hands on: a
tool result, an error result, the quoted stderr tail, a failure message. So a server that
echoes its key reaches neither the model's provider nor the record.

Bounds. A result is held to `loop.max_tool_result_bytes` like any tool's (`run_tool`): a
larger one is that call's error result, never stored or replayed. What the SDK logs about a
server (a traceback per non-JSON stdout line, unbounded for a server that prints its debug
output there) is rate-limited, cut and scrubbed (`collector.envs.mcplog`).

Failures. A result with ``isError`` is an error result for the model, as is a protocol
error answering one call. A server that does not start within `startup_timeout_s`, or whose
connection closes (it crashed, or was killed) is an `EnvironmentFailure`: the episode ends
as `error` naming the server and the cause, and the loop's guarantees (nothing from a cut
turn runs, gates hold siblings, every call id settled once) are those of any tool, since
MCP tools run through the same `run_tool`. A server that hangs is bounded by the tool
timeout like any tool.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import json
import os
import re
import sys
import tempfile
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TextIO

from collector.config import public_url, url_credentials
from collector.envs import mcplog
from collector.envs.base import Environment, EpisodeContext, EpisodeWorld, Task, Tool, ToolCallContext
from collector.envs.tasks import task_from_row
from collector.envs.toolkit import ToolError, schema_validator, tool
from collector.errors import ConfigError, EnvironmentFailure
from collector.turn import REDACTED_CREDENTIAL

Grader = Callable[["MCPWorld", str | None], float | Awaitable[float]]

#: A `pass_env` value shorter than this is not treated as a credential: scrubbing a `1` or
#: `on` from every record would wreck the data (the redactor's `MIN_SCRUBBED_CHARS`).
MIN_CREDENTIAL_CHARS = 4


class MCPEnvironment(Environment):
    """Tasks from config (or a task file), tools from an MCP server; see the module docstring."""

    name = "mcp"

    def __init__(
        self,
        server: str | Sequence[str],
        tasks: Sequence[Mapping[str, Any]] = (),
        grader: str | None = None,
        grade_tool: str | None = None,
        env: Mapping[str, str] | None = None,
        startup_timeout_s: float = 30.0,
        gates: Sequence[str] = (),
        server_log: str | None = None,
        pass_env: Sequence[str] = (),
    ) -> None:
        try:
            importlib.import_module("mcp")
        except ImportError:
            raise ConfigError(
                "env.name: the mcp environment needs the mcp package: pip install 'collector[mcp]'"
            ) from None
        if isinstance(server, str):
            if not server.startswith(("http://", "https://")):
                raise ConfigError(
                    f"env.options.server: {server[:80]!r} is neither a command list nor an http(s) URL"
                )
        elif not server or not all(isinstance(part, str) for part in server):
            raise ConfigError("env.options.server: a command must be a non-empty list of strings")
        mcplog.install()  # before any session: the SDK's per-line log records are bounded
        if grader is not None and grade_tool is not None:
            raise ConfigError("env.options: give grader or grade_tool, not both")
        self.server: str | tuple[str, ...] = server if isinstance(server, str) else tuple(server)
        self.grade_tool = grade_tool
        self.grader = _resolve_grader(grader) if grader is not None else None
        self.variables = dict(env or {})
        self.startup_timeout_s = float(startup_timeout_s)
        self.gates = frozenset(gates)
        self.server_log = server_log
        self.pass_env = tuple(pass_env)
        self._tasks = [
            task_from_row(row, f"mcp-{n:04d}", where=f"env.options.tasks.{n}") for n, row in enumerate(tasks)
        ]

    def tasks(self) -> Sequence[Task]:
        return self._tasks

    def describe_server(self) -> str:
        """The server as messages name it: the URL, or the command's first words."""
        if isinstance(self.server, str):
            return public_url(self.server)
        return " ".join(self.server[:3])[:120]

    def credentials(self) -> tuple[str, ...]:
        """The `pass_env` values set here and the server URL's credentials, in their sent and
        escaped forms (see the module docstring's "Secrets")."""
        values = [os.environ.get(name, "") for name in self.pass_env]
        values = [v for v in values if len(v) >= MIN_CREDENTIAL_CHARS]
        if isinstance(self.server, str):
            values += url_credentials(self.server)
        forms = {
            form for v in values for form in (v, json.dumps(v)[1:-1], json.dumps(v, ensure_ascii=False)[1:-1])
        }
        return tuple(sorted(forms, key=lambda f: (-len(f), f)))

    def scrub(self, text: str) -> str:
        """`text` with every credential of `credentials()` replaced (longest form first)."""
        pattern = _credential_pattern(self.credentials())
        return pattern.sub(REDACTED_CREDENTIAL, text) if pattern is not None else text

    def start(self, task: Task, context: EpisodeContext | None = None) -> MCPWorld:
        return MCPWorld(self, task, context)


class MCPWorld(EpisodeWorld):
    """One episode's MCP session: its tools, and the grader that may ask the server."""

    def __init__(self, env: MCPEnvironment, task: Task, context: EpisodeContext | None) -> None:
        self.env = env
        self.task = task
        self.context = context
        self._client: Any = None
        self._session: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()
        self._ended: BaseException | None = None
        self._tools: list[Tool] = []
        self._stderr: TextIO | None = None
        """Where a stdio server's stderr goes; its tail is quoted when the server fails."""

    @property
    def tools(self) -> Sequence[Tool]:
        return self._tools

    async def open(self) -> None:
        where = self.env.describe_server()
        mcplog.GUARD.add_secrets(self.env.credentials())  # what the SDK logs is scrubbed too
        listed: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        # The session lives in a task of its own: the SDK's task groups cancel their host
        # task when the transport fails, and that host must not be the episode.
        self._session = asyncio.create_task(self._hold_session(listed), name=f"mcp-session {where}")
        try:
            async with asyncio.timeout(self.env.startup_timeout_s):
                tools = await asyncio.shield(listed)
        except TimeoutError:
            await self.close()
            raise EnvironmentFailure(
                f"MCP server {where} did not start within {self.env.startup_timeout_s:g} s"
            ) from None
        except Exception as exc:  # noqa: BLE001 - reported as EnvironmentFailure, its cause dropped: it may quote a secret
            tail = self._stderr_tail()
            await self.close()
            raise EnvironmentFailure(
                f"MCP server {where} failed to start: {_describe(exc, self.env.scrub)}{tail}"
            ) from None
        built = []
        for entry in tools:
            if entry.name == self.env.grade_tool:
                continue
            try:
                built.append(self._tool(entry))
            except ValueError as exc:  # refused once, here, rather than at every call
                raise EnvironmentFailure(
                    f"MCP server {where}: tool {str(entry.name)[:80]!r}: its schema is refused: {exc}"
                ) from None
        self._tools = built

    async def _hold_session(self, listed: asyncio.Future[list[Any]]) -> None:
        from mcp import Client

        try:
            async with Client(self._target()) as client:
                tools = await _list_tools(client)
                self._client = client
                listed.set_result(tools)
                await self._closing.wait()
        except BaseException as exc:  # noqa: BLE001 - the session's end is reported to its callers
            self._ended = exc
            if not listed.done():
                listed.set_exception(exc if isinstance(exc, Exception) else EOFError("session cancelled"))
        finally:
            self._client = None

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is None:
            return
        self._closing.set()
        try:
            await asyncio.wait({session}, timeout=self.env.startup_timeout_s)
        finally:  # also when the caller stops waiting: the session never outlives its episode
            if not session.done():  # a transport that will not shut down
                session.cancel()
            stderr, self._stderr = self._stderr, None
            if stderr is not None:
                stderr.close()

    def _stderr_tail(self) -> str:
        """`; its stderr ended: <last line>` for a stdio server that wrote any, else ""."""
        if self._stderr is None or self._stderr.closed:
            return ""
        try:
            self._stderr.flush()
            self._stderr.seek(0, os.SEEK_END)
            size = self._stderr.tell()
            self._stderr.seek(max(0, size - 4096))
            lines = [line.strip() for line in self._stderr.read().splitlines() if line.strip()]
        except (OSError, ValueError):
            return ""
        # Scrubbed before it is cut: a cut through a key would leave its first part unmatched.
        return f"; its stderr ended: {self.env.scrub(lines[-1])[:300]}" if lines else ""

    async def call(
        self, name: str, arguments: Mapping[str, Any], meta: Mapping[str, str] | None = None
    ) -> str:
        """Call a server tool; its text result, or `ToolError` for an ``isError`` result.

        Raises `EnvironmentFailure` when the session ends under the call (the server died)."""
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED

        where = f"MCP server {self.env.describe_server()}"
        session, client = self._session, self._client
        if session is None or client is None or session.done():
            raise EnvironmentFailure(f"{where}: the session has ended{self._cause()}")
        request = asyncio.ensure_future(
            client.call_tool(name, dict(arguments), meta=dict(meta) if meta else None)
        )
        try:
            await asyncio.wait({request, session}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not request.done():  # the session ended first, or the episode was cancelled
                request.cancel()
        scrub = self.env.scrub
        if request.cancelled() or not request.done():
            cause = self._cause() + self._stderr_tail()
            raise EnvironmentFailure(scrub(f"{where} closed the session during {name}{cause}"))
        exc = request.exception()
        if isinstance(exc, MCPError):
            if exc.code == CONNECTION_CLOSED:
                raise EnvironmentFailure(
                    scrub(
                        f"{where} closed the connection during {name} (the server exited or was killed)"
                        + self._stderr_tail()
                    )
                ) from None
            raise ToolError(f"{name}: {scrub(exc.message)[:300]}") from None
        if isinstance(exc, RuntimeError | RecursionError) and not session.done():
            # The SDK checking the result against the tool's outputSchema failed (it raises
            # RuntimeError; a schema it cannot follow, RecursionError): this call's error, and
            # the session goes on.
            raise ToolError(f"{name}: the result could not be checked: {_describe(exc, scrub)}") from None
        if exc is not None:
            raise EnvironmentFailure(f"{where} failed during {name}: {_describe(exc, scrub)}") from None
        result = request.result()
        text = scrub(_result_text(result))
        if result.is_error:
            raise ToolError(f"{name}: {text[:300]}")
        return text

    def _cause(self) -> str:
        return f" ({_describe(self._ended, self.env.scrub)})" if self._ended is not None else ""

    async def grade(self, final_text: str | None) -> float:
        if self.env.grader is not None:
            value = self.env.grader(self, final_text)
            return float(await value if inspect.isawaitable(value) else value)
        if self.env.grade_tool is not None:
            text = await self.call(self.env.grade_tool, {"final_text": final_text or ""})
            return float(json.loads(text)) if text.strip() else 0.0
        expected = self.task.metadata.get("expected")
        return 1.0 if expected is not None and str(expected) in (final_text or "") else 0.0

    def _target(self) -> Any:
        from mcp import StdioServerParameters
        from mcp.client.stdio import get_default_environment, stdio_client

        if isinstance(self.env.server, str):
            return self.env.server
        command, *args = self.env.server
        missing = [name for name in self.env.pass_env if name not in os.environ]
        if missing:
            raise EnvironmentFailure(f"env.options.pass_env: {', '.join(missing)} not set on this worker")
        variables = {
            **get_default_environment(),
            **self.env.variables,
            **{name: os.environ[name] for name in self.env.pass_env},
        }
        if command == "python":
            # The worker's interpreter and import path: a server module next to the
            # environment (on env.python_path) imports exactly as it does here.
            command = sys.executable
            variables.setdefault("PYTHONPATH", os.pathsep.join(p for p in sys.path if p))
        params = StdioServerParameters(command=command, args=list(args), env=variables)
        if self.env.server_log is not None:
            self._stderr = open(self.env.server_log, "a+", encoding="utf-8")  # noqa: SIM115 - closed in close()
        else:
            self._stderr = tempfile.TemporaryFile("w+", encoding="utf-8")  # noqa: SIM115 - closed in close()
        return stdio_client(params, errlog=self._stderr)

    def _tool(self, listed: Any) -> Tool:
        name = str(listed.name)

        # The context's keyword is one no server argument will be called.
        async def call_server(collector_call_context: ToolCallContext | None = None, **arguments: Any) -> str:
            meta = None
            if (call := collector_call_context) is not None:
                meta = {"collector/episode_id": call.episode.episode_id, "collector/call_id": call.call_id}
            return await self.call(name, arguments, meta)

        schema = dict(listed.input_schema or {"type": "object"})
        output_schema = getattr(listed, "output_schema", None)
        if output_schema:
            try:
                schema_validator(output_schema)  # the SDK checks results against it: compile it now
            except ValueError as exc:
                raise ValueError(f"outputSchema: {exc}") from None
        return tool(
            call_server,
            name=name,
            description=listed.description or "",
            parameters=schema,
            gate=name in self.env.gates,
        )


async def _list_tools(client: Any) -> list[Any]:
    tools: list[Any] = []
    cursor = None
    for _ in range(100):  # a paginator that never ends cannot hang the episode
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            break
    return tools


def _result_text(result: Any) -> str:
    texts = [block.text for block in result.content if getattr(block, "type", None) == "text"]
    if texts:
        return "\n".join(texts)
    if result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False, default=str)
    return ""


@functools.lru_cache(maxsize=64)
def _credential_pattern(forms: tuple[str, ...]) -> re.Pattern[str] | None:
    # Cached: the same few forms are matched against every result of the run.
    return re.compile("|".join(map(re.escape, forms))) if forms else None


def _describe(exc: BaseException, scrub: Callable[[str], str] = str) -> str:
    # An exception group (anyio's task groups) hides the cause one level down. `scrub` runs
    # before the cut, so no key is left half-matched at the end.
    inner = getattr(exc, "exceptions", None)
    if inner:
        return _describe(inner[0], scrub)
    text = scrub(" ".join(str(exc).split()))[:200]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _resolve_grader(spec: str) -> Grader:
    module_name, _, attr = spec.partition(":")
    if not attr:
        raise ConfigError(f"env.options.grader: {spec!r} is not package.module:attr")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except ImportError as exc:
        raise ConfigError(f"env.options.grader: cannot import module {module_name!r} ({exc.msg})") from None
    except AttributeError:
        raise ConfigError(f"env.options.grader: {module_name!r} has no attribute {attr!r}") from None
    if not callable(obj):
        raise ConfigError(f"env.options.grader: {spec!r} is not callable")
    grader: Grader = obj
    return grader

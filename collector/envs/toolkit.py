"""Tools: schemas from typed Python callables, validation before a call, and safe execution.

Tests: tests/envs/test_tools.py, tests/envs/test_tool_threads.py.

A `Tool` (collector.envs.base) pairs a JSON Schema with a function. `tool()` builds one from
a typed callable (each parameter becomes a property; defaults make it optional), from a
callable taking one pydantic model (the model's fields are the arguments), or from a JSON
Schema given as data (``tool(fn, name=..., parameters=schema)``: tasks from datasets ship
their tools as JSON; the arguments then reach `fn` as keywords). The schema and the
validator are built once per function (or per schema) and cached, so worlds that bind
fresh methods per episode pay nothing per episode.

A parameter annotated `ToolCallContext` is not an argument of the model: it is left out of
the schema and receives the call's context (episode, call id, turn index).

`run_tool` is the only way the loop runs a tool, and it never raises for the tool's doing:

1. arguments are validated first (pydantic in strict mode, unknown keys rejected): a model
   that sends ``"amount": "1000"`` or a misspelt key is told so, and nothing runs. Strict,
   because coercing a model's mistake into an action is the failure this project exists
   to prevent. Tools built from a JSON Schema are checked with the `jsonschema` package
   (the schema's own draft, Draft 2020-12 when it names none), the field's standard
   validator; messages name the failing field and keyword, never the value. A schema is
   compiled when the tool is built: one that is not valid JSON Schema, has a `$ref` that
   resolves nowhere (nothing remote is fetched) or a `$ref` cycle that never moves into the
   value (`{"$ref": "#"}`, which the validator follows until RecursionError) is refused there
   with a `ValueError`. Whatever the validator still raises at a call is that call's error
   result (``ran=False``), never an exception out of `run_tool`;
2. the function runs under a per-tool timeout. Coroutine functions are awaited and
   cancelled at the timeout; plain functions run on the collector's own tool threads
   (`ToolThreads`) unless the tool is marked `inline`, for fast in-memory tools where a
   thread hop costs more than the work. A thread cannot be killed: a call that times out
   while running is abandoned (the model gets an error) and keeps its thread until the
   function returns;
3. an exception or a timeout becomes an error result naming the tool and the exception
   type. Only `asyncio.CancelledError` (the job cancelling the episode) and
   `collector.errors.EnvironmentFailure` pass through: a tool raises the latter when the
   world itself is broken (its tool server died), and the loop ends the episode as `error`.
   A tool that wants to answer with an error result raises `ToolError(message)`: the model
   reads ``error: {message}``.

Results are strings for the model: a `str` as is, anything else as JSON. A result longer than
`loop.max_tool_result_bytes` (UTF-8 bytes, 1 MiB by default: `DEFAULT_MAX_RESULT_BYTES`)
becomes an error result naming its size and the limit; the result itself is dropped, since
it would be stored and sent to the model again on every later turn.

The thread limit. Plain functions never use asyncio's default executor: it holds only
``min(32, cpus + 4)`` threads, so that many hung tools used to make every later threaded
call on the loop (the tool's own and anyone else's `asyncio.to_thread`) wait out its
timeout. They run on `SYNC_TOOL_THREADS` (64, the default episodes in flight per worker, so
a healthy worker never queues) daemon threads per process, started on demand; daemon,
so that a hung tool cannot hold up the worker's exit. Abandoned threads are counted; once
all of them are held by abandoned calls, a new call is refused at once with an error result
naming the cause (``all 64 tool threads are held by calls that timed out ...``) and
``ran=False``, instead of queueing behind functions that may never return. A thread comes
back as soon as its function returns. A call whose time runs out while still queued is
dropped and never runs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import inspect
import json
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, get_args, get_type_hints

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from collector.envs.base import ArgumentValidator, Tool, ToolCallContext, ToolFunction

# Re-exported: the JSON-schema half of the tools lives in collector.envs.schemas.
from collector.envs.schemas import ToolArgumentError as ToolArgumentError
from collector.envs.schemas import ToolSchemaError as ToolSchemaError
from collector.envs.schemas import check_schema as check_schema
from collector.envs.schemas import schema_validator as schema_validator
from collector.errors import EnvironmentFailure
from collector.turn import JSONObject, ToolSpec


class ToolError(Exception):
    """Raised by a tool to answer with an error result: the model reads ``error: {message}``."""


@dataclass(slots=True, frozen=True)
class ToolOutcome:
    content: str
    is_error: bool
    ran: bool = True
    """False when the call was refused before the function was called (invalid arguments)."""


@dataclass(slots=True, frozen=True)
class _Compiled:
    parameters: JSONObject
    validate: ArgumentValidator
    context_parameter: str | None = None


_CACHE: dict[Any, _Compiled] = {}


def tool(
    function: ToolFunction,
    *,
    name: str | None = None,
    description: str | None = None,
    gate: bool = False,
    timeout_s: float | None = None,
    inline: bool = False,
    parameters: Mapping[str, Any] | None = None,
) -> Tool:
    """A `Tool` from a typed callable (or one taking a single pydantic model), or from
    `parameters`, a JSON Schema given as data, validated with `jsonschema`.

    How a call runs (`Tool.execution`, printed per tool by `collector validate`): an ``async
    def`` function is awaited on the episode's event loop. **A plain function runs on a
    thread by default**: calls from the worker's concurrent episodes run at the same time,
    so the function, and anything it shares between calls (a module-level cache, a parser,
    a C extension), must be thread-safe. `inline=True` calls it on the event loop instead:
    calls never overlap and no thread hop is paid, but a call cannot be timed out, so only
    for fast in-memory tools. When in doubt about thread safety, make the tool `inline` or
    ``async def``.

    `description` defaults to the first paragraph of the docstring. `gate` marks an
    approval or human-review tool: a failed call to it holds every sibling of its turn.
    With `parameters` the function's type hints are not read for arguments (it may take
    ``**arguments``); a schema that is not valid JSON Schema raises `ValueError` here.
    """
    if parameters is not None:
        schema: JSONObject = dict(parameters)
        compiled = _Compiled(schema, schema_validator(schema), _context_parameter(function))
    else:
        compiled = _compile(function)
    doc = inspect.getdoc(function) or ""
    return Tool(
        name=name or function.__name__,
        description=description if description is not None else doc.split("\n\n", 1)[0].strip(),
        parameters=compiled.parameters,
        function=function,
        gate=gate,
        validator=compiled.validate,
        timeout_s=timeout_s,
        inline=inline,
        context_parameter=compiled.context_parameter,
    )


def describe_execution(tools: Sequence[Tool]) -> str:
    """Each tool with how its calls run: ``calculator (inline), lookup (thread)``."""
    return ", ".join(f"{t.name} ({t.execution})" for t in tools) or "none"


def tool_specs(tools: Sequence[Tool]) -> list[ToolSpec]:
    """The provider-neutral specs the adapters turn into each transport's tool schema."""
    return [ToolSpec(name=t.name, description=t.description, parameters=t.parameters) for t in tools]


def _compile(function: ToolFunction) -> _Compiled:
    # Bound methods of different instances share their underlying function: key on it.
    key = getattr(function, "__func__", function)
    compiled = _CACHE.get(key)
    if compiled is None:
        compiled = _build(function)
        _CACHE[key] = compiled
    return compiled


def _context_parameter(function: ToolFunction) -> str | None:
    """The parameter annotated `ToolCallContext`, if the function declares one."""
    try:
        hints = get_type_hints(function)
    except (NameError, TypeError):
        return None
    for name, hint in hints.items():
        if name != "return" and (hint is ToolCallContext or ToolCallContext in get_args(hint)):
            return name
    return None


def _build(function: ToolFunction) -> _Compiled:
    signature = inspect.signature(function)
    hints = get_type_hints(function)
    context = _context_parameter(function)
    params = [
        p
        for p in signature.parameters.values()
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name != context
    ]
    if len(params) == 1 and _is_model(hints.get(params[0].name)):
        model: type[BaseModel] = hints[params[0].name]
        schema = _clean_schema(model.model_json_schema())
        return _Compiled(schema, _model_validator(model, positional=True), context)
    fields: dict[str, Any] = {}
    for p in params:
        if p.name not in hints:
            raise TypeError(f"tool {function.__name__}: parameter {p.name!r} has no type annotation")
        default = ... if p.default is inspect.Parameter.empty else p.default
        fields[p.name] = (hints[p.name], default)
    args_model = create_model(
        f"{function.__name__}_arguments",
        __config__=ConfigDict(extra="forbid", strict=True),
        **fields,
    )
    schema = _clean_schema(args_model.model_json_schema())
    return _Compiled(schema, _model_validator(args_model, positional=False), context)


def _is_model(annotation: object) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _model_validator(model: type[BaseModel], positional: bool) -> ArgumentValidator:
    def validate(arguments: JSONObject) -> tuple[tuple[Any, ...], dict[str, Any]]:
        try:
            instance = model.model_validate(arguments)
        except ValidationError as exc:
            raise ToolArgumentError(_describe(exc)) from None
        if positional:
            return (instance,), {}
        # Shallow on purpose: nested models reach the tool as models, not dicts.
        return (), {name: getattr(instance, name) for name in type(instance).model_fields}

    return validate


def _describe(exc: ValidationError) -> str:
    # Field paths and pydantic's message, never `input`: the value may be a secret.
    parts = []
    for err in exc.errors(include_url=False, include_input=False)[:5]:
        where = ".".join(str(p) for p in err["loc"]) or "arguments"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


def _clean_schema(schema: JSONObject) -> JSONObject:
    """Drop pydantic's `title`s: noise for the model, and some transports reject them."""

    def walk(node: Any, in_properties: bool = False) -> Any:
        if isinstance(node, dict):
            # Inside `properties` the keys are argument names (one may be called "title").
            return {
                k: walk(v, in_properties=(k in ("properties", "$defs") and not in_properties))
                for k, v in node.items()
                if in_properties or k != "title"
            }
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    cleaned: JSONObject = walk(schema)
    cleaned.setdefault("properties", {})
    return cleaned


# --- Threads for plain-function tools. ---

#: Threads per process for plain-function tools (see the module docstring).
SYNC_TOOL_THREADS = 64

_Work = tuple["concurrent.futures.Future[Any]", Callable[[], Any]]


class ToolThreadsExhausted(RuntimeError):
    """Every tool thread is held by a call that timed out and is still running."""


class ToolThreads:
    """At most `size` daemon threads for plain-function tools, counting abandoned ones."""

    def __init__(self, size: int = SYNC_TOOL_THREADS) -> None:
        if size < 1:
            raise ValueError("ToolThreads needs at least one thread")
        self.size = size
        self._queue: queue.SimpleQueue[_Work] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0
        self._queued = 0
        self._abandoned = 0

    @property
    def abandoned(self) -> int:
        """Threads still running a call whose caller gave up on it (timeout or cancellation)."""
        return self._abandoned

    async def run(self, function: Callable[[], Any]) -> Any:
        """`function()` on a tool thread (in a copy of the caller's context, as `to_thread` does).

        On cancellation a running call is abandoned and a queued one dropped.
        """
        if self._abandoned >= self.size:
            raise ToolThreadsExhausted(
                f"all {self.size} tool threads are held by calls that timed out and are still running"
            )
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._lock:
            self._queued += 1
            start = self._queued > self._idle and self._threads < self.size
            if start:
                self._threads += 1
                name = f"collector-tool-{self._threads}"
        self._queue.put((future, functools.partial(contextvars.copy_context().run, function)))
        if start:
            threading.Thread(target=self._serve, name=name, daemon=True).start()
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            # A call not yet started is dropped (the worker skips it); a running one keeps
            # its thread until the function returns, and is counted until then.
            if not future.cancel():
                with self._lock:
                    self._abandoned += 1
                future.add_done_callback(self._give_back)
            raise

    def _give_back(self, _: concurrent.futures.Future[Any]) -> None:
        with self._lock:
            self._abandoned -= 1

    def _serve(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            future, function = self._queue.get()
            with self._lock:
                self._idle -= 1
                self._queued -= 1
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = function()
            # Broad on purpose: the exception is the call's result, handed to its awaiter.
            except BaseException as exc:  # noqa: BLE001
                future.set_exception(exc)
            else:
                future.set_result(result)


#: The tool threads of this process (threads start on first use).
DEFAULT_TOOL_THREADS = ToolThreads()


# --- Running a tool. ---


#: The largest tool result kept, in UTF-8 bytes (1 MiB), when the caller names no other:
#: the default of `loop.max_tool_result_bytes`. A result is replayed to the model on every
#: later turn and stored whole, so a 16 MB answer is a cost at every step, not once.
DEFAULT_MAX_RESULT_BYTES = 1024 * 1024


async def run_tool(
    tool_: Tool,
    arguments: JSONObject,
    timeout_s: float,
    *,
    threads: ToolThreads | None = None,
    context: ToolCallContext | None = None,
    max_result_bytes: int | None = None,
) -> ToolOutcome:
    """Validate, then run under a timeout. Never raises except on cancellation and
    `EnvironmentFailure` (see the module docstring).

    Plain functions run on `threads` (default: `DEFAULT_TOOL_THREADS`). A tool with a
    `context_parameter` receives `context` there. A result longer than `max_result_bytes`
    (default `DEFAULT_MAX_RESULT_BYTES`) is dropped: the call's result is an error saying so.
    """
    try:
        if tool_.validator is not None:
            args, kwargs = tool_.validator(arguments)
        else:
            args, kwargs = schema_validator(tool_.parameters)(arguments)
    except ToolArgumentError as exc:
        return ToolOutcome(f"error: invalid arguments for {tool_.name}: {exc}; nothing was run", True, False)
    except ToolSchemaError as exc:
        return ToolOutcome(f"error: {tool_.name}: {exc}; nothing was run", True, False)
    except ValueError as exc:  # the hand-built Tool's schema itself is broken
        return ToolOutcome(f"error: {tool_.name} has an invalid schema: {exc}; nothing was run", True, False)
    # Broad on purpose: a validator that fails in itself (RecursionError, a resolver error)
    # fails this call, never the worker's batch.
    except Exception as exc:  # noqa: BLE001
        return ToolOutcome(
            f"error: {tool_.name}: its arguments could not be checked ({type(exc).__name__}); "
            "nothing was run",
            True,
            False,
        )
    if tool_.context_parameter is not None:
        kwargs[tool_.context_parameter] = context
    limit = tool_.timeout_s if tool_.timeout_s is not None else timeout_s
    function = tool_.function
    deadline = asyncio.timeout(limit)
    try:
        if tool_.inline and not inspect.iscoroutinefunction(function):
            result = function(*args, **kwargs)
            if inspect.isawaitable(result):
                async with deadline:
                    result = await result
        else:
            async with deadline:
                if inspect.iscoroutinefunction(function):
                    result = await function(*args, **kwargs)
                else:
                    pool = threads if threads is not None else DEFAULT_TOOL_THREADS
                    result = await pool.run(functools.partial(function, *args, **kwargs))
    except ToolThreadsExhausted as exc:
        return ToolOutcome(f"error: {tool_.name} was not run: {exc}; nothing was run", True, False)
    except EnvironmentFailure:
        raise
    except ToolError as exc:
        return ToolOutcome(f"error: {_short(exc)}", True)
    except TimeoutError as exc:
        if deadline.expired():
            return ToolOutcome(f"error: {tool_.name} timed out after {limit:g} s", True)
        return _failed(tool_, exc)
    # Broad on purpose: whatever a tool raises is a result for the model, never a crash.
    except Exception as exc:  # noqa: BLE001
        return _failed(tool_, exc)
    return _bounded(tool_, _to_text(result), max_result_bytes or DEFAULT_MAX_RESULT_BYTES)


def _bounded(tool_: Tool, text: str, limit: int) -> ToolOutcome:
    # Cheap first: at most 4 UTF-8 bytes a character, so a short str cannot exceed the limit.
    # A very long one is not encoded just to be measured (it may be huge): its characters
    # are a lower bound on its bytes.
    if len(text) * 4 <= limit:
        return ToolOutcome(text, False)
    if len(text) > 4 * limit:
        size = f"at least {len(text):,}"
    else:
        encoded = len(text.encode("utf-8", "surrogatepass"))
        if encoded <= limit:
            return ToolOutcome(text, False)
        size = f"{encoded:,}"
    return ToolOutcome(
        f"error: {tool_.name} returned {size} bytes, over loop.max_tool_result_bytes = {limit:,}; "
        "the result was dropped",
        True,
    )


def _failed(tool_: Tool, exc: Exception) -> ToolOutcome:
    return ToolOutcome(f"error: {tool_.name} failed: {type(exc).__name__}: {_short(exc)}", True)


def _short(exc: Exception, limit: int = 300) -> str:
    text = str(exc)
    return text if len(text) <= limit else text[:limit] + "..."


def _to_text(result: Any) -> str:
    if isinstance(result, str):
        return result
    if isinstance(result, BaseModel):
        return result.model_dump_json()
    return json.dumps(result, ensure_ascii=False, default=str)

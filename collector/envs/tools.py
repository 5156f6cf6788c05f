"""Tools: schemas from typed Python callables, validation before a call, and safe execution.

A `Tool` (collector.envs.base) pairs a JSON Schema with a function. `tool()` builds one from
a typed callable (each parameter becomes a property; defaults make it optional) or from a
callable taking one pydantic model (the model's fields are the arguments). The schema and
the pydantic validator are built once per function and cached, so worlds that bind fresh
methods per episode pay nothing per episode.

`run_tool` is the only way the loop runs a tool, and it never raises for the tool's doing:

1. arguments are validated first (pydantic in strict mode, unknown keys rejected): a model
   that sends ``"amount": "1000"`` or a misspelt key is told so, and nothing runs. Strict,
   because coercing a model's mistake into an action is the failure this project exists
   to prevent. Tools built from a raw schema are checked against a small JSON Schema
   subset (types, required, properties, additionalProperties, enum);
2. the function runs under a per-tool timeout. Coroutine functions are awaited and
   cancelled at the timeout; plain functions run on the collector's own tool threads
   (`ToolThreads`) unless the tool is marked `inline`, for fast in-memory tools where a
   thread hop costs more than the work. A thread cannot be killed: a call that times out
   while running is abandoned (the model gets an error) and keeps its thread until the
   function returns;
3. an exception or a timeout becomes an error result naming the tool and the exception
   type. Only `asyncio.CancelledError` (the job cancelling the episode) passes through.

Results are strings for the model: a `str` as is, anything else as JSON.

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
from typing import Any, get_type_hints

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from collector.envs.base import ArgumentValidator, Tool, ToolFunction
from collector.turn import JSONObject, ToolSpec


class ToolArgumentError(ValueError):
    """Arguments do not match the tool's schema. The message names fields, never values."""


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


_CACHE: dict[Any, _Compiled] = {}


def tool(
    function: ToolFunction,
    *,
    name: str | None = None,
    description: str | None = None,
    gate: bool = False,
    timeout_s: float | None = None,
    inline: bool = False,
) -> Tool:
    """A `Tool` from a typed callable (or one taking a single pydantic model).

    `description` defaults to the first paragraph of the docstring. `gate` marks an
    approval or human-review tool: a failed call to it holds every sibling of its turn.
    """
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
    )


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


def _build(function: ToolFunction) -> _Compiled:
    signature = inspect.signature(function)
    hints = get_type_hints(function)
    params = [p for p in signature.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if len(params) == 1 and _is_model(hints.get(params[0].name)):
        model: type[BaseModel] = hints[params[0].name]
        return _Compiled(_clean_schema(model.model_json_schema()), _model_validator(model, positional=True))
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
    return _Compiled(schema, _model_validator(args_model, positional=False))


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


# --- A small JSON Schema subset, for tools built from a raw schema without a validator. ---

_TYPES: Mapping[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
    "null": (type(None),),
}


def check_schema(schema: Mapping[str, Any], value: Any, where: str = "arguments") -> None:
    """Raise `ToolArgumentError` when `value` breaks the schema's types, required keys or enum."""
    expected = schema.get("type")
    if expected is not None:
        names = expected if isinstance(expected, list) else [expected]
        ok = False
        for type_name in names:
            types = _TYPES.get(type_name)
            if types is None:
                ok = True  # an unknown type keyword is not ours to enforce
            elif isinstance(value, types) and not (isinstance(value, bool) and bool not in types):
                ok = True
        if not ok:
            raise ToolArgumentError(f"{where}: expected {' or '.join(names)}, got {type(value).__name__}")
    if "enum" in schema and value not in schema["enum"]:
        raise ToolArgumentError(f"{where}: not one of the allowed values")
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        for key in schema.get("required", ()):
            if key not in value:
                raise ToolArgumentError(f"{where}.{key}: field required")
        for key, item in value.items():
            if key in properties:
                check_schema(properties[key], item, f"{where}.{key}")
            elif schema.get("additionalProperties") is False:
                raise ToolArgumentError(f"{where}.{key}: unknown argument")
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for i, item in enumerate(value):
            check_schema(schema["items"], item, f"{where}.{i}")


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


async def run_tool(
    tool_: Tool, arguments: JSONObject, timeout_s: float, *, threads: ToolThreads | None = None
) -> ToolOutcome:
    """Validate, then run under a timeout. Never raises except on cancellation.

    Plain functions run on `threads` (default: `DEFAULT_TOOL_THREADS`).
    """
    try:
        if tool_.validator is not None:
            args, kwargs = tool_.validator(arguments)
        else:
            check_schema(tool_.parameters, arguments)
            args, kwargs = (), dict(arguments)
    except ToolArgumentError as exc:
        return ToolOutcome(f"error: invalid arguments for {tool_.name}: {exc}; nothing was run", True, False)
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
    except TimeoutError as exc:
        if deadline.expired():
            return ToolOutcome(f"error: {tool_.name} timed out after {limit:g} s", True)
        return _failed(tool_, exc)
    # Broad on purpose: whatever a tool raises is a result for the model, never a crash.
    except Exception as exc:  # noqa: BLE001
        return _failed(tool_, exc)
    return ToolOutcome(_to_text(result), False)


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

"""Tasks from files: JSONL or Parquet with columns `id`, `prompt`, `metadata` (and an
optional `models`: the model names the task applies to).

Tests: tests/envs/test_loading.py.

RL datasets store prompts either as a string or as a list of chat messages in the OpenAI
shape: system and few-shot turns, assistant `tool_calls` with `function.arguments`, and
`tool` messages with `tool_call_id`. Both load into `Task.prompt` (a string stays a string;
a list becomes `collector.turn` messages).

A file is checked whole at load time, before any episode starts, and a bad row is a
`ConfigError` naming the file and the row: a few-shot tool call with no result, or a result
with no call, would otherwise be rejected by strict backends in the middle of a run.
Few-shot arguments are parsed strictly; text that is not a JSON object is kept as a
malformed call (replayed as ``"{}"``) rather than repaired.

`metadata` may be an object or a JSON string. `id` may be missing: rows are then named
``{file stem}-{row number}``, stable as long as the file is.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from collector.envs.base import Task
from collector.errors import ConfigError
from collector.turn import (
    ArgStatus,
    AssistantMessage,
    Message,
    SystemMessage,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)


def load_tasks(path: str | Path) -> list[Task]:
    """Every task of a `.jsonl` / `.json` (one object a line) or `.parquet` file."""
    file = Path(path)
    tasks = [task_from_row(row, f"{file.stem}-{n}", where=f"{file}: row {n}") for n, row in read_rows(file)]
    if not tasks:
        raise ConfigError(f"env.task_file: {file} holds no tasks")
    return tasks


def read_rows(path: str | Path) -> Iterator[tuple[int, Mapping[str, Any]]]:
    """(row number, row) of every row of a task file, every column as written."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"env.task_file: no such file: {file}")
    return _parquet_rows(file) if file.suffix == ".parquet" else _jsonl_rows(file)


def _jsonl_rows(file: Path) -> Iterator[tuple[int, Mapping[str, Any]]]:
    with file.open("rb") as handle:
        for n, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                # JSON Lines is UTF-8 by definition; a Latin-1 or UTF-16 file stops here.
                raise ConfigError(
                    f"env.task_file: {file}: line {n}: not UTF-8 text (byte 0x{raw[exc.start]:02x})"
                ) from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{file}: line {n}: not valid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise ConfigError(f"{file}: line {n}: expected an object per line")
            yield n, row


def _parquet_rows(file: Path) -> Iterator[tuple[int, Mapping[str, Any]]]:
    import pyarrow.parquet as pq  # only when a Parquet file is actually used

    try:
        table = pq.read_table(file)
    # Broad on purpose: pyarrow raises several types here, all meaning "unreadable".
    except Exception as exc:
        kind = type(exc).__name__
        raise ConfigError(f"env.task_file: {file}: not a readable Parquet file ({kind})") from exc
    yield from enumerate(table.to_pylist(), start=1)


def task_from_row(row: Mapping[str, Any], default_id: str, where: str) -> Task:
    """One task from a row with `prompt` (and optional `id`, `metadata`)."""
    if "prompt" not in row or row["prompt"] is None:
        raise ConfigError(f"{where}: missing column 'prompt'")
    prompt = row["prompt"]
    metadata = row.get("metadata") or {}
    if isinstance(metadata, str):
        try:
            metadata = json.loads(metadata)
        except ValueError:
            raise ConfigError(f"{where}: metadata is not valid JSON") from None
    if not isinstance(metadata, dict):
        raise ConfigError(f"{where}: metadata must be an object")
    task_id = row.get("id")
    task_id = default_id if task_id is None else str(task_id)
    models = row.get("models")
    if models is not None and (not isinstance(models, list) or not all(isinstance(m, str) for m in models)):
        raise ConfigError(f"{where}: models must be a list of model names")
    only = tuple(models) if models is not None else None
    if isinstance(prompt, str):
        return Task(task_id, prompt, metadata, only)
    if not isinstance(prompt, list) or not prompt:
        raise ConfigError(f"{where}: prompt must be a string or a non-empty list of messages")
    return Task(task_id, messages_from_chat(prompt, where), metadata, only)


def messages_from_chat(items: list[Any], where: str = "prompt") -> list[Message]:
    """OpenAI-shaped chat messages to `collector.turn` messages, checking call/result pairing."""
    messages: list[Message] = []
    open_calls: dict[str, str] = {}  # call id -> tool name, waiting for its result
    for i, item in enumerate(items):
        at = f"{where}: message {i}"
        if not isinstance(item, Mapping):
            raise ConfigError(f"{at}: expected an object")
        role = item.get("role")
        if role != "tool" and open_calls:
            raise ConfigError(f"{at}: tool call(s) {sorted(open_calls)} have no result before this message")
        content = _text(item.get("content"), at)
        if role == "system" or role == "developer":
            messages.append(SystemMessage(content))
        elif role == "user":
            messages.append(UserMessage(content))
        elif role == "assistant":
            calls = [_call(c, f"{at}: tool_calls {j}") for j, c in enumerate(item.get("tool_calls") or ())]
            open_calls = {c.id: c.name for c in calls}
            if len(open_calls) != len(calls):
                raise ConfigError(f"{at}: duplicate tool call ids")
            messages.append(AssistantMessage(content, calls))
        elif role == "tool":
            call_id = item.get("tool_call_id")
            if not isinstance(call_id, str) or call_id not in open_calls:
                raise ConfigError(f"{at}: tool result for an unknown or already answered call id")
            name = open_calls.pop(call_id)
            messages.append(ToolResultMessage(call_id, item.get("name") or name, content))
        else:
            raise ConfigError(f"{at}: unknown role {str(role)[:20]!r}")
    if open_calls:
        raise ConfigError(f"{where}: tool call(s) {sorted(open_calls)} have no result")
    return messages


def _text(content: Any, at: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: keep the text ones
        return "".join(p.get("text") or "" for p in content if isinstance(p, Mapping))
    raise ConfigError(f"{at}: content must be a string or a list of parts")


def _call(raw: Any, at: str) -> ToolCall:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{at}: expected an object")
    nested = raw.get("function")
    function: Mapping[str, Any] = nested if isinstance(nested, Mapping) else raw
    name = function.get("name")
    call_id = raw.get("id")
    if not isinstance(name, str) or not isinstance(call_id, str):
        raise ConfigError(f"{at}: a tool call needs a string id and function.name")
    arguments = function.get("arguments")
    if isinstance(arguments, Mapping):
        return ToolCall(call_id, name, dict(arguments), ArgStatus.OK, raw_object=dict(arguments))
    text = arguments if isinstance(arguments, str) else "{}"
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        return ToolCall(call_id, name, parsed, ArgStatus.OK, raw_arguments=text)
    return ToolCall(call_id, name, None, ArgStatus.MALFORMED, raw_arguments=text)

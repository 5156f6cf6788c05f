"""`collector export RUN OUT`: a run's committed episodes, filtered, in a format a trainer reads.

Formats (`FORMATS`, name -> writer; a new format is one function and one entry):

- ``chat-jsonl``: one JSON object per line, ``{"messages": [...], "tools": [...]}``: the
  shape the OpenAI fine-tuning API and TRL's SFT trainer read
  (`collector.record.chat.template_messages`: null and empty keys dropped, arguments JSON
  strings). ``datasets.load_dataset("json", data_files=OUT)`` opens it.
- ``parquet``: every column of the shard schema, one file written with pyarrow (so Hugging
  Face sees plain strings, not pandas' large_string). Converts an Arrow IPC run for the
  readers that have no IPC reader (Ray Data, DuckDB without an extension).
- ``atif``: one ATIF-v1.7 trajectory per line (`collector.analysis.atif`), for the agent
  tooling that reads Harbor's trajectory format.

Rewards from a regrade (`--annotation NAME`, `collector regrade --out NAME`): the ``reward``
of every exported episode is the annotation's (``parquet``: the column; ``atif``: the
trajectory's ``extra.reward``, with ``extra.reward_annotation`` naming it), and a `--where`
on ``reward`` tests that reward. ``chat-jsonl`` carries no reward, so naming an annotation
with it is a `ConfigError`, as is an annotation that does not cover every committed episode
(checked before anything is written).

Filters (`--where`, ANDed): ``COLUMN OP VALUE`` over `WHERE_COLUMNS`, OP one of ``= != > >=
< <=``; ``=`` and ``!=`` take a comma list (``stop_reason=done,max_steps``). A filter that
does not parse, an unknown column, or a value of the wrong type is a `ConfigError` naming it.

Where the file goes: `collector.analysis.output.write_output` (atomic, symlinks, FIFOs, `-`,
never inside a run directory).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from collector.analysis.atif import write_atif
from collector.analysis.output import write_output
from collector.analysis.source import Source
from collector.errors import ConfigError, OutputError
from collector.record.chat import template_messages, template_tools
from collector.record.shards import STOP_REASONS

__all__ = ["FORMATS", "WHERE_COLUMNS", "export_run", "parse_where"]

#: Columns `--where` may test, and how a value given for each is parsed.
WHERE_COLUMNS: dict[str, Callable[[str], object]] = {
    "stop_reason": lambda v: _choice(v, STOP_REASONS, "stop_reason"),
    "trainable": lambda v: _choice(v.lower(), ("true", "false"), "trainable") == "true",
    "model": str,
    "budget": int,
    "reward": float,
}

_WHERE = re.compile(r"^\s*([a-z_]+)\s*(!=|>=|<=|==|=|>|<)\s*(.*?)\s*$")


def _choice(value: str, choices: Sequence[str], column: str) -> str:
    if value not in choices:
        raise ValueError(f"{column} is one of {', '.join(choices)}")
    return value


def parse_where(text: str) -> ds.Expression:
    """One ``COLUMN OP VALUE`` filter as a dataset expression (ConfigError naming what is wrong)."""
    match = _WHERE.match(text)
    if match is None:
        raise ConfigError(f"--where {text!r}: expected COLUMN OP VALUE, e.g. stop_reason=done or budget>=64")
    column, op, raw = match.groups()
    if column not in WHERE_COLUMNS:
        raise ConfigError(f"--where {text!r}: cannot filter on {column!r}; "
                          f"choose from {', '.join(WHERE_COLUMNS)}")
    parse = WHERE_COLUMNS[column]
    many = op in ("=", "==", "!=")
    try:
        values = [parse(v.strip()) for v in raw.split(",")] if many else [parse(raw)]
    except ValueError as e:
        raise ConfigError(f"--where {text!r}: bad value {raw!r} ({e})") from None
    if not many and column in ("stop_reason", "trainable", "model"):
        raise ConfigError(f"--where {text!r}: {column} takes = or !=")
    field = ds.field(column)
    if column == "stop_reason":  # dictionary-encoded: compare its strings
        field = field.cast(pa.string())
    if many:
        expr = field.isin(values)
        return ~expr if op == "!=" else expr
    value = values[0]
    comparisons: dict[str, Callable[[], ds.Expression]] = {
        ">": lambda: field > value, ">=": lambda: field >= value,
        "<": lambda: field < value, "<=": lambda: field <= value,
    }
    return comparisons[op]()


def _write_chat_jsonl(source: Source, out: BinaryIO) -> int:
    run_dir = source.run_dir
    table = source.read(["chat", "tools"])
    chats, tools_lists = table.column("chat").to_pylist(), table.column("tools").to_pylist()
    # Checked before the first byte: an OUT written in place (a FIFO) gets nothing half-done.
    if any(chat is None or tools is None for chat, tools in zip(chats, tools_lists, strict=True)):
        raise OutputError(
            f"{run_dir}: written before schema version 3 (no chat column); use --format parquet"
        )
    for chat, tools in zip(chats, tools_lists, strict=True):
        line = {"messages": template_messages(chat), "tools": template_tools(tools)}
        out.write((json.dumps(line, ensure_ascii=False) + "\n").encode("utf-8"))
    return len(chats)


def _write_parquet(source: Source, out: BinaryIO) -> int:
    table = source.read(None)
    pq.write_table(table, out, compression="zstd")
    return int(table.num_rows)


Writer = Callable[[Source, BinaryIO], int]

#: Export format name -> writer(source, binary file) returning the rows written.
FORMATS: dict[str, Writer] = {
    "chat-jsonl": _write_chat_jsonl,
    "parquet": _write_parquet,
    "atif": write_atif,  # Agent Trajectory Interchange Format, one trajectory a line (analysis.atif)
}


def export_run(run_dir: str | Path, out: str | Path, fmt: str, where: Sequence[str] = (),
               annotation: str | None = None) -> int:
    """Write the committed episodes of `run_dir` passing every `where` filter to `out`, with
    annotation `annotation`'s rewards when named; return the rows."""
    if fmt not in FORMATS:
        raise ConfigError(f"unknown export format {fmt!r} (expected {', '.join(FORMATS)})")
    if annotation is not None and fmt == "chat-jsonl":
        raise ConfigError("--annotation: chat-jsonl carries no reward; use --format parquet or atif")
    flt: ds.Expression | None = None
    for text in where:
        expr = parse_where(text)
        flt = expr if flt is None else flt & expr
    run = Path(run_dir)
    source = Source(run, flt, annotation, filter_columns=tuple(WHERE_COLUMNS))
    if annotation is not None:
        # Before OUT is touched: an annotation that misses an episode is refused with nothing written.
        source.read(["episode_id"])
    return write_output(out, lambda f: FORMATS[fmt](source, f), run_dir=run)

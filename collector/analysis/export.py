"""`collector export RUN OUT`: a run's committed episodes, filtered, in a format a trainer reads.

Formats (`FORMATS`, name -> writer; a new format is one function and one entry):

- ``chat-jsonl``: one JSON object per line, ``{"messages": [...], "tools": [...]}``: the
  shape the OpenAI fine-tuning API and TRL's SFT trainer read
  (`collector.record.chat.template_messages`: null and empty keys dropped, arguments JSON
  strings). ``datasets.load_dataset("json", data_files=OUT)`` opens it.
- ``parquet``: every column of the shard schema, one file written with pyarrow (so Hugging
  Face sees plain strings, not pandas' large_string). Converts an Arrow IPC run for the
  readers that have no IPC reader (Ray Data, DuckDB without an extension).

Filters (`--where`, ANDed): ``COLUMN OP VALUE`` over `WHERE_COLUMNS`, OP one of ``= != > >=
< <=``; ``=`` and ``!=`` take a comma list (``stop_reason=done,max_steps``). A filter that
does not parse, an unknown column, or a value of the wrong type is a `ConfigError` naming it.

The file is written beside OUT under a temporary name and renamed into place, so OUT is
either the previous file or a complete export.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from collector.analysis.stats import read_committed
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


def _write_chat_jsonl(run_dir: Path, flt: ds.Expression | None, tmp: Path) -> int:
    table = read_committed(run_dir, ["chat", "tools"], flt)
    rows = 0
    with open(tmp, "w", encoding="utf-8") as f:
        chats, tools_lists = table.column("chat").to_pylist(), table.column("tools").to_pylist()
        for chat, tools in zip(chats, tools_lists, strict=True):
            if chat is None or tools is None:
                raise OutputError(f"{run_dir}: written before schema version 3 (no chat column); "
                                  "use --format parquet")
            line = {"messages": template_messages(chat), "tools": template_tools(tools)}
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
            rows += 1
    return rows


def _write_parquet(run_dir: Path, flt: ds.Expression | None, tmp: Path) -> int:
    table = read_committed(run_dir, None, flt)
    pq.write_table(table, str(tmp), compression="zstd")
    return int(table.num_rows)


Writer = Callable[[Path, "ds.Expression | None", Path], int]

#: Export format name -> writer(run_dir, filter, temp path) returning the rows written.
FORMATS: dict[str, Writer] = {
    "chat-jsonl": _write_chat_jsonl,
    "parquet": _write_parquet,
}


def export_run(run_dir: str | Path, out: str | Path, fmt: str, where: Sequence[str] = ()) -> int:
    """Write the committed episodes of `run_dir` passing every `where` filter to `out`; return the rows."""
    if fmt not in FORMATS:
        raise ConfigError(f"unknown export format {fmt!r} (expected {', '.join(FORMATS)})")
    flt: ds.Expression | None = None
    for text in where:
        expr = parse_where(text)
        flt = expr if flt is None else flt & expr
    target = Path(out)
    if target.is_dir():
        raise OutputError(f"{target} is a directory; name the file to write")
    tmp = target.with_name(f".{target.name}.tmp")
    try:
        rows = FORMATS[fmt](Path(run_dir), flt, tmp)
        os.replace(tmp, target)
    except OSError as e:
        raise OutputError(f"cannot write {target}: {e.strerror or e}") from e
    finally:
        tmp.unlink(missing_ok=True)
    return rows

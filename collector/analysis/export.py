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

Filters (`--where`, ANDed): ``COLUMN OP VALUE`` over `WHERE_COLUMNS`, OP one of ``= != > >=
< <=``; ``=`` and ``!=`` take a comma list (``stop_reason=done,max_steps``). A filter that
does not parse, an unknown column, or a value of the wrong type is a `ConfigError` naming it.

Where the file goes (`write_output`, also the trainer view's writer). A regular OUT (or a
new one) is written beside it under a temporary name and renamed into place, so OUT is
either the previous file or a complete export. A symlink is resolved first and its target
replaced (``latest.jsonl -> v3.jsonl`` stays a link, to the new v3.jsonl). An OUT that is
not a regular file (a FIFO, ``/dev/stdout``, ``/dev/null``, ``/dev/full``) is written in
place, never replaced by a file, and a write error there (``/dev/full``: no space) is an
`OutputError`. ``-`` writes to standard output. An OUT inside a run directory (any
directory holding `.collector/manifest.json`, or the run being read) is refused in one line
before anything is read: a file under a run's ``data/`` would be read as shards by every
plain reader, which would then count each episode twice.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from collector.analysis.atif import write_atif
from collector.analysis.stats import read_committed
from collector.errors import ConfigError, OutputError
from collector.record.chat import template_messages, template_tools
from collector.record.shards import STOP_REASONS
from collector.storage.manifest import MANIFEST

__all__ = ["FORMATS", "WHERE_COLUMNS", "export_run", "parse_where", "refuse_inside_run", "write_output"]

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


def _write_chat_jsonl(run_dir: Path, flt: ds.Expression | None, out: BinaryIO) -> int:
    table = read_committed(run_dir, ["chat", "tools"], flt)
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


def _write_parquet(run_dir: Path, flt: ds.Expression | None, out: BinaryIO) -> int:
    table = read_committed(run_dir, None, flt)
    pq.write_table(table, out, compression="zstd")
    return int(table.num_rows)


Writer = Callable[[Path, "ds.Expression | None", BinaryIO], int]

#: Export format name -> writer(run_dir, filter, binary file) returning the rows written.
FORMATS: dict[str, Writer] = {
    "chat-jsonl": _write_chat_jsonl,
    "parquet": _write_parquet,
    "atif": write_atif,  # Agent Trajectory Interchange Format, one trajectory a line (analysis.atif)
}


def refuse_inside_run(out: str | Path, run_dir: str | Path | None = None) -> None:
    """Raise `OutputError` when `out` (symlinks resolved) lies inside a run directory: one
    holding `.collector/manifest.json`, or `run_dir` itself whatever its layout."""
    resolved = Path(os.path.realpath(out))
    run = Path(os.path.realpath(run_dir)) if run_dir is not None else None
    for parent in resolved.parents:
        if parent == run or (parent / MANIFEST).is_file():
            raise OutputError(
                f"{out}: inside the run directory {parent}; write it elsewhere (a file there would be "
                "read as part of the run)"
            )


def write_output(out: str | Path, write: Callable[[BinaryIO], int], run_dir: str | Path | None = None) -> int:
    """Call `write` with a binary file for `out` and return what it returns (see the module
    docstring: ``-``, symlinks, non-regular files, atomic replacement, run directories)."""
    if str(out) == "-":
        stream = sys.stdout.buffer
        rows = write(stream)
        stream.flush()
        return rows
    refuse_inside_run(out, run_dir)
    try:
        st: os.stat_result | None = os.stat(out)  # through symlinks: what OUT really is
    except FileNotFoundError:
        st = None  # a new file, or a dangling link: created where the link points
    except OSError as e:
        raise OutputError(f"cannot write {out}: {e.strerror or e}") from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise OutputError(f"{out} is a directory; name the file to write")
    try:
        if st is not None and not stat.S_ISREG(st.st_mode):
            # A FIFO or a device: a rename would put a regular file in its place.
            with open(out, "wb") as f:
                return write(f)
        target = Path(os.path.realpath(out))
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        try:
            with open(tmp, "wb") as f:
                rows = write(f)
            if st is not None:
                os.chmod(tmp, stat.S_IMODE(st.st_mode))  # replacing a file keeps its mode
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
    except OSError as e:
        raise OutputError(f"cannot write {out}: {e.strerror or e}") from None
    return rows


def export_run(run_dir: str | Path, out: str | Path, fmt: str, where: Sequence[str] = ()) -> int:
    """Write the committed episodes of `run_dir` passing every `where` filter to `out`; return the rows."""
    if fmt not in FORMATS:
        raise ConfigError(f"unknown export format {fmt!r} (expected {', '.join(FORMATS)})")
    flt: ds.Expression | None = None
    for text in where:
        expr = parse_where(text)
        flt = expr if flt is None else flt & expr
    run = Path(run_dir)
    return write_output(out, lambda f: FORMATS[fmt](run, flt, f), run_dir=run)

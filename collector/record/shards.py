"""Episode <-> Arrow: the shard schema, and the one place episodes become columns and back.

Why a module of its own: the schema is a contract with every trainer that loads our
files, so it is built in one place, versioned (`collector.record.episode.SCHEMA_VERSION`, stored in
the file metadata under ``collector.schema_version``), and derived mechanically from the
record dataclasses, so that a field the episode loop adds to a record struct becomes a
column without anyone keeping two lists in sync.

How the schema is derived. The nested structs (`turns`, `messages` with their
`tool_calls`, `executed_tool_calls`, `error`) are read off the dataclasses in
`collector.record.episode` through a small explicit type map (`int` -> int64, `float` -> float64,
`str` -> string, `bool` -> bool, `X | None` -> nullable X, `list[X]` -> list<X>, a
dataclass -> struct). Top-level columns follow `COLUMN_ORDER`; an `Episode` field that is
not listed there is appended after it, in declaration order, so adding a field never drops
data (bump SCHEMA_VERSION when you do). Three kinds of columns are special:

- `stop_reason` is dictionary-encoded with a *fixed* dictionary (every `StopReason`, in
  declaration order), so every shard carries the same dictionary and readers that
  concatenate shards (pyarrow datasets, polars categoricals) never have to unify them;
- `tools` is dictionary-encoded per shard: every episode of a task offers the same schemas,
  and as plain strings they were 44% of a support-desk shard's Arrow bytes in memory
  (repeated per row); readers see strings (pandas and polars a categorical);
- the derived columns (`DERIVED_COLUMNS`: is_truncated, num_turns, num_tool_calls,
  input_tokens, output_tokens, wasted_output_tokens) are the `Episode` properties computed
  once at write time, so statistics read a plain column instead of walking nested lists;
  reading an episode back ignores them (the properties recompute the same values);
- unknown columns met on read (a newer writer) are ignored, and fields missing from an
  older shard take the dataclass default, so old shards stay readable where possible.

Conversion is column-wise (`episodes_to_table`): each field's values across the rows, nested
structs included, go to `pa.array` as one flat list; never a table or a dict per row.
"""

from __future__ import annotations

import dataclasses
import operator
import os
import types
import typing
from collections.abc import Callable, Sequence
from enum import Enum
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from collector.errors import OutputError
from collector.record.episode import (
    SCHEMA_VERSION,
    Episode,
)
from collector.stop import StopReason

__all__ = [
    "CHAT_COLUMNS",
    "COLUMN_ORDER",
    "DERIVED_COLUMNS",
    "EXTENSIONS",
    "SCHEMA",
    "SCHEMA_VERSION_KEY",
    "STOP_REASONS",
    "STOP_REASON_TYPE",
    "ShardError",
    "ShardFormat",
    "arrow_type",
    "describe_exception",
    "episode_from_row",
    "episodes_from_table",
    "episodes_to_table",
    "format_of",
    "one_line",
    "read_shard",
    "schema_version_of",
    "table_without_poison",
    "write_shard",
]

ShardFormat = Literal["arrow", "parquet"]

#: File-metadata key holding the schema version (bytes of the decimal number).
SCHEMA_VERSION_KEY = b"collector.schema_version"

#: File extension per format. Arrow IPC files are also Feather v2 files.
EXTENSIONS: dict[str, str] = {"arrow": ".arrow", "parquet": ".parquet"}

#: The documented column order. Episode fields not listed here are appended after it.
COLUMN_ORDER: tuple[str, ...] = (
    "episode_id",
    "run_id",
    "model",
    "provider",
    "budget",
    "env",
    "task_id",
    "sample",
    "seed",
    "stop_reason",
    "is_truncated",
    "trainable",
    "reward",
    "graded_reward",
    "num_turns",
    "num_tool_calls",
    "tool_errors",
    "input_tokens",
    "output_tokens",
    "wasted_output_tokens",
    "duration_s",
    "turns",
    "messages",
    "executed_tool_calls",
    "error",
    "worker",
    # --- chat-template block (schema version 3): `collector.record.chat` ---
    "system_prompt",
    "chat",
    "tools",
)

#: The columns schema version 3 added; a version-2 shard lacks exactly these.
CHAT_COLUMNS: tuple[str, ...] = ("system_prompt", "chat", "tools")

#: Columns computed from `Episode` properties at write time (type of each property).
DERIVED_COLUMNS: dict[str, type] = {
    "is_truncated": bool,
    "num_turns": int,
    "num_tool_calls": int,
    "input_tokens": int,
    "output_tokens": int,
    "wasted_output_tokens": int,
    "thinking_cut": bool,  # issue 16; appended after the documented order (still version 3)
}

#: The fixed stop_reason dictionary: index i is the i-th StopReason member.
STOP_REASONS: tuple[str, ...] = tuple(r.value for r in StopReason)
_REASON_INDEX: dict[str, int] = {r: i for i, r in enumerate(STOP_REASONS)}
STOP_REASON_TYPE = pa.dictionary(pa.int8(), pa.string())
#: `tools`: the same JSON in most rows of a shard, so stored once per shard.
TOOLS_TYPE = pa.dictionary(pa.int32(), pa.string())

# The explicit type map for scalar annotations. A new scalar type in a record is one line here.
_SCALARS: dict[Any, pa.DataType] = {
    int: pa.int64(),
    float: pa.float64(),
    str: pa.string(),
    bool: pa.bool_(),
}


def _unwrap_optional(hint: Any) -> tuple[Any, bool]:
    """`X | None` -> (X, True); anything else -> (hint, False)."""
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) != 1:
            raise TypeError(f"unsupported union in a record field: {hint!r}")
        return args[0], True
    return hint, False


def arrow_type(hint: Any) -> pa.DataType:
    """The Arrow type of a record annotation, through the explicit type map."""
    hint, _ = _unwrap_optional(hint)
    if hint in _SCALARS:
        return _SCALARS[hint]
    if isinstance(hint, type) and issubclass(hint, Enum) and issubclass(hint, str):
        return pa.string()
    if typing.get_origin(hint) is list:
        (item,) = typing.get_args(hint)
        return pa.list_(arrow_type(item))
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return pa.struct(_struct_fields(hint))
    raise TypeError(f"no Arrow type for record annotation {hint!r}: add it to shards._SCALARS")


def _struct_fields(cls: type) -> list[pa.Field]:
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        _, optional = _unwrap_optional(hints[f.name])
        out.append(pa.field(f.name, arrow_type(hints[f.name]), nullable=optional))
    return out


def _build_schema() -> pa.Schema:
    hints = typing.get_type_hints(Episode)
    by_name: dict[str, pa.Field] = {}
    for f in dataclasses.fields(Episode):
        if f.name == "stop_reason":
            by_name[f.name] = pa.field(f.name, STOP_REASON_TYPE, nullable=False)
        elif f.name == "tools":
            by_name[f.name] = pa.field(f.name, TOOLS_TYPE, nullable=False)
        else:
            _, optional = _unwrap_optional(hints[f.name])
            by_name[f.name] = pa.field(f.name, arrow_type(hints[f.name]), nullable=optional)
    for name, kind in DERIVED_COLUMNS.items():
        by_name[name] = pa.field(name, _SCALARS[kind], nullable=False)
    ordered = [by_name.pop(name) for name in COLUMN_ORDER if name in by_name]
    ordered.extend(by_name.values())  # fields the record gained since COLUMN_ORDER was written
    metadata = {SCHEMA_VERSION_KEY: str(SCHEMA_VERSION).encode()}
    return pa.schema(ordered, metadata=metadata)


#: The shard schema (with SCHEMA_VERSION in its metadata).
SCHEMA: pa.Schema = _build_schema()


# --- Episode -> Arrow columns -------------------------------------------------------------
#
# Every column is built column-wise: the values of one field across all rows (or all nested
# structs of all rows) are read in one C-level pass (`operator.attrgetter` of every field,
# transposed with `zip`) and handed to `pa.array` as a flat list of scalars; a list of
# structs becomes the flattened structs plus offsets (`ListArray.from_arrays`). Building a
# dict per struct for `pa.array` to walk instead cost 2-2.7x the CPU (BENCHMARKS.md section
# n), and this conversion runs once per episode on the worker's hot path.

_Encode = Callable[[list[Any]], pa.Array]


def _is_record(hint: Any) -> bool:
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


def _encoder(hint: Any) -> _Encode:
    """The column builder for values of the record annotation `hint` (None where nullable)."""
    inner, _ = _unwrap_optional(hint)
    arrow = arrow_type(hint)
    if _is_record(inner):
        return _struct_encoder(inner, arrow)
    if typing.get_origin(inner) is list:
        (item,) = typing.get_args(inner)
        if _is_record(_unwrap_optional(item)[0]):
            return _list_encoder(_encoder(item), arrow)
    # Scalars and lists of scalars: pyarrow's own converter is C all the way down (a
    # str-valued Enum member is a str, which it takes as is).
    return lambda values: pa.array(values, type=arrow)


def _list_encoder(encode_item: _Encode, arrow: pa.DataType) -> _Encode:
    def encode(values: list[Any]) -> pa.Array:
        offsets = [0]
        flat: list[Any] = []
        has_null = False
        for value in values:
            if value is None:
                has_null = True
            else:
                flat.extend(value)
            offsets.append(len(flat))
        mask = pa.array([v is None for v in values], type=pa.bool_()) if has_null else None
        offsets_array = pa.array(offsets, type=pa.int32())
        return pa.ListArray.from_arrays(offsets_array, encode_item(flat), type=arrow, mask=mask)

    return encode


#: Zero values by Arrow type id, for the children of a null struct (`_struct_encoder`).
_ZEROS: dict[int, Any] = {
    pa.int64().id: 0,
    pa.float64().id: 0.0,
    pa.string().id: "",
    pa.bool_().id: False,
    pa.list_(pa.int64()).id: [],  # the id of every list type, whatever its items
}


def _struct_encoder(cls: type, arrow: pa.DataType) -> _Encode:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    encoders = [_encoder(hints[name]) for name in names]
    fields = [arrow.field(i) for i in range(arrow.num_fields)]
    get = operator.attrgetter(*names)
    # What a null struct's children hold: the zero of each non-nullable field, as pyarrow's
    # row-wise converter fills them (a Parquet writer refuses nulls in a non-nullable child).
    blank = tuple(None if f.nullable else _ZEROS.get(f.type.id) for f in fields)

    def encode(values: list[Any]) -> pa.Array:
        mask = None
        if any(v is None for v in values):
            mask = pa.array([v is None for v in values], type=pa.bool_())
            rows = [blank if v is None else get(v) for v in values]
        else:
            rows = list(map(get, values))
        columns = zip(*rows, strict=True) if rows else iter([()] * len(names))
        children = [build(list(column)) for build, column in zip(encoders, columns, strict=True)]
        return pa.StructArray.from_arrays(children, fields=fields, mask=mask)

    return encode


def _episode_columns() -> list[tuple[str, _Encode]]:
    """(name, builder) of every column read straight off an `Episode` attribute, SCHEMA order;
    the derived columns read the properties of the same name."""
    hints = typing.get_type_hints(Episode)
    columns = []
    for f in SCHEMA:
        if f.name in ("stop_reason", "tools"):
            continue  # dictionary-encoded: built on their own
        hint = DERIVED_COLUMNS[f.name] if f.name in DERIVED_COLUMNS else hints[f.name]
        columns.append((f.name, _encoder(hint)))
    return columns


_COLUMNS = _episode_columns()
_GET_COLUMNS = operator.attrgetter(*(name for name, _ in _COLUMNS))


def episodes_to_table(episodes: Sequence[Episode]) -> pa.Table:
    """Build the shard table for `episodes`: one row each, column-wise, SCHEMA exactly."""
    rows = list(map(_GET_COLUMNS, episodes))
    columns = zip(*rows, strict=True) if rows else iter([()] * len(_COLUMNS))
    arrays = {name: encode(list(values)) for (name, encode), values in zip(_COLUMNS, columns, strict=True)}
    arrays["tools"] = pa.array([ep.tools for ep in episodes], type=pa.string()).dictionary_encode()
    indices = pa.array([_REASON_INDEX[ep.stop_reason.value] for ep in episodes], type=pa.int8())
    arrays["stop_reason"] = pa.DictionaryArray.from_arrays(indices, pa.array(STOP_REASONS))
    return pa.Table.from_arrays([arrays[f.name] for f in SCHEMA], schema=SCHEMA)


# --- Arrow rows -> Episode -----------------------------------------------------------------

_Load = Callable[[Any], Any]


def _loader(hint: Any) -> _Load | None:
    inner, optional = _unwrap_optional(hint)
    if isinstance(inner, type) and dataclasses.is_dataclass(inner):
        load_struct = _struct_loader(inner)
        if optional:
            return lambda v: None if v is None else load_struct(v)
        return load_struct
    if typing.get_origin(inner) is list:
        (item,) = typing.get_args(inner)
        load_item = _loader(item)
        if load_item is None:
            return None
        return lambda v: None if v is None else [load_item(x) for x in v]
    if isinstance(inner, type) and issubclass(inner, Enum):
        enum_cls = inner
        return lambda v: None if v is None else enum_cls(v)
    return None


def _struct_loader(cls: type) -> _Load:
    hints = typing.get_type_hints(cls)
    specs = [(f.name, _loader(hints[f.name])) for f in dataclasses.fields(cls)]

    def load(row: dict[str, Any]) -> Any:
        kwargs = {}
        for name, conv in specs:
            if name in row:  # missing in an older shard: the dataclass default applies
                value = row[name]
                kwargs[name] = value if conv is None else conv(value)
        return cls(**kwargs)

    return load


_LOAD_EPISODE = _struct_loader(Episode)


def episodes_from_table(table: pa.Table) -> list[Episode]:
    """Rebuild `Episode`s from shard rows (derived and unknown columns are ignored)."""
    return [_LOAD_EPISODE(row) for row in table.to_pylist()]


def episode_from_row(row: dict[str, Any]) -> Episode:
    """Rebuild one `Episode` from one shard row as a dict (`table.to_pylist()[i]`), for a
    reader that changes the row first (the report clips its long strings)."""
    episode: Episode = _LOAD_EPISODE(row)
    return episode


# --- Files -----------------------------------------------------------------------------------


def schema_version_of(schema: pa.Schema) -> int | None:
    """The schema version stored in a shard's metadata, or None when absent or unreadable."""
    raw = (schema.metadata or {}).get(SCHEMA_VERSION_KEY)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def write_shard(path: Path, table: pa.Table, fmt: ShardFormat) -> None:
    """Write `table` to `path` (zstd) and fsync it. The caller renames it into place."""
    if fmt == "arrow":
        options = ipc.IpcWriteOptions(compression="zstd")
        with pa.OSFile(str(path), "wb") as sink, ipc.new_file(sink, table.schema, options=options) as w:
            w.write_table(table)
    elif fmt == "parquet":
        pq.write_table(table, str(path), compression="zstd")
    else:
        raise ValueError(f"unknown shard format {fmt!r}")
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def format_of(path: Path | str) -> ShardFormat:
    """The shard format a file name says (by extension; a pending ``.tmp`` shard by the one before)."""
    name = Path(path).name.removesuffix(".tmp")
    suffix = Path(name).suffix
    if suffix == ".parquet":
        return "parquet"
    if suffix == ".arrow":
        return "arrow"
    raise ValueError(f"not a shard file name: {path}")


def read_shard(path: Path | str, columns: Sequence[str] | None = None) -> pa.Table:
    """Read one shard (all columns, or `columns`) and validate what was read.

    Any failure to read (missing file, garbage, truncation, a checksum-free corruption that
    only shows as bad offsets, a column the file lacks) is an `OutputError` of one line,
    ``"{path}: {short reason}"``: a damaged file is the user's data problem, named, never a
    traceback. `validate(full=True)` is what turns bad offsets or UTF-8 into an error here
    rather than a crash (or silent garbage) later in `to_pylist`.

    Parquet restores the dictionary type from the stored Arrow schema, but its index width
    may differ; the table is cast back to SCHEMA's types where the columns exist so that
    callers see one schema whatever the format.
    """
    try:
        table = _read_shard(path, columns)
        table.validate(full=True)
    except (pa.ArrowException, OSError, ValueError) as e:
        # ArrowInvalid and friends are ValueErrors; ArrowIOError and a missing file are OSErrors.
        raise ShardError(str(path), describe_exception(e)) from e
    return table


class ShardError(OutputError):
    """A shard file cannot be read: ``"{path}: {reason}"``, one line.

    The path and the reason are kept apart (`path`, `reason`) so that a caller that already
    names the file (the store's quarantine warning) can print the reason alone. Both are the
    exception's args, so it pickles like every collector error.
    """

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(path, reason)
        self.path = path
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


def one_line(e: BaseException) -> str:
    """`Type: message` on one line (why an episode or a cell was left out of a commit)."""
    return " ".join(f"{type(e).__name__}: {e}".split())


def table_without_poison(
    chunk: Sequence[Episode], rejected: dict[str, str]
) -> tuple[pa.Table | None, list[Episode]]:
    """The shard table of `chunk`, leaving out (into `rejected`) each episode whose own row
    cannot be built: one value that does not fit the schema (an int beyond int64 from an
    environment's grader, say) costs its episode, not its whole shard. Only on failure is
    the chunk built row by row to find them. Used by the driver's commits and by workers
    that write their own shards (`output.worker_writes`)."""
    try:
        return episodes_to_table(chunk), list(chunk)
    except (pa.ArrowException, OverflowError, ValueError, TypeError):
        pass
    good = []
    for ep in chunk:
        try:
            episodes_to_table([ep])
        except (pa.ArrowException, OverflowError, ValueError, TypeError) as e:
            rejected[ep.episode_id] = one_line(e)
            continue
        good.append(ep)
    return (episodes_to_table(good), good) if good else (None, [])


def describe_exception(e: BaseException) -> str:
    """`Type: first line of the message`, for one-line reports about damaged files."""
    if isinstance(e, OSError) and e.strerror:
        return f"{type(e).__name__}: {e.strerror}"
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def _read_shard(path: Path | str, columns: Sequence[str] | None) -> pa.Table:
    cols = list(columns) if columns is not None else None
    if format_of(path) == "parquet":
        table = pq.read_table(str(path), columns=cols)
    else:
        with pa.memory_map(str(path), "r") as source:
            options = None
            if cols is not None:
                # Only the wanted columns are decompressed; the rest of the file is never touched.
                names = ipc.open_file(source).schema.names
                missing = [c for c in cols if c not in names]
                if missing:
                    raise ShardError(str(path), f"no column {missing[0]!r}")
                options = ipc.IpcReadOptions(included_fields=[names.index(c) for c in cols])
            table = ipc.open_file(source, options=options).read_all()
            if cols is not None:
                table = table.select(cols)
    return _conform(table)


def _conform(table: pa.Table) -> pa.Table:
    """Cast columns whose type differs from SCHEMA only by encoding details (Parquet)."""
    fields = []
    changed = False
    for f in table.schema:
        idx = SCHEMA.get_field_index(f.name)
        want = SCHEMA.field(idx) if idx >= 0 else None
        # Parquet names list items "element" and may widen dictionary indices: cast back.
        if want is not None and not want.type.equals(f.type, check_metadata=True):
            fields.append(pa.field(f.name, want.type, nullable=want.nullable))
            changed = True
        else:
            fields.append(f)
    if not changed:
        return table
    return table.cast(pa.schema(fields, metadata=table.schema.metadata))

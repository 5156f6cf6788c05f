"""Episodes already encoded as shard rows, on their way from a worker to a commit.

Why this exists: with driver-side writes, a worker used to return its batch as `Episode`
objects. Pickling them through Ray (slotted dataclasses: Python `__getstate__` per record,
nested) and unpickling them in the driver, then building the shard's Arrow columns there,
cost more CPU than the episode loop itself spends per turn (BENCHMARKS.md section n). Now
the worker builds the batch's rows once (`collector.record.shards.episodes_to_table`) and
sends them as one Arrow IPC stream (`to_ipc`): bytes that cross Ray without a pickler.

The driver reads the stream back without copying (`from_ipc`) and sees one `Row` per
episode (`rows_of`): the few columns its decisions and counts read (id, cell, stop reason,
error, retries), plus where the row lives. It buffers rows per cell like episodes, and a
commit stitches a shard out of them (`gather`): slices of the batch tables, never a
per-row conversion.

Tests: tests/record/test_rows.py.
"""

from __future__ import annotations

import typing
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.ipc as ipc

from collector.record.episode import Episode, EpisodeError
from collector.record.shards import SCHEMA, table_without_poison

__all__ = ["Row", "Rows", "from_ipc", "gather", "rows_of", "shard_table", "to_ipc"]

#: The columns a `Row` reads off its table.
_ROW_COLUMNS = ("episode_id", "model", "budget", "provider", "stop_reason", "retries", "error",
                "is_truncated", "reasoning")


@dataclass(slots=True, eq=False)
class Row:
    """One episode as a row of an encoded batch: what the driver's decisions, counts and
    trackers read (as of an `Episode`), and where the row is (`table`, `index`)."""

    episode_id: str
    model: str
    budget: int
    provider: str
    stop_reason: str
    retries: list[str]
    error: EpisodeError | None
    is_truncated: bool
    reasoning: str | None
    table: pa.Table
    index: int


def to_ipc(table: pa.Table) -> bytes:
    """`table` as one uncompressed Arrow IPC stream (the bytes a worker returns)."""
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    data: bytes = sink.getvalue().to_pybytes()
    return data


def from_ipc(data: bytes) -> pa.Table:
    """The table of an IPC stream `to_ipc` wrote; its columns point into `data`, uncopied.
    Refuses a stream of another schema (another collector version on the worker)."""
    table = ipc.open_stream(pa.py_buffer(data)).read_all()
    if not table.schema.equals(SCHEMA, check_metadata=True):
        raise ValueError("a worker returned rows of another shard schema (another collector version?)")
    return table


def rows_of(table: pa.Table) -> list[Row]:
    """One `Row` per row of an encoded batch, in order."""
    ids, models, budgets, providers, reasons, retries, errors, cut, reasoning = (
        table.column(name).to_pylist() for name in _ROW_COLUMNS
    )
    return [
        Row(ids[i], models[i], budgets[i], providers[i], reasons[i], retries[i],
            None if errors[i] is None else EpisodeError(**errors[i]), cut[i], reasoning[i], table, i)
        for i in range(table.num_rows)
    ]


def gather(rows: Sequence[Row]) -> pa.Table:
    """The shard table of `rows`, in their order: each run of consecutive rows of one batch
    is a zero-copy slice of it, and the slices are stitched into one chunk: the table
    `episodes_to_table` would build of the same episodes."""
    if not rows:
        return SCHEMA.empty_table()
    pieces: list[pa.Table] = []
    first = rows[0]
    table, start, end = first.table, first.index, first.index + 1
    for row in rows[1:]:
        if row.table is table and row.index == end:
            end += 1
            continue
        pieces.append(table.slice(start, end - start))
        table, start, end = row.table, row.index, row.index + 1
    pieces.append(table.slice(start, end - start))
    table = pa.concat_tables(pieces).combine_chunks()
    # A slice keeps its batch's whole `tools` dictionary: encoded again, the shard holds only
    # its own schemas, as `episodes_to_table` would have built it.
    tools = table.schema.get_field_index("tools")
    own = table.column(tools).chunk(0).dictionary_decode().dictionary_encode()
    return table.set_column(tools, SCHEMA.field(tools), own)


#: What a store commits: finished episodes, or rows workers encoded (never the two mixed).
Rows = Sequence[Episode] | Sequence[Row]


def shard_table(chunk: Rows, rejected: dict[str, str]) -> tuple[pa.Table | None, Rows]:
    """One shard's table of `chunk` and what it holds. Rows are stitched (`gather`; a worker
    already left out those that fit no shard); episodes are converted, each whose row cannot
    be built left out into `rejected` (`table_without_poison`)."""
    if chunk and isinstance(chunk[0], Row):
        rows = typing.cast(Sequence[Row], chunk)
        return gather(rows), rows
    return table_without_poison(typing.cast(Sequence[Episode], chunk), rejected)

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

Filters (`--where`, ANDed): ``COLUMN OP VALUE``, the grammar `collector episodes` reads too
(`collector.analysis.where`): OP one of ``= != > >= < <=``; ``=`` and ``!=`` take a comma list
(``stop_reason=done,max_steps``). A filter that does not parse, an unknown column, a value of
the wrong type or an unknown stop reason is a `ConfigError` naming it.

Where the file goes: `collector.analysis.output.write_output` (atomic, symlinks, FIFOs, `-`,
never inside a run directory).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

import pyarrow.parquet as pq

from collector.analysis.atif import write_atif
from collector.analysis.output import write_output
from collector.analysis.source import Source
from collector.analysis.where import where_filter
from collector.errors import ConfigError, OutputError
from collector.record.chat import template_messages, template_tools

__all__ = ["FORMATS", "export_run"]

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
    flt, tested = where_filter(where)
    run = Path(run_dir)
    # `reward` always: an annotation replaces that column, which must be there to replace.
    source = Source(run, flt, annotation, filter_columns=("reward", *tested))
    if annotation is not None:
        # Before OUT is touched: an annotation that misses an episode is refused with nothing written.
        source.read(["episode_id"])
    return write_output(out, lambda f: FORMATS[fmt](source, f), run_dir=run)

"""`collector follow`: the followed batches on stdout, as JSON lines or one Arrow IPC stream.

`collector/cli.py` registers the arguments; `collector.analysis.follow` does the following.
Each jsonl line is ``{"cursor", "seq", ["group_errors"], "episode"}``, flushed after each
batch so a consumer reads each as it lands and resumes from the last cursor it read; the
Arrow stream is the shard columns plus ``cursor``, one record batch per commit.

Tests: tests/analysis/test_follow.py (the CLI's two formats carry the same cursors; the
SIGKILLed follower process).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import pyarrow as pa

from collector.analysis import json_values
from collector.analysis.follow import Follower

__all__ = ["main"]


def main(args: argparse.Namespace) -> int:
    """`collector follow`: write the batches to stdout; one line on stderr for held groups."""
    follower = Follower(args.follow_run, args.since, groups=args.groups, forever=args.forever,
                        poll_s=args.poll, annotation=args.annotation, wait_s=args.wait)
    write = _write_arrow if args.format == "arrow" else _write_jsonl
    write(follower, sys.stdout)
    groups, samples = follower.held
    if groups:
        print(f"collector follow: {args.follow_run}: {groups} incomplete group(s) held ({samples} samples), "
              f"not released; --since {follower.cursor} resumes them", file=sys.stderr)
    return 0


def _write_jsonl(follower: Follower, out: Any) -> None:
    for batch in follower:
        lines = []
        for i, (cursor, row) in enumerate(zip(batch.row_cursors, batch.table.to_pylist(), strict=True)):
            line: dict[str, Any] = {"cursor": cursor, "seq": batch.seq}
            if batch.group_errors:
                line["group_errors"] = batch.group_errors[i]
            line["episode"] = row
            lines.append(json_values.dumps(line, default=str))
        out.write("\n".join(lines) + "\n")
        out.flush()  # a consumer reads each batch as it lands, and resumes from what it read


def _write_arrow(follower: Follower, out: Any) -> None:
    from collector.record.shards import SCHEMA

    sink = out.buffer if hasattr(out, "buffer") else out
    writer: pa.ipc.RecordBatchStreamWriter | None = None
    schema: pa.Schema | None = None
    try:
        for batch in follower:
            table = batch.table.append_column("cursor", pa.array(batch.row_cursors, pa.string()))
            if writer is None:
                schema = table.schema
                writer = pa.ipc.new_stream(sink, schema)
            writer.write_table(table.cast(schema) if schema is not None and table.schema != schema else table)
            sink.flush()
        if writer is None:  # no rows: still a valid (empty) stream
            writer = pa.ipc.new_stream(sink, SCHEMA.append(pa.field("cursor", pa.string())))
    finally:
        if writer is not None:
            writer.close()
            sink.flush()

"""Shards: rows/s and MB/s of the collector's shard writer against raw pyarrow writes.

Issue 6, item 1c. Real episodes first (the collector against the simulator, `bench-zero`,
zero latency), replicated under fresh ids to the row count asked for. Then, interleaved:

- ``collector``: `RunStore.commit(episodes)`: Episode -> Arrow (`shards.episodes_to_table`),
  Arrow IPC zstd shards of `rows_per_shard` rows, each fsynced in ``.collector/tmp/``,
  recorded in the manifest, then renamed into ``data/`` (the exactly-once commit);
- ``collector-parquet``: the same with ``output.format = "parquet"`` (zstd Parquet);
- ``raw-pylist``: the same rows as plain pyarrow would take them: `dataclasses.asdict` ->
  `pa.Table.from_pylist(rows, schema)` -> the same IPC zstd files, same split, no fsync;
- ``raw-write``: only the file writes of already built tables (the floor of any writer);
- ``raw-write-parquet``: the same tables written as zstd Parquet.

Target: collector >= 0.7x raw-pylist rows/s.

    .venv/bin/python -m bench.shards [--rows 20000] [--rounds 5]
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from bench.common import Clock, SimProcess, median, parser, report
from bench.workload import commit, items_for, make_config, run_collector
from collector.record.episode import Episode
from collector.record.shards import SCHEMA, episodes_to_table

NAME = "shards"


def _real_episodes(n: int) -> list[Episode]:
    cfg = make_config("bench-zero", n, 64)
    with SimProcess() as sim:
        _, episodes = asyncio.run(run_collector(cfg, items_for(cfg, n), sim.root, with_shards=False))
    return episodes


def _replicate(base: list[Episode], rows: int) -> list[Episode]:
    return [dataclasses.replace(base[i % len(base)], episode_id=f"{i:016x}") for i in range(rows)]


def _write(path: Path, table: pa.Table) -> None:
    options = ipc.IpcWriteOptions(compression="zstd")
    with pa.OSFile(str(path), "wb") as sink, ipc.new_file(sink, table.schema, options=options) as w:
        w.write_table(table)


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for pattern in ("*.arrow", "*.parquet") for f in path.rglob(pattern))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__)
    p.add_argument("--rows", type=int, default=20_000)
    p.add_argument("--rows-per-shard", type=int, default=512)
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.rounds = 200, args.rounds or 1
    args.rounds = args.rounds or 5
    cfg = make_config("bench-zero", 64, 64)
    output = cfg.output.model_copy(update={"rows_per_shard": args.rows_per_shard})
    cfg = cfg.model_copy(update={"output": output})
    episodes = _replicate(_real_episodes(min(args.rows, 1000)), args.rows)
    chunks = [episodes[i:i + args.rows_per_shard] for i in range(0, len(episodes), args.rows_per_shard)]
    prebuilt = [episodes_to_table(c) for c in chunks]
    arrow_mb = sum(t.nbytes for t in prebuilt) / 1e6
    schema = SCHEMA

    def collector(tmp: Path) -> None:
        commit(cfg, episodes, str(tmp))

    parquet_cfg = cfg.model_copy(update={"output": output.model_copy(update={"format": "parquet"})})

    def collector_parquet(tmp: Path) -> None:
        commit(parquet_cfg, episodes, str(tmp))

    def raw_pylist(tmp: Path) -> None:
        for i, chunk in enumerate(chunks):
            _write(tmp / f"{i}.arrow", pa.Table.from_pylist([dataclasses.asdict(e) for e in chunk], schema))

    def raw_write(tmp: Path) -> None:
        for i, table in enumerate(prebuilt):
            _write(tmp / f"{i}.arrow", table)

    def raw_write_parquet(tmp: Path) -> None:
        for i, table in enumerate(prebuilt):
            pq.write_table(table, str(tmp / f"{i}.parquet"), compression="zstd")

    variants = {"collector": collector, "collector-parquet": collector_parquet, "raw-pylist": raw_pylist,
                "raw-write": raw_write, "raw-write-parquet": raw_write_parquet}
    rows: list[dict[str, Any]] = []
    for rnd in range(args.rounds):
        order = list(variants)
        order = order[rnd % len(order):] + order[: rnd % len(order)]
        for name in order:
            tmp = Path(tempfile.mkdtemp(prefix="bench-shards-"))
            try:
                gc.collect()
                clock = Clock()
                variants[name](tmp)
                clock.stop()
                size = _dir_bytes(tmp) / 1e6
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            rows.append({"round": rnd, "variant": name, "rows": args.rows,
                         "rows_per_s": args.rows / clock.wall,
                         "arrow_mb_per_s": arrow_mb / clock.wall, "disk_mb_per_s": size / clock.wall,
                         "disk_mb": size, "cpu_util": clock.cpu / clock.wall})
    summary = []
    for name in variants:
        mine = [r for r in rows if r["variant"] == name]
        per_round = [r["rows_per_s"] / next(x["rows_per_s"] for x in rows
                                            if x["round"] == r["round"] and x["variant"] == "raw-pylist")
                     for r in mine]
        summary.append({"variant": name, **{k: median([r[k] for r in mine]) for k in
                                            ("rows_per_s", "arrow_mb_per_s", "disk_mb_per_s", "disk_mb",
                                             "cpu_util")},
                        "x_vs_raw_pylist": median(per_round)})
    notes = [f"{args.rows} rows ({arrow_mb:.1f} MB as Arrow in memory), "
             f"{args.rows_per_shard} rows per shard, "
             f"IPC zstd; {args.rounds} rounds", "target: collector >= 0.7x raw-pylist"]
    return report(NAME, "Shard writer vs raw pyarrow", args, rows, summary, notes)


if __name__ == "__main__":
    main()

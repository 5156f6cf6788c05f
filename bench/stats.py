"""Statistics: `collector stats` over 1M episodes against DuckDB and polars on the same files.

Issue 6, item 1d. A run directory of `--rows` synthetic episodes is made once and kept
(bench/results/stats-run-<rows>-<rows_per_shard>/): real episodes from the simulator are
the template, tiled to the row count with their scalar columns redrawn (4 models x 6
budgets; stop reasons, truncation, rewards and token counts drawn per budget), and
committed through the collector's own `LocalRunStore` (manifest, partitions, shards of the
collector's default 512 rows), so `collector stats` reads exactly what a real run leaves.

Then, interleaved:
- ``collector``: `compute_stats(run, by=(model, budget), target=0.05)` and its table: what
  `collector stats RUN --target 0.05` does after start-up;
- ``duckdb``: the same counts and sums in one SQL query over the same shards (DuckDB reads
  Arrow IPC through a pyarrow dataset: it has no IPC reader of its own);
- ``polars``: the same with `pl.scan_ipc` over the same shard paths.

Target: collector within 1.5x of the faster of the two.

    .venv/bin/python -m bench.stats [--rows 1000000] [--rounds 5]
"""

from __future__ import annotations

import dataclasses
import gc
import shutil
import sys
from pathlib import Path
from typing import Any
from unittest import mock

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.dataset as ds

from bench.common import RESULTS, Clock, median, parser, report
from bench.workload import make_config
from collector.analysis.stats import compute_stats, format_stats
from collector.config import config_fingerprint, resolved_config
from collector.record.shards import SCHEMA, episodes_to_table
from collector.storage.local import LocalRunStore
from collector.storage.manifest import committed_shard_paths

NAME = "stats"
MODELS = ["sim-terse", "sim-verbose", "sim-hidden-cut", "sim-leaky"]
BUDGETS = [32, 64, 96, 128, 192, 256]


@dataclasses.dataclass(slots=True)
class _Key:
    """What `LocalRunStore.commit` reads off an episode to group and dedupe it."""

    episode_id: str
    model: str
    budget: int
    index: int


def _template() -> pa.Table:
    from bench.shards import _real_episodes

    return episodes_to_table(_real_episodes(300))


def _tiled(template: pa.Table, keys: list[_Key], seed: int) -> pa.Table:
    """`len(keys)` rows: template rows, scalar columns redrawn for each key's (model, budget)."""
    n = len(keys)
    rng = np.random.default_rng(seed + keys[0].index)
    table = template.take(pa.array(rng.integers(0, template.num_rows, n)))
    budget = keys[0].budget
    p_cut = min(0.9, 12.0 / budget)
    u = rng.random(n)
    reasons = np.where(u < 0.01, "error", np.where(u < 0.01 + p_cut, "length",
                       np.where(u < 0.03 + p_cut, "malformed_tool_call", "done")))
    truncated = reasons == "length"
    reward = np.where(reasons == "done", (rng.random(n) < 0.8).astype(float), 0.0)
    out_tokens = rng.integers(20, 3 * budget, n)
    wasted = np.where(truncated, np.minimum(out_tokens, budget), 0)

    def put(name: str, values: Any) -> None:
        nonlocal table
        i = table.schema.get_field_index(name)
        table = table.set_column(i, SCHEMA.field(name), pa.array(values).cast(SCHEMA.field(name).type))

    put("episode_id", [k.episode_id for k in keys])
    put("model", [keys[0].model] * n)
    put("budget", [budget] * n)
    # The collector writes one fixed dictionary (every StopReason) in every shard: keep it.
    dictionary = template.column("stop_reason").chunk(0).dictionary
    lookup = {v: i for i, v in enumerate(dictionary.to_pylist())}
    indices = pa.array([lookup[r] for r in reasons.tolist()], pa.int8())
    i = table.schema.get_field_index("stop_reason")
    column = pa.DictionaryArray.from_arrays(indices, dictionary)
    table = table.set_column(i, SCHEMA.field("stop_reason"), column)
    put("is_truncated", truncated)
    put("reward", reward)
    put("trainable", (reasons != "error") & (reasons != "timeout"))
    put("output_tokens", out_tokens)
    put("wasted_output_tokens", wasted)
    return table


def make_run(rows: int, rows_per_shard: int) -> Path:
    """The synthetic run directory (made once, then reused)."""
    run_dir = RESULTS / f"stats-run-{rows}-{rows_per_shard}"
    if (run_dir / ".complete").exists():
        return run_dir
    shutil.rmtree(run_dir, ignore_errors=True)
    template = _template()
    cfg = make_config("bench-zero", 64, 64)
    keys = [_Key(f"{i:016x}", MODELS[i % len(MODELS)], BUDGETS[(i // len(MODELS)) % len(BUDGETS)], i)
            for i in range(rows)]
    fake = mock.patch("collector.record.shards.episodes_to_table",
                      lambda chunk: _tiled(template, list(chunk), 7))
    with fake, LocalRunStore.open(run_dir, config_fingerprint(cfg), resolved_config(cfg), "arrow",
                             rows_per_shard) as store:
        for start in range(0, rows, 100_000):
            store.commit(keys[start:start + 100_000])  # type: ignore[arg-type]
    (run_dir / ".complete").write_text("ok\n")
    return run_dir


_SQL = """
SELECT model, budget, count(*) AS episodes,
       count(*) FILTER (WHERE stop_reason = 'error') AS errors,
       count(*) FILTER (WHERE stop_reason <> 'error' AND is_truncated) AS truncated,
       count(*) FILTER (WHERE stop_reason = 'malformed_tool_call') AS malformed,
       count(*) FILTER (WHERE stop_reason = 'done') AS done,
       sum(reward) FILTER (WHERE stop_reason <> 'error') AS reward_sum,
       sum(wasted_output_tokens) AS wasted, sum(output_tokens) AS output_tokens
FROM shards GROUP BY model, budget ORDER BY model, budget
"""
_COLUMNS = ["model", "budget", "stop_reason", "is_truncated", "reward", "wasted_output_tokens",
            "output_tokens"]


def _duckdb(paths: list[str]) -> int:
    shards = ds.dataset(paths, format="ipc", schema=SCHEMA).to_table(columns=_COLUMNS)  # noqa: F841
    con = duckdb.connect()
    try:
        return len(con.execute(_SQL).fetchall())
    finally:
        con.close()


def _polars(paths: list[str]) -> int:
    reason = pl.col("stop_reason").cast(pl.Utf8)
    ok = reason != "error"
    out = (pl.scan_ipc(paths).select(_COLUMNS).group_by(["model", "budget"]).agg(
        pl.len().alias("episodes"), (reason == "error").sum().alias("errors"),
        (ok & pl.col("is_truncated")).sum().alias("truncated"),
        (reason == "malformed_tool_call").sum().alias("malformed"), (reason == "done").sum().alias("done"),
        pl.col("reward").filter(ok).sum().alias("reward_sum"), pl.col("wasted_output_tokens").sum(),
        pl.col("output_tokens").sum()).sort(["model", "budget"]).collect())
    return out.height


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--rows-per-shard", type=int, default=512)
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.rounds = 5_000, args.rounds or 1
    args.rounds = args.rounds or 5
    clock = Clock()
    run_dir = make_run(args.rows, args.rows_per_shard)
    made_s = clock.stop().wall
    paths = [str(x) for x in committed_shard_paths(run_dir)]

    def collector() -> int:
        result = compute_stats(run_dir, by=("model", "budget"), target=0.05)
        format_stats(result, "table")
        return len(result.groups)

    variants = {"collector": collector, "duckdb": lambda: _duckdb(paths), "polars": lambda: _polars(paths)}
    groups = {name: f() for name, f in variants.items()}  # warm the page cache, check agreement
    if len(set(groups.values())) != 1:
        raise RuntimeError(f"the variants disagree on the number of groups: {groups}")
    rows: list[dict[str, Any]] = []
    for rnd in range(args.rounds):
        order = list(variants)
        order = order[rnd % 3:] + order[: rnd % 3]
        for name in order:
            gc.collect()
            clock = Clock()
            variants[name]()
            clock.stop()
            rows.append({"round": rnd, "variant": name, "seconds": clock.wall,
                         "rows_per_s": args.rows / clock.wall,
                         "cpu_util": clock.cpu / clock.wall})
    summary = []
    for name in variants:
        mine = [r for r in rows if r["variant"] == name]
        ratios = []
        for r in mine:
            others = [x["seconds"] for x in rows if x["round"] == r["round"] and x["variant"] != "collector"]
            ratios.append(r["seconds"] / min(others))
        summary.append({"variant": name, "seconds": median([r["seconds"] for r in mine]),
                        "rows_per_s": median([r["rows_per_s"] for r in mine]),
                        "cpu_util": median([r["cpu_util"] for r in mine]),
                        "time_x_vs_faster_peer": median(ratios)})
    notes = [f"{args.rows} episodes in {len(paths)} shards ({args.rows_per_shard} rows each), "
             f"{groups['collector']} (model, budget) groups; run dir made/reused in {made_s:.1f} s",
             "target: collector time <= 1.5x the faster of duckdb and polars"]
    return report(NAME, "collector stats vs DuckDB and polars", args, rows, summary, notes)


if __name__ == "__main__":
    main()

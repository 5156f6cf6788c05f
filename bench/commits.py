"""Commit latency of the run store at 0, 1,000 and 20,000 committed shards.

Issue 19, item 3. Each size gets a run dir holding that many committed shards (copies of
one real 1-row shard, named in the manifest as the store writes them, so the store's open
verifies them all like any resume), then `--commits` one-episode commits are timed one by
one (wall time: the fsyncs are the point). Reported per size: median and p99 of one
commit, and the compaction the store does once per so many commits (timed as `close`,
which compacts the log), amortized over the commits that trigger one
(`collector.data.store._COMPACT_MIN_RECORDS`, or a quarter of the shard count).

Before/after: the same script against another checkout of the collector package, e.g.
the commit before the log::

    git archive 6bb5ebe collector | tar -x -C /tmp/before
    .venv/bin/python -m bench.commits --collector-from /tmp/before --out bench/results/commits-before.json
    .venv/bin/python -m bench.commits

A store without the log (before) has no compaction: its close row is its plain close.
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import parser, report

FP = "bench-commits"


def _build(run: Path, shards: int) -> None:
    """A run dir with `shards` committed 1-row shards (the real store writes the first)."""
    from collector.data.manifest import DATA_DIR, MANIFEST
    from collector.data.store import RunStore
    from tests.data.factory import make_batch

    with RunStore.open(run, FP, {}, "arrow", 1) as st:
        st.commit(make_batch(1, start=10_000_000))
    manifest = json.loads((run / MANIFEST).read_text())
    first = manifest["shards"][0]
    source = run / first["path"]
    entries = []
    for i in range(shards):
        rel = f"{DATA_DIR}/part-{i + 1:06d}-0bench00.arrow"
        shutil.copyfile(source, run / rel)
        entries.append({**first, "path": rel})
    source.unlink()
    manifest["shards"] = entries
    manifest["next_part"] = shards + 1
    (run / MANIFEST).write_text(json.dumps(manifest, indent=1))


def _measure(shards: int, commits: int) -> dict[str, Any]:
    from collector.data import store as store_mod
    from collector.data.store import RunStore
    from tests.data.factory import make_batch

    with tempfile.TemporaryDirectory(prefix="bench-commits-") as tmp:
        run = Path(tmp) / "run"
        if shards:
            _build(run, shards)
        started = time.perf_counter()
        st = RunStore.open(run, FP, {}, "arrow", 1)
        open_s = time.perf_counter() - started
        work = make_batch(commits, start=20_000_000)
        latencies = []
        for ep in work:
            t0 = time.perf_counter()
            st.commit([ep])
            latencies.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        st.close()
        close_s = time.perf_counter() - t0
    every = getattr(store_mod, "_COMPACT_MIN_RECORDS", None)
    per = max(every, (shards + commits) // 4) if every else None
    latencies.sort()
    median = statistics.median(latencies)
    return {
        "shards": shards,
        "commits": commits,
        "open_s": open_s,
        "commit_median_ms": median * 1e3,
        "commit_p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1e3,
        "close_ms": close_s * 1e3,
        "compaction_every": per if per is not None else "-",
        "amortized_ms": (median + (close_s / per if per else 0.0)) * 1e3,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__)
    p.add_argument("--sizes", type=int, nargs="+", default=[0, 1_000, 20_000])
    p.add_argument("--commits", type=int, default=100)
    p.add_argument("--collector-from", default=None,
                   help="a directory holding another `collector` package to measure instead")
    args = p.parse_args(argv)
    if args.collector_from:
        sys.path.insert(0, str(Path(args.collector_from).resolve()))
    if args.quick:
        args.sizes, args.commits = [0, 20], 5
    import collector

    rows = [_measure(n, args.commits) for n in args.sizes]
    notes = [f"collector package measured: {Path(collector.__file__).parent}",
             "wall times; each commit is one 1-episode shard (fsynced) plus the store's manifest "
             "write or commit record"]
    return report("commits", "commit latency against committed shards", args, rows, rows, notes)


if __name__ == "__main__":
    main()

"""`collector report` on a 100,000-episode run: seconds to write the page, and its size.

Issue 28: the report must be written "in seconds" for a 100,000-episode run and stay under
5 MB with its transcript sample. The run is bench/stats.py's synthetic one (real simulator
episodes tiled to the row count, committed through the collector's own `RunStore`, 4 models
x 6 budgets, shards of 512 rows), made once and kept under bench/results/.

Measured per round, in one process (the page cache warm after the first round):
- ``report``: `write_report(run, out, target=0.05)`, everything the command does after start-up;
- its parts, each alone: ``stats`` (`compute_stats`), ``turn stats`` (`compute_turn_stats`),
  ``check`` (`check_run`, which reads every shard whole: the verdict the page shows).

Target: ``report`` under 10 s at 100,000 episodes, the page under 5 MB.

    .venv/bin/python -m bench.report [--rows 100000] [--rounds 3]
"""

from __future__ import annotations

import gc
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import Clock, median, parser, report
from bench.stats import make_run
from collector.analysis.check import check_run
from collector.analysis.report import write_report
from collector.analysis.stats import compute_stats
from collector.analysis.turnstats import compute_turn_stats

NAME = "report"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__)
    p.add_argument("--rows", type=int, default=100_000)
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.rounds = 2_000, args.rounds or 1
    args.rounds = args.rounds or 3
    clock = Clock()
    run_dir = make_run(args.rows, 512)
    made_s = clock.stop().wall
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.html"
        variants: dict[str, Callable[[], object]] = {
            "report": lambda: write_report(run_dir, out, 0.05),
            "stats": lambda: compute_stats(run_dir, target=0.05),
            "turn stats": lambda: compute_turn_stats(run_dir),
            "check": lambda: check_run(run_dir),
        }
        size = int(variants["report"]())  # type: ignore[call-overload]  # warm the page cache
        rows: list[dict[str, Any]] = []
        for rnd in range(args.rounds):
            for name, f in variants.items():
                gc.collect()
                clock = Clock()
                f()
                clock.stop()
                rows.append({"round": rnd, "part": name, "seconds": clock.wall,
                             "cpu_util": clock.cpu / clock.wall})
        page = out.read_text(encoding="utf-8")
        transcripts, figures = page.count('<details class="ep"'), page.count('<svg class="figure"')
    summary = [{"part": name, "seconds": median([r["seconds"] for r in rows if r["part"] == name]),
                "cpu_util": median([r["cpu_util"] for r in rows if r["part"] == name])} for name in variants]
    summary.append({"part": "page size (MB)", "seconds": size / 1e6, "cpu_util": float("nan")})
    notes = [f"{args.rows} episodes in 512-row shards; run dir made/reused in {made_s:.1f} s",
             f"page: {size / 1e6:.2f} MB, {transcripts} transcripts, {figures} figures",
             "target: report < 10 s at 100,000 episodes, page < 5 MB"]
    return report(NAME, "collector report on a large run", args, rows, summary, notes)


if __name__ == "__main__":
    main()

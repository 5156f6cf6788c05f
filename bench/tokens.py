"""Token capture: shard bytes per turn and commit rows/s with `sampling.token_ids` on vs off.

Issue 13. Real episodes first: the same plan collected twice against the simulator
(`bench-zero`, Chat Completions, cap 256), once with token capture off and once on. The
simulator generates the same turns either way (the token fields never change a turn) and
both runs use one plan, so the two sets differ only by the token columns. Each set is
replicated under fresh ids to the row count asked for, then committed through
`RunStore.commit` (Episode -> Arrow, IPC zstd shards, fsync, manifest) in interleaved
rounds, off and on side by side.

    .venv/bin/python -m bench.tokens [--rows 20000] [--rounds 5]
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

from bench.common import Clock, SimProcess, median, parser, report
from bench.workload import commit, items_for, make_config, run_collector
from collector.config import RunConfig
from collector.record.episode import Episode

NAME = "tokens"


def _with_tokens(cfg: RunConfig, on: bool) -> RunConfig:
    return cfg.model_copy(update={"sampling": cfg.sampling.model_copy(update={"token_ids": on})})


def _replicate(base: list[Episode], rows: int) -> list[Episode]:
    return [dataclasses.replace(base[i % len(base)], episode_id=f"{i:016x}") for i in range(rows)]


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*.arrow"))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__)
    p.add_argument("--rows", type=int, default=20_000)
    p.add_argument("--rows-per-shard", type=int, default=512)
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.rounds = 200, args.rounds or 1
    args.rounds = args.rounds or 5
    base = make_config("bench-zero", 64, 64)
    output = base.output.model_copy(update={"rows_per_shard": args.rows_per_shard})
    n = min(args.rows, 1000)
    sets: dict[str, tuple[RunConfig, list[Episode]]] = {}
    # One plan for both: the config's fingerprint (hence episode ids and seeds) differs with
    # token capture, and the same items keep the two sets turn for turn the same.
    items = items_for(make_config("bench-zero", n, 64), n)
    with SimProcess() as sim:
        for name, on in (("off", False), ("on", True)):
            cfg = _with_tokens(make_config("bench-zero", n, 64), on)
            cfg = cfg.model_copy(update={"output": output})
            _, episodes = asyncio.run(run_collector(cfg, items, sim.root, with_shards=False))
            sets[name] = (cfg, _replicate(episodes, args.rows))
    turns = {name: sum(len(e.turns) for e in eps) for name, (_, eps) in sets.items()}
    captured = sum(1 for e in sets["on"][1] for t in e.turns if t.output_token_ids is not None)
    rows: list[dict[str, Any]] = []
    for rnd in range(args.rounds):
        order = ["off", "on"] if rnd % 2 == 0 else ["on", "off"]
        for name in order:
            cfg, episodes = sets[name]
            tmp = Path(tempfile.mkdtemp(prefix="bench-tokens-"))
            try:
                gc.collect()
                clock = Clock()
                commit(cfg, episodes, str(tmp))
                clock.stop()
                size = _dir_bytes(tmp)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            rows.append({"round": rnd, "token_capture": name, "rows": args.rows, "turns": turns[name],
                         "rows_per_s": args.rows / clock.wall, "rows_per_cpu_s": args.rows / clock.cpu,
                         "disk_mb": size / 1e6,
                         "bytes_per_turn": size / turns[name], "cpu_util": clock.cpu / clock.wall})
    summary = []
    for name in ("off", "on"):
        mine = [r for r in rows if r["token_capture"] == name]
        keys = ("rows_per_s", "rows_per_cpu_s", "disk_mb", "bytes_per_turn")
        medians = {k: median([r[k] for r in mine]) for k in keys}
        summary.append({"token_capture": name, "turns": turns[name], **medians})
    off, on = summary

    def ratio(key: str) -> float:  # per-round on/off, median: robust to the machine's load
        by_round = {(r["round"], r["token_capture"]): r[key] for r in rows}
        return median([by_round[(i, "on")] / by_round[(i, "off")] for i in range(args.rounds)])

    notes = [f"{args.rows} rows ({turns['on']} turns, {captured} with ids), "
             f"{args.rows_per_shard} rows per shard, IPC zstd, commit through RunStore; "
             f"{args.rounds} interleaved rounds",
             f"token capture on: {on['bytes_per_turn'] / off['bytes_per_turn']:.2f}x bytes per turn, "
             f"{ratio('rows_per_s'):.2f}x commit rows/s, {ratio('rows_per_cpu_s'):.2f}x rows per CPU second "
             "(per-round medians)"]
    return report(NAME, "Token capture: shard bytes and commit speed", args, rows, summary, notes)


if __name__ == "__main__":
    main()

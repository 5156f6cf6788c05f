"""Admission: goodput of adaptive admission against a sweep of static settings (issue 29).

Two simulated servers with a capacity (`collector.sim.capacity`), served by `bench.simserver`
in its own process: `sim-hosted` (a tokens-per-minute budget, 429 + Retry-After past it) and
`sim-gpu` (16 sequences at once, a queue of 16 whose wait is latency, 503 past it). On
each, one `EpisodeWorker` (no Ray around it) runs the same episodes with `ray.admission =
"static"` at 2, 4, 8, 12, 16, 24, 32, 64, 128 and 256 episodes in flight, and with
`"adaptive"` (ceiling: the default `ray.episodes_in_flight`, 64, untuned), with and without
the engine's `/metrics` (`provider.server_metrics = "vllm"`: the simulator publishes its
queue and KV use in vLLM's names). The variants run
in interleaved rounds, each round starting a fresh simulator (so no run inherits another's
queue or bucket), and the median over rounds is reported.

Per row: goodput (episodes that did not end as `error`, per second of wall time), its ratio
to the best static setting of the same preset (the fastest static setting that lost no
episode: one with `error` episodes has not collected its work), 429s, 5xx and timeouts per
1,000 requests (counted from the retry causes the episodes record), and `error` episodes.
Target: adaptive >= 0.9 x best static, no `error` episode.

    .venv/bin/python -m bench.admission [--episodes 240] [--rounds 2] [--static 2 4 ... 256]
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import SimProcess, median, parser, report
from bench.workload import items_for, make_config, worker_for
from collector.config import config_from_dict

NAME = "admission"
PRESETS = ("sim-hosted", "sim-gpu")
DEFAULT_STATIC = 64  # ray.episodes_in_flight's default


async def _run(model: str, in_flight: int, adaptive: bool, episodes: int, root: str,
               metrics: bool = False) -> dict[str, Any]:
    base = make_config(model, episodes, in_flight)
    data = base.model_dump(mode="json")
    data["ray"]["admission"] = "adaptive" if adaptive else "static"
    if metrics:  # the simulator's /metrics, in vLLM's names (collector.sim.capacity)
        data["provider"]["server_metrics"] = "vllm"
    cfg = config_from_dict(data)
    items = items_for(cfg, episodes)
    worker = worker_for(cfg, root)
    await worker.ready()
    start = time.perf_counter()
    result = await worker.run_batch(items)
    wall = time.perf_counter() - start
    await worker.close()
    causes: Counter[str] = Counter()
    requests = 0
    for episode in result:
        # Every attempt: one per turn, one per retry, and the failed call of an error episode.
        causes.update(episode.retries)
        requests += len(episode.turns) + len(episode.retries) + (str(episode.stop_reason) == "error")
    errors = sum(1 for e in result if str(e.stop_reason) == "error")
    good = len(result) - errors
    per_k = 1000.0 / max(1, requests)
    return {"goodput": good / wall, "wall_s": wall, "errors": errors, "requests": requests,
            "r429_per_k": causes["429"] * per_k, "r5xx_per_k": causes["5xx"] * per_k,
            "timeouts_per_k": causes["timeout"] * per_k}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__)
    p.add_argument("--episodes", type=int, default=240)
    p.add_argument("--static", type=int, nargs="+", default=[2, 4, 8, 12, 16, 24, 32, 64, 128, 256])
    p.add_argument("--presets", nargs="+", default=list(PRESETS))
    args = p.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 2)
    if args.quick:
        args.episodes, args.static = 24, [64]
    variants: list[tuple[str, int, bool]] = [("adaptive", DEFAULT_STATIC, True),
                                             ("adaptive + /metrics", DEFAULT_STATIC, True)]
    variants += [(f"static {n}", n, False) for n in args.static]
    samples: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for rnd in range(rounds):
        for model in args.presets:
            order = variants if rnd % 2 == 0 else variants[::-1]
            for label, n, adaptive in order:
                with SimProcess(seed=rnd) as sim:
                    row = asyncio.run(_run(model, n, adaptive, args.episodes, sim.root,
                                           metrics=label.endswith("/metrics")))
                samples.setdefault((model, label), []).append(row)
                print(f"round {rnd} {model} {label}: {row['goodput']:.1f} ep/s, errors {row['errors']}",
                      file=sys.stderr, flush=True)
    rows: list[dict[str, Any]] = []
    for model in args.presets:
        medians = {label: {k: median([s[k] for s in samples[(model, label)]])
                           for k in samples[(model, label)][0]}
                   for label, _, _ in variants}
        # The best static setting a sweep would keep: the fastest that lost no episode. A
        # setting whose episodes end as `error` looks fast (its failed episodes end early, and
        # its survivors are the short episodes), but its run is not done: those episodes are
        # missing and must be collected again.
        clean = [label for label, _, a in variants if not a and medians[label]["errors"] == 0]
        best_label = max(clean or [label for label, _, a in variants if not a],
                         key=lambda lab: medians[lab]["goodput"])
        best = medians[best_label]["goodput"]
        for label, n, adaptive in variants:
            m = medians[label]
            name = label + (" (default)" if not adaptive and n == DEFAULT_STATIC else "")
            name += " (best static)" if label == best_label else ""
            rows.append({"preset": model, "admission": name, "goodput_ep_s": round(m["goodput"], 1),
                         "ratio_to_best": round(m["goodput"] / best, 2) if best else 0.0,
                         "429_per_1k": round(m["r429_per_k"], 1), "5xx_per_1k": round(m["r5xx_per_k"], 1),
                         "timeouts_per_1k": round(m["timeouts_per_k"], 1), "errors": int(m["errors"])})
    return report(NAME, "Admission: adaptive vs static in-flight settings on two capacity presets", args,
                  rows, rows)


if __name__ == "__main__":
    main()

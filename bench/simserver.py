"""The simulator as the benchmarks serve it: `python -m bench.simserver --port N`.

The collector's own presets plus two made for measuring:

- ``bench-zero``: sim-terse's lengths without wrong arguments and with no latency, for
  overhead (how fast can a client go when the server answers at once);
- ``bench-lat``: the same with a log-normal latency of median 100 ms and sigma 0.35
  (about 55-180 ms for 90% of turns; mean 106.3 ms), for the Little's-law runs.

Served by uvicorn in its own process, so that on a 2-core machine it has a core to itself
and the client's CPU is measured apart from it.
"""

from __future__ import annotations

import argparse
import dataclasses
import math

import uvicorn

from collector.sim import PRESETS, create_app

BENCH_ZERO = dataclasses.replace(PRESETS["sim-terse"], name="bench-zero", error_rate=0.0,
                                 description="benchmarks: no latency, no wrong arguments")
LAT_MEDIAN_MS = 100.0
LAT_SIGMA = 0.35
BENCH_LAT = dataclasses.replace(BENCH_ZERO, name="bench-lat", latency_ms_median=LAT_MEDIAN_MS,
                                latency_sigma=LAT_SIGMA,
                                description="benchmarks: log-normal latency, median 100 ms")
#: Expected latency of bench-lat in seconds (mean of a log-normal: median * exp(sigma^2 / 2)).
LAT_MEAN_S = LAT_MEDIAN_MS / 1000.0 * math.exp(LAT_SIGMA**2 / 2)
BENCH_PRESETS = {**PRESETS, BENCH_ZERO.name: BENCH_ZERO, BENCH_LAT.name: BENCH_LAT}


def main() -> None:
    p = argparse.ArgumentParser(description="serve the simulator with the bench presets")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    # backlog: a thousand connections may open at once in the concurrency runs.
    uvicorn.run(create_app(args.seed, BENCH_PRESETS), host="127.0.0.1", port=args.port,
                log_level="warning", access_log=False, lifespan="off", backlog=4096)


if __name__ == "__main__":
    main()

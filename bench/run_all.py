"""Run every benchmark in turn, one after another (never two at once: they would share cores).

    .venv/bin/python -m bench.run_all [--quick] [--only overhead stats ...]

Each script prints its table and writes bench/results/<name>.json; this one then prints the
summary rows of all of them together and writes bench/results/all.json.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import RESULTS, machine, table

BENCHES = ("overhead", "concurrency", "shards", "stats", "memory", "peer", "history", "e2e", "driver",
           "admission", "tokenin", "pools", "harness_gateway")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--quick", action="store_true", help="minimal sizes (smoke test)")
    p.add_argument("--only", nargs="+", choices=BENCHES, default=list(BENCHES))
    p.add_argument("--results", default=str(RESULTS), help="directory for the JSON files")
    args = p.parse_args(argv)
    out_dir = Path(args.results)
    out_dir.mkdir(parents=True, exist_ok=True)
    payloads: dict[str, Any] = {}
    for name in args.only:
        module = importlib.import_module(f"bench.{name}")
        started = time.perf_counter()
        sub = ["--out", str(out_dir / f"{name}.json")] + (["--quick"] if args.quick else [])
        payloads[name] = module.main(sub)
        payloads[name]["elapsed_s"] = time.perf_counter() - started
    print("\n==== all benchmarks ====")
    for name, payload in payloads.items():
        print(f"\n[{name}] {payload['title']} ({payload['elapsed_s']:.0f} s)")
        print(table(payload["summary"]))
        for note in payload["notes"]:
            print(f"  {note}")
    everything = {"machine": machine(), "benchmarks": payloads}
    (out_dir / "all.json").write_text(json.dumps(everything, indent=2, default=str))
    print(f"\nwrote {out_dir / 'all.json'}")
    return everything


if __name__ == "__main__":
    main()

"""`python -m collector.sim [--host H] [--port N] [--seed S]`: serve the simulator alone.

The same command as `collector sim` (one-line errors, address printed once listening), with
the port this entry point always had as its default.

Tests: tests/system/sim/test_cli_sim.py.
"""

from __future__ import annotations

import argparse
import sys

from collector.cli import main as cli_main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m collector.sim", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    return cli_main(["sim", "--host", args.host, "--port", str(args.port), "--seed", str(args.seed)])


if __name__ == "__main__":
    sys.exit(main())

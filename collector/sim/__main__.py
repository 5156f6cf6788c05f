"""`python -m collector.sim [--host H] [--port N] [--seed S]`: serve the simulator alone."""

from __future__ import annotations

import argparse

from collector.sim.server import serve


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m collector.sim", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    serve(args.host, args.port, args.seed)


if __name__ == "__main__":
    main()

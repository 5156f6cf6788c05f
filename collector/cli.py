"""`collector`: the command line. Thin on purpose: parse arguments, call one function, print.

Every subcommand imports what it needs lazily, so `collector validate` and `collector stats`
never pay for importing Ray. Bad input never shows a traceback: every `CollectorError`
(and an unreadable path) becomes one line on stderr and exit code 2. Exit code 1 means the
command ran and found a problem (`check` with violations).

    collector run CONFIG [--set k=v ...] [--address ADDR] [--target X]
    collector stats RUN_DIR [--by COL,...] [--target X] [--format table|csv|json]
    collector show RUN_DIR EPISODE_ID
    collector validate CONFIG [--set k=v ...]
    collector check RUN_DIR
    collector sim [--host H] [--port N] [--seed S]
    collector trainer-view RUN_DIR OUT [--mode sequence|stepwise]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from collector.errors import CollectorError

EXIT_OK, EXIT_PROBLEM, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130


def _by(values: list[str] | None) -> tuple[str, ...]:
    if not values:
        return ("model", "budget")
    columns = (col.strip() for value in values for col in value.split(",") if col.strip())
    # A column named twice (`--by model,model`, or in two `--by`) is grouped by once.
    return tuple(dict.fromkeys(columns))


def _fraction(text: str) -> float:
    value = float(text.rstrip("%")) / (100 if text.endswith("%") else 1)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"target must be in [0, 1] or a percentage, got {text}")
    return value


def _cmd_run(args: argparse.Namespace) -> int:
    from collector.config import load_config
    from collector.data.stats import compute_stats, format_stats
    from collector.run.job import run_job

    cfg = load_config(args.config, args.set)
    result = run_job(cfg, address=args.address, show_progress=not args.quiet, retry_errors=args.retry_errors)
    print(result.summary(), file=sys.stderr)
    stats = compute_stats(result.run_dir, by=("model", "budget"), target=args.target)
    print(format_stats(stats, "table"))
    return EXIT_OK


def _cmd_stats(args: argparse.Namespace) -> int:
    from collector.data.stats import compute_stats, format_stats

    stats = compute_stats(args.run_dir, by=_by(args.by), target=args.target)
    print(format_stats(stats, args.format))
    return EXIT_OK


def _cmd_show(args: argparse.Namespace) -> int:
    from collector.data.analysis import render_episode

    print(render_episode(args.run_dir, args.episode_id))
    return EXIT_OK


def _cmd_validate(args: argparse.Namespace) -> int:
    from collector.config import load_config
    from collector.run.plan import plan_work

    cfg = load_config(args.config, args.set)
    plan = plan_work(cfg)
    print(f"{args.config}: ok")
    print(plan.describe())
    return EXIT_OK


def _cmd_check(args: argparse.Namespace) -> int:
    from collector.data.check import check_run

    report = check_run(args.run_dir)
    for problem in report.problems:
        print(problem)
    if report.ok:
        print(f"{args.run_dir}: ok")
        return EXIT_OK
    print(f"{args.run_dir}: {len(report.problems)} problem(s)", file=sys.stderr)
    return EXIT_PROBLEM


def _cmd_sim(args: argparse.Namespace) -> int:
    from collector.sim.server import serve

    if not 0 <= args.port <= 65535:
        print(f"collector: error: --port must be between 0 and 65535, got {args.port}", file=sys.stderr)
        return EXIT_BAD_INPUT

    def ready(base_url: str) -> None:
        # Only now: the socket is bound and the server accepts connections (port 0 resolved).
        print(
            f"simulated provider on {base_url} (seed {args.seed}); Ctrl-C stops it",
            file=sys.stderr,
            flush=True,
        )

    try:
        serve(args.host, args.port, args.seed, on_ready=ready)
    except OSError as exc:
        # A taken port, a host that does not resolve or is not ours: the user's input.
        reason = exc.strerror or str(exc)
        print(f"collector: error: cannot listen on {args.host}:{args.port}: {reason}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        # The way to stop a server, not an interrupted job: nothing to resume.
        print("collector: simulated provider stopped", file=sys.stderr)
    return EXIT_OK


def _cmd_trainer_view(args: argparse.Namespace) -> int:
    from collector.data.trainer import token_summary, trainer_table, write_view

    view = trainer_table(args.run_dir, args.mode)
    write_view(view, args.out)
    left_out = ", ".join(f"{n} {why}" for why, n in sorted(view.skipped.items())) or "none"
    print(f"{args.out}: {len(view.rows)} rows from {view.episodes} episodes ({args.mode}); "
          f"left out: {left_out}", file=sys.stderr)
    t = token_summary(args.run_dir)
    print(f"token capture: {t['turns_with_ids']} of {t['turns']} turns with ids, "
          f"{t['turns_not_returned']} asked for and not returned, {t['turns_withheld']} withheld, "
          f"{t['turns_count_mismatch']} miscounted; prefix-consistent: {t['prefix_consistent']} "
          f"of {t['multi_turn_with_prompt_ids']} multi-turn episodes with prompt ids", file=sys.stderr)
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="collector",
        description="Run LLM-agent episodes over a model x output-token-budget sweep into Arrow shards.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def overrides(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--set",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="override a config field, value as TOML (e.g. sweep.budgets=[64,128])",
        )

    def target(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--target",
            type=_fraction,
            default=None,
            metavar="X",
            help="per model, report the smallest budget with truncation rate <= X (0.05 or 5%%)",
        )

    p = sub.add_parser("run", help="run (or resume) the sweep a config describes")
    p.add_argument("config")
    overrides(p)
    p.add_argument(
        "--address",
        default=None,
        help="Ray cluster to attach to (default: ray.address, then RAY_ADDRESS, else local)",
    )
    target(p)
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.add_argument(
        "--retry-errors",
        action="store_true",
        help="first forget the episodes earlier runs committed as error, so they are collected again",
    )
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("stats", help="truncation table of a run directory")
    p.add_argument("run_dir")
    p.add_argument(
        "--by", action="append", metavar="COL[,COL...]", help="group by these columns (default model,budget)"
    )
    target(p)
    p.add_argument("--format", choices=("table", "csv", "json"), default="table")
    p.set_defaults(func=_cmd_stats)

    p = sub.add_parser("show", help="print one episode's transcript")
    p.add_argument("run_dir")
    p.add_argument("episode_id")
    p.set_defaults(func=_cmd_show)

    p = sub.add_parser("validate", help="check a config and show what it would run")
    p.add_argument("config")
    overrides(p)
    p.set_defaults(func=_cmd_validate)

    p = sub.add_parser("check", help="verify every shard of a run directory")
    p.add_argument("run_dir")
    p.set_defaults(func=_cmd_check)

    p = sub.add_parser("sim", help="serve the simulated provider (all four wire formats)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8787, help="0 lets the OS pick a free port")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_cmd_sim)

    p = sub.add_parser("trainer-view", help="write a run's captured tokens as token-level training samples")
    p.add_argument("run_dir")
    p.add_argument("out", help="the Parquet file to write")
    p.add_argument("--mode", choices=("sequence", "stepwise"), default="sequence",
                   help="one row per prefix-consistent episode (default), or one per turn")
    p.set_defaults(func=_cmd_trainer_view)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except CollectorError as exc:
        print(f"collector: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as exc:
        # A path the user gave that cannot be read: their input, not our bug.
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"collector: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("collector: interrupted; run the same command again to resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    return code


if __name__ == "__main__":
    sys.exit(main())

"""`collector`: the command line. Thin on purpose: parse arguments, call one function, print.

Every subcommand imports what it needs lazily, so `collector validate` and `collector stats`
never pay for importing Ray. Bad input never shows a traceback: every `CollectorError`
(and an unreadable path) becomes one line on stderr and exit code 2. Exit code 1 means the
command ran and found a problem (`check` with violations).

    collector run CONFIG|--demo [--set k=v ...] [--address ADDR] [--in-process] [--target X]
    collector init DIR
    collector stats RUN_DIR [--by COL,...] [--target X] [--format table|csv|json]
                    [--per episode|turn|tool|task]
    collector episodes RUN_DIR [--where COL OP VALUE ...] [--model M] [--budget N] [--limit N]
                       [--format table|json]
    collector show RUN_DIR EPISODE_ID [--format text|json]
    collector validate CONFIG [--set k=v ...]
    collector validate-tasks PATH [--backend docker|local_no_isolation]
    collector check RUN_DIR [--health] [--card CARD]
    collector card RUN_DIR [-o OUT] [--target X] [--data-files GLOB]
    collector schema
    collector export RUN_DIR OUT [--format chat-jsonl|parquet|atif] [--where COL OP VALUE ...]
                                 [--annotation NAME]
    collector sim [--host H] [--port N] [--seed S]
    collector trainer-view RUN_DIR OUT [--mode sequence|stepwise] [--annotation NAME]
    collector report RUN_DIR [OTHER_RUN] [-o OUT] [--target X]
    collector cluster-check ADDRESS [--cpus-per-worker X] [--timeout S]
    collector follow RUN [--since CURSOR] [--format jsonl|arrow] [--groups all|complete] [--forever]
                         [--wait SECONDS] [--poll SECONDS] [--annotation NAME]

Every RUN_DIR may also be ``s3://bucket/prefix``: it is read through a local mirror synced
first (`collector.storage.mirror.resolve_run`, the one place the argument is resolved).

A closed stdout (`collector stats RUN | head`) ends the command quietly with exit code 141,
as a command killed by SIGPIPE would. An interrupted run (Ctrl-C or SIGTERM) commits what
it holds and exits 128 + the signal number: 130 for SIGINT, 143 for SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence

from collector import __version__
from collector.errors import CollectorError

EXIT_OK, EXIT_PROBLEM, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
#: What a shell reports for a command killed by SIGPIPE (128 + 13), as `yes | head` does.
EXIT_CLOSED_PIPE = 128 + signal.SIGPIPE


def _by(values: list[str] | None) -> tuple[str, ...]:
    if not values:
        return ()  # the default grouping: model x budget, by provider too when there are several
    columns = (col.strip() for value in values for col in value.split(",") if col.strip())
    # A column named twice (`--by model,model`, or in two `--by`) is grouped by once.
    return tuple(dict.fromkeys(columns))


def _fraction(text: str) -> float:
    value = float(text.rstrip("%")) / (100 if text.endswith("%") else 1)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"target must be in [0, 1] or a percentage, got {text}")
    return value


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.0 < value <= 86400.0:  # NaN fails too
        raise argparse.ArgumentTypeError(f"must be seconds in (0, 86400], got {text}")
    return value


def _wait_seconds(text: str) -> float:
    return 0.0 if text.strip() in ("0", "0.0") else _positive_seconds(text)


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def _cmd_run(args: argparse.Namespace) -> int:
    from collector.config import load_config

    sets = [*args.set, "ray.pool=in_process"] if args.in_process else args.set
    # The config first: a typo is reported before the job's imports (pyarrow, and Ray for a
    # Ray pool) are paid for.
    cfg = load_config(_run_config_path(args), sets)
    from collector.analysis.stats import compute_stats, format_stats
    from collector.run.job import run_job

    result = run_job(cfg, address=args.address, show_progress=not args.quiet, retry_errors=args.retry_errors)
    print(result.summary(), file=sys.stderr)
    from collector.storage.mirror import resolve_run

    # A run in object storage is read through its synced mirror, as `collector stats` reads it.
    stats = compute_stats(resolve_run(result.run_dir), target=args.target)
    print(format_stats(stats, "table"))
    return EXIT_OK


def _run_config_path(args: argparse.Namespace) -> str:
    """CONFIG, or the packaged demo config for `run --demo` (exactly one of the two)."""
    if args.demo == (args.config is not None):
        raise CollectorError("collector run: give a CONFIG file or --demo (not both)")
    if args.demo:
        from collector.starter import demo_config

        return str(demo_config())
    return str(args.config)


def _cmd_init(args: argparse.Namespace) -> int:
    from collector.starter import write_starter

    written = write_starter(args.dir)
    for path in written:
        print(f"wrote {path}")
    print(f"next: cd {args.dir} && collector run config.toml")
    return EXIT_OK


def _cmd_stats(args: argparse.Namespace) -> int:
    from collector.analysis.stats import compute_stats, format_stats

    if args.per == "tool":
        from collector.analysis.toolstats import compute_tool_stats, format_tool_stats

        tools = compute_tool_stats(args.run, by=_by(args.by), target=args.target)
        print(format_tool_stats(tools, args.format))
        return EXIT_OK
    if args.per == "task":
        from collector.analysis.taskstats import compute_task_stats, format_task_stats

        print(format_task_stats(compute_task_stats(args.run, by=_by(args.by)), args.format))
        return EXIT_OK
    if args.per == "turn":
        from collector.analysis.turnstats import compute_turn_stats, format_turn_stats

        turns = compute_turn_stats(args.run, by=_by(args.by), target=args.target)
        print(format_turn_stats(turns, args.format))
        return EXIT_OK
    if args.groups or args.annotation:  # group health, and rewards from a regrade: analysis.health
        from collector.analysis.health import stats_command

        return stats_command(args)
    stats = compute_stats(args.run, by=_by(args.by), target=args.target)
    print(format_stats(stats, args.format))
    return EXIT_OK


def _cmd_show(args: argparse.Namespace) -> int:
    from collector.analysis.episodes import render_episode

    print(render_episode(args.run, args.episode_id, args.format, terminal=sys.stdout.isatty()))
    return EXIT_OK


def _where(args: argparse.Namespace) -> list[str]:
    """`episodes`' filters in the grammar `export` reads (`collector.analysis.where`)."""
    where = list(args.where)
    if args.model is not None:
        where.append(f"model={args.model}")
    if args.budget is not None:
        where.append(f"budget={args.budget}")
    return where


def _cmd_episodes(args: argparse.Namespace) -> int:
    from collector.analysis.episodes import format_listing, list_episodes

    table = list_episodes(args.run, _where(args), args.limit)
    text = format_listing(table, args.format)
    if text:
        print(text)
    return EXIT_OK


def _cmd_schema(args: argparse.Namespace) -> int:
    import json

    from collector.config import RunConfig

    print(json.dumps(RunConfig.model_json_schema(), indent=2))
    return EXIT_OK


def _cmd_validate(args: argparse.Namespace) -> int:
    from collector.config import load_config
    from collector.run.plan import load_env, plan_work, tools_of_first_task

    cfg = load_config(args.config, args.set)
    env = load_env(cfg)
    plan = plan_work(cfg, env)
    print(f"{args.config}: ok")
    print(plan.describe())
    print(tools_of_first_task(plan, env))
    return EXIT_OK


def _cmd_validate_tasks(args: argparse.Namespace) -> int:
    import asyncio

    from collector.envs.harbor_validate import validate_tasks, verdict_lines

    verdicts = asyncio.run(validate_tasks(args.path, args.backend))
    for line in verdict_lines(verdicts):
        print(line)
    return EXIT_OK if all(v.ok for v in verdicts) else EXIT_PROBLEM


def _cmd_check(args: argparse.Namespace) -> int:
    from collector.analysis.check import check_run

    if args.card is not None:
        return _check_card(args)

    report = check_run(args.run)
    if args.health:
        from collector.analysis.health import add_health

        add_health(report, args.run, args.max_failure_share)
    for problem in report.problems:
        print(problem)
    for note in report.notes:  # not errors, but a user looking at the dir should know
        print(f"note: {note}")
    if report.ok:
        print(f"{args.run_dir}: ok")
        return EXIT_OK
    print(f"{args.run_dir}: {len(report.problems)} problem(s)", file=sys.stderr)
    return EXIT_PROBLEM


def _check_card(args: argparse.Namespace) -> int:
    from collector.analysis.card import check_card

    result = check_card(args.run, args.card)
    for problem in result.problems:
        print(problem)
    if result.ok:
        print(f"{args.card}: ok ({result.checked} claims hold for {args.run_dir})")
        return EXIT_OK
    print(f"{args.card}: {len(result.problems)} of {result.checked} claim(s) do not hold", file=sys.stderr)
    return EXIT_PROBLEM


def _cmd_card(args: argparse.Namespace) -> int:
    from collector.analysis.card import DEFAULT_TARGET, write_card

    target = DEFAULT_TARGET if args.target is None else args.target
    path = write_card(args.run, args.out, target, args.data_files)
    print(f"wrote {path}; check it with: collector check {args.run_dir} --card {path}", file=sys.stderr)
    return EXIT_OK


def _cmd_regrade(args: argparse.Namespace) -> int:
    from collector.analysis.regrade import regrade_command
    from collector.envs.loading import load_environment

    return regrade_command(args, load_environment)


def _cmd_export(args: argparse.Namespace) -> int:
    from collector.analysis.export import export_run

    rows = export_run(args.run, args.out, args.format, args.where, args.annotation)
    print(f"{args.out}: {rows} episodes ({args.format})", file=sys.stderr)
    return EXIT_OK


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
    from collector.analysis.trainer import (
        missing_ids_reason,
        summary_lines,
        token_summary,
        trainer_table,
        write_view,
    )

    t = token_summary(args.run)
    reason = missing_ids_reason(t)
    if reason is not None:  # before OUT is touched: an empty view is no training data
        raise CollectorError(f"{args.run_dir}: no token ids to train on: {reason}")
    view = trainer_table(args.run, args.mode, args.annotation)
    write_view(view, args.out)
    left_out = ", ".join(f"{n} {why}" for why, n in sorted(view.skipped.items())) or "none"
    print(f"{args.out}: {len(view.rows)} rows from {view.episodes} episodes ({args.mode}); "
          f"left out: {left_out}", file=sys.stderr)
    print(f"token capture: {t['turns_with_ids']} of {t['turns']} turns with ids, "
          f"{t['turns_not_returned']} asked for and not returned, {t['turns_withheld']} withheld, "
          f"{t['turns_count_mismatch']} miscounted; prefix-consistent: {t['prefix_consistent']} "
          f"of {t['multi_turn_with_prompt_ids']} multi-turn episodes with prompt ids", file=sys.stderr)
    print("\n".join(summary_lines(t)), file=sys.stderr)
    return EXIT_OK if view.rows else EXIT_PROBLEM


def _cmd_cluster_check(args: argparse.Namespace) -> int:
    from collector.run.cluster import check_cluster

    ok, lines = check_cluster(args.address, args.timeout, args.cpus_per_worker)
    print("\n".join(lines))
    return EXIT_OK if ok else EXIT_PROBLEM


def _cmd_follow(args: argparse.Namespace) -> int:
    from collector.analysis.follow_output import main

    return main(args)


def _cmd_report(args: argparse.Namespace) -> int:
    from collector.analysis.report import report_command

    other = None
    if args.other is not None:
        from collector.storage.mirror import resolve_run

        _refuse_config_as_run(args.other)
        other = str(resolve_run(args.other))
    return report_command(args.run, args.out, args.target, args.run_dir, other)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="collector",
        description="Run LLM-agent episodes over a model x output-token-budget sweep into Arrow shards.",
    )
    parser.add_argument("--version", action="version", version=f"collector {__version__}")
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

    def config(p: argparse.ArgumentParser) -> None:
        p.add_argument("config", metavar="CONFIG", help="the run's TOML config file")

    def run_dir(p: argparse.ArgumentParser) -> None:
        p.add_argument("run_dir", metavar="RUN_DIR",
                       help="a run directory or s3://bucket/prefix (output.path of a run)")

    p = sub.add_parser("run", help="run (or resume) the sweep a config describes")
    p.add_argument("config", metavar="CONFIG", nargs="?", default=None,
                   help="the run's TOML config file (or --demo)")
    p.add_argument("--demo", action="store_true", help="run the packaged demo config (no CONFIG needed)")
    overrides(p)
    p.add_argument(
        "--address",
        default=None,
        help="Ray cluster to attach to (default: ray.address, then RAY_ADDRESS, else local)",
    )
    p.add_argument(
        "--in-process",
        action="store_true",
        help="run the workers in this process, without Ray (same as --set ray.pool=in_process)",
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
    run_dir(p)
    p.add_argument(
        "--by", action="append", metavar="COL[,COL...]", help="group by these columns (default model,budget)"
    )
    target(p)
    p.add_argument("--format", choices=("table", "csv", "json"), default="table")
    p.add_argument(
        "--per",
        choices=("episode", "turn", "tool", "task"),
        default="episode",
        help="episode: share of episodes with a cut turn; turn: turns cut / turns, by turn index and kind; "
        "tool: calls cut per tool, call sizes, the budget each tool needs; task: tasks cut far more "
        "than their cell",
    )
    p.add_argument("--groups", action="store_true", help="group health: zero-variance groups per cell")
    p.add_argument("--annotation", default=None, metavar="NAME",
                   help="rewards from `collector regrade --out NAME`")
    p.set_defaults(func=_cmd_stats)

    p = sub.add_parser("episodes", help="list the committed episodes of a run directory (ids first)")
    run_dir(p)
    p.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="COL OP VALUE",
        help="keep episodes where e.g. stop_reason=length, trainable=false, budget>=64 (repeatable)",
    )
    p.add_argument("--model", default=None, metavar="M", help="only this model (same as --where model=M)")
    p.add_argument("--budget", type=int, default=None, metavar="N", help="only this per-turn budget")
    p.add_argument("--limit", type=_count, default=None, metavar="N", help="at most N episodes")
    p.add_argument("--format", choices=("table", "json"), default="table", help="json: one object a line")
    p.set_defaults(func=_cmd_episodes)

    p = sub.add_parser("show", help="print one episode's transcript")
    run_dir(p)
    p.add_argument(
        "episode_id", metavar="EPISODE_ID", help="an episode id, or a unique prefix of one (see `episodes`)"
    )
    p.add_argument(
        "--format", choices=("text", "json"), default="text", help="json: the stored row, every column"
    )
    p.set_defaults(func=_cmd_show)

    p = sub.add_parser("validate", help="check a config and show what it would run")
    config(p)
    overrides(p)
    p.set_defaults(func=_cmd_validate)

    p = sub.add_parser("validate-tasks", help="run Harbor tasks' oracles and verifiers before a sweep")
    p.add_argument("path", metavar="PATH", help="a Harbor task directory, or a directory of them")
    p.add_argument("--backend", choices=("docker", "local_no_isolation"), default="docker",
                   help="the sandbox backend (local_no_isolation: no isolation at all)")
    p.set_defaults(func=_cmd_validate_tasks)

    p = sub.add_parser("check", help="verify every shard of a run directory")
    run_dir(p)
    p.add_argument("--health", action="store_true", help="also look for hollow turns, identical samples, ...")
    p.add_argument("--max-failure-share", type=_fraction, default=0.05, metavar="X",
                   help="--health: name a cell whose error + timeout share is above X (default 0.05)")
    p.add_argument("--card", default=None, metavar="CARD",
                   help="instead: recompute every claim of a dataset card (`collector card`) from the shards")
    p.set_defaults(func=_cmd_check)

    p = sub.add_parser("card", help="write a Hugging Face dataset card (README.md) of checkable claims")
    run_dir(p)
    p.add_argument("-o", "--out", default="README.md",
                   help="the card (a .md file), or the folder (an export's) to write README.md in")
    p.add_argument("--target", type=_fraction, default=None, metavar="X",
                   help="the per-tool budget target the card states (default 5%%)")
    p.add_argument("--data-files", default="*.parquet", metavar="GLOB",
                   help="the card's data_files: the export's files beside it (default: %(default)s)")
    p.set_defaults(func=_cmd_card)

    p = sub.add_parser("regrade", help="re-grade every committed episode with an environment's grader")
    run_dir(p)
    p.add_argument("--env", required=True, metavar="SPEC",
                   help="the environment: a name or package.module:attr")
    p.add_argument("--out", default="regrade", metavar="NAME", help="the annotation's name (default regrade)")
    p.add_argument("--timeout", type=_positive_seconds, default=30.0, metavar="S",
                   help="seconds each replayed tool call and each grade may take (default 30)")
    p.set_defaults(func=_cmd_regrade)

    p = sub.add_parser("schema", help="print the config's JSON Schema (for editors; see the README)")
    p.set_defaults(func=_cmd_schema)

    p = sub.add_parser("init", help="write a starter project: config.toml, my_env/, the notebook")
    p.add_argument("dir", metavar="DIR", help="directory to create (must not hold those files already)")
    p.set_defaults(func=_cmd_init)

    p = sub.add_parser("export", help="write a run's committed episodes (filtered) for a trainer")
    run_dir(p)
    p.add_argument("out", metavar="OUT", help="the file to write")
    # Literal names here keep `collector export --help` free of imports; export.FORMATS is the truth.
    p.add_argument("--format", default="chat-jsonl", help="chat-jsonl (messages + tools), parquet or atif")
    p.add_argument("--where", action="append", default=[], metavar="COL OP VALUE",
                   help="keep rows where e.g. stop_reason=done, trainable=true, budget>=64 (repeatable)")
    p.add_argument("--annotation", default=None, metavar="NAME",
                   help="rewards from `collector regrade --out NAME` (parquet, atif)")
    p.set_defaults(func=_cmd_export)

    p = sub.add_parser("sim", help="serve the simulated provider (all four wire formats)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    p.add_argument(
        "--port", type=int, default=8787, help="port to listen on; 0: any free one (default: %(default)s)"
    )
    p.add_argument("--seed", type=int, default=0, help="the simulator's base seed (default: %(default)s)")
    p.set_defaults(func=_cmd_sim)

    p = sub.add_parser("trainer-view", help="write a run's captured tokens as token-level training samples")
    p.add_argument("run_dir")
    p.add_argument("out", help="the Parquet file to write")
    p.add_argument("--mode", choices=("sequence", "stepwise"), default="sequence",
                   help="one row per prefix-consistent episode (default), or one per turn")
    p.add_argument("--annotation", default=None, metavar="NAME",
                   help="rewards from `collector regrade --out NAME`")
    p.set_defaults(func=_cmd_trainer_view)

    p = sub.add_parser("follow", help="print a run's committed episodes as they land, resumable")
    p.add_argument("follow_run", metavar="RUN", help="a run directory or s3://bucket/prefix")
    p.add_argument("--since", default=None, metavar="CURSOR", help="resume after this row's cursor")
    p.add_argument("--format", choices=("jsonl", "arrow"), default="jsonl", help="arrow: an IPC stream")
    p.add_argument("--groups", choices=("all", "complete"), default="all", help="complete: whole groups only")
    p.add_argument("--forever", action="store_true", help="keep following after the writer is gone")
    p.add_argument("--wait", type=_wait_seconds, default=0.0, metavar="SECONDS",
                   help="wait up to SECONDS for a run that has not started yet (default 0: fail at once)")
    p.add_argument("--annotation", default=None, metavar="NAME",
                   help="rewards from `collector regrade --out NAME` (local runs)")
    p.add_argument("--poll", type=float, default=1.0, metavar="SECONDS", help="how often to look for commits")
    p.set_defaults(func=_cmd_follow)

    p = sub.add_parser("cluster-check", help="say whether a run can use a Ray cluster: its nodes and CPUs")
    p.add_argument("address", metavar="ADDRESS", help="the cluster's address, host:port (as for --address)")
    p.add_argument("--cpus-per-worker", type=float, default=1.0, metavar="X",
                   help="ray.cpus_per_worker of the run to fit (default: %(default)s)")
    p.add_argument("--timeout", type=_positive_seconds, default=60.0, metavar="S",
                   help="seconds to join the cluster and to hear from each node (default: 60)")
    p.set_defaults(func=_cmd_cluster_check)

    p = sub.add_parser("report", help="write one self-contained HTML page of a run (figures, transcripts)")
    run_dir(p)
    p.add_argument("other", metavar="OTHER_RUN", nargs="?", default=None,
                   help="a second run, compared with the first cell by cell on the same page")
    p.add_argument("-o", "--out", default="report.html", help="the HTML file to write (default: %(default)s)")
    target(p)
    p.set_defaults(func=_cmd_report)
    return parser


def _closed_pipe() -> int:
    """The reader of stdout went away (`| head`): end quietly, as other CLIs do.

    stdout is pointed at /dev/null first, so the interpreter's final flush of what is still
    buffered cannot fail again with an "Exception ignored" message.
    """
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # a stdout without a file descriptor (embedded, captured)
        pass
    return EXIT_CLOSED_PIPE


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return _dispatch(args)
    except BrokenPipeError:
        return _closed_pipe()


def _refuse_config_as_run(given: str) -> None:
    """A config file where a run directory belongs (`collector stats config.toml`): say so, and
    where that config's run is, instead of "not a run directory"."""
    if not given.endswith(".toml") or not os.path.isfile(given):
        return
    from collector.config import load_config

    try:
        where = f"; its run is {load_config(given).output.path}"
    except CollectorError:
        where = ""  # not a valid config: naming it a config is still the useful part
    raise CollectorError(f"{given} is a run's config file, not a run directory{where} "
                         "(`collector run` writes it)")


def _dispatch(args: argparse.Namespace) -> int:
    try:
        if getattr(args, "run_dir", None) is not None:
            # Every reader's RUN_DIR, resolved once: a path as given, an s3:// URI to its
            # synced local mirror (`args.run_dir` stays what the user typed, for messages).
            from collector.storage.mirror import resolve_run

            args.run = resolve_run(args.run_dir)
            _refuse_config_as_run(args.run_dir)
        elif getattr(args, "follow_run", None) is not None:
            _refuse_config_as_run(args.follow_run)
        code: int = args.func(args)
        sys.stdout.flush()  # inside the handlers: a closed pipe shows up here, not at exit
    except CollectorError as exc:
        print(f"collector: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:
        return _closed_pipe()
    except OSError as exc:
        # A path the user gave that cannot be read: their input, not our bug.
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"collector: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt as exc:
        # Ctrl-C, or SIGTERM turned into the same by the run (`collector.run.signals`): what
        # was finished is committed by now; one more signal must not change the outcome.
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_IGN)
        number = getattr(exc, "signum", signal.SIGINT)
        name = signal.Signals(number).name
        print(f"collector: interrupted ({name}); run the same command again to resume", file=sys.stderr)
        return 128 + int(number)
    return code


if __name__ == "__main__":
    sys.exit(main())

"""`collector regrade RUN --env SPEC --out NAME`: a new grader's rewards, without the model.

For every committed episode the environment `SPEC` builds a fresh world for the episode's
task (`start_world`), its tools are run on the episode's recorded `executed_tool_calls` in
order (the model is never called: the world's state is rebuilt from what the episode did),
and the world's grader is asked again. The result is an *annotation*: one row per
episode_id with the new ``reward``, ``graded`` (whether the grader ran), ``grader``,
``grader_version`` and ``annotated_at``; `collector stats --annotation NAME` reads it in
place of the stored reward.

Which episodes the grader decides. ``done`` episodes are graded on their final answer;
``max_steps`` ones with no answer when the run's ``loop.reward.grade_max_steps`` is on.
Cut (``length``, ``context_overflow``) and ``malformed_tool_call`` episodes keep reward 0
whatever the new grader says: the turn that would have finished the task never ran, and a
trainer must not learn that a cut pays. ``error`` and ``timeout`` episodes are not the
model's answer: annotated with reward 0 and ``graded`` false, as stored.

Exactly once, SIGKILL-safe. The annotation lives under ``.collector/annotations/NAME/``
(a ``.`` directory, files without a shard extension: invisible to pandas, polars, DuckDB,
Hugging Face; see `collector.storage.manifest`): ``meta.json`` (the environment spec and
grader, created once; a rerun with another grader is refused), then per batch a chunk
``chunk-<seq>-<uuid>.annot`` (an Arrow IPC file, written whole) and its create-only record
``commit-<seq>.json`` naming it. The record is the commit point; the next run annotates what
no record covers, so every episode is annotated exactly once. Where: the run's own storage
(`collector.analysis.annotation_store`): the run directory, or for an ``s3://`` run the
bucket itself (create-only by ``If-None-Match: *``, refused on an endpoint that ignores it),
never only the reader's local mirror, which its next sync would clear.

Orphans are decided by the records, never by timing. A chunk is written for one seq (its
name says which) before its record; it is an orphan only once record ``<seq>`` exists and
names another chunk (its writer was killed, or another regrade won that seq), and only then
deleted. A chunk whose record does not exist yet is never deleted, however old: its writer
may be about to create it. Two regrades of one NAME at once: locally the second is refused
in one line before it reads or deletes anything (a flock on ``regrade.lock``, released by
the kernel when a regrade dies); in S3 (no flock) both may grade, the create-only record
lets one commit each seq, and the other stops in one line, deleting only its own chunk.

Graders (`collector.analysis.grader_calls`). Every grader has a deadline: each replayed call
and the grade get ``--timeout`` seconds (30), the episode their sum and one more, run in a
thread that is abandoned past it, so a synchronous grader that hangs cannot hold the
regrade. A grader that raises, hangs or returns no reward (None, a string, a bool, NaN,
infinity, an integer too large for a float) stops the regrade with one line naming the
episode and the cause; the episodes graded before it, its own batch's included, are
committed first.

Recorded tool arguments are the redacted ones (`collector.episode.redact`): a tool whose
outcome depends on a redacted secret replays differently; such an environment should not
declare itself regradable.

Tests: tests/analysis/test_regrade.py, tests/analysis/test_regrade_faults.py
"""

from __future__ import annotations

import datetime as dt
import json
import re
import uuid
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from collector.analysis.annotation_store import AnnotationFiles, LocalAnnotations, S3Annotations
from collector.analysis.committed import read_columns, read_committed
from collector.analysis.grader_calls import GraderThread
from collector.errors import CollectorError, ConfigError, OutputError
from collector.stop import StopReason
from collector.storage.location import parse_location
from collector.storage.manifest import META_DIR, RESOLVED_CONFIG

__all__ = ["ANNOTATIONS_DIR", "ANNOTATION_SCHEMA", "RegradeResult", "annotated_table", "apply_annotation",
           "read_annotation", "regrade_command", "regrade_run", "resolved_run_config"]

ANNOTATIONS_DIR = f"{META_DIR}/annotations"
CHUNK_SUFFIX = ".annot"
_RECORD = re.compile(r"commit-(\d{9})\.json")
#: A chunk (or its temp file) written for record N: ``chunk-<N>-<uuid>.annot``.
_CHUNK = re.compile(r"\.?chunk-(\d{9})-[0-9a-f]{32}\.annot(\.[0-9a-f]{8}\.tmp)?")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
#: Cut and malformed episodes: reward 0 whatever the grader says (module docstring).
_KEEP_ZERO = frozenset({StopReason.LENGTH.value, StopReason.CONTEXT_OVERFLOW.value,
                        StopReason.MALFORMED_TOOL_CALL.value})
_INFRA = frozenset({StopReason.ERROR.value, StopReason.TIMEOUT.value})

ANNOTATION_SCHEMA = pa.schema([
    ("episode_id", pa.string()), ("reward", pa.float64()), ("graded", pa.bool_()),
    ("grader", pa.string()), ("grader_version", pa.string()), ("annotated_at", pa.string()),
])
#: Seconds a replayed tool or an async grader may take (the loop's default tool timeout).
TOOL_TIMEOUT_S = 30.0


def resolved_run_config(run_dir: str | Path) -> dict[str, Any]:
    """The run's resolved config (``config`` of `RESOLVED_CONFIG`); {} when the file is absent.

    Raises OutputError (one line naming the file) when it exists but cannot be read.
    """
    path = Path(run_dir) / RESOLVED_CONFIG
    try:
        data = json.loads(path.read_text())
        config = data["config"]
        if not isinstance(config, dict):
            raise TypeError("config is not an object")
        return config
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise OutputError(f"{path}: unreadable ({e})") from e


def _dir(run_dir: str | Path, name: str) -> Path:
    if not _NAME.fullmatch(name):
        raise ConfigError(f"--out/--annotation: {name!r} is not a name (letters, digits, _ . -; at most 64)")
    return Path(run_dir) / ANNOTATIONS_DIR / name


def _records(files: AnnotationFiles) -> dict[int, str]:
    """Commit record seq -> the chunk it names (OutputError naming a record that is not one)."""
    out: dict[int, str] = {}
    for name in files.names():
        if (m := _RECORD.fullmatch(name)) is None:
            continue
        try:
            chunk = json.loads(files.read(name) or b"")["chunk"]
            if not isinstance(chunk, str):
                raise TypeError("chunk is not a name")
        except (ValueError, KeyError, TypeError) as e:
            raise OutputError(f"{files.where}/{name}: unreadable annotation record ({e})") from e
        out[int(m.group(1))] = chunk
    return dict(sorted(out.items()))


def _committed(files: AnnotationFiles, records: dict[int, str]) -> pa.Table:
    """The rows of every chunk a record names, in record order."""
    tables = [pa.table({f.name: pa.array([], f.type) for f in ANNOTATION_SCHEMA})]
    for seq, chunk in records.items():
        try:
            data = files.read(chunk)
            if data is None:
                raise FileNotFoundError(f"{chunk} is missing")
            tables.append(ipc.open_file(pa.BufferReader(data)).read_all())
        except (OSError, ValueError, pa.ArrowException) as e:
            raise OutputError(f"{files.where}/commit-{seq:09d}.json: unreadable chunk ({e})") from e
    return pa.concat_tables(tables)


def read_annotation(run_dir: str | Path, name: str) -> pa.Table:
    """The committed rows of annotation `name` (only chunks a record names). OutputError if absent."""
    folder = _dir(run_dir, name)
    if not (folder / "meta.json").is_file():
        raise OutputError(f"{folder}: no annotation {name!r} "
                          f"(run `collector regrade RUN --env SPEC --out {name}`)")
    files = LocalAnnotations(folder)
    return _committed(files, _records(files))


def apply_annotation(run_dir: str | Path, table: pa.Table, name: str) -> pa.Table:
    """`table` (with `episode_id` and `reward`) with the annotation's reward in place of the
    stored one. OutputError when the annotation does not cover every episode of `table`."""
    ann = read_annotation(run_dir, name)
    ids = table.column("episode_id")
    where = pc.index_in(ids, value_set=ann.column("episode_id"))
    missing = where.null_count
    if missing:
        raise OutputError(f"{_dir(run_dir, name)}: annotation {name!r} lacks {missing} of {len(ids)} "
                          f"committed episodes (resume it: collector regrade RUN --env SPEC --out {name})")
    reward = pc.take(ann.column("reward"), where)
    return table.set_column(table.schema.get_field_index("reward"), "reward", reward)


def annotated_table(run_dir: str | Path, name: str, by: Sequence[str] = ()) -> pa.Table:
    """The columns `collector stats` aggregates (and the `by` ones), with annotation `name`'s rewards."""
    from collector.analysis.committed import stored_columns

    cols = [*by, "episode_id", "provider", "model", "budget", "stop_reason", "is_truncated", "reward",
            "wasted_output_tokens", "output_tokens",
            *stored_columns(run_dir, "retries", "thinking_cut", "reasoning")]
    return apply_annotation(run_dir, read_columns(run_dir, list(dict.fromkeys(cols))), name)


@dataclass(slots=True)
class RegradeResult:
    annotated: int
    """Episodes this call annotated (the rest were already)."""
    total: int
    """Committed episodes of the run."""
    folder: Path
    """The annotation's folder in the run directory (an ``s3://`` run's: in its local mirror)."""
    where: str = ""
    """Where it was committed, as the user knows it (a path, or the ``s3://`` URI)."""


def _grader(env: Regradable) -> tuple[str, str]:
    return getattr(env, "name", type(env).__name__) or type(env).__name__, str(env.grader_version)


def _final_text(messages: Sequence[dict[str, Any]]) -> str | None:
    for m in reversed(messages):
        if m.get("role") == "assistant":
            return str(m.get("text") or "")
    return None


class Regradable(Protocol):
    """What regrade needs of an environment (`collector.envs.base.Environment` has it all;
    analysis sits below the environments, so it names the shape, not the class)."""

    name: str
    regradable: bool
    grader_version: str

    def tasks(self) -> Sequence[Any]: ...

    async def regrade(self, task: Any, episode: Mapping[str, Any], calls: Sequence[tuple[str, str, str, int]],
                      final_text: str | None, timeout_s: float = ...) -> float: ...


def _regrade_call(env: Regradable, tasks: dict[str, Any], row: dict[str, Any], grade_max_steps: bool,
                  timeout_s: float) -> tuple[Coroutine[Any, Any, float] | None, float]:
    """The grader's call for `row` and its deadline, or None when the stored stop decides (0)."""
    reason = row["stop_reason"]
    if reason in _INFRA or reason in _KEEP_ZERO:
        return None, 0.0
    if reason == StopReason.MAX_STEPS.value and not grade_max_steps:
        return None, 0.0
    task = tasks.get(row["task_id"])
    if task is None:
        raise ConfigError(f"episode {row['episode_id']}: task {row['task_id']!r} is not among the "
                          "environment's tasks")
    calls = [(c["name"], c["call_id"], c["arguments_json"], c["turn_index"])
             for c in row["executed_tool_calls"] or []]  # in the order they ran
    final = _final_text(row["messages"] or []) if reason == StopReason.DONE.value else None
    # Each replayed call and the grade itself get a tool's time (their own bounds, for async
    # ones); the deadline is their sum and one more, so that an async bound fires first.
    return env.regrade(task, row, calls, final, timeout_s), timeout_s * (len(calls) + 2)


def _chunk_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, ANNOTATION_SCHEMA) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def _chunk_seq(name: str) -> int | None:
    """The record seq a chunk (or its temp file) was written for; None for another file."""
    m = _CHUNK.fullmatch(name)
    return int(m.group(1)) if m else None


def _delete_orphans(files: AnnotationFiles, records: dict[int, str]) -> None:
    """Delete the chunks a record has decided are orphans: written for seq N, while record N
    names another chunk (their writer was killed, or lost the race for N to another regrade).
    A chunk whose record N does not exist yet is never deleted, whatever its age: its writer
    may be about to create that record (the commit record decides, never timing). Chunks of
    a run killed before its record are decided by the next regrade's record of the same N."""
    for name in files.names():
        seq = _chunk_seq(name)
        if seq is not None and seq in records and records[seq] != name:
            files.delete(name)


def _files_of(run: str, run_dir: str | Path, name: str) -> AnnotationFiles:
    """Where annotation `name` of `run` (as the user gave it) is written: the run directory,
    or for ``s3://`` the bucket itself (a mirror's next sync removes what is only local)."""
    folder = _dir(run_dir, name)
    location = parse_location(run)
    if isinstance(location, Path):
        return LocalAnnotations(folder)
    from collector.storage.s3lease import probe_conditional_writes
    from collector.storage.s3objects import bucket_of

    bucket = bucket_of(location.bucket)
    probe_conditional_writes(bucket, location)  # exactly once rests on the create-only record
    return S3Annotations(bucket, location, f"{ANNOTATIONS_DIR}/{name}")


def regrade_run(run_dir: str | Path, env: Regradable, spec: str, name: str = "regrade", batch: int = 256, *,
                files: AnnotationFiles | None = None, timeout_s: float = TOOL_TIMEOUT_S) -> RegradeResult:
    """Annotate every committed episode of `run_dir` not yet in annotation `name` (module docstring).

    `files` is where the annotation is written (default: the run directory's folder; an
    ``s3://`` run's `S3Annotations`); `timeout_s` a tool's time (each replayed call and the
    grade get it). Raises ConfigError when the environment cannot be regraded or differs from
    the one the annotation was begun with; OutputError (one line naming the episode) when the
    grader fails, after committing what was graded before it.
    """
    if not env.regradable:
        raise ConfigError(f"--env {spec}: environment {getattr(env, 'name', spec)!r} does not declare itself "
                          "regradable (Environment.regradable)")
    grader, version = _grader(env)
    files = files if files is not None else LocalAnnotations(_dir(run_dir, name))
    refusal = (f"{files.where}: another regrade of {name!r} is running; nothing was changed "
               "(rerun once it ends: it resumes where that one stopped)")
    with files.exclusive(refusal):
        _check_meta(files, spec, grader, version, name)
        records = _records(files)
        _delete_orphans(files, records)
        done = set(_committed(files, records).column("episode_id").to_pylist())
        loop_cfg = resolved_run_config(run_dir).get("loop") or {}
        grade_max_steps = bool((loop_cfg.get("reward") or {}).get("grade_max_steps", False))
        cols = ["episode_id", "run_id", "task_id", "model", "provider", "budget", "sample", "seed", "env",
                "stop_reason", "executed_tool_calls", "messages"]
        rows = [r for r in read_committed(run_dir, cols).to_pylist() if r["episode_id"] not in done]
        rows.sort(key=lambda r: r["episode_id"])
        tasks = {t.id: t for t in env.tasks()}
        seq = max(records, default=0)
        annotated = 0

        def commit(part: list[dict[str, Any]], rewards: list[tuple[float, bool]]) -> None:
            nonlocal seq, annotated
            if not part:
                return
            now = dt.datetime.now(dt.UTC).isoformat()
            table = pa.table({
                "episode_id": [r["episode_id"] for r in part], "reward": [g[0] for g in rewards],
                "graded": [g[1] for g in rewards], "grader": [grader] * len(part),
                "grader_version": [version] * len(part), "annotated_at": [now] * len(part),
            }, schema=ANNOTATION_SCHEMA)
            seq += 1
            chunk = f"chunk-{seq:09d}-{uuid.uuid4().hex}{CHUNK_SUFFIX}"  # for record `seq` only
            files.put(chunk, _chunk_bytes(table))
            record = f"commit-{seq:09d}.json"
            if not files.create(record, json.dumps({"chunk": chunk, "episodes": len(part)}).encode()):
                # Record `seq` names another chunk: this one is decided an orphan, by the record.
                files.delete(chunk)
                raise OutputError(f"{files.where}: {record} was created meanwhile by another regrade of "
                                  f"{name!r}; stopped, what it committed is kept (rerun once it ends)")
            annotated += len(part)
            _delete_orphans(files, {seq: chunk})  # a killed run's chunk for this seq, decided now

        credentials = getattr(env, "credentials", None)
        thread = GraderThread(credentials() if callable(credentials) else ())
        try:
            for start in range(0, len(rows), batch):
                part = rows[start:start + batch]
                rewards: list[tuple[float, bool]] = []
                for row in part:
                    try:
                        call, deadline = _regrade_call(env, tasks, row, grade_max_steps, timeout_s)
                        if call is None:
                            rewards.append((0.0, False))
                        else:
                            rewards.append((thread.grade(row["episode_id"], call, deadline, timeout_s), True))
                    except CollectorError:
                        commit(part[:len(rewards)], rewards)  # what was graded before it is kept
                        raise
                commit(part, rewards)
        finally:
            thread.close()
    return RegradeResult(annotated=annotated, total=len(done) + len(rows),
                         folder=_dir(run_dir, name), where=files.where)


def _check_meta(files: AnnotationFiles, spec: str, grader: str, version: str, name: str) -> None:
    """Create meta.json once; refuse a grader other than the one the annotation was begun with."""
    meta = {"env": spec, "grader": grader, "grader_version": version}
    created = dt.datetime.now(dt.UTC).isoformat()
    if files.create("meta.json", json.dumps({**meta, "created": created}).encode()):
        return
    try:
        begun = json.loads(files.read("meta.json") or b"")
        if not isinstance(begun, dict):
            raise ValueError("not an object")
    except ValueError as e:
        raise OutputError(f"{files.where}/meta.json: unreadable ({e})") from e
    if {k: begun.get(k) for k in meta} != meta:
        raise ConfigError(f"{files.where}/meta.json: annotation {name!r} was begun with grader "
                          f"{begun.get('grader')} {begun.get('grader_version')} ({begun.get('env')}), "
                          f"not {grader} {version}; choose another --out")


def regrade_command(args: Any, load_environment: Callable[[str, Any], Regradable]) -> int:
    """`collector regrade RUN --env SPEC [--out NAME]`; the CLI passes the environment loader
    (`collector.envs.loading.load_environment`: the layer above analysis)."""
    env_cfg = resolved_run_config(args.run).get("env") or {}
    # The run's own options when the spec is the run's environment; none for another one.
    options = env_cfg.get("options") if env_cfg.get("name") == args.env else None
    env = load_environment(args.env, options)
    files = _files_of(str(args.run_dir), args.run, args.out)
    result = regrade_run(args.run, env, args.env, args.out, files=files, timeout_s=args.timeout)
    print(f"{result.where}: {result.annotated} episodes annotated now, {result.total} in all")
    return 0

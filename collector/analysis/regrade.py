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
``chunk-<uuid>.annot`` (an Arrow IPC file: temp, fsync, rename) and its create-only record
``commit-<seq>.json`` naming it. The record is the commit point: a chunk no record names (a
kill between the two) is an orphan that readers ignore and the next run deletes; the next
run annotates what no record covers, so every episode is annotated exactly once. Two
regrades of one NAME at once are refused by the create-only record (``O_EXCL``).

Recorded tool arguments are the redacted ones (`collector.episode.redact`): a tool whose
outcome depends on a redacted secret replays differently; such an environment should not
declare itself regradable.

Tests: tests/analysis/test_regrade.py
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import math
import os
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from collector.analysis.committed import read_columns, read_committed
from collector.errors import ConfigError, OutputError
from collector.stop import StopReason
from collector.storage.manifest import META_DIR, RESOLVED_CONFIG, fsync_dir

__all__ = ["ANNOTATIONS_DIR", "ANNOTATION_SCHEMA", "RegradeResult", "annotated_table", "apply_annotation",
           "read_annotation", "regrade_command", "regrade_run", "resolved_run_config"]

ANNOTATIONS_DIR = f"{META_DIR}/annotations"
CHUNK_SUFFIX = ".annot"
_RECORD = re.compile(r"commit-(\d{9})\.json")
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


def _records(folder: Path) -> list[tuple[int, Path]]:
    if not folder.is_dir():
        return []
    out = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _RECORD.fullmatch(p.name))]
    return sorted(out)


def read_annotation(run_dir: str | Path, name: str) -> pa.Table:
    """The committed rows of annotation `name` (only chunks a record names). OutputError if absent."""
    folder = _dir(run_dir, name)
    records = _records(folder)
    if not (folder / "meta.json").is_file():
        raise OutputError(f"{folder}: no annotation {name!r} "
                          f"(run `collector regrade RUN --env SPEC --out {name}`)")
    tables = [pa.table({f.name: pa.array([], f.type) for f in ANNOTATION_SCHEMA})]
    for _, record in records:
        try:
            chunk = folder / json.loads(record.read_text())["chunk"]
            with pa.memory_map(str(chunk)) as source:
                tables.append(ipc.open_file(source).read_all())
        except (OSError, ValueError, KeyError, TypeError, pa.ArrowException) as e:
            raise OutputError(f"{record}: unreadable annotation record or chunk ({e})") from e
    return pa.concat_tables(tables)


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


async def _regrade_one(env: Regradable, tasks: dict[str, Any], row: dict[str, Any], grade_max_steps: bool
                       ) -> tuple[float, bool]:
    reason = row["stop_reason"]
    if reason in _INFRA or reason in _KEEP_ZERO:
        return 0.0, False
    if reason == StopReason.MAX_STEPS.value and not grade_max_steps:
        return 0.0, False
    task = tasks.get(row["task_id"])
    if task is None:
        raise ConfigError(f"episode {row['episode_id']}: task {row['task_id']!r} is not among the "
                          "environment's tasks")
    calls = [(c["name"], c["call_id"], c["arguments_json"], c["turn_index"])
             for c in row["executed_tool_calls"] or []]  # in the order they ran
    final = _final_text(row["messages"] or []) if reason == StopReason.DONE.value else None
    value = await env.regrade(task, row, calls, final, TOOL_TIMEOUT_S)
    if not math.isfinite(value):
        raise OutputError(f"episode {row['episode_id']}: the grader returned {value}")
    return value, True


def _create_only(path: Path, payload: dict[str, Any]) -> None:
    """Write `path` once: it must not exist (O_EXCL); fsync it and its directory."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, json.dumps(payload).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(path.parent)


def _write_chunk(folder: Path, table: pa.Table) -> str:
    name = f"chunk-{uuid.uuid4().hex}{CHUNK_SUFFIX}"
    tmp = folder / f"{name}.tmp"
    with pa.OSFile(str(tmp), "wb") as sink, ipc.new_file(sink, ANNOTATION_SCHEMA) as writer:
        writer.write_table(table)
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, folder / name)
    fsync_dir(folder)
    return name


def _clean_orphans(folder: Path, records: list[tuple[int, Path]]) -> None:
    named = {json.loads(p.read_text())["chunk"] for _, p in records}
    for p in folder.iterdir():
        if p.name.startswith("chunk-") and p.name not in named:
            p.unlink()  # a chunk no record names: a kill between its rename and its record


def regrade_run(run_dir: str | Path, env: Regradable, spec: str, name: str = "regrade", batch: int = 256
                ) -> RegradeResult:
    """Annotate every committed episode of `run_dir` not yet in annotation `name` (module docstring).

    Raises ConfigError when the environment cannot be regraded or differs from the one the
    annotation was begun with.
    """
    if not env.regradable:
        raise ConfigError(f"--env {spec}: environment {getattr(env, 'name', spec)!r} does not declare itself "
                          "regradable (Environment.regradable)")
    grader, version = _grader(env)
    folder = _dir(run_dir, name)
    folder.mkdir(parents=True, exist_ok=True)
    meta = {"env": spec, "grader": grader, "grader_version": version}
    try:
        _create_only(folder / "meta.json", {**meta, "created": dt.datetime.now(dt.UTC).isoformat()})
    except FileExistsError:
        begun = json.loads((folder / "meta.json").read_text())
        if {k: begun.get(k) for k in meta} != meta:
            raise ConfigError(f"{folder / 'meta.json'}: annotation {name!r} was begun with grader "
                              f"{begun.get('grader')} {begun.get('grader_version')} ({begun.get('env')}), "
                              f"not {grader} {version}; choose another --out") from None
    records = _records(folder)
    _clean_orphans(folder, records)
    done = set(read_annotation(run_dir, name).column("episode_id").to_pylist())
    loop_cfg = resolved_run_config(run_dir).get("loop") or {}
    grade_max_steps = bool((loop_cfg.get("reward") or {}).get("grade_max_steps", False))
    cols = ["episode_id", "run_id", "task_id", "model", "provider", "budget", "sample", "seed", "env",
            "stop_reason", "executed_tool_calls", "messages"]
    rows = [r for r in read_committed(run_dir, cols).to_pylist() if r["episode_id"] not in done]
    rows.sort(key=lambda r: r["episode_id"])
    total = len(done) + len(rows)
    tasks = {t.id: t for t in env.tasks()}
    seq = records[-1][0] if records else 0

    async def grade_all() -> None:
        nonlocal seq
        for start in range(0, len(rows), batch):
            part = rows[start:start + batch]
            graded = [await _regrade_one(env, tasks, r, grade_max_steps) for r in part]
            now = dt.datetime.now(dt.UTC).isoformat()
            table = pa.table({
                "episode_id": [r["episode_id"] for r in part], "reward": [g[0] for g in graded],
                "graded": [g[1] for g in graded], "grader": [grader] * len(part),
                "grader_version": [version] * len(part), "annotated_at": [now] * len(part),
            }, schema=ANNOTATION_SCHEMA)
            chunk = _write_chunk(folder, table)
            seq += 1
            try:
                _create_only(folder / f"commit-{seq:09d}.json", {"chunk": chunk, "episodes": len(part)})
            except FileExistsError:
                raise OutputError(f"{folder}: commit-{seq:09d}.json appeared meanwhile: another regrade of "
                                  f"{name!r} is running") from None

    asyncio.run(grade_all())
    return RegradeResult(annotated=len(rows), total=total, folder=folder)


def regrade_command(args: Any, load_environment: Callable[[str, Any], Regradable]) -> int:
    """`collector regrade RUN --env SPEC [--out NAME]`; the CLI passes the environment loader
    (`collector.envs.loading.load_environment`: the layer above analysis)."""
    env_cfg = resolved_run_config(args.run).get("env") or {}
    # The run's own options when the spec is the run's environment; none for another one.
    options = env_cfg.get("options") if env_cfg.get("name") == args.env else None
    env = load_environment(args.env, options)
    result = regrade_run(args.run, env, args.env, args.out)
    print(f"{result.folder}: {result.annotated} episodes annotated now, {result.total} in all")
    return 0

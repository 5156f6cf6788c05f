"""One episode of a committed run: find it by id or prefix, list, load and render transcripts.

What `collector show` and `collector episodes` print (`render_episode`, `list_episodes`), and
the same from Python. Each reads only the columns it needs until it finds the shard holding
the episode. Tests: tests/analysis/test_analysis.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from collector.analysis import json_values
from collector.analysis.stats import read_committed
from collector.analysis.tables import load_run
from collector.analysis.terminal import escape_controls
from collector.analysis.where import where_filter
from collector.errors import OutputError
from collector.record.episode import Episode, MessageRecord, ToolCallRecord
from collector.record.shards import ShardError, describe_exception, episodes_from_table, read_shard
from collector.storage.manifest import committed_shard_paths
from collector.storage.mirror import resolve_run

__all__ = [
    "episode_row",
    "get_episode",
    "list_episodes",
    "load_episodes",
    "render_episode",
    "render_transcript",
    "resolve_episode_id",
]


def load_episodes(run_dir: str | Path, ids: Sequence[str] | None = None) -> list[Episode]:
    """Committed episodes as `Episode` objects (all, or those with the given ids)."""
    filt = None if ids is None else ds.field("episode_id").isin(list(ids))
    return episodes_from_table(load_run(run_dir, filter=filt))


def resolve_episode_id(run_dir: str | Path, id_or_prefix: str) -> str:
    """The committed episode id that is `id_or_prefix` or the only one starting with it.

    OutputError (one line) when no committed id starts with it, or more than one does (the
    message names a few of them). Reads only the `episode_id` column.
    """
    ids = read_committed(resolve_run(run_dir), ["episode_id"]).column("episode_id")
    if pc.any(pc.equal(ids, id_or_prefix)).as_py():
        return id_or_prefix
    matches = ids.filter(pc.starts_with(ids, id_or_prefix)).to_pylist() if id_or_prefix else []
    if not matches:
        raise OutputError(f"{run_dir}: no committed episode {id_or_prefix!r}")
    unique = sorted(set(matches))
    if len(unique) > 1:
        shown = ", ".join(unique[:3]) + (", ..." if len(unique) > 3 else "")
        raise OutputError(
            f"{run_dir}: episode id prefix {id_or_prefix!r} matches {len(unique)} episodes ({shown}); "
            "give more of the id"
        )
    return str(unique[0])


def _locate(run_dir: str | Path, episode_id: str) -> tuple[Path, pa.Table]:
    """The committed shard holding `episode_id` and that episode's row of it.

    Only the `episode_id` column of each shard is read until the shard holding it is found.
    """
    for path in committed_shard_paths(resolve_run(run_dir)):
        ids = read_shard(path, ["episode_id"]).column("episode_id")
        hit = pc.index(ids, episode_id).as_py()
        if hit >= 0:
            return path, read_shard(path).slice(hit, 1)
    raise OutputError(f"{run_dir}: no committed episode {episode_id!r}")


def get_episode(run_dir: str | Path, episode_id: str) -> Episode:
    """One committed episode by id; OutputError (one line) when the run has no such episode."""
    path, row = _locate(run_dir, episode_id)
    try:
        return episodes_from_table(row)[0]
    except (ValueError, TypeError, KeyError) as e:
        # Decoded but not an episode (an unknown stop reason, a field of the wrong
        # type): the file's fault, named in one line like any unreadable shard.
        raise ShardError(str(path), f"row of {episode_id!r} is not an episode "
                                    f"({describe_exception(e)})") from e


def episode_row(run_dir: str | Path, episode_id: str) -> dict[str, Any]:
    """One committed episode as its stored row (every column, as plain JSON-ready values)."""
    row: dict[str, Any] = _locate(run_dir, episode_id)[1].to_pylist()[0]
    return row


#: The columns `collector episodes` lists, in order.
LISTING_COLUMNS = ("episode_id", "model", "budget", "task_id", "sample", "stop_reason", "num_turns", "reward")


def list_episodes(run_dir: str | Path, where: Mapping[str, str] | Sequence[str] | None = None,
                  limit: int | None = None) -> pa.Table:
    """Committed episodes passing every filter of `where` (`LISTING_COLUMNS`), by id.

    `where` holds ``COLUMN OP VALUE`` filters in the grammar `collector export` reads
    (`collector.analysis.where`: ``budget>=64``, ``stop_reason=length,max_steps``), or a
    mapping of column to the value it must equal. An unknown column, a value of the wrong
    type or an unknown stop reason is a one-line ConfigError.
    """
    terms = [f"{c}={v}" for c, v in where.items()] if isinstance(where, Mapping) else list(where or ())
    filt, _ = where_filter(terms)
    table = read_committed(resolve_run(run_dir), list(LISTING_COLUMNS), filt)
    table = table.sort_by([("model", "ascending"), ("budget", "ascending"), ("task_id", "ascending"),
                           ("sample", "ascending"), ("episode_id", "ascending")])
    return table if limit is None else table.slice(0, limit)


def format_listing(table: pa.Table, fmt: str) -> str:
    """`collector episodes` output: an aligned table (header, one row per episode) or JSON lines."""
    rows = table.to_pylist()
    if fmt == "json":
        return "\n".join(json_values.dumps(row) for row in rows)
    header = list(table.column_names)
    cells = [[("-" if row[c] is None else f"{row[c]:g}" if isinstance(row[c], float) else str(row[c]))
              for c in header] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def render_episode(run_dir: str | Path, episode_id: str, fmt: str = "text", *, terminal: bool = False) -> str:
    """What `collector show` prints: the readable transcript, or (`fmt="json"`) the stored row.

    `episode_id` may be a unique prefix of a committed id (`resolve_episode_id`). With
    `terminal`, the transcript's control characters are shown as escapes (`escape_controls`):
    model output must not drive the terminal it is read on. JSON escapes them by itself.
    """
    full_id = resolve_episode_id(run_dir, episode_id)
    if fmt == "json":
        return json_values.dumps(episode_row(run_dir, full_id), indent=2)
    text = render_transcript(get_episode(run_dir, full_id))
    return escape_controls(text) if terminal else text


# --- transcript rendering -------------------------------------------------------------------


def _yn(flag: bool) -> str:
    return "yes" if flag else "no"


def _indent(text: str, prefix: str = "    ") -> str:
    # Lines end at newlines only: splitlines() would also break at CR, form feeds and U+2028,
    # hiding an overprinting CR from the terminal escaping in `render_episode`.
    return "\n".join(prefix + line for line in text.rstrip("\n").split("\n")) if text else ""


def _call_text(call: ToolCallRecord, executed: set[tuple[int | None, str]], turn: int | None) -> str:
    if call.arguments_json is None:
        chars = f"{call.unparsed_chars} chars" if call.unparsed_chars is not None else "fragment"
        args = f"<{call.status}: {chars} not parsed, not stored>"
    else:
        args = call.arguments_json
        if call.status != "ok":
            args += f"  ({call.status})"
    # No turn: a few-shot call of the task's prompt, written by the task's author, never run.
    ran = "in the prompt" if turn is None else "executed" if (turn, call.id) in executed else "not executed"
    return f"  -> {call.name} [{call.id}] {args}  <{ran}>"


def _message_text(m: MessageRecord, executed: set[tuple[int | None, str]]) -> list[str]:
    # Assistant messages and tool results without a turn are the prompt's few-shot examples.
    if m.role == "tool":
        where = " . prompt" if m.turn_index is None else ""
        tag = f"[tool {m.name or '?'} . {m.call_id}{' . error' if m.is_error else ''}{where}]"
    elif m.role == "assistant":
        tag = f"[assistant . turn {m.turn_index}]" if m.turn_index is not None else "[assistant . prompt]"
    else:
        tag = f"[{m.role}]"
    out = [tag]
    if m.text:
        out.append(_indent(m.text))
    out.extend(_call_text(c, executed, m.turn_index) for c in m.tool_calls)
    return out


def trainable_text(ep: Episode) -> str:
    """`trainable` with what it means for this episode: whether it is a training row, and why a
    cut one is one (README: a cut turn ends the episode as a zero-reward row, kept to train on)."""
    if not ep.trainable:
        return (f"no (ended as {ep.stop_reason.value}: a failure or a clock, not the model's doing; "
                "leave it out of training)")
    if ep.stop_reason.value in ("length", "malformed_tool_call", "context_overflow"):
        return f"yes (a training row with reward {ep.reward:g}: the model's own {ep.stop_reason.value})"
    return "yes (a training row)"


def render_transcript(ep: Episode) -> str:
    """An episode as text: header, per-turn table, then the messages with their tool calls."""
    graded = "-" if ep.graded_reward is None else f"{ep.graded_reward:g}"
    lines = [
        f"episode {ep.episode_id}   run {ep.run_id}",
        f"model {ep.model} ({ep.provider})   budget {ep.budget}   env {ep.env}   task {ep.task_id}   "
        f"sample {ep.sample}   seed {ep.seed}",
        f"stop_reason {ep.stop_reason.value}   truncated {_yn(ep.is_truncated)}   reward {ep.reward:g}   "
        f"graded {graded}",
        f"trainable {trainable_text(ep)}",
        f"turns {ep.num_turns}   tool calls {ep.num_tool_calls} ({len(ep.executed_tool_calls)} executed, "
        f"{ep.tool_errors} errors)   tokens in {ep.input_tokens} out {ep.output_tokens} "
        f"(wasted {ep.wasted_output_tokens})   {ep.duration_s:.2f}s"
        + (f"   worker {ep.worker}" if ep.worker else "") + (f"   node {ep.node}" if ep.node else ""),
    ]
    if ep.error is not None:
        lines.append(f"error {ep.error.type}: {ep.error.message}")
    lines += ["", "turn  finish (raw)                     out/cap     latency  notes"]
    for t in ep.turns:
        notes = []
        if t.length_signals:
            notes.append("cut: " + ",".join(t.length_signals))
        if t.incomplete_reason:
            notes.append(f"incomplete: {t.incomplete_reason}")
        if t.repairs:
            notes.append("repaired: " + ",".join(t.repairs))
        if t.malformed_calls:
            notes.append(f"{t.malformed_calls} malformed")
        if t.unparsed_tool_call:
            notes.append("unparsed tool call in text")
        if t.invisible_output:
            notes.append("invisible output (tokens spent, nothing shown)")
        if t.retries:
            notes.append("retried: " + ",".join(t.retries))
        if t.response_model and t.response_model != ep.model:
            notes.append(f"answered by {t.response_model}")
        if t.discarded:
            notes.append("discarded")
        finish = f"{t.finish_class} ({t.raw_finish_reason})"
        lines.append(f"{t.index:>4}  {finish:<32} {f'{t.output_tokens}/{t.max_output_tokens}':>9}  "
                     f"{t.latency_s:>7.2f}s  {'; '.join(notes)}".rstrip())
    executed: set[tuple[int | None, str]] = {(c.turn_index, c.call_id) for c in ep.executed_tool_calls}
    lines.append("")
    for m in ep.messages:
        lines.extend(_message_text(m, executed))
    return "\n".join(lines)


"""`collector check RUN_DIR`: verify every committed shard against the invariants we promise.

The collector exists to keep a handful of promises (see ../shared/seeds and the issue):
a turn cut by the output cap never acts on the world; every tool call id is settled
exactly once; the stop_on reasons carry reward 0; errors are never training data; and
each episode is in the data exactly once. The episode loop enforces them as it runs; this
module re-derives them from the stored rows alone, so a trainer (or a CI job) can trust a
run directory it did not watch being written. Checked, per committed shard:

1. the file reads and validates; its size and sha256 equal those recorded at commit (when
   the manifest has them); its schema equals `collector.record.shards.SCHEMA` (names and types)
   and its metadata carries `SCHEMA_VERSION`; its row count and partition match the manifest;
2. episode ids are unique across the run and equal `collector.record.episode.episode_id` of the
   row's run, task, sample, model and budget;
3. no executed tool call comes from a turn cut by the output cap (whatever stop_on says:
   nothing from a cut turn ever runs), from a discarded turn, or from a call whose arguments
   were malformed; with `length` in stop_on a cut turn is the episode's last and its stop
   reason is `length` (likewise a malformed turn and `malformed_tool_call`);
4. every call id of an assistant message is settled by exactly one tool result before the
   next assistant message (or the end), and no tool result settles an unknown id;
5. reward is 0 for the stop_on reasons (at most 0 under the `grade_then_clamp` policy);
6. `error` episodes are not trainable and carry an error record; `timeout` episodes are not
   trainable (a wall-clock limit depends on the infrastructure, not only on the model).

stop_on and the reward policy come from ``.collector/config.resolved.json`` (both stop_on
reasons and policy "zero" when it is missing). A damaged file is one line naming it, never
a crash.

7. every file a plain reader would see (anything outside ``.collector/``) is a committed
   shard: a stray file (a shard copied in by hand, an orphan, anything else) is a problem,
   since a glob or `pd.read_parquet(run)` would read it or fail on it. Listed as notes:
   a committed shard still waiting in ``.collector/tmp/`` (a crash between the manifest
   swap and its move: plain readers miss it until the next `collector run` moves it), and
   uncommitted temp files and quarantined files (hidden from every reader). A run dir
   of the layout before ``.collector/`` gets one note saying plain readers trip on it.
8. every stored token id is at least 0 and below its turn's vocabulary size
   (`collector.analysis.check_tokens`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from collector.analysis.check_tokens import token_id_problems
from collector.errors import OutputError
from collector.record.episode import SCHEMA_VERSION, episode_id
from collector.record.shards import (
    CHAT_COLUMNS,
    SCHEMA,
    ShardError,
    describe_exception,
    read_shard,
    schema_version_of,
)
from collector.stop import STOP_ON_CHOICES, StopReason
from collector.storage.manifest import (
    LEGACY_MANIFEST,
    META_DIR,
    QUARANTINE,
    RESOLVED_CONFIG,
    TMP_DIR,
    TMP_SUFFIX,
    NotARunDirectory,
    file_digest,
    is_legacy,
    pending_path,
    read_manifest,
    shard_location,
)

__all__ = ["MAX_PROBLEMS", "CheckReport", "check_run"]

#: Shard schema versions checked (2: before the chat-template block, read alike without it).
_READABLE_VERSIONS = (2, SCHEMA_VERSION)

#: At most this many problems are listed; the rest are counted.
MAX_PROBLEMS = 200

_ROW_COLUMNS = [
    "episode_id", "run_id", "task_id", "sample", "model", "provider", "budget", "stop_reason", "trainable",
    "reward", "turns", "messages", "executed_tool_calls",
]

# The fields of the nested columns that the row checks read. Turning whole rows into Python
# objects (message text, arguments, token counts) was most of the cost of a check (62 us a
# row over 200k rows); casting each nested column down to these fields first leaves that
# work in Arrow. A nested dict is a list<struct> field projected the same way.
_Spec = tuple["str | dict[str, _Spec]", ...]
_NESTED: dict[str, _Spec] = {
    "turns": ("index", "finish_class", "discarded", "malformed_calls", "unparsed_tool_call"),
    "messages": ("role", "turn_index", "call_id", {"tool_calls": ("id", "status")}),
    "executed_tool_calls": ("turn_index", "call_id", "name"),
}


def _projected_type(full: pa.DataType, spec: _Spec) -> pa.DataType:
    """`full` (a list<struct>) with only the struct fields `spec` names, nested alike."""
    struct = full.value_type
    fields = []
    for item in spec:
        if isinstance(item, dict):
            ((name, sub),) = item.items()
            f = struct.field(name)
            fields.append(pa.field(name, _projected_type(f.type, sub), nullable=f.nullable))
        else:
            fields.append(struct.field(item))
    return pa.list_(pa.struct(fields))


_PROJECTED = {name: _projected_type(SCHEMA.field(name).type, spec) for name, spec in _NESTED.items()}


def _rows(table: pa.Table) -> list[dict[str, Any]]:
    """The rows as dicts of just what `_check_row` reads (`has_error` stands in for `error`)."""
    columns = {}
    for name in _ROW_COLUMNS:
        column = table.column(name)
        columns[name] = column.cast(_PROJECTED[name]) if name in _PROJECTED else column
    # A dictionary column converts element by element (4.5 us a row); its string cast does not.
    columns["stop_reason"] = columns["stop_reason"].cast(pa.string())
    columns["has_error"] = pc.is_valid(table.column("error"))
    if "reasoning" in table.column_names:  # the sweep's reasoning axis (issue 16) names ids too
        columns["reasoning"] = table.column("reasoning")
    rows: list[dict[str, Any]] = pa.table(columns).to_pylist()
    return rows


@dataclass(slots=True)
class CheckReport:
    """The outcome of `check_run`: `ok` when no problem was found."""

    run_dir: str
    problems: list[str] = field(default_factory=list)
    """One line each, naming the file (and episode) at fault."""
    notes: list[str] = field(default_factory=list)
    """Findings that are not errors in the committed data (orphan or quarantined files)."""
    shards: int = 0
    episodes: int = 0
    found: int = 0
    """Problems found, including those beyond MAX_PROBLEMS that are counted but not listed."""

    @property
    def ok(self) -> bool:
        return not self.problems

    def add(self, problem: str) -> None:
        self.found += 1
        if self.found <= MAX_PROBLEMS:
            self.problems.append(problem)
        elif self.found == MAX_PROBLEMS + 1:
            self.problems.append(f"... more problems not listed (first {MAX_PROBLEMS} shown)")

    def summary(self) -> str:
        """One line: shards and episodes checked, and ok or how many problems."""
        state = "ok" if self.ok else f"{self.found} problem(s)"
        return f"{self.run_dir}: {self.shards} shards, {self.episodes} episodes: {state}"


@dataclass(slots=True, frozen=True)
class _Policy:
    stop_on: frozenset[str]
    clamp: bool
    """True under grade_then_clamp: a stop_on episode's reward may be negative, never positive."""


def _policy(root: Path, report: CheckReport) -> _Policy:
    default = _Policy(frozenset(r.value for r in STOP_ON_CHOICES), clamp=False)
    path = root / (RESOLVED_CONFIG.rsplit("/", 1)[-1] if is_legacy(root) else RESOLVED_CONFIG)
    try:
        config = json.loads(path.read_text())["config"]
        loop = config.get("loop", {})
        stop_on = loop.get("stop_on", [r.value for r in STOP_ON_CHOICES])
        policy = loop.get("reward", {}).get("policy", "zero")
        return _Policy(frozenset(stop_on), clamp=policy == "grade_then_clamp")
    except FileNotFoundError:
        report.notes.append(f"{RESOLVED_CONFIG} missing: assuming both stop_on reasons, reward policy zero")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        report.add(f"{RESOLVED_CONFIG}: unreadable ({describe_exception(e)})")
    return default


def check_run(run_dir: str | Path) -> CheckReport:
    """Verify every committed shard of `run_dir`; never raises for damaged data.

    A path that is not a run directory at all (no manifest) is bad input, not a problem
    found: `NotARunDirectory` is raised (the command line's exit code 2).
    """
    root = Path(run_dir)
    report = CheckReport(run_dir=str(run_dir))
    try:
        manifest = read_manifest(root)
    except NotARunDirectory:
        raise
    except OutputError as e:
        report.add(str(e))
        return report
    if manifest.get("schema_version") not in _READABLE_VERSIONS:
        report.add(f"manifest: schema version {manifest.get('schema_version')}, expected {SCHEMA_VERSION}")
    policy = _policy(root, report)
    seen: dict[str, str] = {}
    listed = set()
    for entry in manifest["shards"]:
        rel = str(entry.get("path"))
        if rel in listed:  # its rows are committed once: read it once (the next run repairs it)
            report.add(f"{rel}: named twice in the manifest")
            continue
        listed.add(rel)
        report.shards += 1
        table = _read_checked(root, rel, entry, report)
        if table is None:
            continue
        report.episodes += table.num_rows
        for row in _rows(table):
            _check_row(rel, row, policy, seen, report)
        for problem in token_id_problems(rel, table):
            report.add(problem)
    if is_legacy(root):
        report.notes.append(f"old run-dir layout ({LEGACY_MANIFEST} at the top): plain readers (pandas, "
                            "HF datasets) trip on its sidecar files; collector readers do not")
    else:
        _strays(root, listed, report)
    return report


def _read_checked(root: Path, rel: str, entry: dict[str, Any], report: CheckReport) -> pa.Table | None:
    path = shard_location(root, rel)
    if not path.exists():
        report.add(f"{rel}: named in the manifest but missing")
        return None
    try:
        size, checksum = file_digest(path)
        table = read_shard(path)
    except ShardError as e:
        report.add(f"{rel}: unreadable or not of the collector's schema ({e.reason})")
        return None
    except Exception as e:  # noqa: BLE001 - a damaged file of any kind is reported, never raised
        report.add(f"{rel}: unreadable or not of the collector's schema ({describe_exception(e)})")
        return None
    # Recorded at commit (absent in older manifests): damage that still decodes shows here.
    if entry.get("size") is not None and size != entry["size"]:
        report.add(f"{rel}: {size} bytes, the manifest says {entry['size']}")
    elif entry.get("checksum") is not None and checksum != entry["checksum"]:
        report.add(f"{rel}: checksum differs from the one recorded at commit (file damaged)")
    version = schema_version_of(table.schema)
    if version not in _READABLE_VERSIONS:
        report.add(f"{rel}: schema version {version}, expected {SCHEMA_VERSION}")
    # A version-2 shard lacks the chat-template block and nothing else; the rest is checked alike.
    absent = set(CHAT_COLUMNS) if version == 2 else set()
    bad = [f.name for f in SCHEMA if f.name not in absent and (f.name not in table.schema.names
           or not table.schema.field(f.name).type.equals(f.type))]
    extra = [n for n in table.schema.names if SCHEMA.get_field_index(n) < 0]
    if bad or extra:
        report.add(f"{rel}: schema differs from the collector's (columns {', '.join(bad + extra)})")
        return None
    if table.num_rows != entry.get("rows"):
        report.add(f"{rel}: {table.num_rows} rows, the manifest says {entry.get('rows')}")
    for column, want in (("model", entry.get("model")), ("budget", entry.get("budget"))):
        values = set(table.column(column).unique().to_pylist())
        if want is not None and values - {want}:
            strays = sorted(values - {want}, key=str)
            report.add(f"{rel}: rows with {column} {strays} in the partition of {want}")
    return table


def _check_row(
    rel: str, row: dict[str, Any], policy: _Policy, seen: dict[str, str], report: CheckReport
) -> None:
    eid = row["episode_id"]
    where = f"{rel}: episode {eid}"
    if eid in seen:
        report.add(f"{where}: duplicate episode id (also in {seen[eid]})")
    else:
        seen[eid] = rel
    expected = episode_id(row["run_id"], row["task_id"], row["sample"], row["model"], row["budget"])
    # A sweep over several providers names the model as "provider/model" in the id
    # (collector.run.plan), so the same model under two providers gets two ids; that second
    # hash is computed only when the first does not match.
    # A sweep with a reasoning axis adds "@<setting>" to either (issue 16).
    names = [f"{row['provider']}/{row['model']}"]
    if row.get("reasoning") is not None:
        names = [f"{n}@{row['reasoning']}" for n in (row["model"], *names)]
    if eid != expected and all(
        eid != episode_id(row["run_id"], row["task_id"], row["sample"], n, row["budget"]) for n in names
    ):
        report.add(f"{where}: id is not episode_id(run, task, sample, model, budget) = {expected}")
    reason = row["stop_reason"]
    turns = row["turns"]
    cut = {t["index"] for t in turns if t["finish_class"] == "length"}
    discarded = {t["index"] for t in turns if t["discarded"]}
    malformed_ids = {
        (m["turn_index"], c["id"])
        for m in row["messages"] if m["role"] == "assistant"
        for c in m["tool_calls"] if c["status"] == "malformed"
    }
    for call in row["executed_tool_calls"]:
        turn = call["turn_index"]
        what = f"{where}: tool {call['name']} [{call['call_id']}] executed"
        if turn in cut:
            report.add(f"{what} from turn {turn}, which was cut by the output-token limit")
        elif turn in discarded:
            report.add(f"{what} from discarded turn {turn}")
        if (turn, call["call_id"]) in malformed_ids:
            report.add(f"{what} with malformed arguments")
    last = turns[-1]["index"] if turns else None
    if StopReason.LENGTH in policy.stop_on and cut:
        first_cut = min(cut)
        if reason != StopReason.LENGTH or first_cut != last:
            report.add(f"{where}: turn {first_cut} was cut but the episode went on or ended as {reason} "
                       "(length is in stop_on)")
    if StopReason.MALFORMED_TOOL_CALL in policy.stop_on:
        bad_turns = [t["index"] for t in turns if t["index"] not in cut
                     and (t["malformed_calls"] > 0 or t["unparsed_tool_call"])]
        if bad_turns and (reason != StopReason.MALFORMED_TOOL_CALL or bad_turns[0] != last):
            report.add(f"{where}: turn {bad_turns[0]} had a malformed tool call but the episode went on or "
                       f"ended as {reason} (malformed_tool_call is in stop_on)")
    for problem in _settlement(row["messages"]):
        report.add(f"{where}: {problem}")
    reward = row["reward"]
    if reason in policy.stop_on and (reward > 0 if policy.clamp else reward != 0):
        report.add(f"{where}: reward {reward} for a {reason} episode (stop_on reasons carry reward 0)")
    if reason == StopReason.ERROR:
        if row["trainable"]:
            report.add(f"{where}: error episode marked trainable")
        if not row["has_error"]:
            report.add(f"{where}: error episode without an error record")
    elif reason == StopReason.TIMEOUT and row["trainable"]:
        report.add(f"{where}: timeout episode marked trainable")


def _settlement(messages: Iterable[dict[str, Any]]) -> list[str]:
    """Problems with call settlement: each call id answered once, in the turn it arose."""
    problems: list[str] = []
    pending: dict[str, int] = {}
    opened_at: int | None = None

    def close() -> None:
        for call_id in pending:
            problems.append(f"call {call_id} of turn {opened_at} was never settled")
        pending.clear()

    for m in messages:
        if m["role"] == "assistant":
            close()
            opened_at = m["turn_index"]
            for c in m["tool_calls"]:
                if c["id"] in pending:
                    problems.append(f"call id {c['id']} appears twice in turn {opened_at}")
                pending[c["id"]] = 0
        elif m["role"] == "tool":
            call_id = m["call_id"]
            if call_id in pending:
                del pending[call_id]
            else:
                problems.append(f"tool result for {call_id}, which no open call of the current turn has "
                                "(unknown, or settled twice)")
    close()
    return problems


def _strays(root: Path, listed: set[str], report: CheckReport) -> None:
    """Rule 7: every file a plain reader sees is committed; hidden leftovers are notes."""
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if rel == META_DIR or rel.startswith(f"{META_DIR}/") or not path.is_file() or rel in listed:
            continue
        report.add(f"{rel}: stray file, not in the manifest: plain readers (a glob, pd.read_parquet(run)) "
                   "would read it or fail on it; move it out of the run dir (the next collector run "
                   f"moves it to {QUARANTINE}/)")
    pending = {pending_path(root, rel).name: rel for rel in listed}
    tmp = root / TMP_DIR
    for path in sorted(tmp.iterdir()) if tmp.is_dir() else []:
        if path.name in pending:
            if not (root / pending[path.name]).exists():  # committed: not stray, only not yet in sight
                report.notes.append(f"{pending[path.name]}: committed but still in {TMP_DIR}/ (interrupted "
                                    "commit): plain readers miss it until the next collector run moves it")
        elif path.name.endswith(TMP_SUFFIX):
            report.notes.append(f"{TMP_DIR}/{path.name}: temporary file of an interrupted commit, hidden "
                                "from readers (removed on the next run)")
    quarantine = root / QUARANTINE
    if quarantine.is_dir():
        for path in sorted(quarantine.iterdir()):
            report.notes.append(f"{QUARANTINE}/{path.name}: moved aside on an earlier open (not in the data)")

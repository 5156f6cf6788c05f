"""Follow a run: its committed episodes, in commit order, as they land (issue 27).

    from collector.analysis.follow import follow
    for batch in follow("runs/sweep", since=cursor, groups="complete"):
        train_on(batch.table)          # an Arrow table: one commit's new rows (or complete groups)
        save(batch.cursor)             # resume after it: follow(run, since=batch.cursor)

    collector follow RUN [--since CURSOR] [--format jsonl|arrow] [--groups complete] [--forever]

The follower only reads what is committed, through the run's on-disk format alone (the base
``.collector/manifest.json``, the commit log ``.collector/commit-<seq>.json``, the shards it
names, read with `read_shard`); nothing in the collector waits on it. A run in object
storage (``s3://bucket/prefix``) is followed through its local mirror, synced at each poll
(`collector.storage.mirror.resolve_run`).

Output of ``collector follow``: ``--format jsonl`` (default) writes one line per episode,
``{"cursor": ..., "seq": <commit>, ["group_errors": <its group's errors>,] "episode": {<row>}}``,
flushed after each batch; ``--format arrow`` writes one Arrow IPC stream, the shard columns
plus ``cursor``, a record batch per `Batch` (an empty run: the schema, no batch). Bad input
(no run, a cursor that is not one, torn, or another run's) is one line on stderr and exit 2.

Guarantees
----------
- Only committed data: a row is delivered once a commit record (or the base) names its shard.
- Commit order: rows come in the order of the commit log; within a commit, in the record's
  shard order and each shard's row order (the "stream").
- Resume, exactly: every delivered row (every jsonl line, every row of an Arrow batch) has a
  cursor; ``since=that cursor`` delivers exactly the rows after it: each committed episode
  once per cursor history, none before its commit, none twice. Where that cannot be told
  (below), the follower refuses in one line naming the run and the cursor: never a silent skip.
- Memory: one commit's rows (a commit folded into the base before the follower read it
  comes shard by shard), plus, with ``groups="complete"``, the samples of incomplete groups.

Cursor. ``STORE:SEQ.N.LAST[+K:SHARD:ROW]``: the run's store (`store_identity`: 12 hex digits
of the manifest's ``store_id``, made with the run; not the episodes' ``run_id``, which comes
from the config), an anchor, the committed state after commit SEQ,
which held N shards, the last named LAST (its file name without extension, ``-`` for none),
then K lines of output after that anchor, the K-th being row ROW of shard SHARD. Grouped
cursors start with ``g``; their anchor is the last state at which no group was held (the
low-water mark), and K counts the lines released since, so a resume re-reads the held
samples from the anchor and skips the K lines already delivered. Every part is required: a
cursor of another run (even ``STORE:0.0.-``, the start, which would match any run), one cut
short (``...+``) or in another form is refused in one line, never read as another position.
A resume checks that its K-th line is still row ROW of SHARD: a forget or a repair folded
into the base since can move rows after the anchor, and skipping K lines would then skip
rows never delivered; such a cursor is refused in one line (resume from its anchor, getting
some rows again, or from the start). A run created before store ids is identified by its
fingerprint and creation time.

Compaction. The writer folds the log into a new base now and then (``log_through`` = the
last record folded), then deletes the folded records. A follower whose anchor is at or
after the base's ``log_through`` reads the records after it. One behind the base reads the
entries' ``"seq"``: the seq of the commit that first committed the entry's rows, which the
store writes into every entry it commits (`collector.storage.commit`), a forget's
replacement keeping the seq of the shard it replaces. The anchor's state is the entries with
a seq at or below the anchor's, and the rows after it are the others: exact across
compactions, ``--retry-errors`` forgets and repairs. A run written before that field (some
entry without it) is read as follows: the base's entries do not say which commit added them
(path, rows, model, budget, size, checksum, an ISO ``committed`` time of one-second
resolution). But the base lists its shards
in commit order (a fold appends each record's additions; a forget removes entries and
appends their replacements), and only a forget or a repair ever removes one. So when the
first N entries of the base are the anchor's N shards (its last one, LAST, is still the
N-th), nothing of the anchor's state was removed, and exactly the entries after the N-th
were committed after it: those are delivered (as one catch-up step at the base's seq). When
they are not (a ``--retry-errors`` forget or a repair of a shard at or before the anchor,
folded before the follower came back), no exact answer exists in today's format: the
follower stops with one line naming the run and the cursor. A forget or a repair of a shard
*after* the anchor while a cursor has K > 0 lines into it is caught by the cursor's place
check (above): refused in one line.

Forget (``collector run --retry-errors``). The store writes a ``forget`` record: the shards
holding error episodes are replaced by shards without them. A follower delivers nothing for
it (the replacements hold rows it delivered already) and does not retract the error rows it
delivered. The retried episodes are then committed like any other, with the same
``episode_id`` as the error they replace: a consumer sees the error first, its retry later
(keep the last row per id to get the run's final state). With ``groups="complete"`` a
retried sample's group was released already (with its error counted), so the retry is held
as a new incomplete group and reported at the end; follow without groups to train on retries.

Groups. With ``groups="complete"`` a sample is released only with its whole group: the
episodes of one task, model, budget (and provider and reasoning setting, where the run has
those axes), samples ``0 .. samples_per_task-1`` (``.collector/config.resolved.json`` when
the follower starts; a cursor resumes exactly while it is unchanged). A group is released
once every sample is committed, error episodes included: a batch counts its error episodes
(`Batch.errors`; each jsonl line has its group's, ``"group_errors"``), and the trainer
decides (drop the group, or mask the errors). A released group's rows are together, samples
in order: group i is rows ``i*size .. i*size+size-1``. Groups still incomplete when the
follower ends are reported (`Follower.held`; the CLI prints one line on stderr).

The end. Nothing marks a run complete (a finished sweep and an interrupted one leave the
same files, and a later ``collector run`` may widen it), so the follower ends after the first
read that began once the writer's lock was seen released (the writer released it after its
last commit, so that read holds everything it committed): locally,
no flock on ``.collector/run.lock`` (read from ``/proc/locks``, so the follower never takes
a lock a starting writer would be refused by; where it is unreadable the writer counts as
present; a writer on another host of a network filesystem does not show there: follow such a
run with ``forever``); in object storage, no ``run.lock`` object, or one whose lease expired,
read from the bucket itself and judged on the store's clock as the writer's own takeover rule
judges it (`collector.storage.s3lease.lease_held`: the answer's ``Date`` against the object's
``LastModified``), never on this reader's clock, which may run ahead or behind by minutes.
With ``forever=True`` (``--forever``) it keeps polling.

The start. A follower started before its run (a trainer launched first) waits up to
``wait_s`` seconds (``--wait SECONDS``; 0 by default: no run is an error at once) for the
run's manifest to appear, then follows it to its end as above: the writer takes the run's
lock before it writes the manifest, so a run that has just appeared is never taken for one
that has ended.

Tests: tests/analysis/test_follow_faults.py (a finished run's cursors after ``--retry-errors``,
torn and foreign cursors, an S3 follower with its clock ahead); tests/analysis/test_follow.py
(compaction behind the cursor, forget, groups, the end,
a SIGKILLed ``collector follow`` process resumed from its last printed cursor against a
running ``collector run``, locally and in a moto bucket); tests/system/analysis/test_follow_example.py
runs examples/follow_trainer.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc

from collector.analysis.regrade import apply_annotation
from collector.errors import OutputError
from collector.record.episode import Episode
from collector.record.shards import ShardError, episodes_from_table, read_shard
from collector.storage.manifest import (
    LOCK,
    MANIFEST,
    RESOLVED_CONFIG,
    NotARunDirectory,
    commit_record_path,
    pending_path,
)

__all__ = ["Batch", "Cursor", "FollowError", "Follower", "follow"]

Groups = Literal["all", "complete"]

#: Columns that tell two cells apart besides task, model and budget, where the run has them.
_GROUP_AXES = ("task_id", "provider", "model", "budget", "reasoning")
#: How often one poll reads again when the base changed under it (a compaction in between).
_ATTEMPTS = 20
#: ``[g]STORE:SEQ.N.LAST[+K:SHARD:ROW]``: every part required, digits without sign or leading junk.
_NAME = r"[A-Za-z0-9_][A-Za-z0-9_-]*"
_CURSOR = re.compile(rf"(g?)([0-9a-f]{{12}}):(\d{{1,18}})\.(\d{{1,18}})\.(-|{_NAME})"
                     rf"(?:\+([1-9]\d{{0,17}}):({_NAME}):(\d{{1,18}}))?")
#: The columns that carry each row's place in its shard through grouping (dropped before delivery).
_SHARD_COL, _ROW_COL = "__follow_shard", "__follow_row"


def store_identity(base: dict[str, Any]) -> str:
    """The run a cursor belongs to: its manifest's ``store_id`` (made when the run was created,
    kept by every later writer and compaction); for a run created before store ids, a digest of
    its fingerprint and creation time."""
    store_id = base.get("store_id")
    if isinstance(store_id, str) and re.fullmatch(r"[0-9a-f]{12,}", store_id):
        return store_id[:12]
    made = f"{base.get('fingerprint')}|{base.get('created')}".encode()
    return hashlib.sha256(made).hexdigest()[:12]


class FollowError(OutputError):
    """The run cannot be followed from this cursor (one line naming the run and the cursor)."""


@dataclass(frozen=True)
class Cursor:
    """A position in a run's delivery stream: in the run of store `store` (`store_identity`),
    after the state `seq` (`shards` shards, the last `last`), then `lines` lines of output, the last of them
    row `at[1]` of shard `at[0]`. `grouped` cursors anchor at a low-water mark."""

    store: str
    seq: int
    shards: int
    last: str
    lines: int = 0
    grouped: bool = False
    at: tuple[str, int] | None = None

    def __str__(self) -> str:
        text = f"{'g' if self.grouped else ''}{self.store}:{self.seq}.{self.shards}.{self.last or '-'}"
        if self.lines and self.at is not None:
            text += f"+{self.lines}:{self.at[0]}:{self.at[1]}"
        return text

    @classmethod
    def parse(cls, text: str, where: str) -> Cursor:
        m = _CURSOR.fullmatch(text.strip())
        if m is None:
            raise FollowError(f"{where}: {text!r} is not a follow cursor (STORE:SEQ.N.LAST[+K:SHARD:ROW], as "
                              "`collector follow` prints it; a cursor from before store ids: follow from the "
                              "start)")
        g, store, seq, shards, last, lines, stem, row = m.groups()
        at = (stem, int(row)) if lines is not None else None
        return cls(store, int(seq), int(shards), "" if last == "-" else last, int(lines or 0), bool(g), at)


@dataclass(frozen=True)
class Batch:
    """Rows delivered together: one commit's new rows (or the groups it completed).

    `cursor` resumes after the whole batch, `row_cursors[i]` after row i. `seq` is the commit
    they belong to (the base's `log_through` for rows caught up from a compacted base)."""

    table: pa.Table
    seq: int
    row_cursors: list[str]
    groups: int = 0
    """Grouped mode: how many groups have rows here (all whole, but for the first batch of a
    follower resumed from a cursor inside a group: that group's rest)."""
    errors: int = 0
    group_errors: list[int] = field(default_factory=list)
    """Grouped mode: per row, the error episodes of its group."""

    @property
    def cursor(self) -> str:
        return self.row_cursors[-1]

    def episodes(self) -> list[Episode]:
        """The rows as `Episode` objects (in the table's order)."""
        return episodes_from_table(self.table)


@dataclass
class _State:
    """A committed state: after commit `seq`, the shard paths named, in order."""

    seq: int
    paths: list[str]

    def anchor(self, run: str, grouped: bool) -> Cursor:
        last = _stem(self.paths[-1]) if self.paths else ""
        return Cursor(run, self.seq, len(self.paths), last, 0, grouped)


@dataclass
class _Step:
    """What one commit record (or a catch-up from the base) adds to the stream."""

    after: _State
    new: list[dict[str, Any]]
    record: bool = True
    """From a commit record (delivered as one table); False: caught up from the base (shard by shard)."""


def _stem(path: str) -> str:
    name = path.rsplit("/", 1)[-1]
    return name.rsplit(".", 1)[0]


def _read_json(path: Path) -> Any:
    """The JSON in `path`, or None when it does not exist (yet, or any more)."""
    try:
        return json.loads(path.read_bytes())
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError) as e:
        raise FollowError(f"{path} is unreadable: {e}") from e


def _paths(entries: Sequence[dict[str, Any]]) -> list[str]:
    """Entry paths, each once (a damaged manifest naming a file twice counts it once, as every
    collector reader does)."""
    return list(dict.fromkeys(str(e["path"]) for e in entries))


class Follower:
    """Iterate to get `Batch`es as commits land (see the module docstring); `cursor` is where
    the last one left off, `held` the (groups, samples) still incomplete."""

    def __init__(self, run: str | Path, since: str | None = None, *, groups: Groups = "all",
                 forever: bool = False, poll_s: float = 1.0,
                 sleep: Callable[[float], None] = time.sleep, annotation: str | None = None,
                 wait_s: float = 0.0, clock: Callable[[], float] = time.monotonic) -> None:
        if groups not in ("all", "complete"):
            raise FollowError(f"{run}: groups must be 'all' or 'complete', got {groups!r}")
        self.run = str(run)
        self.grouped = groups == "complete"
        self.forever = forever
        self.poll_s = poll_s
        self.wait_s = wait_s
        """How long to wait for a run that has not started (no manifest yet) before giving up."""
        self._clock = clock
        self.annotation = annotation
        """A regrade (`collector regrade --out NAME`) whose rewards replace the stored ones."""
        self._sleep = sleep
        self._object = self.run.startswith("s3://")
        self.since = Cursor.parse(since, self.run) if since is not None else None
        if self.since is not None and self.since.grouped != self.grouped:
            if self.since.grouped or self.since.lines:
                kind, flag = ("grouped", "with") if self.since.grouped else ("plain", "without")
                raise FollowError(f"{self.run}: cursor {since} is a {kind} cursor; "
                                  f"follow {flag} --groups complete")
            # A plain cursor at a commit boundary is a grouped one with nothing held there.
            self.since = Cursor(self.since.store, self.since.seq, self.since.shards, self.since.last, 0, True)
        self.cursor: str | None = since
        self.store_id = ""
        """The run's store (`store_identity`), read with its manifest; every cursor carries it."""
        self.held: tuple[int, int] = (0, 0)

    # --- where the files are -----------------------------------------------------------

    def _root(self) -> Path | None:
        """The run's directory now (an object store's mirror synced first), or None when
        there is no run there yet."""
        if not self._object:
            root = Path(self.run)
            return root if (root / MANIFEST).is_file() else None
        from collector.storage.mirror import resolve_run  # lazy: boto3 only for s3:// runs

        try:
            return resolve_run(self.run)
        except NotARunDirectory:
            return None

    def _writer_present(self, root: Path) -> bool:
        lock = root / LOCK
        if self._object:
            # The lock object itself, its lease judged on the store's clock as the writer's own
            # takeover rule judges it (`collector.storage.s3lease.lease_held`): never this
            # reader's clock, which may run ahead of the store's (or behind) by any amount.
            from collector.storage.location import ObjectLocation, parse_location
            from collector.storage.s3lease import lease_held
            from collector.storage.s3objects import bucket_of

            location = parse_location(self.run)
            assert isinstance(location, ObjectLocation)
            return lease_held(bucket_of(location.bucket), location)
        try:
            st = os.stat(lock)
        except FileNotFoundError:
            return False
        wanted = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
        try:
            with open("/proc/locks", encoding="ascii") as f:
                return any(len(fields) > 5 and fields[1] == "FLOCK" and fields[5] == wanted
                           for fields in (line.split() for line in f))
        except OSError:
            return True  # cannot tell: follow until interrupted rather than end early

    # --- reading the log ---------------------------------------------------------------

    def _base(self, root: Path) -> dict[str, Any]:
        base = _read_json(root / MANIFEST)
        through = base.get("log_through", 0) if isinstance(base, dict) else None
        if (not isinstance(base, dict) or not isinstance(base.get("shards"), list)
                or not isinstance(through, int) or through < 0):
            raise FollowError(f"{root / MANIFEST} is not a collector manifest")
        return base

    def _record(self, root: Path, seq: int) -> dict[str, Any] | None:
        record = _read_json(commit_record_path(root, seq))
        if record is None:
            return None
        if (not isinstance(record, dict) or record.get("seq") != seq
                or record.get("op") not in ("commit", "forget")
                or not isinstance(record.get("add"), list) or not isinstance(record.get("remove"), list)):
            raise FollowError(f"{self.run}: commit record {seq} is not one this follower knows")
        return record

    def _state_at(self, root: Path, cursor: Cursor | None) -> _State:
        """The committed state a cursor's anchor names (None: the start), checked against the run."""
        for _ in range(_ATTEMPTS):
            base = self._base(root)
            self.store_id = store_identity(base)
            if cursor is None:
                return _State(0, [])
            if cursor.store != self.store_id:
                raise FollowError(f"{self.run}: cursor {cursor} is of another run (store {cursor.store}; "
                                  f"this run's is {self.store_id}): follow from the start or from a cursor "
                                  "this run printed")
            through = int(base["log_through"])
            entries = base["shards"]
            if cursor.seq < through:
                return self._behind(entries, cursor, through)
            state = _State(through, _paths(entries))
            for seq in range(through + 1, cursor.seq + 1):
                record = self._record(root, seq)
                if record is None:
                    break
                state = _apply(state, record)
            else:
                found = state.anchor(self.store_id, False)
                if (found.shards, found.last) != (cursor.shards, cursor.last):
                    raise FollowError(f"{self.run}: cursor {cursor} does not match this run (its state after "
                                      f"commit {cursor.seq} has {len(state.paths)} shards)")
                return state
            if self._base(root).get("log_through") == through:
                raise FollowError(f"{self.run}: cursor {cursor} is ahead of the run (no commit {cursor.seq})")
        raise FollowError(f"{self.run}: the run kept compacting while cursor {cursor} was located; try again")

    def _behind(self, entries: list[dict[str, Any]], cursor: Cursor, through: int) -> _State:
        """The anchor's state when the base has folded past it (see "Compaction")."""
        if entries and all(isinstance(e.get("seq"), int) for e in entries):
            return _State(cursor.seq, _paths([e for e in entries if e["seq"] <= cursor.seq]))
        paths = _paths(entries)
        n = cursor.shards
        if n > len(paths) or (n and _stem(paths[n - 1]) != cursor.last):
            raise FollowError(
                f"{self.run}: cursor {cursor} is behind the base (log_through {through}) and a shard of its "
                "state was removed since (a forget or a repair): the rows after it cannot be told apart "
                "exactly (the store's entries carry no commit seq); follow from the start"
            )
        return _State(cursor.seq, paths[:n])

    def _steps(self, root: Path, state: _State) -> Iterator[_Step]:
        """The steps after `state` committed now, in order (records; a catch-up from the base
        for records folded and deleted before this follower read them)."""
        while True:
            record = self._record(root, state.seq + 1)
            if record is not None:
                after = _apply(state, record)
                # A forget's additions are the rows it kept of shards delivered already.
                yield _Step(after, list(record["add"]) if record["op"] == "commit" else [])
                state = after
                continue
            base = self._base(root)
            through = int(base["log_through"])
            if through <= state.seq:
                return  # nothing committed after `state` yet
            entries = list(base["shards"])
            if entries and all(isinstance(e.get("seq"), int) for e in entries):
                new = [e for e in entries if e["seq"] > state.seq]
            else:
                paths = _paths(entries)
                if paths[:len(state.paths)] != state.paths:
                    raise FollowError(
                        f"{self.run}: cursor {state.anchor(self.store_id, self.grouped)} is behind the base "
                        f"(log_through {through}) and a shard of its state was removed since (a forget "
                        "or a repair): the rows after it cannot be told apart exactly (the store's entries "
                        "carry no commit seq)"
                    )
                first = {str(e["path"]): e for e in reversed(entries)}  # the first entry naming each
                new = [first[p] for p in paths[len(state.paths):]]
            state = _State(through, _paths(entries))
            yield _Step(state, new, record=False)

    def _shard(self, root: Path, entry: dict[str, Any]) -> pa.Table:
        """A committed shard: in data/, or still pending in .collector/tmp/ (between a commit
        record and the move, or until the next open after a crash there)."""
        rel = str(entry["path"])
        final, pending = root / rel, pending_path(root, rel)
        for path in (final, pending, final):  # the move may happen between two looks
            if path.exists():
                try:
                    return read_shard(path)
                except ShardError:
                    if path.exists():
                        raise
        raise FollowError(f"{self.run}: committed shard {rel} is gone (removed by a later forget before this "
                          "follower read it); follow from a later cursor or from the start")

    # --- the iteration -----------------------------------------------------------------

    def __iter__(self) -> Iterator[Batch]:
        root = self._wait_for_run()
        start = self.since
        state = self._state_at(root, start)
        # Its size is read at the first row (see `_chunks`), not now: a writer creates the
        # manifest before it writes config.resolved.json, and a follower may start in between.
        grouper = _Grouper(0) if self.grouped else None
        skip = start.lines if start is not None else 0  # lines after the anchor already delivered
        lines = 0  # lines delivered (or skipped) since the current anchor
        anchor = state.anchor(self.store_id, self.grouped)
        first = True
        while True:
            # Whether a writer holds the run, seen before the read (see "The end"); for an
            # object store in the previous sync, so that the read comes from a later listing.
            present = self._writer_present(root)
            if not first or self._object:  # an object store: a listing after the one that saw the lock
                root = self._root() or root
            for step in self._steps(root, state):
                chunks = self._chunks(root, step, grouper)
                for table, last_chunk, gids, gerrs, places in chunks:
                    n = table.num_rows
                    if skip:
                        dropped = min(skip, n)
                        skip -= dropped
                        lines += dropped
                        if not skip and start is not None:
                            self._check_place(start, places[dropped - 1])
                        table, gids, gerrs = table.slice(dropped), gids[dropped:], gerrs[dropped:]
                        places = places[dropped:]
                        n -= dropped
                    if not n:
                        continue
                    cursors = [str(Cursor(self.store_id, anchor.seq, anchor.shards, anchor.last, lines + i,
                                          self.grouped, places[i - 1])) for i in range(1, n + 1)]
                    lines += n
                    if last_chunk and (grouper is None or not grouper.held):
                        cursors[-1] = str(step.after.anchor(self.store_id, self.grouped))
                    self.cursor = cursors[-1]
                    yield Batch(table, step.after.seq, cursors, len(set(gids)), _count_errors(table), gerrs)
                state = step.after
                if grouper is None or not grouper.held:
                    anchor, lines = state.anchor(self.store_id, self.grouped), 0
                    if not skip:
                        self.cursor = str(anchor)
            if grouper is not None:
                self.held = (len(grouper.held), sum(len(g) for g in grouper.held.values()))
            if first and skip and start is not None:
                raise FollowError(f"{self.run}: cursor {start} names {start.lines} lines after its anchor; "
                                  f"the run has only {start.lines - skip} there")
            first = False
            if not present and not self.forever:
                return  # the writer was gone before this read began: the read saw all it committed
            self._sleep(self.poll_s)

    def _check_place(self, cursor: Cursor, found: tuple[str, int]) -> None:
        """The cursor's K-th line after its anchor must still be the row it was when it was
        printed: a forget or a repair that rewrote shards after the anchor (and was folded into
        the base) moves rows, and skipping K lines would then skip rows never delivered."""
        if cursor.at != found:
            was = cursor.at or ("?", "?")
            raise FollowError(
                f"{self.run}: cursor {cursor} cannot be resumed exactly: line {cursor.lines} after its "
                f"anchor was row {was[1]} of shard {was[0]}, and is now row {found[1]} of {found[0]} (a "
                "forget or a repair rewrote the shards after it since; resume from the anchor, "
                "re-receiving some rows, or from the start)"
            )

    def _wait_for_run(self) -> Path:
        """The run's root once it exists: at once, within `wait_s` (bounded), or ever (`forever`)."""
        deadline = self._clock() + self.wait_s
        while True:
            root = self._root()
            if root is not None:
                return root
            left = deadline - self._clock()
            if not self.forever and left <= 0:
                if self.wait_s:
                    raise FollowError(f"{self.run}: no run started there within {self.wait_s:g} s "
                                      f"(no {MANIFEST}); --wait SECONDS waits longer")
                raise FollowError(f"{self.run} is not a run (no {MANIFEST}); "
                                  "--wait SECONDS waits for one to start")
            self._sleep(self.poll_s if self.forever else min(self.poll_s, left))

    def _group_size(self, root: Path) -> int:
        resolved = _read_json(root / RESOLVED_CONFIG)
        size = resolved.get("config", {}).get("samples_per_task", 1) if isinstance(resolved, dict) else None
        if not isinstance(size, int) or size < 1:
            raise FollowError(
                f"{self.run}: no samples_per_task in {RESOLVED_CONFIG}: groups cannot be completed"
            )
        return size

    def _chunks(self, root: Path, step: _Step, grouper: _Grouper | None
                ) -> Iterator[tuple[pa.Table, bool, list[int], list[int], list[tuple[str, int]]]]:
        """The step's output: its rows, one table per commit (per shard when caught up from a
        compacted base: that can be the whole run), or the groups they complete; each with
        whether it is the step's last, and per row its group's number and error count and its
        place (shard name without extension, row in that shard)."""
        whole = step.record or len(step.new) <= 1
        parts: list[pa.Table] = []
        gids: list[int] = []
        gerrs: list[int] = []
        places: list[tuple[str, int]] = []
        for i, entry in enumerate(step.new):
            table = self._shard(root, entry)
            if self.annotation is not None:
                # A regrade annotates committed episodes after the fact: one it does not cover
                # yet is an error naming the gap (resume the regrade), never the stored reward.
                table = apply_annotation(root, table, self.annotation)
            # Each row's place rides along through grouping (which reorders rows), then is dropped.
            table = table.append_column(_SHARD_COL, pa.array([_stem(str(entry["path"]))] * table.num_rows,
                                                             pa.string()))
            table = table.append_column(_ROW_COL, pa.array(range(table.num_rows), pa.int64()))
            if grouper is not None:
                if not grouper.size:  # a commit exists: the writer's open is done, its config written
                    grouper.size = self._group_size(root)
                table, ids, errs = grouper.feed(table)
            else:
                ids, errs = [], []
            place = list(zip(table.column(_SHARD_COL).to_pylist(), table.column(_ROW_COL).to_pylist(),
                             strict=True))
            table = table.drop_columns([_SHARD_COL, _ROW_COL])
            last = i == len(step.new) - 1
            if whole:
                parts.append(table)
                gids += ids
                gerrs += errs
                places += place
                if last:
                    yield _concat(parts), True, gids, gerrs, places
            else:
                yield table, last, ids, errs, place


def _apply(state: _State, record: dict[str, Any]) -> _State:
    gone = {str(rel) for rel in record["remove"]}
    paths = [p for p in state.paths if p not in gone]
    known = set(paths)
    paths.extend(p for p in _paths(record["add"]) if p not in known)
    return _State(int(record["seq"]), paths)


def _concat(tables: list[pa.Table]) -> pa.Table:
    tables = [t for t in tables if t.num_rows] or tables[:1]
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables, promote_options="default")


def _count_errors(table: pa.Table) -> int:
    if "stop_reason" not in table.column_names:
        return 0
    return int(pc.sum(pc.equal(table.column("stop_reason").cast(pa.string()), "error")).as_py() or 0)


@dataclass
class _Grouper:
    """Holds the samples of incomplete groups; `feed` returns the groups a table completes."""

    size: int
    released: int = 0
    #: group key -> sample -> (table, row): the held row, copied out of its shard (see `feed`).
    held: dict[tuple[Any, ...], dict[int, tuple[pa.Table | None, int]]] = field(default_factory=dict)

    def feed(self, table: pa.Table) -> tuple[pa.Table, list[int], list[int]]:
        """The rows of the groups `table` completes (each group's together, samples in order),
        with per row its group's number (in release order) and its group's error count."""
        axes = [a for a in _GROUP_AXES if a in table.column_names]
        keys = zip(*(table.column(a).to_pylist() for a in axes), strict=True)
        samples = table.column("sample").to_pylist()
        done: list[dict[int, tuple[pa.Table | None, int]]] = []
        for i, (key, sample) in enumerate(zip(keys, samples, strict=True)):
            group = self.held.setdefault(key, {})
            group[int(sample)] = (None, i)  # None: this table; a sample committed again replaces the held one
            if all(s in group for s in range(self.size)):
                done.append(self.held.pop(key))
        # The rows left held are copied out of the shard (a slice would keep all of its buffers
        # alive): memory is the held rows, not every shard that still has one.
        mine = sorted(i for group in self.held.values() for t, i in group.values() if t is None)
        if mine:
            kept = table.take(pa.array(mine, pa.int64()))
            where = {i: n for n, i in enumerate(mine)}
            for group in self.held.values():
                for s, (t, i) in group.items():
                    if t is None:
                        group[s] = (kept, where[i])
        rows = [(table if t is None else t).slice(i, 1) for group in done
                for t, i in (group[s] for s in range(self.size))]
        out = _concat(rows) if rows else table.slice(0, 0)
        errors = pc.equal(out.column("stop_reason").cast(pa.string()), "error").to_pylist()
        gids, gerrs = [], []
        for g in range(len(done)):
            self.released += 1
            mine = errors[g * self.size:(g + 1) * self.size]
            gids += [self.released] * self.size
            gerrs += [sum(bool(e) for e in mine)] * self.size
        return out, gids, gerrs


def follow(run: str | Path, since: str | None = None, *, groups: Groups = "all", forever: bool = False,
           poll_s: float = 1.0, annotation: str | None = None, wait_s: float = 0.0) -> Follower:
    """Follow `run` (a run directory or ``s3://bucket/prefix``): iterate the result for
    `Batch`es in commit order as they are committed, from after `since` (a cursor one of them
    carried; None: from the start), waiting up to `wait_s` seconds for a run that has not
    started yet. See the module docstring for the guarantees."""
    return Follower(run, since, groups=groups, forever=forever, poll_s=poll_s, annotation=annotation,
                    wait_s=wait_s)

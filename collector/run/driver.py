"""The driver loop: keep every worker busy, drop repeats, stop when told, commit on the policy.

Plain code over a `collector.run.pool.WorkerPool` (Ray in production, a fake in
tests/run/test_driver_loop.py, tests/run/test_driver_buffer.py and
tests/run/test_driver_written.py); the Ray-backed runs are tests/run/test_job.py and the
driver fault tests in tests/faults.

1. every ready worker is kept busy: each has a few batches outstanding, refilled as batches
   return. A worker still starting (a replacement) gets no batch until it is ready;
2. returned episodes go to the commit buffer (`collector.run.commits`): an id that reaches
   the driver twice is dropped there and then; an episode that stops the run
   (`collector.run.stoppers`) is never committed, and no more work is handed out;
3. when an actor dies (`WorkerLost`), its outstanding items go back to the front of the
   queue and the actor is replaced; a replacement that cannot be placed within
   `ray.start_timeout_s` stops the run. An actor holding a batch past its deadline (frozen:
   SIGSTOP, a hung node, an inline tool blocking its loop) is treated the same way, since
   Ray never reports it dead. The deadline is `ray.batch_timeout_s`, or by default
   `loop.episode_timeout_s x (waves + 1) + 60 s` from dispatch, where waves = ceil(items a
   worker holds at once / episodes_in_flight): a healthy worker finishes every batch it
   holds within that many episode timeouts. A late reply of the abandoned actor is never
   read (its call is forgotten), and any id that still reached the driver twice would be
   dropped before commit;
4. the plan is read as the workers need it (`WorkQueue`): a million-episode sweep is never
   held whole in the driver, and ids already committed are dropped as their items come up;
5. the progress line counts episodes as workers finish them (each worker polled for its
   running count when the line is drawn, not on every pass), committed or not: display only.

Tests: tests/run/test_driver_loop.py, tests/run/test_driver_buffer.py, tests/run/test_driver_written.py,
tests/run/test_driver_progress.py.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from collector.config import RunConfig
from collector.errors import CollectorError
from collector.record.rows import Row, from_ipc, rows_of
from collector.run.commits import CommitBuffer, CommitTarget, Committed, Written, episode_buffer, shard_buffer
from collector.run.encoded import EncodedBatch
from collector.run.plan import WorkItem
from collector.run.pool import Actor, Call, WorkerFailed, WorkerLost, WorkerPool, batch_of
from collector.run.preflight import check_cluster_fits
from collector.run.progress import LiveCounts, Progress
from collector.run.stoppers import run_stopper
from collector.run.worker import WorkerSetup
from collector.run.worker_writes import Outcome, WrittenBatch, without_seen
from collector.stop import StopReason
from collector.storage.local import CommitIncomplete

if TYPE_CHECKING:
    from collector.tracking import Tracking

#: How long the driver blocks waiting for a call before refreshing the progress line.
WAIT_S = 0.25
#: How long drawing the progress line waits for the workers' answers to its poll (a healthy
#: worker answers in a few ms; a busy or frozen one is read at the next line).
POLL_WAIT_S = 0.05
#: Replacement actors allowed per configured worker before the run gives up.
RESTARTS_PER_WORKER = 3
#: Slack added to the derived batch deadline (env start and grading run outside the
#: episode timer; a busy machine schedules late).
BATCH_SLACK_S = 60.0


@dataclass(slots=True)
class JobResult:
    run_dir: Path | str
    """The run directory, or the ``s3://`` URI of a run in object storage."""
    run_id: str
    planned: int
    """Episodes the config describes."""
    already: int
    """Episodes committed before this run started (resume)."""
    committed: int = 0
    """Episodes this run committed."""
    duplicates_dropped: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    """Committed episodes of this run per stop reason."""
    worker_restarts: int = 0
    redispatched: int = 0
    """Work items run again because the worker holding them died."""
    elapsed_s: float = 0.0
    warnings: list[str] = field(default_factory=list)
    retried_errors: int = 0
    """`error` episodes of earlier runs forgotten to be run again (`retry_errors`)."""
    retries: Counter[str] = field(default_factory=Counter)
    """Retried requests of this run's committed episodes, per cause (`Episode.retries`)."""

    def summary(self) -> str:
        parts = [f"{self.run_dir}: {self.already + self.committed}/{self.planned} episodes committed"]
        if self.already:
            parts.append(f"{self.already} from earlier runs")
        if self.retried_errors:
            parts.append(f"{self.retried_errors} earlier error episodes run again")
        parts.append(f"{self.committed} new in {self.elapsed_s:.1f}s")
        if self.worker_restarts:
            parts.append(f"{self.worker_restarts} worker(s) replaced, {self.redispatched} episodes re-run")
        if self.duplicates_dropped:
            parts.append(f"{self.duplicates_dropped} duplicates dropped")
        if self.retries or self.counts.get(StopReason.ERROR.value):
            causes = ", ".join(f"{cause}: {n}" for cause, n in sorted(self.retries.items()))
            retried = f"{sum(self.retries.values())} requests retried" + (f" ({causes})" if causes else "")
            parts.append(f"{retried}, {self.counts.get(StopReason.ERROR.value, 0)} episodes ended as error")
        return "; ".join(parts)


@dataclass(slots=True)
class Snapshot:
    """What an `on_commit` callback sees after each commit (tests use it to inject faults)."""

    committed: int
    counts: Counter[str]
    busy_actors: list[Actor]
    """Handles of actors with batches outstanding, busiest first."""


class WorkQueue:
    """The items left to hand out, in plan order: those put back (a lost worker's) first,
    then the plan's, drawn from its iterator only as batches are made."""

    def __init__(self, items: Iterable[WorkItem]) -> None:
        self._plan = iter(items)
        self._ready: deque[WorkItem] = deque()

    def __bool__(self) -> bool:
        if not self._ready:
            item = next(self._plan, None)
            if item is None:
                return False
            self._ready.append(item)
        return True

    def take(self, n: int) -> list[WorkItem]:
        """Up to `n` items, fewer only once the plan is spent."""
        taken: list[WorkItem] = []
        while len(taken) < n and self:
            taken.append(self._ready.popleft())
        return taken

    def put_back(self, items: list[WorkItem]) -> None:
        """Items to hand out again before any other (their order kept)."""
        self._ready.extendleft(reversed(items))


class _Slot:
    """One worker position: its current actor (replaced when it dies) and outstanding calls."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.actor: Actor = None
        self.generation = 0
        self.outstanding = 0
        self.starting: Call | None = None
        """The pending `ready()` call of an actor not yet ready; no batches until it returns."""
        self.started_at = 0.0

    @property
    def key(self) -> tuple[int, int]:
        """This slot's current worker, for the live counts."""
        return self.index, self.generation


def _failure(exc: WorkerFailed, what: str, pool: WorkerPool) -> CollectorError:
    """The error to raise when our own code raised inside a worker (a bug or a config problem,
    not a death): a CollectorError as it was raised, anything else as one line."""
    if isinstance(exc.cause, CollectorError):
        return exc.cause
    return CollectorError(pool.with_logs(f"{what}: {exc}"))


class Driver:
    """One run's dispatch and collection over `pool`, committing into `store` (module docstring)."""

    def __init__(
        self,
        cfg: RunConfig,
        result: JobResult,
        pool: WorkerPool,
        store: CommitTarget,
        todo: Iterable[WorkItem],
        *,
        setup: WorkerSetup,
        on_commit: Callable[[Snapshot], None] | None = None,
        address: str | None = None,
        shield: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext,
    ) -> None:
        self.cfg = cfg
        self.result = result
        self.pool = pool
        self.setup = setup
        self.on_commit = on_commit
        self.shield = shield
        """Wraps every commit: a signal arriving inside is raised once it is done
        (`collector.run.signals.RunSignals.deferred`), so no taken episode is dropped."""
        self.progress: Progress | None = None
        self.store = store
        self.queue = WorkQueue(todo)
        self.inflight: dict[Call, tuple[_Slot, int, list[WorkItem]]] = {}
        self.dispatched_at: dict[Call, float] = {}
        """When each in-flight batch was handed out (its deadline counts from there)."""
        self.slots: list[_Slot] = []
        self.episodes: CommitBuffer[Row] = episode_buffer(store, cfg.output)
        """Finished episodes' rows not yet committed (driver-side writes)."""
        self.shards: CommitBuffer[Written] = shard_buffer(store, cfg.output)
        """With worker-side writes, the shards workers wrote and the driver has not committed yet."""
        self.seen: set[str] = set()
        """Ids kept since the last commit. Older ones are the store's (`holds`): a set of every
        id of the run beside the store's own cost ~60 bytes an episode at a million."""
        self.stop_reason: CollectorError | None = None
        self.uncommitted: CommitIncomplete | None = None
        """The last commit that left episodes out; reported when the run ends (the rest goes on)."""
        self.uncommitted_count = 0
        self.address = address or "the embedded local cluster"
        """The cluster as the user named it (`--address`, `ray.address`), for messages."""
        self.nodes_at_start: set[str] = set()
        """Ids of the nodes alive when the workers started: a missing one later died."""
        self.live = LiveCounts()
        """Finished episodes for the progress line (display only, never for commits)."""
        self.polls: dict[Call, tuple[int, int]] = {}
        """Outstanding `finished()` polls, per worker (slot index, generation)."""
        self.tracking: Tracking | None = None
        """Experiment trackers fed after each commit (`collector.tracking`: never blocks, never fails)."""

    @property
    def writes_on_workers(self) -> bool:
        return self.setup.sink is not None

    # --- actors -------------------------------------------------------------------------

    def _spawn(self, slot: _Slot) -> None:
        slot.generation += 1
        setup = replace(self.setup, name=f"w{slot.index}.{slot.generation}")
        slot.actor, slot.starting = self.pool.start(setup, self.cfg.ray.cpus_per_worker)
        slot.outstanding = 0
        slot.started_at = time.monotonic()

    def _replace(self, slot: _Slot, generation: int) -> None:
        if slot.generation != generation:
            return  # another failed call of the same dead actor already replaced it
        limit = RESTARTS_PER_WORKER * len(self.slots)
        if self.result.worker_restarts >= limit:
            died = self.result.worker_restarts
            raise CollectorError(self.pool.with_logs(f"workers died {died} times; giving up"))
        self.result.worker_restarts += 1
        self.pool.kill(slot.actor)
        self._spawn(slot)

    def start_workers(self) -> None:
        """Start every worker and wait, at most `ray.start_timeout_s`, until each is ready."""
        check_cluster_fits(self.cfg, *self.pool.cpus())
        self.slots = [_Slot(i) for i in range(self.cfg.ray.workers)]
        for slot in self.slots:
            self._spawn(slot)
        timeout = self.cfg.ray.start_timeout_s
        deadline = time.monotonic() + timeout
        waiting = [slot.starting for slot in self.slots if slot.starting is not None]
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CollectorError(self._not_placed("not ready", timeout))
            for call in self.pool.wait(waiting, min(left, WAIT_S)):
                waiting.remove(call)
                try:
                    self.pool.result(call)
                except WorkerFailed as exc:
                    raise _failure(exc, "a worker failed to start", self.pool) from None
                except WorkerLost as exc:
                    # The actor could not be placed or died while starting (resources, a lost node).
                    message = f"a worker could not start: {exc.kind}"
                    raise CollectorError(self.pool.with_logs(message)) from None
        for slot in self.slots:
            slot.starting = None
        self.nodes_at_start = self.pool.alive_nodes()

    def _not_placed(self, what: str, timeout: float) -> str:
        cpus = self.cfg.ray.cpus_per_worker
        lost = self.nodes_at_start - self.pool.alive_nodes() if self.nodes_at_start else set()
        if lost:
            # The usual cause of a replacement with no room: its node died with the old worker.
            return (
                f"{len(lost)} of {len(self.nodes_at_start)} node(s) of the Ray cluster at {self.address} "
                f"died during the run, and no live node took a replacement worker within "
                f"ray.start_timeout_s = {timeout:g}s; committed episodes are safe, run again to resume"
            )
        return (
            f"a worker was {what} after ray.start_timeout_s = {timeout:g}s (no node with "
            f"{cpus:g} free CPUs, or a slow start); committed episodes are safe, run again to resume"
        )

    def started(self, call: Call) -> None:
        """A replacement's `ready()` returned: hand it batches, or stop on a start failure."""
        slot = next((s for s in self.slots if s.starting == call), None)
        if slot is None:
            return  # the ready() of an actor already replaced (it died meanwhile)
        generation = slot.generation
        slot.starting = None
        try:
            self.pool.result(call)
        except WorkerFailed as exc:
            raise _failure(exc, "a worker failed to start", self.pool) from None
        except WorkerLost:
            self._replace(slot, generation)  # died while starting: counts as another death

    def check_starting(self) -> None:
        """Stop the run if a replacement actor has waited longer than `ray.start_timeout_s`."""
        timeout = self.cfg.ray.start_timeout_s
        now = time.monotonic()
        for slot in self.slots:
            if slot.starting is not None and now - slot.started_at > timeout:
                raise CollectorError(self._not_placed("replaced but could not be placed or started", timeout))

    def stop_workers(self) -> None:
        for slot in self.slots:
            # An actor never placed would only make its close() wait.
            self.pool.close(slot.actor, started=slot.starting is None)

    # --- dispatch -----------------------------------------------------------------------

    def _batch_size(self) -> int:
        # Small runs are spread over every worker rather than packed into one batch.
        spread = math.ceil(self.result.planned / (2 * len(self.slots)))
        return max(1, min(self.cfg.ray.batch_size, spread))

    def _per_worker(self, batch: int) -> int:
        # Enough outstanding batches that the worker's slots never wait on the driver.
        return max(2, math.ceil(self.cfg.ray.episodes_in_flight / batch) + 1)

    def fill(self) -> None:
        if self.stop_reason is not None:
            return
        batch = self._batch_size()
        per_worker = self._per_worker(batch)
        for slot in self.slots:
            while slot.starting is None and self.queue and slot.outstanding < per_worker:
                items = self.queue.take(batch)
                call = self.pool.run(slot.actor, items, write=self.writes_on_workers)
                self.inflight[call] = (slot, slot.generation, items)
                self.dispatched_at[call] = time.monotonic()
                slot.outstanding += 1

    def batch_deadline_s(self) -> float:
        """How long a worker may hold a batch (module docstring, step 3)."""
        explicit = self.cfg.ray.batch_timeout_s
        if explicit is not None:
            return explicit
        batch = self._batch_size()
        waves = math.ceil(self._per_worker(batch) * batch / self.cfg.ray.episodes_in_flight)
        return self.cfg.loop.episode_timeout_s * (waves + 1) + BATCH_SLACK_S

    def _requeue(self, items: list[WorkItem]) -> None:
        self.result.redispatched += len(items)
        self.queue.put_back(items)

    def check_batches(self) -> None:
        """Give up on every actor holding a batch past its deadline: re-run its items elsewhere."""
        limit = self.batch_deadline_s()
        now = time.monotonic()
        late = {
            (slot.index, generation): (slot, generation)
            for call, (slot, generation, _) in self.inflight.items()
            if now - self.dispatched_at[call] > limit
        }
        for slot, generation in late.values():
            calls = [c for c, (s, g, _) in self.inflight.items() if s is slot and g == generation]
            for call in calls:
                _, _, items = self.inflight.pop(call)
                del self.dispatched_at[call]
                self._requeue(items)
            self._replace(slot, generation)

    # --- collection ---------------------------------------------------------------------

    def collect(self, call: Call) -> None:
        slot, generation, items = self.inflight.pop(call)
        self.dispatched_at.pop(call, None)
        if slot.generation == generation:
            slot.outstanding -= 1
        try:
            reply = batch_of(self.pool.result(call))
        except WorkerFailed as exc:
            raise _failure(exc, "a worker failed", self.pool) from None
        except WorkerLost:
            # The actor (or its node) died: run its items again on a fresh actor.
            self._requeue(items)
            self._replace(slot, generation)
            return
        worker = (slot.index, generation)
        if isinstance(reply, WrittenBatch):
            self._collect_written(reply, worker)
        else:
            self._collect_rows(reply, worker)
        if self.buffered() > self.cfg.output.max_buffered_rows:
            self.commit()  # now, not after the other batches that returned with this one

    def _collect_rows(self, batch: EncodedBatch, worker: tuple[int, int]) -> None:
        """A batch of encoded rows (`collector.run.encoded`): each kept row buffered in its cell;
        a refused episode (its row could not be built) kept out and reported, as a commit does."""
        try:
            rows = rows_of(from_ipc(batch.rows))
        except (pa.ArrowException, ValueError) as exc:
            raise CollectorError(self.pool.with_logs(f"a worker returned unreadable rows: {exc}")) from None
        self.live.returned(worker, [r.stop_reason for r in rows] + [o.stop_reason for o in batch.refused])
        for row in rows:
            if self._keep(row):
                self.episodes.add((row.model, row.budget), row)
        self._unstorable({o.episode_id: batch.reasons[o.episode_id] for o in batch.refused if self._keep(o)})

    def _unstorable(self, reasons: dict[str, str]) -> None:
        """Episodes whose row fits no shard (id -> why): not committed (a rerun runs them),
        reported when the run ends; the run goes on."""
        if reasons:
            message = f"{len(reasons)} episode(s) could not be stored ({next(iter(reasons.values()))})"
            self.uncommitted = CommitIncomplete(message, 0, set(reasons))
            self.uncommitted_count += len(reasons)

    def _keep(self, episode: Row | Outcome) -> bool:
        """Whether a returned episode is one to commit: not seen before, not one that stops the run."""
        if episode.episode_id in self.seen or self.store.holds(episode.episode_id):
            self.result.duplicates_dropped += 1
            return False
        stopper = run_stopper(episode, self.cfg)
        if stopper is not None:
            # Not committed: the episode says nothing about the model; the rerun runs it.
            if self.stop_reason is None:
                self.stop_reason = stopper
            return False
        self.seen.add(episode.episode_id)
        self.live.keep(str(episode.stop_reason))
        return True

    def _collect_written(self, batch: WrittenBatch, worker: tuple[int, int]) -> None:
        """A writing worker's batch: the same decisions per episode, its shards buffered per cell
        (a shard of ids all seen before is discarded, a partly seen one rewritten: `without_seen`)."""
        assert self.setup.sink is not None
        self.live.returned(worker, (o.stop_reason for o in batch.outcomes))
        kept = {o.episode_id: o for o in batch.outcomes if self._keep(o)}
        for written in batch.shards:
            shard = without_seen(self.setup.sink, written, set(kept))
            if shard is not None:
                self.shards.add((shard.model, shard.budget), (shard, [kept[i] for i in shard.episode_ids]))
        self._unstorable(batch.refused)

    def buffered(self) -> int:
        """Rows held for commit, in either write mode."""
        return self.episodes.buffered() + self.shards.buffered()

    def commit(self, force: bool = False) -> None:
        """Commit what the policy says is due (`collector.run.commits`); everything when forced."""
        buffer = self.shards if self.writes_on_workers else self.episodes
        with self.shield():
            done = buffer.commit(force)
            if done is not None:
                self._committed(done)

    def _committed(self, done: Committed) -> None:
        """Count a commit's episodes into the result and tell `on_commit`."""
        if done.left_out is not None:
            # Some episodes were left out: the others are committed and the run goes on; the
            # ones left out are not committed (a rerun runs them) and the run ends saying so.
            self.uncommitted = done.left_out
            self.uncommitted_count += len(done.left_out.uncommitted)
        self.result.committed += done.written
        # Committed or left out, they have left the buffer: the store answers for them now
        # (one left out may come back as a late copy and is tried again).
        self.seen.difference_update(e.episode_id for e in done.episodes)
        self.result.duplicates_dropped += len(done.episodes) - done.written
        self.result.counts.update(str(e.stop_reason) for e in done.episodes)
        self.result.retries.update(cause for e in done.episodes for cause in e.retries)
        if self.tracking is not None:
            self.tracking.committed(done.episodes)
        if self.on_commit is not None:
            busy = sorted((s for s in self.slots if s.outstanding), key=lambda s: -s.outstanding)
            actors = [s.actor for s in busy]
            self.on_commit(Snapshot(self.result.committed, Counter(self.result.counts), actors))

    # --- progress -----------------------------------------------------------------------

    def poll_finished(self, wait_s: float = 0.0) -> None:
        """Ask each ready worker how many episodes it has finished (one call in flight per
        worker) and read the answers that come back within `wait_s` (0: only those already
        back; the others are read next time)."""
        asked = set(self.polls.values())
        for slot in self.slots:
            if slot.starting is None and slot.key not in asked:
                self.polls[self.pool.poll(slot.actor)] = slot.key
        deadline = time.monotonic() + wait_s
        while self.polls:
            done = self.pool.wait(list(self.polls), max(0.0, deadline - time.monotonic()))
            for call in done:
                worker = self.polls.pop(call)
                try:
                    finished = self.pool.result(call)
                except (WorkerFailed, WorkerLost):
                    continue  # a dead worker's count is moot
                assert isinstance(finished, dict)
                self.live.reported(worker, finished)
            if not done or time.monotonic() >= deadline:
                break

    def live_counts(self) -> Counter[str]:
        return self.live.counts(s.key for s in self.slots)

    def show(self, force: bool = False) -> None:
        """Draw the progress line if it is due. The workers are polled only then, and their
        answers awaited a moment (`POLL_WAIT_S`): polling on every pass of the loop was one
        Ray call per returned batch and per idle pass, for a line drawn at most 5 times a
        second (every 5 s into a log) (BENCHMARKS.md section n)."""
        if self.progress is None or not (force or self.progress.due()):
            return
        self.poll_finished(POLL_WAIT_S)
        notes = []
        if self.result.retried_errors:
            notes.append(f"{self.result.retried_errors} earlier errors re-run")
        if self.result.worker_restarts:
            notes.append(f"{self.result.worker_restarts} worker(s) replaced")
        counts = self.live_counts()
        note = ", ".join(notes)
        self.progress.update(self.result.committed, counts, note, force=force, finished=counts.total())

    def close_progress(self) -> None:
        if self.progress is not None:
            counts = self.live_counts()
            self.progress.close(self.result.committed, counts, finished=counts.total())

    def loop(self) -> None:
        while self.inflight or (self.queue and self.stop_reason is None):
            self.fill()
            starting = [s.starting for s in self.slots if s.starting is not None]
            waiting = list(self.inflight) + starting
            if not waiting:  # cannot happen with a ready slot and a non-empty queue; be safe
                time.sleep(WAIT_S)
                continue
            # Wake on the first batch back (not all of them: that made waves, each worker
            # draining its slots between refills), then take whatever else is already back.
            # The timeout still bounds each pass, for the deadlines and for Ctrl-C.
            for call in self.pool.wait(waiting, WAIT_S):
                if call in self.inflight:
                    self.collect(call)
                else:
                    self.started(call)
            self.check_starting()
            self.check_batches()
            self.commit()
            self.show()

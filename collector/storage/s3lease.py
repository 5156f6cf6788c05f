"""The single-writer lock of a run in an object store: a lease on ``.collector/run.lock``.

No flock exists there, so the lock is an object naming its holder (host, host_id, pid, uuid,
started, renewed, renewals, lease_s), created with ``If-None-Match: *``. A second writer is
refused in one line naming the holder. Takeovers, both a PUT with ``If-Match`` on the ETag
read (so two contenders cannot both win):

- at once, when the holder is on this very host and its pid is gone. "This host" is the
  `host_identity` (the kernel's boot id, or else the machine id, plus the inode of this pid
  namespace), not the hostname: two containers may share a hostname, and a pid that is free
  in one says nothing about the other;
- once its lease has expired: the lease's age is measured on the store's clock only, the
  response's ``Date`` against the object's ``LastModified`` (both the server's), never this
  writer's clock against the server's (a skewed clock would take over a live holder).

The holder renews it (``If-Match`` on its own ETag; every renewal differs in bytes, so its
ETag does too) before each commit record, and during long operations (`Lease.renew_if_due`:
between shard verifications on open, between the shard PUTs of a large commit) once a quarter
of the lease has passed: opening thousands of shards or writing a large commit does not let
the lease lapse. A holder whose lock was taken over or deleted gets 412 (or 404) there, which
is `LockLost`. `probe_conditional_writes` refuses an endpoint on which none of this holds.

Tests: tests/storage/test_objectstore.py, tests/storage/test_s3_lease.py,
tests/storage/test_s3_retries.py, tests/faults/test_two_writers.py.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collector.errors import OutputError
from collector.storage.location import ObjectLocation
from collector.storage.manifest import LOCK, META_DIR, now_iso
from collector.storage.runstore import LockLost
from collector.storage.s3client import PreconditionFailed, S3Bucket
from collector.storage.s3objects import json_bytes

__all__ = ["LEASE_S", "PROBE_PREFIX", "Lease", "host_identity", "lease_held", "pid_dead",
           "probe_conditional_writes"]

log = logging.getLogger(__name__)

#: How long a lock stays valid without renewal. Renewed before every commit, so any driver
#: committing every `commit_interval_s` (30 s) keeps it; a holder dead on another host is
#: taken over this long after its last commit.
LEASE_S = 120.0
#: Keys `probe_conditional_writes` creates (and deletes; an open removes any left behind).
PROBE_PREFIX = f"{META_DIR}/probe-"


def host_identity() -> str:
    """Which kernel and pid namespace this process runs in: ``<boot id or machine id>:<pid ns
    inode>``; empty when neither id can be read (then no holder is ever declared dead here)."""
    machine = ""
    for source in ("/proc/sys/kernel/random/boot_id", "/etc/machine-id"):
        with contextlib.suppress(OSError):
            machine = Path(source).read_text().strip()
        if machine:
            break
    try:
        namespace = str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        namespace = ""
    return f"{machine}:{namespace}" if machine and namespace else ""


@dataclass
class Lease:
    """The run's lock object, held by this store while its ETag is the one we wrote."""

    bucket: S3Bucket
    key: str
    where: str
    lease_s: float
    token: dict[str, Any] = field(default_factory=dict)
    etag: str = ""
    # Our own interval since the last renewal (monotonic: never compared with the store's clock).
    _renewed_at: float = field(default_factory=time.monotonic, repr=False)
    # Verification threads renew through one lease: one renewal at a time, each on the last ETag.
    _renewing: threading.RLock = field(default_factory=threading.RLock, repr=False)

    @classmethod
    def acquire(cls, bucket: S3Bucket, loc: ObjectLocation, lease_s: float) -> Lease:
        lease = cls(bucket, loc.key(LOCK), str(loc), lease_s)
        lease.token = {"host": socket.gethostname(), "host_id": host_identity(), "pid": os.getpid(),
                       "uuid": uuid.uuid4().hex, "started": now_iso(), "renewed": now_iso(),
                       "renewals": 0, "lease_s": lease_s}
        try:
            lease.etag = bucket.put(lease.key, json_bytes(lease.token), create_only=True)
            return lease
        except PreconditionFailed:
            pass
        found = bucket.get_with_date(lease.key)
        if found is None:  # released between our create and our read: one more try
            try:
                lease.etag = bucket.put(lease.key, json_bytes(lease.token), create_only=True)
                return lease
            except PreconditionFailed:
                raise OutputError(f"run {loc} is in use by another collector process (its lock was "
                                  "re-created while this one tried to take it)") from None
        body, etag, modified, server_now = found
        try:
            holder = json.loads(body)
            if not isinstance(holder, dict):
                raise ValueError
        except ValueError:
            holder = {}
        who = (f"host {holder.get('host', '?')}, pid {holder.get('pid', '?')}, "
               f"since {holder.get('started', '?')}")
        here = host_identity()
        dead = (bool(here) and holder.get("host_id") == here and holder.get("host") == socket.gethostname()
                and pid_dead(holder.get("pid")))
        held = holder.get("lease_s")
        held_s = float(held) if isinstance(held, int | float) else lease_s
        age = ((server_now if server_now is not None else _store_now(bucket, loc)) - modified).total_seconds()
        if not dead and age < held_s:
            raise OutputError(
                f"run {loc} is in use by another collector process ({who}; its lease, renewed "
                f"{age:.0f} s ago, expires in {held_s - age:.0f} s unless renewed)"
            )
        try:
            lease.etag = bucket.put(lease.key, json_bytes(lease.token), if_match=etag)
        except PreconditionFailed:
            raise OutputError(f"run {loc} is in use by another collector process (it took over the "
                              f"lock of {who} first)") from None
        why = "its process is gone" if dead else f"its lease expired {age - held_s:.0f} s ago"
        log.warning("took over the lock of %s from %s: %s", loc, who, why)
        return lease

    def lost_message(self, what: str) -> str:
        return (f"{self.where}/{LOCK} was taken over or deleted while this run was writing (another "
                f"process may be writing {self.where}); stopped: {what}")

    def renew(self) -> None:
        """Extend the lease (a conditional PUT on our ETag); LockLost when it is no longer ours."""
        with self._renewing:
            self.token["renewed"] = now_iso()
            self.token["renewals"] = int(self.token.get("renewals", 0)) + 1  # new bytes, new ETag
            try:
                self.etag = self.bucket.put(self.key, json_bytes(self.token), if_match=self.etag)
            except PreconditionFailed:
                raise LockLost(self.lost_message("uncommitted episodes run again on the next run")) from None
            self._renewed_at = time.monotonic()

    def renew_if_due(self) -> None:
        """Renew once a quarter of the lease has passed since the last renewal (called between
        the steps of a long operation, from any thread)."""
        with self._renewing:
            if time.monotonic() - self._renewed_at >= self.lease_s / 4:
                self.renew()

    def held(self) -> bool:
        head = self.bucket.head(self.key)
        return head is not None and str(head.get("ETag")) == self.etag

    def release(self) -> None:
        with contextlib.suppress(OutputError):
            self.bucket.delete(self.key, if_match=self.etag)  # not a lock another writer took over


def lease_held(bucket: S3Bucket, loc: ObjectLocation) -> bool:
    """Whether a writer holds the run at `loc` now, by the rule `Lease.acquire` takes over by:
    a lock object whose lease has not expired, its age measured on the store's clock only (the
    answer's ``Date`` against the object's ``LastModified``), and whose holder is not a dead pid
    of this very host. A lock that cannot be read counts as held (a reader ends late, never early)."""
    found = bucket.get_with_date(loc.key(LOCK))
    if found is None:
        return False
    body, _, modified, server_now = found
    try:
        holder = json.loads(body)
        lease_s = float(holder["lease_s"])
    except (ValueError, KeyError, TypeError):
        return True
    here = host_identity()
    if (here and holder.get("host_id") == here and holder.get("host") == socket.gethostname()
            and pid_dead(holder.get("pid"))):
        return False
    if server_now is None:
        try:
            server_now = _store_now(bucket, loc)
        except OutputError:
            return True  # the store's time cannot be read (a read-only reader): held, until it is gone
    return (server_now - modified).total_seconds() < lease_s


def _store_now(bucket: S3Bucket, loc: ObjectLocation) -> dt.datetime:
    """The store's clock when its answers carry no ``Date``: the LastModified of a probe key we
    write (and delete) now."""
    key = loc.key(f"{PROBE_PREFIX}clock-{uuid.uuid4().hex}")
    bucket.put(key, b"clock")
    try:
        found = bucket.get(key)
    finally:
        with contextlib.suppress(OutputError):
            bucket.delete(key)
    if found is None:
        raise OutputError(f"s3://{bucket.name}/{key}: vanished right after it was written")
    return found[2]


def pid_dead(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # exists, someone else's
    return False


def probe_conditional_writes(bucket: S3Bucket, loc: ObjectLocation) -> None:
    """Refuse an endpoint that accepts a create-only PUT over an existing key."""
    key = loc.key(f"{PROBE_PREFIX}{uuid.uuid4().hex}")
    bucket.put(key, b"probe", create_only=True)
    try:
        bucket.put(key, b"probe", create_only=True)
    except PreconditionFailed:
        return
    finally:
        with contextlib.suppress(OutputError):
            bucket.delete(key)
    raise OutputError(
        f"{loc}: the endpoint ignores conditional writes (If-None-Match); exactly-once cannot be "
        "guaranteed there"
    )

"""Reading a run that lives in object storage: a local mirror of its keys, kept in sync.

Every collector reader (`stats`, `check`, `show`, `episodes`, `export`, `trainer-view`,
`load_run`) works on a run directory. A run under ``s3://bucket/prefix`` is read through
`local_view`: every key under the prefix is mirrored, at the same relative path, into
``$COLLECTOR_CACHE_DIR/s3/<bucket>/<prefix>`` (default ``~/.cache/collector``), and the
readers then run unchanged on that directory. `resolve_run` is the one place a reader's
RUN argument is turned into a directory (a URI to its mirror, a path to itself).

Why a mirror and not a filesystem layer under each reader: `check` must see exactly the
bucket's state (stray files in ``data/``, leftovers in ``.collector/tmp/``), the manifest
fold, shard lookup and checksums are all file-based, and a second read of the same run
costs one listing: only keys whose size or ETag changed since the last sync are downloaded
(an index beside the tree remembers what each local file is a copy of), and local files
whose keys are gone are removed.

A writer may be committing or compacting while we sync: the listing is not a snapshot, so
a record can vanish between the listing and its download (compaction folded it into a new
base), or a shard can move from ``.collector/tmp/`` into ``data/``. After each sync the
mirror's manifest is read; if it shows a gap in the commit log or names a shard that is not
there, the sync runs again. A bucket that stays in that state across a sync that changed
nothing is what the bucket holds, and the readers report it (`check`: a problem); one that
keeps changing ends after `SYNC_ATTEMPTS` with one line.

A damaged local copy. The sync trusts a local file whose size and ETag match the key's only
while the file is the one it wrote: the index keeps each file's size and mtime as written, and
a file changed since (edited, truncated, damaged) is verified again against the manifest's
sha256 (a shard) or simply fetched again (any other key). A shard whose local copy differs
from its checksum is fetched again and reported as a warning naming the "local mirror", so
that `check` never blames the bucket for a damaged copy; one that still differs once fetched
is what the bucket holds, and `check` reports it.

Keys outside the run's layout. A key that is not a plain relative path (``data/../../x``,
``a//b``) or that clashes with another (``data/x`` and ``data/x/y``) cannot be mirrored; it is
ignored and reported as a warning naming it, so that one stray key never makes the run
unreadable to every reader.

Errors (no such bucket, no permission, credentials refused, endpoint unreachable, boto3 not
installed) are one `OutputError` line naming the run's URI, built from the error's code,
never from a message that could carry a credential. Credentials come from the SDK's usual
chain (environment, profile, instance role) and are never written to the cache.

Tests: tests/storage/test_s3_readers.py, tests/storage/test_mirror.py.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from collector.errors import OutputError
from collector.storage.location import ObjectLocation, parse_location
from collector.storage.manifest import (
    CHECKSUM_ALGORITHM,
    DATA_DIR,
    LEGACY_MANIFEST,
    MANIFEST,
    NotARunDirectory,
    file_digest,
    read_manifest,
    shard_location,
    unique_entries,
)
from collector.storage.s3client import make_client

__all__ = ["SYNC_ATTEMPTS", "SyncResult", "cache_root", "index_path", "local_view", "mirror_dir",
           "resolve_run", "sync"]

#: How many times a sync is repeated while a writer changes the run under it.
SYNC_ATTEMPTS = 5
#: Bounded waits on the object store (seconds), so that no reader hangs on a dead endpoint.
CONNECT_TIMEOUT_S = 10
READ_TIMEOUT_S = 60
_CHUNK = 1 << 20
_INDEX_VERSION = 1

log = logging.getLogger(__name__)


def resolve_run(run: str | Path) -> Path:
    """The directory a reader reads for `run`: a local path as given, or the synced mirror of
    an ``s3://`` URI (OutputError, one line, for an unsupported or unreachable location)."""
    location = parse_location(run)
    if isinstance(location, Path):
        return location
    return local_view(location)


def cache_root() -> Path:
    """Where mirrors are kept: ``$COLLECTOR_CACHE_DIR``, else ``$XDG_CACHE_HOME/collector``,
    else ``~/.cache/collector``."""
    explicit = os.environ.get("COLLECTOR_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "collector"


def mirror_dir(location: ObjectLocation) -> Path:
    """The local copy of the run at `location` (the same relative paths as its keys).

    A prefix with ``.`` or ``..`` segments is refused: its mirror would lie outside the cache,
    and a sync removes every local file there that is not a key.
    """
    if any(part in ("", ".", "..") for part in location.prefix.split("/")) and location.prefix:
        raise OutputError(f"{location}: a run's prefix cannot hold '.' or '..' segments or '//'")
    root = cache_root() / location.scheme / location.bucket
    return root / location.prefix if location.prefix else root


def index_path(location: ObjectLocation) -> Path:
    """The sync index of `location`'s mirror: outside the mirrored tree (a bucket name never
    starts with a dot), so that no reader and no `check` ever sees it."""
    name = quote(location.prefix, safe="") or "_bucket_root"
    return cache_root() / location.scheme / ".index" / location.bucket / f"{name}.json"


@dataclass
class SyncResult:
    """What one sync changed in the mirror (run-relative paths)."""

    downloaded: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    """One line per key ignored (outside the run's layout) or local copy fetched again."""

    @property
    def changed(self) -> bool:
        return bool(self.downloaded or self.removed)


def local_view(location: ObjectLocation) -> Path:
    """A local directory holding exactly the keys under `location`, synced now.

    Raises `NotARunDirectory` when no manifest is under the prefix, OutputError (one line
    naming the URI) when the store cannot be read or the run keeps changing under the sync.
    """
    root = mirror_dir(location)
    problem = ""
    for _ in range(SYNC_ATTEMPTS):
        result = sync(location)
        for warning in result.warnings:
            log.warning("%s", warning)
        problem = _inconsistency(root)
        if not problem or not result.changed:
            # Consistent; or a sync that changed nothing found it so: the bucket itself holds
            # this state (a stray file, a damaged log), and the readers report it.
            return root
    raise OutputError(f"{location}: the run kept changing while it was mirrored ({SYNC_ATTEMPTS} syncs; "
                      f"last: {problem}); try again")


def _inconsistency(root: Path) -> str:
    """Why the mirror is not a committed state a writer could have left (a sync raced a
    commit or a compaction), or "" when it is one."""
    try:
        manifest = read_manifest(root)
    except NotARunDirectory:
        return "no manifest"
    except OutputError as e:
        return str(e)
    entries, _ = unique_entries(manifest["shards"])
    for entry in entries:
        if not shard_location(root, entry["path"]).is_file():
            return f"{entry['path']} is named in the manifest but was not listed"
    # A shard listed whose commit record was not (it landed after the listing reached the
    # log): a writer never leaves that, so it is either a race or a stray in the bucket.
    named = {entry["path"] for entry in entries}
    data = root / DATA_DIR
    for path in sorted(data.iterdir()) if data.is_dir() else []:
        rel = f"{DATA_DIR}/{path.name}"
        if rel not in named:
            return f"{rel} is not named in the manifest"
    return ""


def sync(location: ObjectLocation) -> SyncResult:
    """Bring the mirror of `location` to the keys listed now: download new and changed keys,
    remove local files whose keys are gone. One sync of a mirror at a time (a file lock)."""
    client = _client(location)
    root = mirror_dir(location)
    index_file = index_path(location)
    index_file.parent.mkdir(parents=True, exist_ok=True)
    with _locked(index_file.with_suffix(".lock")):
        result = SyncResult()
        listing = _list(client, location, result.warnings)
        if MANIFEST not in listing and LEGACY_MANIFEST not in listing:
            raise NotARunDirectory(f"{location} is not a run (no {MANIFEST} under it)")
        index = _load_index(index_file)
        generation = int(index.get("syncs", 0)) + 1
        known: dict[str, dict[str, Any]] = index.get("keys", {})
        root.mkdir(parents=True, exist_ok=True)
        for rel in _local_files(root):
            if rel not in listing:
                (root / rel).unlink()
                known.pop(rel, None)
                result.removed.append(rel)
        checksums = _checksums(root) if any(_changed(root / rel, known.get(rel)) for rel in listing) else {}
        for rel, (size, etag) in sorted(listing.items()):
            target = root / rel
            entry = known.get(rel)
            if entry is not None and entry.get("etag") == etag and entry.get("size") == size:
                if not _changed(target, entry):
                    continue
                if target.is_file() and rel in checksums and _digest(target) == checksums[rel]:
                    known[rel] = {**entry, **_stamp(target)}  # touched, not damaged: nothing to fetch
                    continue
                if target.is_file():
                    result.warnings.append(
                        f"{location}: {rel} in the local mirror ({target}) was damaged or changed since it "
                        "was fetched (it differs from the bucket's object); fetched again")
            try:
                got = _download(client, location, rel, target, index_file.parent)
            except _Clash as clash:
                result.warnings.append(str(clash))
                known.pop(rel, None)
                continue
            if got is None:  # deleted since the listing (a compaction, a moved shard)
                known.pop(rel, None)
                if target.is_file():
                    target.unlink()
                    result.removed.append(rel)
                continue
            # The ETag of what was downloaded, not the listing's: the key may have been
            # replaced in between, and the next sync must then fetch it again.
            known[rel] = {"size": got[0], "etag": got[1], "sync": generation, **_stamp(target)}
            result.downloaded.append(rel)
        _prune_empty_dirs(root)
        _write_index(index_file, {"version": _INDEX_VERSION, "uri": str(location), "syncs": generation,
                                  "keys": known})
    return result


def _stamp(path: Path) -> dict[str, int]:
    """What a local file looked like when the sync wrote or verified it."""
    st = path.stat()
    return {"local_size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _changed(path: Path, entry: dict[str, Any] | None) -> bool:
    """Whether the local copy is not the file the last sync left (or there is none)."""
    if entry is None:
        return True
    try:
        st = path.stat()
    except OSError:
        return True
    return not path.is_file() or (st.st_size, st.st_mtime_ns) != (entry.get("local_size", entry.get("size")),
                                                                 entry.get("mtime_ns", st.st_mtime_ns))


def _checksums(root: Path) -> dict[str, str]:
    """The manifest's checksum of each committed shard, by run-relative path (of both places a
    committed shard may be: data/, or pending); {} when the local manifest cannot be read."""
    try:
        manifest = read_manifest(root)
    except OutputError:
        return {}
    out: dict[str, str] = {}
    for entry in manifest["shards"]:
        checksum = entry.get("checksum")
        if isinstance(checksum, str) and checksum.startswith(f"{CHECKSUM_ALGORITHM}:"):
            out[entry["path"]] = checksum
            out[shard_location(root, entry["path"]).relative_to(root).as_posix()] = checksum
    return out


def _digest(path: Path) -> str:
    return file_digest(path)[1]


def _local_files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() or p.is_symlink())


def _prune_empty_dirs(root: Path) -> None:
    """Object stores have no directories: an emptied one would still be seen by `check`."""
    for path in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):  # not empty
            path.rmdir()


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _load_index(path: Path) -> dict[str, Any]:
    """The last sync's index; a missing or damaged one means "nothing known" (all downloaded)."""
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if (not isinstance(index, dict) or index.get("version") != _INDEX_VERSION
            or not isinstance(index.get("keys"), dict)):
        return {}
    return index


def _write_index(path: Path, index: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_text(json.dumps(index, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)


# --- the object store ----------------------------------------------------------------------


def _client(location: ObjectLocation) -> Any:
    """An S3 client from the SDK's usual configuration (AWS_* variables, profile, role), with
    bounded timeouts and retries (a mirror downloads whole shards: a longer read timeout)."""
    return make_client(f"{location}: reading a run in object storage",
                       connect_timeout_s=CONNECT_TIMEOUT_S, read_timeout_s=READ_TIMEOUT_S)


def _list(client: Any, location: ObjectLocation, warnings: list[str]) -> dict[str, tuple[int, str]]:
    """Every key under the prefix as run-relative path -> (size, ETag); one that cannot be
    mirrored is left out, with a line in `warnings`."""
    prefix = f"{location.prefix}/" if location.prefix else ""
    listing: dict[str, tuple[int, str]] = {}
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=location.bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                key = obj["Key"]
                rel = key[len(prefix):]
                if rel.endswith("/"):
                    continue  # a "directory" marker some tools create: no data, no file
                problem = _not_relative(location, key, rel)
                if problem:
                    warnings.append(problem)
                    continue
                listing[rel] = (int(obj["Size"]), str(obj["ETag"]))
    except OutputError:
        raise
    except Exception as e:  # noqa: BLE001 - every SDK failure becomes one line
        raise _store_error(location, e) from None
    return listing


def _not_relative(location: ObjectLocation, key: str, rel: str) -> str:
    """Why a key cannot be mirrored without escaping the mirror (``..``) or colliding with
    another key (``a//b``), or "" when it is a plain relative path."""
    parts = rel.split("/")
    if not rel or rel.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\0" in rel:
        return (f"{location}: key {key!r} is not a plain relative path (outside the run's layout); "
                "ignored, not mirrored")
    return ""


class _Clash(Exception):
    """A key that cannot have a file of its own in the mirror (another key's directory)."""


def _download(client: Any, location: ObjectLocation, rel: str, target: Path, scratch: Path
              ) -> tuple[int, str] | None:
    """Download `rel` into `target` (whole or not at all); its (size, ETag), or None when
    the key no longer exists."""
    tmp = scratch / f".download-{uuid.uuid4().hex}.part"
    try:
        try:
            reply = client.get_object(Bucket=location.bucket, Key=location.key(rel))
            size = 0
            with open(tmp, "wb") as f:
                for chunk in reply["Body"].iter_chunks(_CHUNK):
                    f.write(chunk)
                    size += len(chunk)
        except Exception as e:  # noqa: BLE001 - every SDK failure becomes one line
            if _code(e) in ("NoSuchKey", "404"):
                return None
            raise _store_error(location, e) from None
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.is_dir():
                raise IsADirectoryError(str(target))
            os.replace(tmp, target)
        except OSError as e:
            # Keys "a" and "a/b" both exist: a file and a directory cannot share a name here.
            raise _Clash(f"{location}: key {location.key(rel)!r} clashes with another key in the local "
                         f"mirror ({e.strerror or type(e).__name__}); ignored, not mirrored") from None
        return size, str(reply.get("ETag", ""))
    finally:
        tmp.unlink(missing_ok=True)


def _code(error: BaseException) -> str:
    response = getattr(error, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return ""


def _status(error: BaseException) -> int | None:
    response = getattr(error, "response", None)
    if isinstance(response, dict):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return int(status) if status is not None else None
    return None


def _endpoint(error: BaseException) -> str:
    """The host the SDK tried (no path, no query, no user info)."""
    url = str(getattr(error, "kwargs", {}).get("endpoint_url", "") or "")
    host = urlsplit(url).hostname if url else None
    port = urlsplit(url).port if url else None
    return f"{host}:{port}" if host and port else (host or "the endpoint")


def _store_error(location: ObjectLocation, error: BaseException) -> OutputError:
    """One line for a failure of the object store, from its code and kind only: an SDK
    message may quote a request, and nothing that could carry a credential is echoed."""
    kind = type(error).__name__
    code = _code(error)
    status = _status(error)
    if code in ("NoSuchBucket",):
        reason = f"bucket {location.bucket!r} does not exist"
    elif code in ("AccessDenied", "AllAccessDisabled") or (status == 403 and code not in (
            "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken")):
        reason = f"access to bucket {location.bucket!r} denied (the credentials lack permission to read it)"
    elif code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken"):
        reason = f"the credentials were refused ({code})"
    elif code:
        reason = f"the object store answered {code}" + (f" (HTTP {status})" if status else "")
    elif kind in ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"):
        reason = ("no usable credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE)")
    elif kind in ("EndpointConnectionError", "ConnectTimeoutError", "ConnectionClosedError",
                  "ReadTimeoutError", "ProxyConnectionError"):
        reason = f"cannot reach {_endpoint(error)} ({kind})"
    elif kind in ("ProfileNotFound", "NoRegionError", "InvalidRegionError"):
        reason = f"the SDK configuration is incomplete ({kind})"
    else:
        reason = f"reading failed ({kind})"
    return OutputError(f"{location}: {reason}")

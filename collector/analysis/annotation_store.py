"""Where a regrade annotation is written: the run's own storage, with the commit protocol's shape.

An annotation (`collector.analysis.regrade`) lives under ``.collector/annotations/NAME/`` of
the run, wherever the run is: a local directory (`LocalAnnotations`) or an S3 prefix
(`S3Annotations`, the bucket itself, never the reader's local mirror, which the next sync
would overwrite). Both offer the same four operations, the ones the commit protocol of
shards rests on (`collector.storage.commit`):

- ``put``: a chunk or ``meta.json`` written whole (locally temp, fsync, rename, fsync the
  directory; in S3 one PUT, which is atomic);
- ``create``: a commit record created only if absent, with its content in one step (locally
  a hard link of a fsynced temp file, which fails when the name exists: a record is never
  seen empty or torn; in S3 ``If-None-Match: *``): the commit point, which two regrades
  cannot both pass;
- ``names`` / ``read``: what is there; ``delete``: a file a record has decided is an orphan.

`LocalAnnotations.exclusive` also holds a flock on ``regrade.lock`` for the whole regrade, so
that a second regrade of the same NAME on this machine is refused before it grades or
deletes anything. S3 has no flock; there the create-only record is what refuses the second
(and nothing a record has not decided is ever deleted, so neither can harm the other).

Tests: tests/analysis/test_regrade_faults.py.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path

from collector.errors import OutputError
from collector.storage.location import ObjectLocation
from collector.storage.manifest import fsync_dir
from collector.storage.s3client import PreconditionFailed, S3Bucket

__all__ = ["AnnotationFiles", "LocalAnnotations", "S3Annotations"]

#: The flock a local regrade holds on its annotation's folder.
LOCK_NAME = "regrade.lock"


class AnnotationFiles(ABC):
    """The files of one annotation, by name (``meta.json``, ``chunk-...``, ``commit-...``)."""

    where: str
    """The annotation's folder as the user knows it (a path or an ``s3://`` URI): every message names it."""

    @abstractmethod
    def names(self) -> list[str]:
        """The file names in the annotation's folder now."""

    @abstractmethod
    def read(self, name: str) -> bytes | None:
        """The file's bytes, None when it does not exist."""

    @abstractmethod
    def put(self, name: str, data: bytes) -> None:
        """Write `name` whole and durably (replacing nothing anyone names: names are unique)."""

    @abstractmethod
    def create(self, name: str, data: bytes) -> bool:
        """Create `name` holding `data` only if absent (the commit point); False when it existed."""

    @abstractmethod
    def delete(self, name: str) -> None:
        """Remove `name` (absent is fine)."""

    @contextlib.contextmanager
    def exclusive(self, refusal: str) -> Iterator[None]:
        """Held for the whole regrade; raises OutputError(`refusal`) when another one holds it."""
        yield


class LocalAnnotations(AnnotationFiles):
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.where = str(folder)

    def names(self) -> list[str]:
        return [p.name for p in self.folder.iterdir()] if self.folder.is_dir() else []

    def read(self, name: str) -> bytes | None:
        try:
            return (self.folder / name).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise OutputError(f"{self.folder / name}: unreadable ({e})") from e

    def _durable_temp(self, name: str, data: bytes) -> Path:
        tmp = self.folder / f".{name}.{uuid.uuid4().hex[:8]}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        return tmp

    def put(self, name: str, data: bytes) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self._durable_temp(name, data)
        os.replace(tmp, self.folder / name)
        fsync_dir(self.folder)

    def create(self, name: str, data: bytes) -> bool:
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self._durable_temp(name, data)
        try:
            os.link(tmp, self.folder / name)  # atomic and create-only: whole or absent, never torn
        except FileExistsError:
            return False
        finally:
            tmp.unlink()
        fsync_dir(self.folder)
        return True

    def delete(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.folder / name).unlink()

    @contextlib.contextmanager
    def exclusive(self, refusal: str) -> Iterator[None]:
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise OutputError(refusal) from None
            for name in self.names():  # a killed writer's temp record or meta: no one else writes here now
                if name.startswith((".commit-", ".meta.json.")) and name.endswith(".tmp"):
                    self.delete(name)
            yield  # released by the kernel if this process is killed
        finally:
            os.close(fd)


class S3Annotations(AnnotationFiles):
    def __init__(self, bucket: S3Bucket, location: ObjectLocation, rel: str) -> None:
        self.bucket = bucket
        self.prefix = location.key(rel).rstrip("/") + "/"
        self.where = f"{location}/{rel}"

    def names(self) -> list[str]:
        return [key[len(self.prefix):] for key in self.bucket.keys(self.prefix)
                if "/" not in key[len(self.prefix):]]

    def read(self, name: str) -> bytes | None:
        found = self.bucket.get(self.prefix + name)
        return None if found is None else found[0]

    def put(self, name: str, data: bytes) -> None:
        self.bucket.put(self.prefix + name, data)

    def create(self, name: str, data: bytes) -> bool:
        try:
            self.bucket.put(self.prefix + name, data, create_only=True)
        except PreconditionFailed:
            return False
        return True

    def delete(self, name: str) -> None:
        self.bucket.delete(self.prefix + name)

"""Where a run lives: a local directory, or a prefix in an object store.

`output.path` (and every reader's RUN argument) is either a filesystem path or a URI
``s3://bucket/prefix``. This module only says which, in one place, so that the writer
(`collector.storage.local` / `collector.storage.s3store`) and the readers agree.

Which stores can hold a run. Exactly once needs a commit point that two writers cannot
both pass: on a local disk that is flock + rename; in an object store it is a create-only
write (S3 ``If-None-Match: *``, answered 412 when the key exists) for each commit record,
and ``If-Match`` on an ETag for the manifest swap. S3 (AWS since 2024-08; MinIO, Cloudflare
R2 and moto implement it too) is supported, and `collector.storage.s3store` refuses an
endpoint that ignores the precondition instead of weakening the guarantee. ``gs://`` and
the other fsspec schemes are refused in one line. GCS has the primitive, in its own form
(``ifGenerationMatch=0`` / ``x-goog-if-generation-match: 0`` for create-only, a generation
match for the swap), but its S3-compatible endpoint honours ``If-None-Match`` only on reads,
so pointing the S3 store at it is refused by the probe; a native adapter is not built here
(no GCS server can run in the test suite to prove it).

Tests: tests/storage/test_location.py, tests/storage/test_s3_readers.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from collector.errors import OutputError

__all__ = ["ObjectLocation", "is_uri", "parse_location"]

#: Schemes a run may live under (a local path has none).
SUPPORTED_SCHEMES = ("s3",)

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
# S3's bucket naming rules (3-63 chars, lower case, digits, dots, hyphens).
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


@dataclass(frozen=True)
class ObjectLocation:
    """A run under ``<scheme>://<bucket>/<prefix>``; `prefix` has no leading or trailing slash."""

    scheme: str
    bucket: str
    prefix: str

    def key(self, rel: str) -> str:
        """The object key of `rel` (a run-relative path such as ``data/part-...arrow``)."""
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def __str__(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.prefix}" if self.prefix else f"{self.scheme}://{self.bucket}"


def is_uri(value: str | Path) -> bool:
    """True when `value` names an object store (``scheme://...``), not a local path."""
    return isinstance(value, str) and _SCHEME.match(value) is not None


def parse_location(value: str | Path) -> Path | ObjectLocation:
    """A local `Path`, or the `ObjectLocation` of a supported URI; OutputError (one line) otherwise.

    A URI carrying credentials (``s3://key:secret@bucket``) is refused without echoing them:
    credentials come from the environment (the SDK's usual chain), never from the path.
    """
    if not is_uri(value):
        return Path(value)
    text = str(value)
    match = _SCHEME.match(text)
    assert match is not None
    scheme = match.group(1).lower()
    parts = urlsplit(text)
    if "@" in parts.netloc:
        raise OutputError(
            f"output path {scheme}://... carries credentials in the URI; remove them and set them "
            "in the environment (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or a profile)"
        )
    if scheme not in SUPPORTED_SCHEMES:
        raise OutputError(
            f"output path {text}: {scheme}:// is not supported (a run can live on a local path or "
            "under s3://bucket/prefix, where commits can be made create-only)"
        )
    bucket = parts.netloc
    if not _BUCKET.match(bucket):
        raise OutputError(f"output path {text}: {bucket!r} is not a valid S3 bucket name")
    if parts.query or parts.fragment:
        raise OutputError(f"output path {text}: a run location takes no query or fragment")
    # One slash each side is the URI's own ("s3://b/run/" is "run"); inside, a key is taken
    # literally by S3 but normalized by every path-based reader (and by the mirror): an empty,
    # "." or ".." segment would name a run that the writer finds and no reader does.
    path = parts.path.removeprefix("/").removesuffix("/")
    if path and any(seg in ("", ".", "..") for seg in path.split("/")):
        raise OutputError(
            f"{text}: a run's prefix cannot hold '.' or '..' segments or '//' (S3 takes keys "
            "literally, every reader would refuse the run); write it without them"
        )
    return ObjectLocation(scheme, bucket, path)

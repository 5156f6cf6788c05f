"""The few S3 calls a run store makes, each failure one line naming the bucket, key and S3 code.

`S3Bucket` wraps a boto3 client for one bucket: create-only puts (``If-None-Match: *``),
puts and deletes conditional on an ETag (``If-Match``), gets, copies and listings. A failed
precondition is a `PreconditionFailed` (the caller decides what it means: another writer
committed first, the lock was taken over); every other botocore failure is an `OutputError`
of one line, ``"s3://bucket/key: <what> (<S3 code>)"``, with the values of the AWS credential
variables scrubbed out of any text taken from botocore (a wrong key must not echo it).

Credentials come from boto3's usual chain (environment, profile, instance or pod role) and
the endpoint from ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` (boto3 reads both itself).
Connect and read timeouts and the retry count are bounded (`_CONFIG`), so an unreachable
endpoint is an error within seconds, never a hang; their worst case also stays well under
the lock's lease (`collector.storage.s3store`).

Throttling. botocore's own attempts give up after `_MAX_ATTEMPTS`, which a burst of
``SlowDown`` (503) outlasts: a run would stop on a bucket that only asked it to slow down.
A throttled request (it was not processed: safe to send again, conditional or not) is
therefore sent again after a jittered exponential back-off (from `THROTTLE_BASE_S`, each
wait at most `THROTTLE_CAP_S`, half of it random), for at most `THROTTLE_BUDGET_S` = 60 s
of waiting per request in total; then it fails as any error does.

A retried conditional write that had landed. When a PUT reached S3 but its answer was lost
(a gateway's 500, a reset after the write, InternalError), the retry of a create-only or
``If-Match`` PUT gets 412 (or 409) from the object this very call wrote. So a refusal after a
retry is checked against what was sent before it is called a conflict: a HEAD (size, and the
MD5 ETag of a single-part PUT), and the bytes themselves when the ETag is not an MD5 (SSE-KMS).
Ours: the write succeeded (its ETag is returned). Another's: `PreconditionFailed`. Unreadable:
an `OutputError` whose outcome is unknown (the caller keeps whatever the write may name).

Tests: tests/storage/test_objectstore.py, tests/storage/test_s3_retries.py,
tests/storage/test_s3client_sessions.py.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar

from collector.errors import OutputError

__all__ = ["THROTTLE_BUDGET_S", "PreconditionFailed", "S3Bucket", "make_client", "scrub"]

log = logging.getLogger(__name__)
_T = TypeVar("_T")

_SECRET_VARS = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID")
#: 3 attempts of at most 5 s connect + 15 s read: a dead endpoint fails in about a minute at worst.
_CONNECT_TIMEOUT_S = 5.0
_READ_TIMEOUT_S = 15.0
_MAX_ATTEMPTS = 3
#: Throttling back-off (see the module docstring): first wait, longest wait, total waiting.
THROTTLE_BASE_S = 1.0
THROTTLE_CAP_S = 15.0
THROTTLE_BUDGET_S = 60.0
#: The codes (and HTTP statuses) of a request the store refused to process for now.
_THROTTLED = frozenset({"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded",
                        "RequestThrottled", "TooManyRequestsException", "ServiceUnavailable", "503"})
#: What each S3 error code means to a user, where the code alone does not say it.
_MEANING = {
    "NoSuchBucket": "no such bucket",
    "AccessDenied": "access denied (check the credentials' permissions on the bucket)",
    "AllAccessDisabled": "access denied (check the credentials' permissions on the bucket)",
    "InvalidAccessKeyId": "the access key id is not known to the endpoint (check the credentials)",
    "SignatureDoesNotMatch": "request signature rejected (check the secret access key)",
    "ExpiredToken": "the session token has expired (refresh the credentials)",
    "InvalidToken": "the session token is invalid (refresh the credentials)",
}


class PreconditionFailed(OutputError):
    """A conditional write or delete was refused (HTTP 412, or 409 for a concurrent one)."""


def scrub(text: str) -> str:
    """`text` with the value of every AWS credential variable set here replaced by ``***``."""
    for var in _SECRET_VARS:
        value = os.environ.get(var)
        if value and len(value) >= 4:
            text = text.replace(value, "***")
    return " ".join(text.split())


def make_client(purpose: str = "an s3:// output", *, connect_timeout_s: float = _CONNECT_TIMEOUT_S,
                read_timeout_s: float = _READ_TIMEOUT_S) -> Any:
    """A boto3 S3 client with bounded timeouts and retries (the writer's and the readers'
    mirror's: one place that builds them); OutputError naming `purpose` when boto3 is missing."""
    try:
        import boto3  # type: ignore[import-untyped]
        from botocore.config import Config  # type: ignore[import-untyped]
    except ImportError:
        raise OutputError(
            f"{purpose} needs boto3, which is not installed: pip install 'collector[s3]'"
        ) from None
    config = Config(
        connect_timeout=connect_timeout_s,
        read_timeout=read_timeout_s,
        retries={"max_attempts": _MAX_ATTEMPTS, "mode": "standard"},
    )
    try:
        return _session(boto3).client("s3", config=config)
    except Exception as e:  # noqa: BLE001 - a bad region or profile: one line, whatever botocore raised
        raise OutputError(f"cannot create an S3 client: {scrub(f'{type(e).__name__}: {e}')}") from None


_loader: Any = None
_loader_lock = threading.Lock()


def _session(boto3: Any) -> Any:
    """A fresh boto3 session (credentials, region and endpoint read from the environment as it is
    now) whose botocore loader of the service descriptions is shared with the others: parsing
    S3's model and endpoint rules anew was most of a client's cost (~0.1 s of CPU), paid by
    every store, reader and worker that builds one. The descriptions are read-only data of the
    installed botocore; the sessions stay apart (a boto3 session is not shared between threads)."""
    import botocore.session  # type: ignore[import-untyped]

    global _loader
    core = botocore.session.get_session()
    with _loader_lock:
        if _loader is None:
            _loader = core.get_component("data_loader")
    core.register_component("data_loader", _loader)
    session = boto3.session.Session(botocore_session=core)
    with _loader_lock:
        # boto3 adds its own data directory to the loader of every session it makes: once will do.
        _loader.search_paths[:] = list(dict.fromkeys(_loader.search_paths))
    return session


def describe(e: BaseException) -> tuple[str, str]:
    """The S3 error code of a botocore failure (or its type) and a short, scrubbed meaning."""
    response = getattr(e, "response", None)
    if isinstance(response, dict):
        error = response.get("Error", {})
        code = str(error.get("Code") or response.get("ResponseMetadata", {}).get("HTTPStatusCode", "?"))
        meaning = _MEANING.get(code) or str(error.get("Message") or "").strip() or "request failed"
        return code, scrub(meaning)
    name = type(e).__name__
    if name in ("EndpointConnectionError", "ConnectTimeoutError", "ConnectionClosedError"):
        return name, scrub(f"endpoint unreachable: {e}")
    if name == "ReadTimeoutError":
        return name, "no answer from the endpoint within the read timeout"
    if name in ("NoCredentialsError", "PartialCredentialsError"):
        return name, ("no AWS credentials found (set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, "
                      "a profile, or a role)")
    return name, scrub(str(e)) or name


def _throttled(e: BaseException) -> bool:
    response = getattr(e, "response", None)
    if not isinstance(response, dict):
        return False
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return describe(e)[0] in _THROTTLED or status == 503


class _Failed(Exception):
    """A request that failed after every retry; `retried`: whether it was sent more than once."""

    def __init__(self, error: BaseException, retried: bool) -> None:
        super().__init__(str(error))
        self.error = error
        self.retried = retried


def _retry_attempts(e: BaseException) -> int:
    response = getattr(e, "response", None)
    if not isinstance(response, dict):
        return 0
    return int(response.get("ResponseMetadata", {}).get("RetryAttempts") or 0)


class S3Bucket:
    """One bucket, through one client (thread-safe: the store verifies shards in a few threads)."""

    def __init__(self, bucket: str, client: Any | None = None) -> None:
        self.name = bucket
        self.client = client if client is not None else make_client()

    @staticmethod
    def _send(call: Callable[[], _T]) -> _T:
        """`call()`, sent again while it is throttled (the module docstring's back-off); `_Failed`
        once it fails otherwise or the budget is spent."""
        waited, attempt = 0.0, 0
        while True:
            try:
                return call()
            except Exception as e:  # noqa: BLE001 - classified here, described by the caller
                if not _throttled(e) or waited >= THROTTLE_BUDGET_S:
                    raise _Failed(e, attempt > 0 or _retry_attempts(e) > 0) from None
                step = min(THROTTLE_CAP_S, THROTTLE_BASE_S * 2 ** attempt)
                delay = min(step / 2 + random.uniform(0, step / 2), THROTTLE_BUDGET_S - waited)
                time.sleep(delay)
                waited += delay
                attempt += 1

    def _fail(self, key: str, action: str, e: BaseException) -> OutputError:
        code, meaning = describe(e)
        status = getattr(e, "response", {}).get("ResponseMetadata", {}).get("HTTPStatusCode")
        where = f"s3://{self.name}/{key}"
        if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (412,):
            return PreconditionFailed(f"{where}: {action} refused: the object changed ({code})")
        return OutputError(f"{where}: {action} failed: {meaning} ({code})")

    def _call(self, key: str, action: str, method: str, **kwargs: Any) -> Any:
        try:
            return self._send(lambda: getattr(self.client, method)(Bucket=self.name, **kwargs))
        except _Failed as f:  # every botocore failure becomes one line
            raise self._fail(key, action, f.error) from None

    def put(self, key: str, body: bytes, *, create_only: bool = False, if_match: str | None = None) -> str:
        """PUT `body` at `key` (create-only, or only over the version with ETag `if_match`); its ETag."""
        extra: dict[str, str] = {}
        if create_only:
            extra["IfNoneMatch"] = "*"
        if if_match is not None:
            extra["IfMatch"] = if_match
        try:
            response = self._send(lambda: self.client.put_object(Bucket=self.name, Key=key, Body=body,
                                                                 **extra))
        except _Failed as f:  # every botocore failure becomes one line
            if if_match is not None and describe(f.error)[0] in ("NoSuchKey", "404"):
                # If-Match on a key that is gone: the version we hold no longer exists (S3 says 404).
                raise PreconditionFailed(f"s3://{self.name}/{key}: write refused: the object is gone") \
                    from None
            failure = self._fail(key, "write", f.error)
            if isinstance(failure, PreconditionFailed) and f.retried:
                landed = self._landed(key, body)
                if landed is not None:
                    log.info("s3://%s/%s: a retried write was refused by its own first attempt, which "
                             "had landed", self.name, key)
                    return landed
            raise failure from None
        return str(response["ETag"])

    def _landed(self, key: str, body: bytes) -> str | None:
        """The ETag of the object at `key` when it holds exactly `body` (the write that a retry
        found in its way was this one), None when it holds something else or nothing; an
        OutputError (outcome unknown) when that cannot be read."""
        try:
            head = self._send(lambda: self.client.head_object(Bucket=self.name, Key=key))
            if int(head.get("ContentLength", -1)) != len(body):
                return None
            etag = str(head["ETag"])
            if etag.strip('"') == hashlib.md5(body, usedforsecurity=False).hexdigest():
                return etag
            # Not an MD5 (SSE-KMS, a multipart upload): the bytes decide.
            got = self._send(lambda: self.client.get_object(Bucket=self.name, Key=key))
            return str(got["ETag"]) if got["Body"].read() == body else None
        except _Failed as f:
            if describe(f.error)[0] in ("NoSuchKey", "404", "NotFound"):
                return None
            code, meaning = describe(f.error)
            raise OutputError(f"s3://{self.name}/{key}: a retried write was refused and what is there "
                              f"could not be read back: {meaning} ({code})") from None

    def get(self, key: str) -> tuple[bytes, str, dt.datetime] | None:
        """The object's bytes, ETag and LastModified (the store's clock), or None when absent."""
        found = self.get_with_date(key)
        return None if found is None else found[:3]

    def get_with_date(self, key: str) -> tuple[bytes, str, dt.datetime, dt.datetime | None] | None:
        """As `get`, with the answer's ``Date`` header (the store's clock now; None if absent)."""
        def read() -> tuple[bytes, str, dt.datetime, dt.datetime | None]:
            response = self.client.get_object(Bucket=self.name, Key=key)
            date = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
            try:
                now = parsedate_to_datetime(date) if date else None
            except (TypeError, ValueError):
                now = None
            return response["Body"].read(), str(response["ETag"]), response["LastModified"], now

        try:
            return self._send(read)
        except _Failed as f:
            if describe(f.error)[0] in ("NoSuchKey", "404"):
                return None
            raise self._fail(key, "read", f.error) from None

    def head(self, key: str) -> dict[str, Any] | None:
        """The object's metadata (ETag, ContentLength, LastModified), or None when absent."""
        try:
            return dict(self._send(lambda: self.client.head_object(Bucket=self.name, Key=key)))
        except _Failed as f:
            if describe(f.error)[0] in ("NoSuchKey", "404", "NotFound"):
                return None
            raise self._fail(key, "read", f.error) from None

    def copy(self, source: str, target: str) -> None:
        """Server-side copy (the bytes never leave the store)."""
        self._call(target, f"copy from {source}", "copy_object", Key=target,
                   CopySource={"Bucket": self.name, "Key": source})

    def delete(self, key: str, *, if_match: str | None = None) -> None:
        """Delete `key` (absent is fine), only if its ETag is `if_match` when given."""
        extra = {"IfMatch": if_match} if if_match is not None else {}
        self._call(key, "delete", "delete_object", Key=key, **extra)

    def keys(self, prefix: str) -> Iterator[str]:
        """Every key starting with `prefix` (page by page, each page's request retried alone)."""
        token: str | None = None
        while True:
            extra = {"ContinuationToken": token} if token else {}
            try:
                page = self._send(lambda: self.client.list_objects_v2(Bucket=self.name, Prefix=prefix,
                                                                     **extra))  # noqa: B023
            except _Failed as f:
                raise self._fail(prefix, "listing", f.error) from None
            for obj in page.get("Contents", []):
                yield str(obj["Key"])
            token = page.get("NextContinuationToken") if page.get("IsTruncated") else None
            if not token:
                return

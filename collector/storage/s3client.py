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
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Iterator
from typing import Any

from collector.errors import OutputError

__all__ = ["PreconditionFailed", "S3Bucket", "make_client", "scrub"]

_SECRET_VARS = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID")
#: 3 attempts of at most 5 s connect + 15 s read: a dead endpoint fails in about a minute at worst.
_CONNECT_TIMEOUT_S = 5.0
_READ_TIMEOUT_S = 15.0
_MAX_ATTEMPTS = 3
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
        return boto3.session.Session().client("s3", config=config)
    except Exception as e:  # noqa: BLE001 - a bad region or profile: one line, whatever botocore raised
        raise OutputError(f"cannot create an S3 client: {scrub(f'{type(e).__name__}: {e}')}") from None


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


class S3Bucket:
    """One bucket, through one client (thread-safe: the store verifies shards in a few threads)."""

    def __init__(self, bucket: str, client: Any | None = None) -> None:
        self.name = bucket
        self.client = client if client is not None else make_client()

    def _fail(self, key: str, action: str, e: BaseException) -> OutputError:
        code, meaning = describe(e)
        status = getattr(e, "response", {}).get("ResponseMetadata", {}).get("HTTPStatusCode")
        where = f"s3://{self.name}/{key}"
        if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (412,):
            return PreconditionFailed(f"{where}: {action} refused: the object changed ({code})")
        return OutputError(f"{where}: {action} failed: {meaning} ({code})")

    def _call(self, key: str, action: str, method: str, **kwargs: Any) -> Any:
        try:
            return getattr(self.client, method)(Bucket=self.name, **kwargs)
        except Exception as e:  # noqa: BLE001 - every botocore failure becomes one line
            raise self._fail(key, action, e) from None

    def put(self, key: str, body: bytes, *, create_only: bool = False, if_match: str | None = None) -> str:
        """PUT `body` at `key` (create-only, or only over the version with ETag `if_match`); its ETag."""
        extra: dict[str, str] = {}
        if create_only:
            extra["IfNoneMatch"] = "*"
        if if_match is not None:
            extra["IfMatch"] = if_match
        try:
            response = self.client.put_object(Bucket=self.name, Key=key, Body=body, **extra)
        except Exception as e:  # noqa: BLE001 - every botocore failure becomes one line
            if if_match is not None and describe(e)[0] in ("NoSuchKey", "404"):
                # If-Match on a key that is gone: the version we hold no longer exists (S3 says 404).
                raise PreconditionFailed(f"s3://{self.name}/{key}: write refused: the object is gone") \
                    from None
            raise self._fail(key, "write", e) from None
        return str(response["ETag"])

    def get(self, key: str) -> tuple[bytes, str, dt.datetime] | None:
        """The object's bytes, ETag and LastModified (the store's clock), or None when absent."""
        try:
            response = self.client.get_object(Bucket=self.name, Key=key)
            return response["Body"].read(), str(response["ETag"]), response["LastModified"]
        except Exception as e:  # noqa: BLE001
            if describe(e)[0] in ("NoSuchKey", "404"):
                return None
            raise self._fail(key, "read", e) from None

    def head(self, key: str) -> dict[str, Any] | None:
        """The object's metadata (ETag, ContentLength, LastModified), or None when absent."""
        try:
            return dict(self.client.head_object(Bucket=self.name, Key=key))
        except Exception as e:  # noqa: BLE001
            if describe(e)[0] in ("NoSuchKey", "404", "NotFound"):
                return None
            raise self._fail(key, "read", e) from None

    def copy(self, source: str, target: str) -> None:
        """Server-side copy (the bytes never leave the store)."""
        self._call(target, f"copy from {source}", "copy_object", Key=target,
                   CopySource={"Bucket": self.name, "Key": source})

    def delete(self, key: str, *, if_match: str | None = None) -> None:
        """Delete `key` (absent is fine), only if its ETag is `if_match` when given."""
        extra = {"IfMatch": if_match} if if_match is not None else {}
        self._call(key, "delete", "delete_object", Key=key, **extra)

    def keys(self, prefix: str) -> Iterator[str]:
        """Every key starting with `prefix`."""
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.name, Prefix=prefix)
            for page in pages:
                for obj in page.get("Contents", []):
                    yield str(obj["Key"])
        except Exception as e:  # noqa: BLE001
            raise self._fail(prefix, "listing", e) from None

"""A real S3-compatible server on loopback for the object-storage tests: moto's standalone
server (`moto[server]`), which implements conditional writes (If-None-Match / If-Match ->
412) as AWS does. One server per test session, a fresh bucket per test.

Use the `s3_bucket` fixture (registered in tests/conftest.py): it sets the environment the
AWS SDKs read (keys, region, `AWS_ENDPOINT_URL_S3`) for this process and the subprocesses a
test starts, and yields an `S3Bucket` with the bucket's name, the endpoint and a boto3
client for assertions.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

#: Test-only credentials; the secret doubles as a value the secret scans look for.
ACCESS_KEY_ID = "collector-test-access-key-id"
SECRET_ACCESS_KEY = "collector-test-secret-never-stored"
REGION = "us-east-1"

_names = itertools.count()


@dataclass
class S3Bucket:
    name: str
    endpoint_url: str
    client: Any
    """A boto3 S3 client on the server (for the test's own reads and assertions)."""

    def uri(self, prefix: str = "run") -> str:
        return f"s3://{self.name}/{prefix}"

    def keys(self, prefix: str = "") -> list[str]:
        """Every key under `prefix`, sorted."""
        out: list[str] = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.name, Prefix=prefix):
            out.extend(obj["Key"] for obj in page.get("Contents", []))
        return sorted(out)

    def env(self) -> dict[str, str]:
        """What a subprocess needs to reach this server (merged into os.environ by the fixture)."""
        return session_env(self.endpoint_url)


def session_env(endpoint_url: str) -> dict[str, str]:
    """The SDK environment for the session's server (what every bucket of the session shares)."""
    return {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_ENDPOINT_URL_S3": endpoint_url,
    }


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """The loopback URL of a moto server started for the session."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> S3Bucket:
    """A fresh, empty bucket, with the SDK environment pointing at the loopback server."""
    import boto3

    bucket = S3Bucket(f"collector-test-{os.getpid()}-{next(_names)}", s3_endpoint, None)
    for key, value in bucket.env().items():
        monkeypatch.setenv(key, value)
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(key, raising=False)
    bucket.client = boto3.client(
        "s3", endpoint_url=s3_endpoint, region_name=REGION,
        aws_access_key_id=ACCESS_KEY_ID, aws_secret_access_key=SECRET_ACCESS_KEY,
    )
    bucket.client.create_bucket(Bucket=bucket.name)
    return bucket

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


@dataclass
class Fault:
    """One scripted failure of the proxy: requests that `match` (method, path with query,
    headers) get `status` instead of the server's answer, `times` times. With `forward` the
    request reaches the server first (the write lands, only its answer is lost: a gateway's
    500, a reset after the write); without, the server never sees it (throttling)."""

    match: Any
    status: int
    code: str
    forward: bool
    times: int = 1
    hits: int = 0


class FaultyProxy:
    """A loopback HTTP proxy in front of the moto server that forwards every request and
    answers as the server did, except for the requests a `Fault` matches. The fault fires on
    the request itself (an event proving the work is in flight), never on a timer."""

    def __init__(self, upstream: str) -> None:
        import http.server
        import threading
        import urllib.parse

        target = urllib.parse.urlsplit(upstream)
        self.upstream = (target.hostname or "127.0.0.1", target.port or 80)
        self.faults: list[Fault] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_: Any) -> None:
                pass

            def _any(self) -> None:
                proxy._handle(self)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def fail(self, match: Any, *, status: int = 500, code: str = "InternalError", forward: bool = True,
             times: int = 1) -> Fault:
        fault = Fault(match, status, code, forward, times)
        with self._lock:
            self.faults.append(fault)
        return fault

    def _fault_for(self, method: str, path: str, headers: Any) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                if fault.hits < fault.times and fault.match(method, path, headers):
                    fault.hits += 1
                    return fault
        return None

    def _handle(self, handler: Any) -> None:
        import http.client

        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        fault = self._fault_for(handler.command, handler.path, handler.headers)
        if fault is None or fault.forward:
            conn = http.client.HTTPConnection(*self.upstream, timeout=30)
            try:
                headers = {k: v for k, v in handler.headers.items() if k.lower() != "connection"}
                conn.request(handler.command, handler.path, body=body, headers=headers)
                answer = conn.getresponse()
                data = answer.read()
                # A HEAD's Content-Length is the object's size: kept; any other is recomputed.
                dropped = ("transfer-encoding", "connection") + (() if handler.command == "HEAD"
                                                                 else ("content-length",))
                status, reply = answer.status, [(k, v) for k, v in answer.getheaders()
                                                if k.lower() not in dropped]
            finally:
                conn.close()
        if fault is not None:
            data = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{fault.code}</Code>'
                    f"<Message>injected by the test proxy</Message></Error>").encode()
            status, reply = fault.status, [("Content-Type", "application/xml")]
        handler.send_response(status)
        for k, v in reply:
            handler.send_header(k, v)
        if fault is not None or handler.command != "HEAD":
            handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        if handler.command != "HEAD":
            handler.wfile.write(data)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def faulty_s3(s3_bucket: S3Bucket, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[S3Bucket, FaultyProxy]]:
    """`s3_bucket`, with the SDK environment pointing at a `FaultyProxy` in front of the server
    (the bucket's own `client` still talks to the server directly, for the test's assertions)."""
    proxy = FaultyProxy(s3_bucket.endpoint_url)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.url)
    try:
        yield s3_bucket, proxy
    finally:
        proxy.close()

"""Is a Ray cluster there? A check of `--address` / `ray.address` before `ray.init` is asked,
and `ray.init` itself bounded by `ray.start_timeout_s` (`start_within`).

Ray gives up on an unreachable address only after minutes of retries and dozens of warning
lines, then names an address it rewrote, and on a port where something else listens it
waits without end. `probe_cluster` answers within `ray.start_timeout_s`, in one line that
names the address as the user gave it. No Ray in here: it is plain sockets.
Tests: tests/system/run/test_ray_address.py.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import threading
import time
from collections.abc import Callable

from collector.errors import ConfigError

__all__ = ["probe_cluster", "start_within"]


def _gcs_endpoint(address: str) -> tuple[str, int] | None:
    """(host, port) of an address that names one (`host:port`, `ray://host:port`, `[::1]:port`);
    None for the forms Ray resolves itself (`auto`, `local`)."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


#: An HTTP/2 client preface and an empty SETTINGS frame: a gRPC server (Ray's GCS, Ray
#: Client) must answer it with a SETTINGS frame of its own (RFC 9113, 3.4).
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_H2_SETTINGS = 4


def probe_cluster(address: str, timeout_s: float) -> None:
    """Raise a one-line ConfigError naming `address` as given unless a gRPC server answers
    there within `timeout_s` (a TCP connect, then an HTTP/2 preface and its SETTINGS reply).

    Ray gives up on an unreachable address only after minutes of retries and dozens of
    warning lines, then names an address it rewrote, and waits without end on a port where
    something else listens; this answers in at most `ray.start_timeout_s`, before anything
    of Ray's has started. With `RAY_USE_TLS` the connect alone is checked.
    """
    endpoint = _gcs_endpoint(address)
    if endpoint is None:
        return
    deadline = time.monotonic() + timeout_s
    try:
        with socket.create_connection(endpoint, timeout=timeout_s) as sock:
            if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
                return
            sock.sendall(_H2_PREFACE)
            reply = b""
            while len(reply) < 9:
                sock.settimeout(max(0.001, deadline - time.monotonic()))
                data = sock.recv(9 - len(reply))
                if not data:
                    break
                reply += data
    except OSError as exc:
        if isinstance(exc, socket.gaierror):
            reason = "unknown host"
        elif isinstance(exc, TimeoutError):
            reason = f"no answer within ray.start_timeout_s = {timeout_s:g}s"
        else:
            reason = exc.strerror or type(exc).__name__
        raise ConfigError(
            f"ray.address: cannot reach a Ray cluster at {address} ({reason}); is it running there?"
        ) from None
    if len(reply) < 9 or reply[3] != _H2_SETTINGS:
        raise ConfigError(
            f"ray.address: {address} accepts connections but is not a Ray cluster (no gRPC answer); "
            "check the host and port"
        )


def start_within(start: Callable[[], None], timeout_s: float, address: str) -> None:
    """Run `start` (`ray.init`) and return when it did, or raise a one-line ConfigError naming
    the address and the likely cause once `timeout_s` has passed.

    A TCP probe (`probe_cluster`) proves a GCS answers, not that this driver can join: Ray
    rewrites a loopback address to the machine's own and then retries "Failed to connect to
    GCS" without end, and a cluster started with another auth mode never lets it in. So
    `start` runs on a daemon thread and is given up on at the deadline (it cannot be
    cancelled; the process is about to exit with the error). Its own exception is re-raised.
    Only for joining a cluster: an embedded cluster's processes would die with the thread
    that started them.
    """
    done = threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            start()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread as it is
            failure.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, name="collector-ray-init", daemon=True).start()
    if not done.wait(timeout_s):
        raise ConfigError(_not_started(address, timeout_s))
    if failure:
        raise failure[0]


def _not_started(address: str, timeout_s: float) -> str:
    bound = f"within ray.start_timeout_s = {timeout_s:g}s"
    endpoint = _gcs_endpoint(address)
    host = endpoint[0] if endpoint else ""
    if host == "localhost" or _is_loopback(host):
        cause = ("Ray rewrites a loopback address to this machine's own: for a single-host cluster "
                 "started on 127.0.0.1, set RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 for the driver")
    else:
        cause = ("the driver cannot reach the nodes' own addresses, or the cluster was started with "
                 "another RAY_AUTH_MODE")
    return (f"ray.address: cannot join the Ray cluster at {address} {bound}; likely cause: {cause} "
            "(docs/clusters.md; `collector cluster-check ADDRESS` checks it)")


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False

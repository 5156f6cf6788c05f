"""The system tier: tests whose subject is a process. Its one fixture: a Ray cluster for the
whole session, started on first use.

Ray takes 5-10 s to start here, so every test that needs it shares one embedded cluster
(runtime-notes.md). `address="local"` so a developer's running cluster is never joined;
a short temp dir (Ray's socket paths have a length limit) removed at the end; token
authentication disabled for this throwaway cluster, so a `collector run --address` started
by a test in a subprocess can attach to it.

The tests that use it are marked `ray` here, and `scripts/test` runs them in a pytest run of
their own without xdist (`-m ray -p no:xdist`): one cluster, started once; two clusters on two
cores would each starve the other's episodes. The rest of the tier runs on two workers.

A test marked `ray` that does not use this cluster starts Ray nodes of its own with `ray start`
(a two-node cluster, the loopback recipe): it is marked `own_cluster` too, here (`-m
own_cluster` selects them alone). `scripts/test` runs them in the same serial run as the
session cluster's tests: in a run of their own beside it, their clusters and the session's
starved each other's start-up on two cores (a worker start timed out). A `collector run` with
its embedded cluster (one node, started and stopped by the run: the demos, the README's
commands, the CLI's signals) is not marked: those run with the rest of the tier.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

#: What the session's loopback S3 server (moto's werkzeug threads, tests/s3server.py) leaves when a
#: client process a test SIGKILLs dies mid-request: its request thread's error and the socket it
#: held, reported whenever they are collected, in whichever test then runs (seen once in CI, in a
#: test that kills nothing). A leak of the test's subject is in its own process, not here; the
#: default tier, where the collector's sockets live, keeps these warnings as errors.
_KILLED_CLIENTS_LEFTOVERS = (  # (a colon separates a filter's fields: "." stands for the message's)
    "ignore:Exception in thread .*process_request_thread:pytest.PytestUnhandledThreadExceptionWarning",
    "ignore:Exception ignored in thread started by. .*process_request_thread:"
    "pytest.PytestUnraisableExceptionWarning",
    "ignore:Exception ignored in. <socket.socket .*laddr=.'127.0.0.1':"
    "pytest.PytestUnraisableExceptionWarning",
)


#: The modules whose tests share an expensive module-scoped fixture (a demo run and the runs the
#: docs show, a wheel and its venv, a run on the embedded cluster, a server): all of a module's
#: tests go to one xdist worker, which builds the fixture once (tests/test_tiers.py checks that
#: every system module with a module-scoped fixture is listed). xdist's own `xdist_group`
#: marker cannot do it on pytest 9 (its `--dist loadgroup` renames the item through an
#: attribute pytest 9 no longer reads), so the scheduler below does.
SHARED_SETUP_MODULES = frozenset({
    "tests/system/test_readme.py",
    "tests/system/test_packaging.py",
    "tests/system/run/test_embedded_cluster.py",
    "tests/system/envs/test_mcp.py",
    "tests/system/faults/test_two_nodes.py",
})


class _SharedSetupScheduling(LoadScopeScheduling):
    """`--dist load` (each test a unit of work), but the tests of a module that shares a
    module-scoped fixture are one unit."""

    def _split_scope(self, nodeid: str) -> str:
        module = nodeid.split("::", 1)[0]
        return module if module in SHARED_SETUP_MODULES else nodeid


@pytest.hookimpl(optionalhook=True)  # xdist's hook: unknown to a run without xdist (`-p no:xdist`)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LoadScopeScheduling | None:
    """The system tier's scheduler under `-n N` (xdist's public hook for one); None (xdist's own)
    for any other `--dist` asked for explicitly."""
    return _SharedSetupScheduling(config, log) if config.getvalue("dist") == "load" else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that uses the session's Ray cluster `ray`, and every other `ray` test
    `own_cluster` (module docstring); every test tolerates what killed S3 clients leave."""
    for item in items:
        for spec in _KILLED_CLIENTS_LEFTOVERS:
            item.add_marker(pytest.mark.filterwarnings(spec))
        if "ray_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.ray)
        elif item.get_closest_marker("ray") is not None:
            item.add_marker(pytest.mark.own_cluster)


@pytest.fixture(scope="session")
def ray_cluster(s3_endpoint: str) -> Iterator[str]:
    """A local Ray cluster (2 CPUs, small object store); yields its address for subprocesses.

    Its workers see the session's S3 server (tests/s3server.py) the way a real cluster's
    nodes see their bucket, from their own environment: a worker writing the shards of an
    s3:// run reads credentials and endpoint there, never from the driver."""
    import ray

    from tests.s3server import session_env

    os.environ.update(session_env(s3_endpoint))
    os.environ["RAY_AUTH_MODE"] = "disabled"
    temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    # Loopback only, like the collector's embedded cluster (collector.run.cluster): with Ray's
    # defaults its servers listen on every interface of the machine. A driver a test starts
    # in a subprocess to attach to it needs Ray's single-machine switch too (it then takes
    # 127.0.0.1 as its node's address, the one this cluster has); a test of a user's own
    # environment drops every RAY_ variable (tests/system/processes.py: user_env).
    from collector.run.cluster import EMBEDDED_INIT, LOOPBACK, ray_constants

    with ray_constants(**EMBEDDED_INIT):
        ray.init(
            address="local",
            num_cpus=2,
            include_dashboard=False,
            object_store_memory=256 * 1024 * 1024,
            _temp_dir=temp_dir,
            log_to_driver=False,
            # Ray's INFO lines go to whatever stderr was at start-up, possibly a test's capture.
            logging_level=logging.WARNING,
            _node_ip_address=LOOPBACK,
        )
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)

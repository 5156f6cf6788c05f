"""Shared fixtures. Only one: a Ray cluster for the whole session, started on first use.

Ray takes 5-10 s to start here, so every test that needs it shares one embedded cluster
(runtime-notes.md). `address="local"` so a developer's running cluster is never joined;
a short temp dir (Ray's socket paths have a length limit) removed at the end; token
authentication disabled for this throwaway cluster, so a `collector run --address` started
by a test in a subprocess can attach to it.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

# The object-storage fixtures (a moto S3 server on loopback, a bucket per test).
from tests.s3server import s3_bucket, s3_endpoint  # noqa: F401


@pytest.fixture(scope="session")
def ray_cluster(s3_endpoint: str) -> Iterator[str]:  # noqa: F811 - the fixture, by name
    """A local Ray cluster (2 CPUs, small object store); yields its address for subprocesses.

    Its workers see the session's S3 server (tests/s3server.py) the way a real cluster's
    nodes see their bucket, from their own environment: a worker writing the shards of an
    s3:// run reads credentials and endpoint there, never from the driver."""
    import ray

    from tests.s3server import session_env

    os.environ.update(session_env(s3_endpoint))
    os.environ["RAY_AUTH_MODE"] = "disabled"
    temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=256 * 1024 * 1024,
        _temp_dir=temp_dir,
        log_to_driver=False,
        # Ray's INFO lines go to whatever stderr was at start-up, possibly a test's capture.
        logging_level=logging.WARNING,
    )
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)

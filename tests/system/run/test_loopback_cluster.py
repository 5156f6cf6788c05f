"""The test session's own Ray cluster (tests/system/conftest.py) listens on loopback only, as the
collector's embedded cluster does (tests/system/run/test_embedded_cluster.py checks that one):
every listening socket of its processes, read with psutil.
"""

from __future__ import annotations

import os

import psutil
import pytest

from tests.system.processes import LOOPBACK, listening


@pytest.mark.ray
def test_the_suites_own_cluster_listens_on_loopback_only(ray_cluster: str) -> None:
    """The session's Ray cluster is as private as the collector's: every socket its GCS, raylet
    and workers listen on is a loopback one."""
    sockets = [s for s in listening(os.getpid()) if s[0] != psutil.Process().name()]
    assert {"gcs_server", "raylet"} <= {name for name, _, _ in sockets}, sockets
    assert [s for s in sockets if s[1] not in LOOPBACK] == []

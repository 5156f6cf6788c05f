"""A dead pid in another container with our host name is not taken for a dead holder (a real process).
"""

from __future__ import annotations

import socket

import pytest

from collector.errors import OutputError
from collector.storage import s3lease
from tests.record.factory import make_batch
from tests.s3server import S3Bucket
from tests.storage.test_s3_lease import dead_pid, open_s3, plant_lock


def test_a_dead_pid_in_another_container_with_our_hostname_is_not_a_dead_holder(s3_bucket: S3Bucket) -> None:
    """Same hostname, a pid that is free here, but another pid namespace (another container):
    its process may well be alive there, and its unexpired lease holds."""
    with open_s3(s3_bucket) as st:
        st.commit(make_batch(2))
    machine = s3lease.host_identity().rsplit(":", 1)[0]
    plant_lock(s3_bucket, host=socket.gethostname(), host_id=f"{machine}:1", pid=dead_pid(), uuid="x",
               started="then", lease_s=3600)
    with pytest.raises(OutputError, match="in use by another collector process"):
        open_s3(s3_bucket)
    # A lock of the earlier format (no host_id) cannot prove it ran here either.
    plant_lock(s3_bucket, host=socket.gethostname(), pid=dead_pid(), uuid="x", started="then", lease_s=3600)
    with pytest.raises(OutputError, match="in use by another collector process"):
        open_s3(s3_bucket)
    # Ours (this kernel, this namespace) with its pid gone: taken over at once.
    plant_lock(s3_bucket, host=socket.gethostname(), host_id=s3lease.host_identity(), pid=dead_pid(),
               uuid="x", started="then", lease_s=3600)
    with open_s3(s3_bucket) as st:
        assert len(st.committed_ids()) == 2

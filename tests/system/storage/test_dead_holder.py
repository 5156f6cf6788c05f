"""A lock whose holder process is dead on this host is taken over at once (a real process, gone).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from collector.errors import OutputError
from collector.storage.s3lease import host_identity
from tests.record.factory import make_batch
from tests.s3server import S3Bucket
from tests.storage.test_objectstore import open_s3


def test_a_dead_holder_on_this_host_is_taken_over_at_once(s3_bucket: S3Bucket) -> None:
    """A lock left by a process of this host that is gone does not block the next run."""
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead_pid = int(proc.stdout)
    token = {"host": socket.gethostname(), "host_id": host_identity(), "pid": dead_pid, "uuid": "x",
             "started": "then", "lease_s": 3600}
    with open_s3(s3_bucket) as st:
        st.commit(make_batch(2))
    s3_bucket.client.put_object(Bucket=s3_bucket.name, Key="run/.collector/run.lock", Body=json.dumps(token))
    with open_s3(s3_bucket) as st:
        assert len(st.committed_ids()) == 2
    token["pid"] = 1  # alive (init), so its unexpired lease holds
    s3_bucket.client.put_object(Bucket=s3_bucket.name, Key="run/.collector/run.lock", Body=json.dumps(token))
    with pytest.raises(OutputError, match="in use by another collector process"):
        open_s3(s3_bucket)

"""The README's object-storage block, run as written (a child Python) against a bucket on loopback.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.s3server import S3Bucket
from tests.storage.test_s3_readers import REPO, _digests, _manifest_rows, _write_run
from tests.system.test_readme import S3_MARK as README_MARK  # the block test_readme.py leaves to this module


def test_the_readme_s3_block_runs_against_a_bucket(tmp_path: Path, s3_bucket: S3Bucket) -> None:
    """docs/clusters.md's "Reading a run in object storage" block runs as shown where it says."""
    text = (REPO / "docs/clusters.md").read_text(encoding="utf-8")
    match = re.search(re.escape(README_MARK) + r"\n```python\n(.*?)^```\n", text, flags=re.S | re.M)
    assert match, "docs/clusters.md has no block marked for this test"
    code = match.group(1)
    named = re.search(r'^bucket, prefix = "([^"]+)", "([^"]+)"$', code, flags=re.M)
    assert named, "the block names its bucket and prefix on one line"
    bucket, prefix = named.groups()
    with contextlib.suppress(s3_bucket.client.exceptions.BucketAlreadyOwnedByYou):
        s3_bucket.client.create_bucket(Bucket=bucket)
    run = _write_run(tmp_path / "local", "parquet", [("sim-a", 64, 7), ("sim-b", 128, 4)])
    for rel in _digests(run):
        s3_bucket.client.put_object(Bucket=bucket, Key=f"{prefix}/{rel}", Body=(run / rel).read_bytes())
    script = code + "\nprint(table.num_rows)\n"
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=dict(os.environ), text=True,
                          capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == str(_manifest_rows(run))

"""An unreachable `--address` / `ray.address` is one line naming the address as the user gave it,
within `ray.start_timeout_s`, and no Ray warning lines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.run.test_cli import write_config
from tests.run.test_worker import free_port

REPO = Path(__file__).resolve().parents[2]

# The safety net only: the fixed driver answers at once for a closed port (connection
# refused); today's drivers retried for minutes, which this would cut and report.
pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("how", ["--address", "ray.address"])
def test_unreachable_address_is_one_line_naming_it(tmp_path: Path, how: str) -> None:
    """A closed loopback port as the cluster address: exit 2, one stderr line naming that address."""
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    where = ["--address", address] if how == "--address" else ["--set", f'ray.address="{address}"']
    proc = subprocess.run(
        [sys.executable, "-m", "collector.cli", "run", str(write_config(tmp_path)), "--quiet",
         "--set", "ray.start_timeout_s=5", *where],
        capture_output=True, text=True, cwd=REPO, timeout=110,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1, proc.stderr[-2000:]
    assert proc.stderr.startswith("collector: error: ray.address: cannot reach a Ray cluster at " + address)
    assert "Traceback" not in proc.stderr

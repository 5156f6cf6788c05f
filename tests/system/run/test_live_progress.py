"""`collector run` on a terminal counts episodes as workers finish them, before any commit.

The run's later episodes wait at a gate (`tests.run.held_env`), so no batch can return and
nothing can be committed; the test reads the redrawn progress line from a pty until it shows
finished episodes with none committed (the event), and only then opens the gate.
"""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

from tests.run.held_env import open_gate
from tests.system.processes import REPO, WAIT_GUARD_S, user_env

HELD = """
name = "held"
[sweep]
models = ["sim-terse"]
budgets = [256]
[env]
name = "tests.run.held_env:HeldArithmetic"
python_path = ["{repo}"]
tasks = 20
[env.options]
gate_dir = "{gate}"
free = 3
num_tasks = 20
[ray]
workers = 1
episodes_in_flight = 32
batch_size = 64
cpus_per_worker = 0.5
[output]
path = "{run_dir}"
rows_per_shard = 1000
commit_interval_s = 3600
"""

#: `[####    ] 3/20  15% (0 committed) | 1.2 ep/s eta 9s | done 3`
FRAME = re.compile(r"\] (\d+)/20\s+\d+% \((\d+) committed\)[^\r\n]*")


def test_progress_counts_finished_episodes_before_the_first_commit(tmp_path: Path) -> None:
    """On a terminal the progress line shows finished episodes per stop reason before any commit."""
    gate, run_dir = tmp_path / "gate", tmp_path / "run"
    gate.mkdir()
    config = tmp_path / "held.toml"
    config.write_text(HELD.format(repo=REPO, gate=gate, run_dir=run_dir))
    master, slave = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "collector", "run", str(config)],
        env=user_env(), cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
    )
    os.close(slave)
    output = b""
    seen: str | None = None
    guard = time.monotonic() + WAIT_GUARD_S
    try:
        while time.monotonic() < guard:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the child closed the pty
                    break
                if not chunk:
                    break
                output += chunk
            if seen is None:
                for frame in FRAME.finditer(output.decode(errors="replace")):
                    finished, committed = int(frame.group(1)), int(frame.group(2))
                    if finished > 0 and committed == 0:
                        seen = frame.group(0)
                        # Nothing is committed yet: the finished count came from the workers.
                        assert not list((run_dir / "data").glob("*")), seen
                        open_gate(gate)
                        break
            elif process.poll() is not None:
                break
    finally:
        open_gate(gate)
        process.wait(timeout=WAIT_GUARD_S)
        os.close(master)
    text = output.decode(errors="replace")
    assert process.returncode == 0, text[-2000:]
    assert seen is not None, text[-2000:]
    assert re.search(r"\| done \d+", seen), seen  # live counts per stop reason, not only a total
    assert "\r" in text  # redrawn in place on a terminal
    assert "20/20 100% (20 committed)" in text

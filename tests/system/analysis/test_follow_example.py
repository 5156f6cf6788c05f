"""examples/follow_trainer.py runs: a toy trainer consuming a sweep while `collector run` collects it.

Every step it prints holds only whole groups; all the sweep's samples are trained on once; a
restart with --resume from the cursor it saved trains on nothing twice (issue 27).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.checking import assert_run_checked

REPO = Path(__file__).resolve().parents[3]
GUARD_S = 240.0  # a guard against a hung test, never a measurement


def run_example(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, str(REPO / "examples/follow_trainer.py"), *args], env=env,
                          text=True, capture_output=True, timeout=GUARD_S, check=False)


def test_the_follow_trainer_example_trains_on_every_whole_group_once(tmp_path: Path) -> None:
    done = run_example("--dir", str(tmp_path), "--tasks", "4", "--samples", "2")
    assert done.returncode == 0, done.stderr
    steps = [line for line in done.stdout.splitlines() if line.startswith("step ")]
    assert steps, done.stdout
    samples = 0
    for line in steps:
        m = re.match(r"step \d+: (\d+) group\(s\) of (\d+), (\d+) samples", line)
        assert m, line
        groups, size, n = map(int, m.groups())
        assert size == 2, line  # whole groups only
        assert groups * size == n, line
        samples += n
    assert samples == 4 * 2 * 2  # tasks x budgets x samples: each once
    assert done.stdout.splitlines()[-1].startswith(f"done: {len(steps)} step(s)")
    assert_run_checked(tmp_path / "run")
    again = run_example("--dir", str(tmp_path), "--resume")
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == [f"done: 0 step(s); run in {tmp_path / 'run'}"]

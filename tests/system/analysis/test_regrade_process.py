"""`collector regrade` SIGKILLed at every step annotates each episode exactly once (a process per kill).
The regrade logic in process: tests/analysis/test_regrade.py.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

from tests.analysis.test_regrade import SPEC, _has, _rows, make_run


def test_regrade_exactly_once_under_sigkill(tmp_path: Path) -> None:
    """Killed at random grades (three times), then run to the end: every episode once."""
    run = make_run(tmp_path)
    rng = random.Random(30)
    code = ("import sys; from collector.analysis.regrade import regrade_run; "
            "from tests.analysis.test_regrade import StrictArithmetic; "
            f"regrade_run(sys.argv[1], StrictArithmetic(), {SPEC!r}, 'strict', batch=3)")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[3])}
    kills = 0
    for _ in range(3):
        # 16 gradeable (done) episodes in all; each run kills before it reaches the end.
        left = 16 - len([r for r in _rows(run) if r["graded"]]) if _has(run) else 16
        if left <= 1:
            break
        proc = subprocess.run([sys.executable, "-c", code, str(run)], env={**env, "REGRADE_KILL_AT":
                              str(rng.randint(1, left - 1))}, capture_output=True, check=False)
        assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
        kills += 1
    assert kills >= 2
    # And once in the narrowest window: the chunk renamed into place, its record not yet made
    # (killed on the event of its first record's creation), which leaves an orphan chunk.
    window = ("import os, signal, sys\n"
              "from collector.analysis.annotation_store import LocalAnnotations as L\n"
              "real = L.create; n = [0]\n"
              "def gate(self, name, data):\n"
              "    n[0] += name.startswith('commit-')\n"
              "    if n[0] == 1: os.kill(os.getpid(), signal.SIGKILL)\n"
              "    return real(self, name, data)\n"
              "L.create = gate\n" + code)
    proc = subprocess.run([sys.executable, "-c", window, str(run)], env=env, capture_output=True, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    folder = run / ".collector" / "annotations" / "strict"
    named = {json.loads(p.read_text())["chunk"] for p in folder.glob("commit-*.json")}
    assert {p.name for p in folder.glob("chunk-*")} - named  # the orphan is there before the rerun
    proc = subprocess.run([sys.executable, "-c", code, str(run)], env=env, capture_output=True, check=False)
    assert proc.returncode == 0, proc.stderr.decode()
    ids = [r["episode_id"] for r in _rows(run)]
    assert len(ids) == len(set(ids)) == 40
    folder = run / ".collector" / "annotations" / "strict"
    assert not list(folder.glob("*.tmp"))
    named = {json.loads(p.read_text())["chunk"] for p in folder.glob("commit-*.json")}
    assert {p.name for p in folder.glob("chunk-*")} == named  # orphans of the kills were removed

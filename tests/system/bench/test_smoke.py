"""Every benchmark script runs end to end at minimal sizes and prints its table (nothing timed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_run_all_quick_prints_every_table(tmp_path: Path) -> None:
    """`python bench/run_all.py --quick` runs every script, prints each table and writes their JSON."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run_all.py"), "--quick", "--results", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("overhead", "concurrency", "shards", "stats", "memory", "peer", "history", "e2e", "driver"):
        payload = json.loads((tmp_path / f"{name}.json").read_text())
        assert payload["summary"], name
        assert f"[{name}]" in proc.stdout
    assert "collector" in proc.stdout
    assert (tmp_path / "all.json").exists()

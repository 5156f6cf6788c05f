"""Every benchmark script runs end to end at minimal sizes and prints its table (nothing timed).

One test per benchmark, so the system tier's two workers share them; `run_all` itself is run
once over the cheapest to show it gathers what each writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.run_all import BENCHES

ROOT = Path(__file__).resolve().parents[3]


def run_all(tmp_path: Path, *names: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run_all.py"), "--quick", "--results", str(tmp_path),
         "--only", *names],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False,
    )


@pytest.mark.parametrize("name", BENCHES)
def test_each_benchmark_runs_quick_and_prints_its_table(tmp_path: Path, name: str) -> None:
    """`python bench/run_all.py --quick --only NAME` runs the script, prints its table and writes its JSON."""
    proc = run_all(tmp_path, name)
    assert proc.returncode == 0, proc.stderr[-3000:]
    payload = json.loads((tmp_path / f"{name}.json").read_text())
    assert payload["summary"], name
    assert f"[{name}]" in proc.stdout


def test_run_all_gathers_every_table_it_ran(tmp_path: Path) -> None:
    """`run_all` prints each script's table under its name and writes all.json beside them."""
    proc = run_all(tmp_path, "stats", "shards")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("stats", "shards"):
        assert f"[{name}]" in proc.stdout
    assert "collector" in proc.stdout
    assert json.loads((tmp_path / "all.json").read_text())

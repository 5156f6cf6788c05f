"""Fixtures of the fault-tolerance tests: the post-collection check, as a fixture."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from collector.check import CheckReport
from tests.faults.checking import assert_run_checked


@pytest.fixture
def run_checker() -> Callable[[str | Path], CheckReport]:
    """`run_checker(run_dir)` runs `collector check` on a collected run and fails on any problem."""
    return assert_run_checked

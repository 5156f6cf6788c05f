"""Fixtures of the fault-tolerance tests: the post-collection check, as a fixture."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from collector.analysis.check import CheckReport
from tests.checking import assert_run_checked, check_runs_left_in_tmp_path


@pytest.fixture
def run_checker() -> Callable[[str | Path], CheckReport]:
    """`run_checker(run_dir)` runs `collector check` on a collected run and fails on any problem."""
    return assert_run_checked


@pytest.fixture(autouse=True)
def _check_every_collected_run(request: pytest.FixtureRequest) -> Iterator[None]:
    """`collector check` on every run directory a fault test leaves behind."""
    yield from check_runs_left_in_tmp_path(request)

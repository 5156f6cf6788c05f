"""Fixtures of the collection-job tests: `collector check` after every collection."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.checking import check_runs_left_in_tmp_path


@pytest.fixture(autouse=True)
def _check_every_collected_run(request: pytest.FixtureRequest) -> Iterator[None]:
    """`collector check` on every run directory a job test leaves behind."""
    yield from check_runs_left_in_tmp_path(request)

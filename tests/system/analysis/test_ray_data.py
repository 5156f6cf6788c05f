"""Ray Data opens a Parquet run directory (Ray's readers start a cluster: the system tier).
The run and the other readers: tests/analysis/test_dataset.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.analysis.test_dataset import manifest_rows, runs  # noqa: F401 - `runs`: the fixture, by name

pytestmark = pytest.mark.usefixtures("ray_cluster")


@pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.data.context")
def test_ray_data_opens_a_parquet_run(runs: dict[str, Path]) -> None:
    """`ray.data.read_parquet(run)` counts the manifest's rows."""
    import ray.data

    run = runs["parquet"]
    dataset = ray.data.read_parquet(str(run))
    assert dataset.count() == manifest_rows(run)


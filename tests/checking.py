"""Run `collector check` on a run directory a test has just collected, and fail loudly.

Issue 7 asks the suite to verify every collection it performs with the same check a
trainer would run (`collector.analysis.check.check_run`), so a test that only counted episodes
cannot pass over a run that broke an invariant (a tool executed from a cut turn, a call
left unsettled, an error episode marked trainable). Any test module may import
`assert_run_checked`; inside tests/faults the `run_checker` fixture wraps it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from collector.analysis.check import CheckReport, check_run
from collector.record.shards import read_shard
from collector.storage.manifest import MANIFEST, committed_shard_paths, read_manifest


def assert_run_checked(run_dir: str | Path, *, allow_notes: bool = True) -> CheckReport:
    """Fail the test with every problem `check_run` finds in `run_dir`; return the report.

    `allow_notes=False` also fails on notes (files the manifest does not name, quarantined
    files): after a run finishes cleanly there must be none.
    """
    report = check_run(run_dir)
    assert report.ok, "collector check found problems:\n" + "\n".join(report.problems)
    if not allow_notes:
        assert not report.notes, "collector check notes:\n" + "\n".join(report.notes)
    manifest = read_manifest(Path(run_dir))
    assert report.shards == len(manifest["shards"])
    assert report.episodes == sum(int(entry["rows"]) for entry in manifest["shards"])
    return report


def committed_ids(run_dir: str | Path) -> Counter[str]:
    """How many times each episode id appears in the committed shards, read from the files."""
    counts: Counter[str] = Counter()
    if not (Path(run_dir) / MANIFEST).exists():
        return counts
    for path in committed_shard_paths(run_dir):
        counts.update(read_shard(path, columns=["episode_id"]).column("episode_id").to_pylist())
    return counts


def committed_rows(run_dir: str | Path) -> list[dict[str, object]]:
    """Every committed row of the run as plain Python dicts."""
    rows: list[dict[str, object]] = []
    for path in committed_shard_paths(run_dir):
        rows.extend(read_shard(path).to_pylist())
    return rows


def check_runs_left_in_tmp_path(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fixture body: after the test, `collector check` every run directory under its tmp_path.

    The collection tests (tests/run, tests/faults) enable it as an autouse fixture, so no
    test that merely counts episodes can pass over a broken invariant. A test that leaves a
    broken run on purpose opts out with `@pytest.mark.corrupts_runs`.
    """
    if "tmp_path" not in request.fixturenames or request.node.get_closest_marker("corrupts_runs"):
        yield
        return
    # Asked for before the test runs, so that tmp_path is torn down after this fixture.
    tmp_path: Path = request.getfixturevalue("tmp_path")
    yield
    for manifest in sorted(tmp_path.rglob(MANIFEST.rsplit("/", 1)[-1])):
        if manifest.relative_to(tmp_path).as_posix().endswith(MANIFEST):
            assert_run_checked(manifest.parent.parent)

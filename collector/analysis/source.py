"""What an export writer reads: a run's committed episodes, filtered, with a regrade's rewards.

`Source(run_dir, filter, annotation).read(columns)` is `read_committed` when no annotation is
named. With one (`collector regrade --out NAME`), `reward` is the annotation's for every
episode (`collector.analysis.regrade.apply_annotation`, which refuses an annotation missing
an episode) and the filter is applied afterwards, so that a `--where reward...` tests the
annotation's reward.

Tests: tests/analysis/test_regrade.py (export --annotation), tests/analysis/test_export.py
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds

from collector.analysis.committed import read_columns, read_committed
from collector.analysis.regrade import apply_annotation

__all__ = ["Source"]


class Source:
    """What a writer reads: the run's committed episodes, filtered, with an annotation's rewards."""

    __slots__ = ("annotation", "filter_columns", "flt", "run_dir")

    def __init__(self, run_dir: Path, flt: ds.Expression | None, annotation: str | None = None,
                 filter_columns: Sequence[str] = ()) -> None:
        self.run_dir, self.flt, self.annotation = run_dir, flt, annotation
        self.filter_columns = tuple(filter_columns)
        """The columns `flt` may test (read too when the filter runs in memory)."""

    def _scan(self, columns: list[str] | None, flt: ds.Expression | None) -> pa.Table:
        if flt is None and columns is not None:
            return read_columns(self.run_dir, columns)  # memory-mapped where the shards allow
        return read_committed(self.run_dir, columns, flt)

    def read(self, columns: list[str] | None) -> pa.Table:
        """`columns` (None: all) of the episodes passing the filter."""
        if self.annotation is None:
            return self._scan(columns, self.flt)
        # The filter may test `reward`, which must be the annotation's: annotate every episode
        # first, then filter in memory (reading every column a filter may test).
        wanted = None
        if columns is not None:
            wanted = list(dict.fromkeys([*columns, "episode_id", *self.filter_columns]))
        table = apply_annotation(self.run_dir, self._scan(wanted, None), self.annotation)
        if self.flt is not None:
            table = ds.dataset(table).to_table(filter=self.flt)
        return table if columns is None else table.select(columns)

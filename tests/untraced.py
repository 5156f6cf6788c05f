"""Coverage paused for the bulk of a statistical test: the thousands of samples it draws run
the same lines as the first few.

A test that compares a measured rate with the simulator's truth draws hundreds to thousands
of episodes or replies through code the other tests already cover line by line and branch by
branch. Under the coverage tracer those draws cost two to four times their CPU (the full run
traces every test: scripts/test), and they add no line or branch to what is measured: the
full run's report is the same with them untraced (the closing note of the issue that added
this module lists the comparison). So the test draws its samples inside `untraced()`, and
what it checks them with (the statistics, the tables) stays traced.

Without coverage running (`scripts/test --fast`, a plain `pytest`), `untraced()` does nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import coverage


@contextlib.contextmanager
def untraced() -> Iterator[None]:
    """Stop the coverage measurement of this process for the block, then start it again."""
    running = coverage.Coverage.current()
    if running is None:
        yield
        return
    running.stop()
    try:
        yield
    finally:
        running.start()

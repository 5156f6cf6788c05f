"""Coverage paused for the bulk of a statistical test: the thousands of samples it draws run
the same lines as the first few.

A test that compares a measured rate with the simulator's truth draws hundreds to thousands
of episodes or replies through code the other tests already cover line by line and branch by
branch. Under the coverage tracer those draws cost two to four times their CPU (the full run
traces every test: scripts/test), and they add no line or branch to what is measured: when
this module came in, the few lines only they reached got direct tests (CHANGELOG), and the
full run's report was otherwise unchanged. So the test draws its samples inside
`untraced()`, and what it checks them with (the statistics, the tables) stays traced. A new
statistical test may do the same once its draws reach nothing the report would lose.

Without coverage running (`scripts/test --fast`, a plain `pytest`), `untraced()` does nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import coverage


@contextlib.contextmanager
def untraced() -> Iterator[None]:
    """Stop every coverage measurement running in this process for the block, then start them
    again. Every one: an xdist worker runs two (pytest-cov starts a second one there), and
    stopping the newest resumes the one under it."""
    stopped: list[coverage.Coverage] = []
    while (running := coverage.Coverage.current()) is not None:
        running.stop()
        stopped.append(running)
    try:
        yield
    finally:
        for measurement in reversed(stopped):
            measurement.start()

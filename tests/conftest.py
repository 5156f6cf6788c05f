"""The suite's two tiers, and the fixtures every test may use.

The default tier is every test outside `tests/system/`: it runs in one process per xdist
worker. A test there may start no process at all (no Ray, no `collector` child, no package
install, no browser, no daemon): an audit hook refuses any process start during such a test,
naming the test, so a slow test cannot creep back in unnoticed. Job and driver tests run their
workers on the in-process pool (`collector.run.inprocess`). The system tier, `tests/system/`,
holds the tests whose subject is a process (signals, SIGKILLs, clusters, the CLI as a child,
the browser, packaging); its own conftest has the session's Ray cluster. `bash scripts/test`
runs both; `bash scripts/test --fast` the default tier alone (docs/testing.md).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# The object-storage fixtures (a moto S3 server on loopback, in a thread; a bucket per test).
from tests.s3server import s3_bucket, s3_endpoint  # noqa: F401

SYSTEM_TIER = Path(__file__).resolve().parent / "system"
#: Audit events that start a process (`subprocess`, `os.system`, `os.fork`, `os.posix_spawn`,
#: the `os.exec*` family): everything Ray, a CLI child, pip or a browser would go through.
PROCESS_EVENTS = frozenset({"subprocess.Popen", "os.system", "os.fork", "os.forkpty", "os.posix_spawn",
                            "os.exec", "os.spawn"})


class ProcessStartRefused(RuntimeError):
    """A default-tier test started a process."""


class _Guard:
    test: str | None = None
    """The default-tier test running now (None: a system test, or between tests)."""


def _refuse_processes(event: str, args: tuple[Any, ...], guard: type[_Guard] = _Guard) -> None:
    # `guard` is bound here: at interpreter shutdown this module's globals are cleared to None
    # while the hook, which cannot be removed, still sees the processes Ray starts then.
    if guard.test is not None and event in PROCESS_EVENTS:
        what = " ".join(str(a) for a in args[:2])[:200]
        raise ProcessStartRefused(
            f"{guard.test} is in the default tier, which starts no process ({event}: {what}); "
            "run it in process, or move it to tests/system/"
        )


sys.addaudithook(_refuse_processes)  # an audit hook cannot be removed: it checks the test running now


def in_system_tier(item: pytest.Item) -> bool:
    return SYSTEM_TIER in Path(str(item.path)).resolve().parents


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Refuse process starts for the whole of a default-tier test: setup, call and teardown."""
    _Guard.test = None if in_system_tier(item) else item.nodeid
    try:
        return (yield)
    finally:
        _Guard.test = None

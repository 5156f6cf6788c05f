"""SIGINT and SIGTERM during a run: an exception in the main thread, never a kill mid-commit
(tests: tests/system/run/test_cli_process.py for the CLI's exits, tests/system/faults/test_signal_commit.py
for a signal landing in a commit).

SIGTERM (what a scheduler or `docker stop` sends) ends a run like Ctrl-C instead of going to
Ray's handler (a native stack dump, exit 15 or SIGABRT, nothing committed): the first signal
raises `Interrupted` in the main thread, the buffered episodes are committed on the way out,
and the CLI exits 128 + the signal number. Later signals are ignored, so they cannot cut the
final commit short, nor Ray's shutdown (`collector.run.cluster` keeps Ray from resetting
SIGTERM's action during it).

A commit is never cut: inside `RunSignals.deferred()` (the driver wraps each commit in it) a
first signal is recorded and raised only once the block has finished, so the episodes that
commit took from the buffer are committed, not dropped with the interrupted call.

Once a signal has stopped the run, a signal whose previous action was the default (death)
stays ignored when the run's handlers are removed: the caller is already unwinding from one,
and a second must not turn exit 143 into a kill.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

__all__ = ["Interrupted", "RunSignals", "signals_interrupt"]


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived during a run. A KeyboardInterrupt, so it unwinds like Ctrl-C
    (the buffered episodes are committed on the way out); `signum` says which signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class RunSignals:
    """The run's handlers: `install` them (again after `ray.init`, which replaces them), and
    hold a signal back for the length of a block (`deferred`)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, active: bool) -> None:
        self.active = active
        """False off the main thread, where no handler can be set: then nothing is done."""
        self.caught: list[int] = []
        self.raised = False
        self._deferring = 0
        self.previous = {signum: signal.getsignal(signum) for signum in self.SIGNALS} if active else {}

    def _handler(self, signum: int, frame: object) -> None:
        if self.caught:
            return  # already stopping
        self.caught.append(signum)
        if self._deferring:
            return  # raised when the deferring block ends
        self.raised = True
        raise Interrupted(signum)

    def install(self) -> None:
        for signum in self.previous:
            signal.signal(signum, self._handler)

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """A block a signal does not interrupt: one arriving inside is raised when it ends
        (unless the block raised something else, which then goes on)."""
        self._deferring += 1
        try:
            yield
        finally:
            self._deferring -= 1
        if not self._deferring and self.caught and not self.raised:
            self.raised = True
            raise Interrupted(self.caught[0])

    def restore(self) -> None:
        for signum, old in self.previous.items():
            if old is None or (self.caught and old == signal.SIG_DFL):
                old = signal.SIG_IGN if self.caught else signal.SIG_DFL
            signal.signal(signum, old)


@contextlib.contextmanager
def signals_interrupt() -> Iterator[RunSignals]:
    """While the block lasts, SIGINT and SIGTERM raise `Interrupted` in the main thread, once
    (module docstring). Call `install` on the yielded object right after `ray.init`."""
    signals = RunSignals(threading.current_thread() is threading.main_thread())
    signals.install()
    try:
        yield signals
    except KeyboardInterrupt as exc:
        # Ray's blocking calls (ray.wait, ray.get) run the handler, then raise a plain
        # KeyboardInterrupt of their own: say which signal it was.
        if signals.caught and not isinstance(exc, Interrupted):
            raise Interrupted(signals.caught[0]) from None
        raise
    finally:
        signals.restore()

"""The harness's supervisor: its process group dies with the worker, even a worker killed by SIGKILL.

    python reaper.py GRACE_S PARENT_PID -- COMMAND [ARG...]

The runner starts this script (standard library only, run by path: it imports nothing of the
collector) as the leader of a new process group, and it runs the harness in that group. It
asks the kernel for SIGTERM when its parent dies (Linux `PR_SET_PDEATHSIG`), which is what a
SIGKILL of the worker leaves as the only signal: on SIGTERM, from the runner or from the
kernel, it sends SIGTERM to the whole group, waits `GRACE_S`, and SIGKILLs the group, itself
included. Without it, the runner's own stop (`collector.harness.runner.stop_group`) covers
every end but the worker's sudden death.

Its exit status is the harness's: the same code, or death by the same signal.

Tests: tests/system/harness/test_harness_run.py.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from types import FrameType

_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before the request took: do what it would ask
        os.kill(os.getpid(), signal.SIGTERM)


def live_members(group: int) -> int:
    """Live processes of the group (this one included), from /proc; zombies do not count."""
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
                count += fields[0] != "Z" and int(fields[2]) == group
    return count


def main(argv: list[str]) -> int:
    grace, parent, separator, *command = argv
    if separator != "--" or not command:
        sys.exit("usage: reaper.py GRACE_S PARENT_PID -- COMMAND [ARG...]")
    group = os.getpgrp()

    def stop(signum: int, frame: FrameType | None) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the group's SIGTERM reaches this process too
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGTERM)
        deadline = time.monotonic() + float(grace)
        while time.monotonic() < deadline and live_members(group) > 1:
            time.sleep(0.05)
        os.killpg(group, signal.SIGKILL)

    signal.signal(signal.SIGTERM, stop)
    _die_with_parent(int(parent))
    harness = subprocess.Popen(command)  # same group: a stop of the group reaches it and its children
    status = harness.wait()
    if status < 0:  # killed by a signal: end the same way, so the runner reads the same status
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

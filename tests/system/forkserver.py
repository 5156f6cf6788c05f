"""A zygote for the system tier's SIGKILL sweeps: one child Python imports what the killed
scripts need once, then forks a fresh process per run of a script and reports its exit status.

A sweep that kills a writer at a dozen points used to start a dozen interpreters, each
importing pyarrow, the collector and (for S3) boto3 before doing a second of work: most of the
sweep's CPU was spent importing. A forked child starts from the zygote's state after those
imports (and whatever warm-up the caller asks for), runs the script as `python -c` would, with
its own `sys.argv`, and dies or exits on its own: the test sees its exit status as a
`subprocess.run` returncode (-9 for a SIGKILL). The zygote runs no script itself, so every
child starts from the same pristine state (a script's monkeypatches die with its process).

Forking is safe here because the zygote has no thread when it forks (imports start none;
`warm` must not either) and the child runs nothing of the zygote's loop: it leaves with
`os._exit`. Python's `random` is reseeded in every child (`os.register_at_fork`), uuid4 and
`tempfile` draw from the OS: no two children share a name. A dead child is reaped by the
zygote before its status is reported, so its pid is gone (what a lease's dead-holder check,
`collector.storage.s3lease.pid_dead`, looks at) as it is after `subprocess.run`.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import TracebackType

REPO = Path(__file__).resolve().parents[2]

#: The warm-up of a zygote whose children write run stores: the imports, and a first conversion
#: of episodes to a table (pyarrow imports numpy and pandas on its first one: 0.3 s a child).
STORES = """
from collector.record.shards import episodes_to_table
from collector.storage import commit, local
from tests.record.factory import make_batch
episodes_to_table(make_batch(2))
"""

_ZYGOTE = textwrap.dedent(
    """
    import json, os, sys, threading, traceback

    exec(compile(sys.argv[1], "<warm>", "exec"), {"__name__": "__warm__"})
    assert threading.active_count() == 1, "the warm-up started a thread: a fork would copy it mid-step"
    reply = os.fdopen(os.dup(1), "w")  # the protocol; stdout itself becomes the children's stderr
    os.dup2(2, 1)
    for line in sys.stdin:
        job = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: the script as `python -c script *argv` runs it, then out
            code = 0
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # the jobs are the zygote's, not its input
            try:
                sys.argv = ["-c", *job["argv"]]
                exec(compile(job["script"], "<string>", "exec"), {"__name__": "__main__"})
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException:
                traceback.print_exc()
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        reply.write(json.dumps({"pid": pid}) + "\\n")
        reply.flush()
        _, status = os.waitpid(pid, 0)
        reply.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\\n")
        reply.flush()
    """
)


class Zygote:
    """`with Zygote("import ...") as z: z.run(script, *argv)`: `warm` is run once in the zygote
    (imports, a client built once so its service description is parsed once); each `run` forks
    a child that runs `script` with `argv` and returns its returncode."""

    def __init__(self, warm: str, env: dict[str, str] | None = None, cwd: Path = REPO) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _ZYGOTE, textwrap.dedent(warm)], cwd=cwd, env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
        )
        self._pending = b""  # read from the raw pipe, not its buffered reader: select must see it all

    def __enter__(self) -> Zygote:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _answer(self, deadline: float) -> dict[str, int]:
        assert self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._pending:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError("a forked child outlived its guard")
            chunk = os.read(fd, 4096)
            if not chunk:
                raise AssertionError(f"the zygote died (rc {self._proc.wait()}): see its stderr above")
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        answer: dict[str, int] = json.loads(line)
        return answer

    def run(self, script: str, *argv: str, timeout: float = 120.0) -> int:
        """Fork a child running `script` with `argv`; its returncode (negative: the signal that
        ended it), as `subprocess.run([python, "-c", script, *argv]).returncode` would be."""
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps({"script": script, "argv": list(argv)}) + "\n")
        self._proc.stdin.flush()
        deadline = time.monotonic() + timeout  # a guard against a hung child, never a measurement
        pid = self._answer(deadline)["pid"]
        try:
            return self._answer(deadline)["returncode"]
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)
            self._answer(time.monotonic() + 30)  # its status, so the next run reads its own
            raise

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()  # the zygote's loop ends with its input
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()

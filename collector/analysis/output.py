"""Where an export, a trainer view or a report goes: `write_output`, atomic and never inside a run.

A regular OUT (or a new one) is written beside it under a temporary name and renamed into
place, so OUT is either the previous file or a complete export. A symlink is resolved first and its target
replaced (``latest.jsonl -> v3.jsonl`` stays a link, to the new v3.jsonl). An OUT that is
not a regular file (a FIFO, ``/dev/stdout``, ``/dev/null``, ``/dev/full``) is written in
place, never replaced by a file, and a write error there (``/dev/full``: no space) is an
`OutputError`. ``-`` writes to standard output. An OUT inside a run directory (any
directory holding `.collector/manifest.json`, or the run being read) is refused in one line
before anything is read: a file under a run's ``data/`` would be read as shards by every
plain reader, which would then count each episode twice.

Tests: tests/analysis/test_export.py
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from collector.errors import OutputError
from collector.storage.manifest import MANIFEST

__all__ = ["refuse_inside_run", "write_output"]


def refuse_inside_run(out: str | Path, run_dir: str | Path | None = None) -> None:
    """Raise `OutputError` when `out` (symlinks resolved) lies inside a run directory: one
    holding `.collector/manifest.json`, or `run_dir` itself whatever its layout."""
    resolved = Path(os.path.realpath(out))
    run = Path(os.path.realpath(run_dir)) if run_dir is not None else None
    for parent in resolved.parents:
        if parent == run or (parent / MANIFEST).is_file():
            raise OutputError(
                f"{out}: inside the run directory {parent}; write it elsewhere (a file there would be "
                "read as part of the run)"
            )


def write_output(out: str | Path, write: Callable[[BinaryIO], int], run_dir: str | Path | None = None) -> int:
    """Call `write` with a binary file for `out` and return what it returns (see the module
    docstring: ``-``, symlinks, non-regular files, atomic replacement, run directories)."""
    if str(out) == "-":
        stream = sys.stdout.buffer
        rows = write(stream)
        stream.flush()
        return rows
    refuse_inside_run(out, run_dir)
    try:
        st: os.stat_result | None = os.stat(out)  # through symlinks: what OUT really is
    except FileNotFoundError:
        st = None  # a new file, or a dangling link: created where the link points
    except OSError as e:
        raise OutputError(f"cannot write {out}: {e.strerror or e}") from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise OutputError(f"{out} is a directory; name the file to write")
    try:
        if st is not None and not stat.S_ISREG(st.st_mode):
            # A FIFO or a device: a rename would put a regular file in its place.
            with open(out, "wb") as f:
                return write(f)
        target = Path(os.path.realpath(out))
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        try:
            with open(tmp, "wb") as f:
                rows = write(f)
            if st is not None:
                os.chmod(tmp, stat.S_IMODE(st.st_mode))  # replacing a file keeps its mode
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
    except OSError as e:
        raise OutputError(f"cannot write {out}: {e.strerror or e}") from None
    return rows

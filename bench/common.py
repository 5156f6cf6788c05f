"""What every benchmark shares: the simulator in its own process, CPU clocks, tables, JSON.

Why this shape. The machines are 2-core and shared with other jobs, so absolute numbers
move by 2x from one minute to the next. Every figure is therefore a *ratio* of variants run
side by side in one process: variants are interleaved (A B C, A B C, ...), each round
repeated, and the median of each is reported with the absolute numbers beside it.

The simulator runs in a child process (`SimProcess`) so that it gets the other core and
the client's CPU is measured alone, with `time.process_time()` of the client process.

Every script writes `bench/results/<name>.json` (git-ignored) holding the machine, the
versions, the arguments and every measured row, and prints the same rows as a table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class SimProcess:
    """`bench.simserver` on a loopback port in a child process; a context manager."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> SimProcess:
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.simserver", "--port", str(self.port), "--seed", str(self.seed)],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                raise RuntimeError(f"simulator exited: {err[-500:]}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.2):
                return self
            time.sleep(0.05)
        self.__exit__(None, None, None)
        raise RuntimeError("simulator did not start in 30 s")

    def cpu_s(self) -> float:
        """CPU seconds the server process has used so far (Linux /proc)."""
        assert self.proc is not None
        with open(f"/proc/{self.proc.pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        return (int(parts[11]) + int(parts[12])) / ticks

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass(slots=True)
class Clock:
    """Wall and client-process CPU time of one measured block."""

    wall0: float = field(default_factory=time.perf_counter)
    cpu0: float = field(default_factory=time.process_time)
    wall: float = 0.0
    cpu: float = 0.0

    def stop(self) -> Clock:
        self.wall = time.perf_counter() - self.wall0
        self.cpu = time.process_time() - self.cpu0
        return self


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def peak_rss_mb() -> float:
    """Peak RSS of this process (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _versions() -> dict[str, str]:
    out = {}
    for name in ("httpx", "httpcore", "aiohttp", "pyarrow", "ray", "duckdb", "polars", "uvicorn",
                 "starlette", "openai", "openai-agents"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[name] = metadata.version(name)
    return out


def machine() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg_at_start": os.getloadavg(),
        "versions": _versions(),
    }


def _cell(value: Any) -> str:
    if isinstance(value, float):
        if value != value:
            return "-"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.3f}" if abs(value) < 1 else f"{value:.2f}"
    return str(value)


def table(rows: Sequence[dict[str, Any]]) -> str:
    if not rows:
        return "(no rows)"
    cols: list[str] = []
    for row in rows:
        cols.extend(k for k in row if k not in cols)
    cells = [[_cell(row.get(c, "")) for c in cols] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines.extend("  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) for r in cells)
    return "\n".join(lines)


def report(name: str, title: str, args: argparse.Namespace, rows: list[dict[str, Any]],
           summary: list[dict[str, Any]], notes: Sequence[str] = ()) -> dict[str, Any]:
    """Print the tables and write `bench/results/<name>.json`; return the payload."""
    payload = {"bench": name, "title": title, "args": vars(args), "machine": machine(),
               "finished": time.strftime("%Y-%m-%dT%H:%M:%S"), "summary": summary, "rows": rows,
               "notes": list(notes)}
    print(f"\n== {title} ==")
    print(table(summary))
    if rows and rows is not summary:
        print("\nall rounds:")
        print(table(rows))
    for note in notes:
        print(f"note: {note}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = Path(args.out) if getattr(args, "out", None) else RESULTS / f"{name}.json"
    out.write_text(json.dumps(payload, indent=2, default=str))
    print(f"wrote {out}")
    return payload


def parser(doc: str | None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="minimal sizes (smoke test), figures meaningless")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (median reported)")
    p.add_argument("--out", default=None, help="JSON path (default bench/results/<name>.json)")
    return p


@contextlib.contextmanager
def cd_root() -> Iterator[None]:
    old = os.getcwd()
    os.chdir(ROOT)
    try:
        yield
    finally:
        os.chdir(old)

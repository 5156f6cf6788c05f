"""A million episodes on one machine: rate, memory and commit cost over a whole run (issue 29).

    .venv/bin/python -m bench.million                       # 1,000,000 episodes, then a killed + resumed run
    .venv/bin/python -m bench.million --episodes 20000      # a smoke run (about two minutes)
    .venv/bin/python -m bench.million --episodes 0 --resume-episodes 1000000   # only the killed one

One real `collector run` subprocess: a sweep of 2 models x 2 budgets of the arithmetic
environment's two-turn tool episode (1,000 tasks, `samples_per_task` scaled so that the
total is `--episodes`), Chat Completions against the collector's simulator (`bench-zero`
and `sim-perfect`: zero latency, no faults) in its own process, output defaults
(Arrow, 512 rows a shard, the driver writes). Every `--interval` seconds it samples:

- **committed episodes**, from the run dir itself (the base manifest's rows plus the rows of
  every commit record above its `log_through`: what any reader would count), and the
  episodes/s since the last sample;
- **RSS** of the driver (the `collector run` process) and of each Ray worker process
  hosting the collector's actor (descendants of the driver named `_WorkerActor`);
- **commit cost**, from the files each commit leaves (the run logs no timings): a commit
  writes its shards into `.collector/tmp/` (mtime: each one written), then its record
  (mtime), then renames the shards into `data/` (ctime: the rename). `commit_ms` is the
  span from the first of those writes to the last rename (it leaves out building the
  first shard's rows and the final fsync of `data/`); `gap_s` is the time between
  two commits' records. Plus the run dir's shard files and manifest bytes.

Then a second run of `--resume-episodes` (default: the same) is SIGKILLed (the driver
only, as a crash would) once half of it is committed, and `collector run` is started again
on the same config and run dir: it resumes (the store reads the committed ids back, the
driver runs the rest). The same series is recorded for both halves; `start_s` is the time
from launching a run to its first commit (for the resume: opening and verifying the
committed half). Finally `collector stats`, `check`, `export --format parquet` and
`trainer-view` are timed on each finished run, and the run dir's size is taken.

Printed: each series bucketed over time (first, middle and last decile of the samples),
the slopes of driver RSS, worker RSS and commit cost against committed episodes (least
squares over the samples after the first decile, warm-up excluded; per 100,000 episodes),
the command timings and the sizes. Run it under `nice -n 10` on a shared machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil

from bench.common import RESULTS, ROOT, SimProcess, parser, report, table

NAME = "million"
MODELS = ("bench-zero", "sim-perfect")
BUDGETS = (128, 256)
TASKS = 1000

CONFIG = """\
name = "million"
seed = 0
samples_per_task = {samples}
[provider]
kind = "chat"
base_url = "{root}/v1"
[sweep]
models = {models}
budgets = {budgets}
[env]
name = "arithmetic"
[env.options]
num_tasks = {tasks}
[ray]
workers = {workers}
episodes_in_flight = {in_flight}
temp_dir = "{tmp}/ray"
[output]
path = "{run_dir}"
format = "arrow"
"""

_RECORD = re.compile(r"commit-(\d+)\.json$")


@dataclass
class RunWatch:
    """What is committed in a run dir, read the way a reader would, incrementally.

    The base manifest is read again only when it is replaced (a compaction); records are
    read once each, and their commit's file times taken once its shards are in `data/`.
    """

    run_dir: Path
    base_rows: int = 0
    base_through: int = 0
    base_stat: tuple[int, int] | None = None
    records: dict[int, int] = field(default_factory=dict)
    unmeasured: dict[int, dict[str, Any]] = field(default_factory=dict)
    commits: list[dict[str, float]] = field(default_factory=list)
    high: int = 0

    def _read_base(self) -> None:
        manifest = self.run_dir / ".collector" / "manifest.json"
        with contextlib.suppress(FileNotFoundError):
            st = manifest.stat()
            if self.base_stat != (st.st_ino, st.st_mtime_ns):
                base = json.loads(manifest.read_text())
                self.base_stat = (st.st_ino, st.st_mtime_ns)
                self.base_rows = sum(int(e["rows"]) for e in base["shards"])
                self.base_through = int(base.get("log_through", 0))

    def _measure(self, seq: int, record: dict[str, Any], record_mtime: float) -> bool:
        firsts, lasts = [record_mtime], []
        for entry in record["add"]:
            try:
                st = (self.run_dir / entry["path"]).stat()
            except FileNotFoundError:
                return False  # not renamed into data/ yet (or compacted away: dropped later)
            firsts.append(st.st_mtime)
            lasts.append(st.st_ctime)
        if lasts:
            self.commits.append({"seq": seq, "at": record_mtime,
                                 "commit_ms": (max(lasts) - min(firsts)) * 1e3,
                                 "rows": sum(int(e["rows"]) for e in record["add"])})
        return True

    def poll(self) -> int:
        meta = self.run_dir / ".collector"
        if not meta.is_dir():
            return 0
        self._read_base()
        for name in os.listdir(meta):
            m = _RECORD.match(name)
            if m is None or int(m.group(1)) in self.records or int(m.group(1)) <= self.base_through:
                continue
            seq, path = int(m.group(1)), meta / name
            try:
                mtime = path.stat().st_mtime
                record = json.loads(path.read_text())
            except (FileNotFoundError, json.JSONDecodeError):
                continue  # compacted away between the listing and the read: the base has it
            self.records[seq] = sum(int(e["rows"]) for e in record["add"])
            self.unmeasured[seq] = {"record": record, "mtime": mtime}
        for seq in sorted(self.unmeasured):
            item = self.unmeasured[seq]
            item["tries"] = item.get("tries", 0) + 1
            if self._measure(seq, item["record"], item["mtime"]) or item["tries"] > 5:
                del self.unmeasured[seq]
        self._read_base()  # a compaction during the listing: count its base, not the records twice
        self.records = {s: r for s, r in self.records.items() if s > self.base_through}
        self.high = max(self.high, self.base_rows + sum(self.records.values()))
        return self.high


def _worker_pids(driver: psutil.Process) -> list[psutil.Process]:
    out = []
    with contextlib.suppress(psutil.NoSuchProcess):
        for child in driver.children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                if "_WorkerActor" in " ".join(child.cmdline()) or "_WorkerActor" in child.name():
                    out.append(child)
    return out


def _rss_mb(proc: psutil.Process) -> float:
    try:
        return float(proc.memory_info().rss) / 2**20
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return float("nan")


def _dir_stats(run_dir: Path) -> dict[str, int]:
    data = run_dir / "data"
    meta = run_dir / ".collector"
    shards = len(os.listdir(data)) if data.is_dir() else 0
    manifest = meta / "manifest.json"
    records = len([n for n in os.listdir(meta) if _RECORD.match(n)]) if meta.is_dir() else 0
    return {"shards": shards, "records": records,
            "manifest_kb": manifest.stat().st_size // 1024 if manifest.exists() else 0}


def _launch(cfg: Path, cwd: str, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    with log.open("ab") as out:
        # cwd is a temporary directory: `-m` puts the cwd first on sys.path.
        return subprocess.Popen([sys.executable, "-m", "collector", "run", str(cfg), "--quiet"],
                                cwd=cwd, env=env, stdout=out, stderr=out, start_new_session=True)


def _reap(proc: subprocess.Popen[bytes]) -> None:
    """Whatever the run's session left (Ray's daemons after a SIGKILLed driver)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.5)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def _phase(label: str, cfg: Path, cwd: str, run_dir: Path, interval: float, log: Path,
           kill_at: int | None = None) -> dict[str, Any]:
    """One `collector run` from launch to exit (or to its SIGKILL at `kill_at` committed)."""
    watch = RunWatch(run_dir)
    start_count = watch.poll()
    t0 = time.monotonic()
    proc = _launch(cfg, cwd, log)
    driver = psutil.Process(proc.pid)
    samples: list[dict[str, Any]] = []
    last_t, last_n = t0, start_count
    first_commit_s: float | None = None
    killed = False
    seen_commits = 0
    while True:
        time.sleep(interval)
        done = proc.poll() is not None
        now = time.monotonic()
        n = watch.poll()
        if first_commit_s is None and n > start_count:
            first_commit_s = now - t0
        workers = _worker_pids(driver) if not done else []
        new = watch.commits[seen_commits:]
        seen_commits = len(watch.commits)
        before = watch.commits[-len(new) - 1:-1] if new else []
        gaps = [b["at"] - a["at"] for a, b in zip(before, new, strict=False)]
        samples.append({
            "phase": label, "t_s": now - t0, "committed": n,
            "ep_s": (n - last_n) / (now - last_t),
            "driver_mb": _rss_mb(driver) if not done else float("nan"),
            "worker_mb": max((_rss_mb(w) for w in workers), default=float("nan")),
            "workers": len(workers),
            "commit_ms": statistics.median([c["commit_ms"] for c in new]) if new else float("nan"),
            "gap_s": statistics.median(gaps) if gaps else float("nan"),
            "commits": len(new),
            **_dir_stats(run_dir),
        })
        last_t, last_n = now, n
        if done:
            break
        if kill_at is not None and n >= kill_at:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            killed = True
            break
    proc.wait()
    _reap(proc)
    watch.poll()
    return {"label": label, "wall_s": time.monotonic() - t0, "start_s": first_commit_s,
            "exit": "SIGKILL" if killed else proc.returncode, "committed": watch.poll(),
            "samples": samples, "commits": watch.commits}


def _deciles(samples: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first, middle and last tenth of the samples (by time), averaged."""
    if not samples:
        return []
    k = max(1, len(samples) // 10)
    mid = max(0, len(samples) // 2 - k // 2)
    rows = []
    for name, part in (("first 10%", samples[:k]), ("middle 10%", samples[mid:mid + k]),
                       ("last 10%", samples[-k:])):
        def avg(key: str, part: Sequence[dict[str, Any]] = part) -> float:
            vals = [s[key] for s in part if s[key] == s[key]]
            return statistics.fmean(vals) if vals else float("nan")
        rows.append({"phase": part[0]["phase"], "decile": name,
                     "t_s": f"{part[0]['t_s']:.0f}-{part[-1]['t_s']:.0f}",
                     "committed": part[-1]["committed"], "ep_s": avg("ep_s"),
                     "driver_mb": avg("driver_mb"), "worker_mb": avg("worker_mb"),
                     "commit_ms": avg("commit_ms"), "gap_s": avg("gap_s"),
                     "shards": part[-1]["shards"], "records": part[-1]["records"],
                     "manifest_kb": part[-1]["manifest_kb"]})
    return rows


def _slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    pairs = [(x, y) for x, y in zip(xs, ys, strict=True) if y == y]
    if len(pairs) < 3:
        return float("nan")
    mx = statistics.fmean(p[0] for p in pairs)
    my = statistics.fmean(p[1] for p in pairs)
    var = sum((p[0] - mx) ** 2 for p in pairs)
    return sum((p[0] - mx) * (p[1] - my) for p in pairs) / var if var else float("nan")


def _slopes(phase: dict[str, Any]) -> dict[str, Any]:
    """Growth per 100,000 committed episodes, warm-up (the first decile) excluded."""
    samples = phase["samples"]
    steady = samples[max(1, len(samples) // 10):]
    xs = [s["committed"] / 1e5 for s in steady]
    commits = phase["commits"][max(1, len(phase["commits"]) // 10):]
    cum, seq_rows = 0, []
    for c in phase["commits"]:
        cum += int(c["rows"])
        seq_rows.append(cum)
    cxs = [r / 1e5 for r in seq_rows[max(1, len(phase["commits"]) // 10):]]
    mean_commit = statistics.fmean(c["commit_ms"] for c in commits) if commits else float("nan")
    return {"phase": phase["label"], "episodes": phase["committed"],
            "driver_mb_per_100k": _slope(xs, [s["driver_mb"] for s in steady]),
            "worker_mb_per_100k": _slope(xs, [s["worker_mb"] for s in steady]),
            "commit_ms_per_100k": _slope(cxs, [c["commit_ms"] for c in commits]),
            "commit_ms_mean": mean_commit,
            "commit_ms_p99": (sorted(c["commit_ms"] for c in commits)[int(0.99 * (len(commits) - 1))]
                              if commits else float("nan")),
            "commits": len(phase["commits"]), "start_s": phase["start_s"] or float("nan"),
            "wall_s": phase["wall_s"], "exit": phase["exit"]}


def _timed(cmd: list[str], cwd: str) -> tuple[float, int, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "collector", *cmd], cwd=cwd, env=env,
                          capture_output=True, text=True)
    return time.perf_counter() - t0, done.returncode, (done.stdout + done.stderr)[-300:]


def _commands(label: str, run_dir: Path, tmp: str) -> list[dict[str, Any]]:
    rows = []
    out = Path(tmp) / f"out-{label}"
    out.mkdir()
    for name, cmd in (("stats", ["stats", str(run_dir)]),
                      ("check", ["check", str(run_dir)]),
                      ("export parquet", ["export", str(run_dir), str(out / "episodes.parquet"),
                                          "--format", "parquet"]),
                      ("trainer-view", ["trainer-view", str(run_dir), str(out / "trainer")])):
        seconds, code, tail = _timed(cmd, tmp)
        rows.append({"run": label, "command": f"collector {name}", "seconds": seconds, "exit": code,
                     "output_mb": _du(out) / 2**20})
        if code != 0:
            print(f"{name} exited {code}: {tail}", flush=True)
    shutil.rmtree(out, ignore_errors=True)
    return rows


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _sizes(label: str, run_dir: Path) -> dict[str, Any]:
    data = run_dir / "data"
    meta = run_dir / ".collector"
    return {"run": label, "run_dir_mb": _du(run_dir) / 2**20, "data_mb": _du(data) / 2**20,
            "shards": len(os.listdir(data)), "manifest_kb": (meta / "manifest.json").stat().st_size / 1024,
            "records_left": len([n for n in os.listdir(meta) if _RECORD.match(n)])}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__)
    p.add_argument("--episodes", type=int, default=1_000_000,
                   help="episodes of the uninterrupted run (0: skip it)")
    p.add_argument("--resume-episodes", type=int, default=None,
                   help="episodes of the killed-and-resumed run (default: --episodes; 0: skip it)")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between samples")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--in-flight", type=int, default=64)
    p.add_argument("--keep", default=None, help="keep the run dirs under this directory")
    args = p.parse_args(argv)
    if args.quick:
        args.episodes, args.interval = 4000, 1.0
    resume_n = args.episodes if args.resume_episodes is None else args.resume_episodes
    cells = len(MODELS) * len(BUDGETS) * TASKS
    base = Path(args.keep) if args.keep else None
    if base is not None:
        base.mkdir(parents=True, exist_ok=True)
    phases: list[dict[str, Any]] = []
    commands: list[dict[str, Any]] = []
    sizes: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="million-", dir=base) as tmp, SimProcess() as sim:
        log = Path(tmp) / "runs.log"
        plans = [("full", args.episodes, None)] if args.episodes else []
        if resume_n:
            plans.append(("killed", resume_n, resume_n // 2))
        for label, n, kill_at in plans:
            samples_per_task = max(1, round(n / cells))
            run_dir = Path(tmp) / f"run-{label}"
            cfg = Path(tmp) / f"{label}.toml"
            cfg.write_text(CONFIG.format(samples=samples_per_task, root=sim.root, models=json.dumps(MODELS),
                                         budgets=json.dumps(BUDGETS), tasks=TASKS, workers=args.workers,
                                         in_flight=args.in_flight, tmp=tmp, run_dir=run_dir))
            total = samples_per_task * cells
            print(f"{label}: {total:,} episodes ({samples_per_task} samples x {cells:,} tasks x cells)",
                  flush=True)
            parts = [_phase(label, cfg, tmp, run_dir, args.interval, log, kill_at)]
            if kill_at is not None:
                print(f"  killed at {parts[0]['committed']:,} committed; resuming", flush=True)
                parts.append(_phase("resumed", cfg, tmp, run_dir, args.interval, log))
            for part in parts:
                print(f"  {part['label']}: {part['committed']:,} committed in {part['wall_s']:.0f} s, "
                      f"exit {part['exit']}", flush=True)
            phases.extend(parts)
            if parts[-1]["committed"] != total:
                print(f"  note: {parts[-1]['committed']:,} committed of {total:,} planned", flush=True)
            commands.extend(_commands(label, run_dir, tmp))
            sizes.append({**_sizes(label, run_dir), "episodes": parts[-1]["committed"]})
        with contextlib.suppress(OSError):
            print("last lines of the runs' output:\n" + "".join(log.read_text().splitlines(True)[-5:]))
    deciles = [row for phase in phases for row in _deciles(phase["samples"])]
    slopes = [_slopes(phase) for phase in phases]
    print("\n== series, bucketed over time ==")
    print(table(deciles))
    print("\n== growth against committed episodes (per 100,000; first decile excluded) ==")
    print(table(slopes))
    print("\n== commands on the finished run ==")
    print(table(commands))
    print("\n== sizes ==")
    print(table(sizes))
    payload = report(NAME, "a million episodes: growth per 100,000 committed episodes (as above)",
                     args, slopes, slopes)
    # Every sample and every commit measured, beside the summary (the tables above are their buckets).
    series = Path(args.out).with_suffix(".series.json") if args.out else RESULTS / f"{NAME}.series.json"
    series.write_text(json.dumps({"deciles": deciles, "commands": commands, "sizes": sizes, "phases": phases},
                                 indent=1, default=str))
    print(f"wrote {series}")
    return payload


if __name__ == "__main__":
    main()

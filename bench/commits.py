"""Commit latency of the run store at 0, 1,000 and 20,000 committed shards.

Issue 19, item 3. Each size gets a run dir holding that many committed shards (copies of
one real 1-row shard, named in the manifest as the store writes them, so the store's open
verifies them all like any resume), then `--commits` one-episode commits are timed one by
one (wall time: the fsyncs are the point). Reported per size: median and p99 of one
commit, and the compaction the store does once per so many commits (timed as `close`,
which compacts the log), amortized over the commits that trigger one
(`collector.storage.commit._COMPACT_MIN_RECORDS`, or a quarter of the shard count).

Before/after: the same script against another checkout of the collector package, e.g.
the commit before the log::

    git archive 6bb5ebe collector | tar -x -C /tmp/before
    .venv/bin/python -m bench.commits --collector-from /tmp/before --out bench/results/commits-before.json
    .venv/bin/python -m bench.commits

A store without the log (before) has no compaction: its close row is its plain close.

``--store s3`` measures the object store (`collector.storage.s3store`) the same way, on a
moto S3 server started in this process on loopback (`moto[s3]`, a dev dependency): each
commit is a shard PUT, a lease renewal, a create-only record PUT, a lock check, a
server-side copy into data/ and a delete. Figures are moto's, not AWS's (no network, one
Python process serving): read them as request counts made visible, not as S3 latency.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import parser, report

FP = "bench-commits"


def _build(run: Path, shards: int) -> None:
    """A run dir with `shards` committed 1-row shards (the real store writes the first)."""
    from collector.storage.local import LocalRunStore
    from collector.storage.manifest import DATA_DIR, MANIFEST
    from tests.record.factory import make_batch

    with LocalRunStore.open(run, FP, {}, "arrow", 1) as st:
        st.commit(make_batch(1, start=10_000_000))
    manifest = json.loads((run / MANIFEST).read_text())
    first = manifest["shards"][0]
    source = run / first["path"]
    entries = []
    for i in range(shards):
        rel = f"{DATA_DIR}/part-{i + 1:06d}-0bench00.arrow"
        shutil.copyfile(source, run / rel)
        entries.append({**first, "path": rel})
    source.unlink()
    manifest["shards"] = entries
    manifest["next_part"] = shards + 1
    (run / MANIFEST).write_text(json.dumps(manifest, indent=1))


def _build_s3(client: Any, bucket: str, uri: str, shards: int) -> None:
    """The same in a bucket: one real shard committed, then copied server-side `shards` times
    and named in the base manifest."""
    from collector.storage.manifest import DATA_DIR, MANIFEST
    from collector.storage.s3store import S3RunStore
    from tests.record.factory import make_batch

    with S3RunStore.open(uri, FP, {}, "arrow", 1) as st:
        st.commit(make_batch(1, start=10_000_000))
    key = f"run/{MANIFEST}"
    manifest = json.loads(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    first = manifest["shards"][0]
    entries = []
    for i in range(shards):
        rel = f"{DATA_DIR}/part-{i + 1:06d}-0bench00.arrow"
        source = {"Bucket": bucket, "Key": f"run/{first['path']}"}
        client.copy_object(Bucket=bucket, Key=f"run/{rel}", CopySource=source)
        entries.append({**first, "path": rel})
    client.delete_object(Bucket=bucket, Key=f"run/{first['path']}")
    manifest["shards"] = entries
    manifest["next_part"] = shards + 1
    client.put_object(Bucket=bucket, Key=key, Body=json.dumps(manifest, indent=1).encode())


class _S3Server:
    """A moto S3 server on loopback for this process, a fresh bucket per size."""

    def __init__(self) -> None:
        import os

        import boto3
        from moto.server import ThreadedMotoServer

        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        os.environ.update({"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench-secret",
                           "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL_S3": endpoint})
        self.client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        self.count = 0

    def bucket(self) -> tuple[str, str]:
        self.count += 1
        name = f"bench-commits-{self.count}"
        self.client.create_bucket(Bucket=name)
        return name, f"s3://{name}/run"


def _measure(shards: int, commits: int, s3: _S3Server | None = None) -> dict[str, Any]:
    # The old names (aliases now) and both homes of the threshold: `--collector-from` measures
    # checkouts from before the commit protocol moved into collector.storage.commit too.
    from collector.storage import local as store_mod
    from collector.storage.local import LocalRunStore
    from collector.storage.s3store import S3RunStore

    with contextlib.suppress(ImportError):
        from collector.storage import commit as store_mod  # type: ignore[no-redef]
    from tests.record.factory import make_batch

    with tempfile.TemporaryDirectory(prefix="bench-commits-") as tmp:
        run = Path(tmp) / "run"
        started = time.perf_counter()
        st: Any
        if s3 is not None:
            bucket, uri = s3.bucket()
            if shards:
                _build_s3(s3.client, bucket, uri, shards)
            started = time.perf_counter()
            st = S3RunStore.open(uri, FP, {}, "arrow", 1)
        else:
            if shards:
                _build(run, shards)
            started = time.perf_counter()
            st = LocalRunStore.open(run, FP, {}, "arrow", 1)
        open_s = time.perf_counter() - started
        work = make_batch(commits, start=20_000_000)
        latencies = []
        for ep in work:
            t0 = time.perf_counter()
            st.commit([ep])
            latencies.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        st.close()
        close_s = time.perf_counter() - t0
    every = getattr(store_mod, "_COMPACT_MIN_RECORDS", None)
    per = max(every, (shards + commits) // 4) if every else None
    latencies.sort()
    median = statistics.median(latencies)
    return {
        "shards": shards,
        "commits": commits,
        "open_s": open_s,
        "commit_median_ms": median * 1e3,
        "commit_p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1e3,
        "close_ms": close_s * 1e3,
        "compaction_every": per if per is not None else "-",
        "amortized_ms": (median + (close_s / per if per else 0.0)) * 1e3,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__)
    p.add_argument("--sizes", type=int, nargs="+", default=[0, 1_000, 20_000])
    p.add_argument("--commits", type=int, default=100)
    p.add_argument("--store", choices=["local", "s3"], default="local",
                   help="the local run dir, or an s3:// run on a moto server on loopback")
    p.add_argument("--collector-from", default=None,
                   help="a directory holding another `collector` package to measure instead")
    args = p.parse_args(argv)
    if args.collector_from:
        sys.path.insert(0, str(Path(args.collector_from).resolve()))
    if args.quick:
        args.sizes, args.commits = [0, 20], 5
    import collector

    s3 = _S3Server() if args.store == "s3" else None
    rows = [{"store": args.store, **_measure(n, args.commits, s3)} for n in args.sizes]
    notes = [f"collector package measured: {Path(collector.__file__).parent}",
             "wall times; each commit is one 1-episode shard (fsynced) plus the store's manifest "
             "write or commit record"]
    if s3 is not None:
        notes.append("s3: a moto server in this process on loopback; each commit is 4 PUT/COPY "
                     "requests and a DELETE plus a lock GET")
        s3.server.stop()
    name = "commits" if args.store == "local" else "commits-s3"
    return report(name, "commit latency against committed shards", args, rows, rows, notes)


if __name__ == "__main__":
    main()

"""The run's storage: where a run lives and how its shards are committed exactly once.

- `opening`: `open_run_store(output.path)`, the one door to a run store;
- `runstore`: the `RunStore` surface, the state and errors both stores share;
- `commit`: the commit protocol, written once over a small backend interface;
- `location`: a local path or ``s3://bucket/prefix``;
- `manifest`: the run directory's names, the manifest and commit log format, atomic writes;
- `pending`: shards written where their episodes finished, awaiting a commit by name;
- `local`: the local-directory backend (flock + rename);
- `s3store`, `s3lease`, `s3objects`, `s3client`: the object-store run (create-only commit
  records, the lease on the lock, shard bytes and the workers' sink, the boto3 calls);
- `mirror`: reading a run in a bucket through a verified local mirror.

Imports the record format and the vocabulary only; the analysis wing and the driver import it.

Tests: tests/test_layout.py (what each wing may import).
"""

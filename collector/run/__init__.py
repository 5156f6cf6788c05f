"""The driver side of a collection: the work plan, the checks before it, Ray workers, progress.

`plan` turns a config into deterministic work items; `preflight` (with `endpoints`,
`modelcheck` and `clusterprobe`) checks keys, reachability, the served models and the cluster
before any episode runs; `job` orchestrates a run; `driver` is its loop over a worker pool
(`pool`'s interface), committing on `commits`' policy and stopping on `stoppers`; `cluster` is
the Ray session and the Ray-backed pool, the only module that imports `ray`; `worker` runs many
episodes at once on one asyncio loop inside a Ray actor (`worker_writes`: the shards it writes
itself); `simlaunch` starts the simulated provider for `kind = "sim"` runs; `progress` draws
the progress line. Everything below this package (episode, providers, envs, storage) is plain
Python.

Tests: tests/run (a folder per module), tests/faults (the driver under faults).
"""

"""The driver side of a collection: the work plan, Ray workers, progress.

`plan` turns a config into deterministic work items; `job` is the driver and the only module
that imports `ray`; `worker` runs many episodes at once on one asyncio loop inside a Ray
actor; `simlaunch` starts the simulated provider for `kind = "sim"` runs; `progress` draws the
progress line. Everything below this package (episode, providers, envs, data) is plain Python.
"""

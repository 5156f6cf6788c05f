"""What is written and read: the episode record, the Arrow schema, the run directory.

`record` (the episode record and its ids), `shards` (Arrow schema, Episode <-> file),
`store` (the run directory: manifest, exactly once, quarantine), `check` (invariants of a
stored run), `stats` and `analysis` (truncation tables, loading a run from Python).
"""

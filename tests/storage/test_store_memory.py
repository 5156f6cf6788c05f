"""What an open run store keeps per committed episode: its id once, packed, with the shard
holding it (`collector.storage.committed`).

The driver's memory at a million episodes is mostly this record (bench/million.py). As a dict
of id strings it held ~94 bytes an episode (199 with a second set of the ids beside it, as
the store once kept); packed, 16 bytes plus the not yet merged ids.
"""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path

import pytest

from collector.storage import committed
from collector.storage.local import LocalRunStore
from tests.record.factory import make_batch

EPISODES = 10_000
#: The ids not yet merged may number MERGE_AT: a fifth of the run's, as at any larger scale.
MERGE_AT = 2048
#: 16 bytes an id once merged, plus the dict of ids not merged yet (at most MERGE_AT of them:
#: ~20 bytes an episode of this run). Measured: 32 bytes; unpacked (never merged), 94.
BYTES_PER_EPISODE = 48


def test_an_open_store_keeps_each_committed_id_once_and_packed(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(committed, "MERGE_AT", MERGE_AT)
    cfg = {"name": "memory", "sweep": {"models": ["sim-perfect"], "budgets": [128]}}
    with LocalRunStore.open(tmp_path / "run", "fp-memory", cfg, "arrow", 4096) as st:
        st.commit(make_batch(EPISODES))
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        st = LocalRunStore.open(tmp_path / "run", "fp-memory", cfg, "arrow", 4096)
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    try:
        assert len(st.committed_ids()) == EPISODES
        assert st.holds(make_batch(1)[0].episode_id)
        kept = sum(d.size_diff for d in after.compare_to(before, "filename"))
        assert kept / EPISODES <= BYTES_PER_EPISODE, f"{kept / EPISODES:.0f} bytes kept per committed episode"
    finally:
        st.close()

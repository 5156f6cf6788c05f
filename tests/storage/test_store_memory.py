"""What an open run store keeps per committed episode: its id once, with the shard holding it.

The driver's memory at a million episodes is mostly this map (bench/million.py). A second
copy of the ids (a set beside the map, as the store once kept) costs ~40-60 bytes an
episode more, which this bound catches.
"""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path

from collector.storage.local import LocalRunStore
from tests.record.factory import make_batch

EPISODES = 20_000
#: A 24-character id is a 73-byte str; the map's entry adds ~40 bytes at its usual load.
BYTES_PER_EPISODE = 135


def test_an_open_store_keeps_each_committed_id_once(tmp_path: Path) -> None:
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

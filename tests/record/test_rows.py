"""Encoded rows: read back from a worker's IPC stream, and stitched into a shard table."""

from __future__ import annotations

from collector.record.rows import from_ipc, gather, rows_of, to_ipc
from collector.record.shards import SCHEMA, episodes_to_table
from collector.stop import StopReason
from tests.record.factory import make_batch, make_episode


def test_a_row_reads_what_the_driver_decides_on() -> None:
    """Id, cell, stop reason, error, retries and truncation, as the episode has them."""
    episodes = [*make_batch(2), make_episode(StopReason.ERROR, sample=7),
                make_episode(StopReason.LENGTH, sample=8)]
    episodes[0].retries = ["429", "timeout"]
    rows = rows_of(from_ipc(to_ipc(episodes_to_table(episodes))))
    for row, episode in zip(rows, episodes, strict=True):
        assert (row.episode_id, row.model, row.budget, row.provider) == (
            episode.episode_id, episode.model, episode.budget, episode.provider)
        assert row.stop_reason == episode.stop_reason.value
        assert row.error == episode.error
        assert row.retries == episode.retries
        assert row.is_truncated == episode.is_truncated
    assert rows[2].error is not None


def test_rows_of_several_batches_in_any_order_make_the_episodes_shard() -> None:
    """Gaps, two batches interleaved, a batch's rows out of order: the same table as the
    episodes converted at once (values, nulls, one `tools` dictionary of the shard's own)."""
    first, second = make_batch(5), make_batch(4, start=10)
    for i, episode in enumerate(first + second):
        episode.tools = f'["t{i % 3}"]'
    a = rows_of(from_ipc(to_ipc(episodes_to_table(first))))
    b = rows_of(from_ipc(to_ipc(episodes_to_table(second))))
    order = [0, 1, 3, 10, 11, 4, 2, 13]
    picked = [(a + b)[i if i < 10 else i - 5] for i in order]
    episodes = [(first + second)[i if i < 10 else i - 5] for i in order]
    table = gather(picked)
    table.validate(full=True)
    assert table.equals(episodes_to_table(episodes))
    assert gather([]).schema.equals(SCHEMA, check_metadata=True)

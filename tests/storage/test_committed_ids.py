"""`collector.storage.committed.CommittedIds` against a plain dict of id -> shard path.

Random sequences of adds (new ids, and ids moved to another shard as `forget` does), discards
and lookups, with merges into the sorted arrays after every few new ids; the ids include ones
ending in zero bytes (a numpy bytes scalar would drop them), upper-case hex and other shapes
that stay as they are.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from collector.record.episode import episode_id
from collector.storage.committed import CommittedIds

HEX = [episode_id("run", f"t{i}", 0, "m", 64) for i in range(12)]
POOL = [
    *HEX,
    "00" * 12, "ab" * 11 + "00", "0" * 23 + "1", "ff" * 12,  # zero bytes at either end
    HEX[0].upper(), "e1", "call-3-0", "x" * 24, "",  # kept as they are
]
PATHS = [f"data/part-{i}.arrow" for i in range(4)]

ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.lists(st.sampled_from(POOL), max_size=6), st.sampled_from(PATHS)),
        st.tuples(st.just("discard"), st.lists(st.sampled_from(POOL), max_size=6), st.none()),
    ),
    max_size=30,
)


@settings(max_examples=300, deadline=None)
@given(ops=ops, merge_at=st.integers(1, 5))
def test_it_answers_as_a_dict_of_ids_to_shards_would(ops: list[tuple[str, list[str], str | None]],
                                                     merge_at: int) -> None:
    ids = CommittedIds(merge_at=merge_at)
    model: dict[str, str] = {}
    for op, batch, path in ops:
        if op == "add":
            assert path is not None
            ids.add(batch, path)
            model.update(dict.fromkeys(batch, path))
        else:
            ids.discard(batch)
            for i in batch:
                model.pop(i, None)
        assert len(ids) == len(model)
        assert sorted(ids) == sorted(model)
        assert all((i in ids) == (i in model) for i in POOL)
        assert ids.shards_of(POOL) == set(model.values())
        for i in POOL:
            assert ids.shards_of([i]) == ({model[i]} if i in model else set())


def test_merged_ids_take_sixteen_bytes_each() -> None:
    ids = CommittedIds(merge_at=1 << 16)
    fresh = [f"{n:024x}" for n in range(200_000)]
    for start in range(0, len(fresh), 512):
        ids.add(fresh[start:start + 512], f"data/part-{start}.arrow")
    assert len(ids) == 200_000
    assert all(i in ids for i in fresh[::997])
    assert f"{200_000:024x}" not in ids
    arrays = ids._keys.nbytes + ids._shard.nbytes
    assert arrays == 16 * len(ids._keys)
    assert len(ids._recent) < 1 << 16

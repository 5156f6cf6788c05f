"""The committed episode ids of an open run store, and the shard that holds each: compact.

Exactly-once rests on this record: a commit drops the ids it already holds, the driver drops
a late copy of a committed episode, and `forget` rewrites only the shards that hold the ids
it removes. A run holds it for its whole life, one entry an episode, so its size is most of
the driver's growth at a million episodes (bench/million.py). As a dict of id strings it
cost ~94 bytes an episode (a 73-byte str and the dict's entry); here an id of the shape
`collector.record.episode.episode_id` makes (24 hex digits: 12 bytes) is kept as those 12
bytes in a sorted numpy array beside a 4-byte shard number: 16 bytes an episode.

New ids go to a small dict first and are merged into the sorted arrays once it holds
`merge_at` of them (a sort of the whole record: ~0.1 s at a million, once per 65,536 new
ids). An id of any other shape (tests', or a hand-made run's) is kept in a dict as it is.

Tests: tests/storage/test_committed_ids.py, tests/storage/test_store_memory.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import numpy.typing as npt

__all__ = ["MERGE_AT", "CommittedIds"]

#: New ids held in the dict before they are merged into the sorted arrays.
MERGE_AT = 1 << 16
_WIDTH = 12  # bytes of an id as episode_id makes it (blake2b, digest_size=12)


def _packed(episode_id: str) -> bytes | None:
    """The id's 12 bytes, when it is 24 lower-case hex digits (its hex is then the id again)."""
    if len(episode_id) != 2 * _WIDTH:
        return None
    try:
        raw = bytes.fromhex(episode_id)
    except ValueError:
        return None
    return raw if raw.hex() == episode_id else None


class CommittedIds:
    """A set of committed ids with the shard path of each (see the module docstring)."""

    def __init__(self, merge_at: int | None = None) -> None:
        self._merge_at = MERGE_AT if merge_at is None else merge_at
        self._paths: list[str] = []
        self._path_no: dict[str, int] = {}
        # Sorted 12-byte keys and the shard number of each. Compared only as numpy arrays:
        # a numpy bytes scalar drops trailing zero bytes, an array of them keeps all 12.
        self._keys: npt.NDArray[np.bytes_] = np.empty(0, dtype=f"S{_WIDTH}")
        self._shard: npt.NDArray[np.int32] = np.empty(0, dtype=np.int32)
        self._recent: dict[str, int] = {}
        self._other: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._keys) + len(self._recent) + len(self._other)

    def __contains__(self, episode_id: object) -> bool:
        if not isinstance(episode_id, str):
            return False
        if episode_id in self._recent or episode_id in self._other:
            return True
        packed = _packed(episode_id)
        if packed is None or not len(self._keys):
            return False
        # One id (the driver asks once per returned episode): a scalar search, ~5x faster
        # than building a query array. The element read back has its trailing zero bytes
        # dropped, so it is compared with the id's bytes stripped the same way.
        at = int(self._keys.searchsorted(packed))
        return at < len(self._keys) and bool(self._keys[at] == packed.rstrip(b"\0"))

    def __iter__(self) -> Iterator[str]:
        raw = self._keys.tobytes()
        for start in range(0, len(raw), _WIDTH):
            yield raw[start:start + _WIDTH].hex()
        yield from self._recent
        yield from self._other

    def add(self, ids: Iterable[str], path: str) -> None:
        """Record `ids` as held by the shard `path` (an id already here moves to `path`)."""
        number = self._path_no.get(path)
        if number is None:
            number = self._path_no[path] = len(self._paths)
            self._paths.append(path)
        packed: list[bytes] = []
        names: list[str] = []
        for episode_id in ids:
            raw = _packed(episode_id)
            if raw is None:
                self._other[episode_id] = number
            elif episode_id in self._recent:
                self._recent[episode_id] = number
            else:
                packed.append(raw)
                names.append(episode_id)
        if packed:
            at, found = self._positions(packed)
            self._shard[at[found]] = number
            for name, old in zip(names, found.tolist(), strict=True):
                if not old:
                    self._recent[name] = number
        if len(self._recent) >= self._merge_at:
            self._merge()

    def shards_of(self, ids: Iterable[str]) -> set[str]:
        """The paths of the shards holding those of `ids` that are here."""
        numbers: set[int] = set()
        packed: list[bytes] = []
        for episode_id in ids:
            number = self._recent.get(episode_id, self._other.get(episode_id))
            if number is not None:
                numbers.add(number)
            elif (raw := _packed(episode_id)) is not None:
                packed.append(raw)
        if packed:
            at, found = self._positions(packed)
            numbers.update(self._shard[at[found]].tolist())
        return {self._paths[n] for n in numbers}

    def discard(self, ids: Iterable[str]) -> None:
        """Forget those of `ids` that are here."""
        packed: list[bytes] = []
        for episode_id in ids:
            if self._recent.pop(episode_id, None) is None and self._other.pop(episode_id, None) is None:
                raw = _packed(episode_id)
                if raw is not None:
                    packed.append(raw)
        if packed:
            at, found = self._positions(packed)
            keep = np.ones(len(self._keys), dtype=bool)
            keep[at[found]] = False
            self._keys, self._shard = self._keys[keep], self._shard[keep]

    def _positions(self, packed: list[bytes]) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.bool_]]:
        """For each 12-byte key: its index in the sorted arrays, and whether it is there."""
        query = np.array(packed, dtype=self._keys.dtype)
        if not len(self._keys):
            return np.zeros(len(query), dtype=np.intp), np.zeros(len(query), dtype=bool)
        at = np.minimum(np.searchsorted(self._keys, query), len(self._keys) - 1)
        return at, self._keys[at] == query

    def _merge(self) -> None:
        new_keys = np.array([bytes.fromhex(n) for n in self._recent], dtype=self._keys.dtype)
        new_shard = np.fromiter(self._recent.values(), dtype=np.int32, count=len(self._recent))
        keys = np.concatenate([self._keys, new_keys])
        shard = np.concatenate([self._shard, new_shard])
        order = np.argsort(keys, kind="stable")
        self._keys, self._shard = keys[order], shard[order]
        self._recent = {}

"""`collector check`'s token-id rule: every stored id is a token of the model.

8. every stored token id (`turns.output_token_ids`, `turns.prompt_token_ids`) is at least 0
   and below the turn's vocabulary size (`turns.token_vocab_size`, as the server reported
   it; unreported: `collector.record.episode.TOKEN_ID_LIMIT`, 2**31). The episode loop never
   stores one outside (`collector.episode.tokens`: the turn keeps no ids then), so an id out
   of range here was written by something else, an older collector or a hand edit, and a
   trainer would embed a token that does not exist.

Computed in Arrow over the flattened id lists (no Python object per id): a check reads runs
of millions of ids. Part of `collector.analysis.check`; tests: tests/episode/test_token_range.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from collector.record.episode import TOKEN_ID_LIMIT

__all__ = ["ID_COLUMNS", "MAX_LISTED", "token_id_problems"]

#: The per-turn id lists checked.
ID_COLUMNS = ("output_token_ids", "prompt_token_ids")
#: Out-of-range ids listed per shard and column; the rest are counted in one line.
MAX_LISTED = 5


def token_id_problems(rel: str, table: pa.Table) -> Iterator[str]:
    """One line per stored id outside its turn's range (at most `MAX_LISTED` per column), then
    a count of the rest."""
    if table.num_rows == 0:
        return
    episodes = table.column("turns").combine_chunks()
    turns = pc.list_flatten(episodes)
    if len(turns) == 0:
        return
    turn_episode = pc.list_parent_indices(episodes)
    reported = pc.fill_null(pc.struct_field(turns, "token_vocab_size"), 0)
    usable = pc.and_(pc.greater(reported, 0), pc.less(reported, TOKEN_ID_LIMIT))
    limits = pc.if_else(usable, reported, pa.scalar(TOKEN_ID_LIMIT, pa.int64()))
    ids_of_episode = table.column("episode_id").combine_chunks()
    index_of_turn = pc.struct_field(turns, "index")
    for column in ID_COLUMNS:
        lists = pc.struct_field(turns, column)
        ids = pc.list_flatten(lists)
        if len(ids) == 0:
            continue
        owner = pc.list_parent_indices(lists)
        bound = pc.take(limits, owner)
        bad = pc.or_(pc.less(ids, 0), pc.greater_equal(ids, bound))
        where = pc.indices_nonzero(bad)
        count = len(where)
        if not count:
            continue
        for position in where[:MAX_LISTED].to_pylist():
            turn = owner[position].as_py()
            episode = ids_of_episode[turn_episode[turn].as_py()].as_py()
            yield (f"{rel}: episode {episode} turn {index_of_turn[turn].as_py()}: {column} holds id "
                   f"{ids[position].as_py()}, outside the vocabulary (0 to {bound[position].as_py() - 1})")
        if count > MAX_LISTED:
            yield f"{rel}: {count - MAX_LISTED} more {column} outside the vocabulary"

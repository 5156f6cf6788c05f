"""What reads a finished (or growing) run: tables, episodes, statistics, figures, exports, check.

The public analysis API (`from collector.analysis import load_run, truncation_table`):

- `tables`: the committed episodes as one Arrow table, and the truncation tables;
- `episodes`: one episode by id, listings, transcripts (`collector show`, `collector episodes`);
- `stats` / `turnstats` / `toolstats` / `taskstats`: the statistics `collector stats` prints,
  per cell, per turn, per tool and per task; `callsizes`: how many tokens turns and calls need;
- `card`: a dataset card whose numbers `collector check --card` recomputes;
- `figures`: the notebook's figures (matplotlib, the `analysis` extra);
- `export` / `trainer`: a run in the formats trainers read (`collector export`, `trainer-view`);
- `check`: the invariants of a stored run, re-derived from its rows (`collector check`).

This wing reads runs through the storage wing (`collector.storage`: manifest, mirror) and the
record format (`collector.record`); nothing below it imports it.
"""

from collector.analysis.episodes import (
    episode_row,
    get_episode,
    list_episodes,
    load_episodes,
    render_episode,
    render_transcript,
    resolve_episode_id,
)
from collector.analysis.tables import (
    PARTITIONING,
    committed_shard_paths,
    load_analysis,
    load_run,
    reasoning_grouping,
    run_dataset,
    stop_reason_mix,
    task_truncation_table,
    tool_truncation_table,
    truncation_table,
    turn_truncation_table,
)

__all__ = [
    "PARTITIONING",
    "committed_shard_paths",
    "episode_row",
    "get_episode",
    "list_episodes",
    "load_analysis",
    "load_episodes",
    "load_run",
    "reasoning_grouping",
    "render_episode",
    "render_transcript",
    "resolve_episode_id",
    "run_dataset",
    "stop_reason_mix",
    "task_truncation_table",
    "tool_truncation_table",
    "truncation_table",
    "turn_truncation_table",
]

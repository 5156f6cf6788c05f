"""Public home of the analysis API: `from collector.analysis import load_run` keeps working.

The implementation lives in `collector.data.analysis`, beside the store and the statistics.
"""

from collector.data.analysis import (
    PARTITIONING,
    committed_shard_paths,
    episode_row,
    get_episode,
    list_episodes,
    load_analysis,
    load_episodes,
    load_run,
    reasoning_grouping,
    render_episode,
    render_transcript,
    resolve_episode_id,
    run_dataset,
    stop_reason_mix,
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
    "truncation_table",
    "turn_truncation_table",
]

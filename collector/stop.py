"""Why an episode ended: the `stop_reason` column of every shard row.

The order in which the episode loop checks its limits decides which reason a turn is
counted under; that order is written down in `collector.episode.loop`.

Tests: tests/episode/test_loop.py, tests/analysis/test_stats.py
"""

from __future__ import annotations

from enum import StrEnum


class StopReason(StrEnum):
    """The typed reason an episode ended. Stored on every episode, dictionary-encoded."""

    DONE = "done"
    """The model answered without calling a tool: the episode finished on its own."""

    MAX_STEPS = "max_steps"
    """The episode used its allotted number of model turns without finishing."""

    LENGTH = "length"
    """A turn was cut by the output-token cap (or the episode's output-token budget ran out).
    Nothing from the cut turn was executed."""

    TIMEOUT = "timeout"
    """The per-episode wall-clock limit expired; in-flight model and tool calls were cancelled."""

    MALFORMED_TOOL_CALL = "malformed_tool_call"
    """A tool call's arguments could not be parsed (even after the conservative repair).
    Nothing from that turn was executed."""

    CONTEXT_OVERFLOW = "context_overflow"
    """The conversation outgrew the model's context window: the provider said so (its
    context-length error), or, with `provider.context_window` set, the next turn could not
    fit before it was asked. Trainable like `length`, under the same reward policy."""

    ERROR = "error"
    """The provider failed after its retries, or the environment crashed: not the model's
    doing. Recorded, but never trainable and never written as zero-reward training data."""


#: The reasons a config may list in `stop_on`: the turn-level faults that end an episode early.
STOP_ON_CHOICES: frozenset[StopReason] = frozenset({StopReason.LENGTH, StopReason.MALFORMED_TOOL_CALL})

"""collector: turn LLM-agent episodes into training data you can trust.

Data flows one way, and the sub-packages follow it:

    config -> run/ (plan, Ray job, workers) -> episode/ (loop, redaction)
           -> providers/ (wire formats) and envs/ (tasks, tools, graders)
           -> data/ (episode record, shards, run store, stats, analysis)

`config`, `turn`, `stop` and `errors` are the vocabulary every layer shares. The simulated
provider (`sim/`) is a separate ASGI app that the loop never imports.

The names a notebook or an environment needs are re-exported here, imported on first use so
that `import collector` stays cheap (no pyarrow, no pydantic models built until asked for).

Tests: tests/test_layout.py (the public names and the cheap import).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: Public name -> the module that defines it.
_EXPORTS = {
    "Environment": "collector.envs.base",
    "EpisodeWorld": "collector.envs.base",
    "Task": "collector.envs.base",
    "Tool": "collector.envs.base",
    "EpisodeContext": "collector.envs.base",
    "ToolCallContext": "collector.envs.base",
    "tool": "collector.envs.toolkit",
    "StopReason": "collector.stop",
    "RunConfig": "collector.config",
    "load_config": "collector.config",
    "load_run": "collector.analysis.tables",
    "truncation_table": "collector.analysis.tables",
    "PARTITIONING": "collector.analysis.tables",
}

__all__ = [
    "PARTITIONING",
    "Environment",
    "EpisodeContext",
    "EpisodeWorld",
    "RunConfig",
    "StopReason",
    "Task",
    "Tool",
    "ToolCallContext",
    "__version__",
    "load_config",
    "load_run",
    "tool",
    "truncation_table",
]

if TYPE_CHECKING:
    from collector.analysis.tables import PARTITIONING, load_run, truncation_table
    from collector.config import RunConfig, load_config
    from collector.envs.base import Environment, EpisodeContext, EpisodeWorld, Task, Tool, ToolCallContext
    from collector.envs.toolkit import tool
    from collector.stop import StopReason


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'collector' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__

"""The grader of the shell tasks (`shell_tasks.jsonl`): did the harness write the answer?

Called by the collector after a harness episode (`reward = "grader"`,
`grader = "shell_grader:answer_written"`) with the episode's working directory: 1.0 when the
file the task names holds the expected text, else 0.0.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def answer_written(workdir: Path, final_text: str | None, task: Any) -> float:
    """1.0 when `workdir / task.metadata["file"]` holds `task.metadata["expected"]`."""
    path = workdir / str(task.metadata["file"])
    try:
        written = path.read_text().strip()
    except OSError:
        return 0.0
    return 1.0 if written == str(task.metadata["expected"]) else 0.0

"""An environment that builds in the driver and fails inside Ray workers (a worker-side bug)."""

from __future__ import annotations

from collections.abc import Sequence

import ray

from collector.envs.arithmetic import ArithmeticEnv
from collector.envs.base import Task


class WorkerOnlyFailure(ArithmeticEnv):
    """Arithmetic tasks in the driver; a RuntimeError when a worker lists them."""

    def tasks(self) -> Sequence[Task]:
        if ray.is_initialized() and ray.get_runtime_context().worker.mode == ray.WORKER_MODE:
            raise RuntimeError("tasks cannot be listed on this worker")
        return super().tasks()

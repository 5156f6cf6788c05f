"""Support-desk lookup and e-mail tasks only: one short tool (`lookup_order`) and one long one
(`send_email`), for the per-tool truth tests. Named by module path in a config, so the run's
identity (and so every episode's seed) is the same on every machine and in every temp dir."""

from __future__ import annotations

from collector.envs.support_desk import SupportDeskEnv


class LookupAndEmail(SupportDeskEnv):
    """The first `num_tasks` lookup and e-mail tasks of the support desk's generated ones."""

    name = "lookup_and_email"

    def __init__(self, num_tasks: int = 8, seed: int = 0) -> None:
        super().__init__(num_tasks=5 * num_tasks, seed=seed)
        self._tasks = [t for t in self._tasks if t.metadata["kind"] in ("lookup", "email")][:num_tasks]

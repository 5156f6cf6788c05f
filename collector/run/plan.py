"""What a run will do: the work items of a config, enumerated deterministically.

The driver and `collector validate` both call `plan_work`; the worker receives `WorkItem`s.
A work item is one episode to run: a cell of the sweep (model x budget [x provider]), a task
and a sample, with its deterministic `episode_id` and per-episode seed. The cells are the
product of models and budgets, or the pairs a sweep lists (`sweep.cells`, `sweep.pairing =
"zip"`); a task that names its models (`Task.models`) runs only in their cells. Either way
an episode's id depends on its own cell alone, so the ids a product sweep always had stay. Because ids depend
only on the config, a rerun enumerates the same ids and resume is a set difference against
the ids already committed.

Items are ordered sample-major and cell-minor, so the first finished batches already cover
every cell of the sweep: a run stopped early still has a little of everything.

This module imports no Ray: it is cheap, and the worker uses it too.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass, field
from pathlib import Path

from collector.config import ProviderConfig, RunConfig, config_fingerprint, run_id
from collector.data.record import episode_id
from collector.envs.base import Environment, Task
from collector.errors import ConfigError


@dataclass(slots=True, frozen=True)
class WorkItem:
    """One episode to run. Small and picklable: it crosses the Ray boundary in batches."""

    episode_id: str
    model: str
    budget: int
    provider_index: int
    """Index into `Plan.providers` (0 when the sweep has a single provider)."""
    task_id: str
    sample: int
    seed: int
    """Per-episode seed, derived from the run seed and the episode id (stable across reruns)."""


@dataclass(slots=True)
class Plan:
    cfg: RunConfig
    run_id: str
    fingerprint: str
    providers: list[ProviderConfig]
    task_ids: list[str]
    items: list[WorkItem] = field(default_factory=list)

    def describe(self) -> str:
        """A few human lines: the sweep's shape and its identity."""
        sweep = self.cfg.sweep
        if sweep.cells is not None or sweep.pairing == "zip":
            axes = [f"{len(sweep.pairs())} (model, budget) cell(s)"]
        else:
            axes = [f"{len(sweep.models)} model(s)", f"{len(sweep.budgets)} budget(s)"]
        if len(self.providers) > 1:
            axes.append(f"{len(self.providers)} providers")
        axes += [f"{len(self.task_ids)} task(s)", f"{self.cfg.samples_per_task} sample(s)"]
        full = len(self.task_ids) * self.cfg.samples_per_task * len(self.providers) * len(sweep.pairs())
        if len(self.items) != full:
            axes[-1] += " (tasks restricted to their models)"
        kinds = ", ".join(
            p.name + ("" if p.kind != "sim" else f" ({p.sim_transport})") for p in self.providers
        )
        return "\n".join(
            [
                f"run_id {self.run_id} (fingerprint {self.fingerprint[:16]})",
                f"{' x '.join(axes)} = {len(self.items)} episodes",
                f"provider: {kinds}; env: {self.cfg.env.name}; output: {self.cfg.output.path}",
            ]
        )


def episode_seed(run_seed: int, eid: str) -> int:
    """A 31-bit seed per episode: different samples of one task get different replies."""
    digest = hashlib.blake2b(f"{run_seed}:{eid}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") & 0x7FFFFFFF


def load_env(cfg: RunConfig) -> Environment:
    """Build the configured environment (built-in name or `package.module:attr`)."""
    from collector.envs.loading import load_environment

    for entry in reversed(cfg.env.python_path):
        path = str(Path(entry).resolve())
        if path not in sys.path:
            sys.path.insert(0, path)
    options = dict(cfg.env.options)
    if cfg.env.task_file is not None:
        options.setdefault("task_file", cfg.env.task_file)
    return load_environment(cfg.env.name, options)


def select_tasks(cfg: RunConfig, env: Environment) -> list[Task]:
    """The environment's tasks, cut to `env.tasks` when set; ids must be unique."""
    tasks = list(env.tasks())
    if cfg.env.tasks is not None:
        tasks = tasks[: cfg.env.tasks]
    if not tasks:
        raise ConfigError(f"env.name: environment {cfg.env.name!r} has no tasks")
    ids = [t.id for t in tasks]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"env.name: environment {cfg.env.name!r} has duplicate task ids")
    return tasks


def plan_work(cfg: RunConfig, env: Environment | None = None) -> Plan:
    """Every episode the config describes, in a deterministic order."""
    env = env if env is not None else load_env(cfg)
    tasks = select_tasks(cfg, env)
    providers = list(cfg.sweep.providers) if cfg.sweep.providers else [cfg.provider]
    rid = run_id(cfg)
    plan = Plan(cfg, rid, config_fingerprint(cfg), providers, [t.id for t in tasks])
    cells = cfg.sweep.pairs()
    for sample in range(cfg.samples_per_task):
        for task in tasks:
            for p_index, provider in enumerate(providers):
                for model, budget in cells:
                    # With several providers the same model name can appear under each: the
                    # provider's label keeps their episode ids apart.
                    id_model = model if len(providers) == 1 else f"{provider.name}/{model}"
                    if task.models is not None and model not in task.models and id_model not in task.models:
                        continue  # the task names the models it applies to
                    eid = episode_id(rid, task.id, sample, id_model, budget)
                    plan.items.append(
                        WorkItem(eid, model, budget, p_index, task.id, sample, episode_seed(cfg.seed, eid))
                    )
    return plan

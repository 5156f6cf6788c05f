"""What a run will do: the work items of a config, enumerated deterministically.

The driver and `collector validate` both call `plan_work`; the worker receives `WorkItem`s.
A work item is one episode to run: a cell of the sweep (model x budget [x provider]), a task
and a sample, with its deterministic `episode_id` and per-episode seed. The cells are the
product of models and budgets, or the pairs a sweep lists (`sweep.cells`, `sweep.pairing =
"zip"`); a task that names its models (`Task.models`) runs only in their cells. Either way
an episode's id depends on its own cell alone, so the ids a product sweep always had stay. Because ids depend
only on the config, a rerun enumerates the same ids and resume is a set difference against
the ids already committed.

Items are ordered sample-major and cell-minor by default, so the first finished batches
already cover every cell of the sweep: a run stopped early still has a little of everything.
`sweep.order = "group_major"` hands out a group's samples one after another instead, so a
consumer of complete groups (GRPO following the run) gets its first ones early.

Bounded and lazy. At most `MAX_TASKS` tasks are read from the environment and at most
`MAX_EPISODES` episodes planned (one line otherwise), and the items are enumerated only when
first asked for: `collector validate` reports the size from the shape alone, at once, and
the job streams them (`Plan.iter_items`) instead of holding the list.

This module imports no Ray: it is cheap, and the worker uses it too.
"""

from __future__ import annotations

import hashlib
import itertools
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from collector.config import (
    MAX_EPISODES,
    MAX_TASKS,
    ProviderConfig,
    ReasoningSetting,
    RunConfig,
    config_fingerprint,
    run_id,
)
from collector.envs.base import Environment, Task
from collector.errors import ConfigError
from collector.record.episode import episode_id


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
    reasoning_index: int | None = None
    """Index into `sweep.reasoning` (None when the sweep has no reasoning axis)."""


@dataclass(slots=True)
class Plan:
    cfg: RunConfig
    run_id: str
    fingerprint: str
    providers: list[ProviderConfig]
    task_ids: list[str]
    task_models: dict[str, frozenset[str]] = field(default_factory=dict)
    """The models a task names as the ones it applies to (tasks that name none are absent)."""
    _items: list[WorkItem] | None = None

    def _applies(self, task_id: str, model: str, id_model: str) -> bool:
        models = self.task_models.get(task_id)
        return models is None or model in models or id_model in models

    def _id_model(self, provider: ProviderConfig, model: str) -> str:
        # With several providers the same model name can appear under each: the provider's
        # label keeps their episode ids apart.
        return model if len(self.providers) == 1 else f"{provider.name}/{model}"

    @property
    def full_size(self) -> int:
        """Episodes of the full sweep, before tasks restricted to their models are applied."""
        cells = len(self.providers) * len(self.cfg.sweep.pairs()) * len(self.cfg.sweep.reasoning or [None])
        return self.cfg.samples_per_task * len(self.task_ids) * cells

    @property
    def size(self) -> int:
        """How many episodes the plan holds, without enumerating them (counted per task and
        cell only when some task names its models)."""
        if not self.task_models:
            return self.full_size
        pairs = self.cfg.sweep.pairs()
        per_sample = sum(
            self._applies(task_id, model, self._id_model(provider, model))
            for task_id in self.task_models
            for provider in self.providers
            for model, _ in pairs
        ) + (len(self.task_ids) - len(self.task_models)) * len(self.providers) * len(pairs)
        return self.cfg.samples_per_task * per_sample * len(self.cfg.sweep.reasoning or [None])

    @property
    def items(self) -> list[WorkItem]:
        """Every episode, in a deterministic order (enumerated on first use and kept)."""
        if self._items is None:
            self._items = list(_enumerate(self))
        return self._items

    def iter_items(self) -> Iterator[WorkItem]:
        """The same items, enumerated afresh and kept by nobody: what the job reads, so that a
        million-episode plan (~230 bytes an item) is never held whole."""
        return iter(self._items) if self._items is not None else _enumerate(self)

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
        if self.size != self.full_size:
            axes[-1] += " (tasks restricted to their models)"
        kinds = ", ".join(
            p.name + ("" if p.kind != "sim" else f" ({p.sim_transport})") for p in self.providers
        )
        return "\n".join(
            [
                f"run_id {self.run_id} (fingerprint {self.fingerprint[:16]})",
                f"{' x '.join(axes)} = {self.size} episodes",
                f"provider: {kinds}; env: {self.cfg.env.name}; output: {self.cfg.output.path}",
            ]
        )


def tools_of_first_task(plan: Plan, env: Environment) -> str:
    """`tools: calculator (inline), ...`: the tools a world of the plan's first task offers,
    each with how its calls run (`Tool.execution`: async, inline or on a thread)."""
    from collector.envs.base import EpisodeContext, start_world
    from collector.envs.toolkit import describe_execution

    if not plan.task_ids:
        return "tools: none (no tasks)"
    task = next(t for t in env.tasks() if t.id == plan.task_ids[0])
    model, budget = plan.cfg.sweep.pairs()[0]
    context = EpisodeContext(episode_id="validate", run_id=plan.run_id, task_id=task.id, model=model,
                             provider=plan.providers[0].name, budget=budget, sample=0, seed=0,
                             env=plan.cfg.env.name)
    return f"tools (task {task.id}): {describe_execution(start_world(env, task, context).tools)}"


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
    """The environment's tasks, cut to `env.tasks` when set; ids must be unique.

    Read lazily up to the limit: an environment that yields more than `MAX_TASKS` tasks
    without `env.tasks` set is refused in one line instead of being read to its end.
    """
    limit = cfg.env.tasks if cfg.env.tasks is not None else MAX_TASKS
    tasks = list(itertools.islice(env.tasks(), limit + 1))
    if len(tasks) > limit:
        if cfg.env.tasks is not None:
            tasks = tasks[:limit]
        else:
            raise ConfigError(
                f"env.name: environment {cfg.env.name!r} has more than {MAX_TASKS:,} tasks; "
                "set env.tasks to use the first N"
            )
    if not tasks:
        raise ConfigError(f"env.name: environment {cfg.env.name!r} has no tasks")
    ids = [t.id for t in tasks]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"env.name: environment {cfg.env.name!r} has duplicate task ids")
    return tasks


def plan_work(cfg: RunConfig, env: Environment | None = None) -> Plan:
    """Every episode the config describes, in a deterministic order (`Plan.items`, lazy)."""
    env = env if env is not None else load_env(cfg)
    tasks = select_tasks(cfg, env)
    providers = list(cfg.sweep.providers) if cfg.sweep.providers else [cfg.provider]
    rid = run_id(cfg)
    task_models = {t.id: frozenset(t.models) for t in tasks if t.models is not None}
    _check_reasoning(cfg, providers)
    plan = Plan(cfg, rid, config_fingerprint(cfg), providers, [t.id for t in tasks], task_models)
    if plan.size > MAX_EPISODES:
        raise ConfigError(
            f"the sweep plans {plan.size:,} episodes ({len(tasks):,} tasks), more than {MAX_EPISODES:,}; "
            "lower samples_per_task or env.tasks, or split it into several runs"
        )
    return plan


def _check_reasoning(cfg: RunConfig, providers: list[ProviderConfig]) -> None:
    """Anthropic's own rule, before anything runs: `budget_tokens` >= 1024 and < `max_tokens`."""
    settings = cfg.sweep.reasoning or [ReasoningSetting(thinking_budget=cfg.sampling.thinking_budget)]
    if not any(p.wire == "anthropic" for p in providers):
        return
    for model, budget in cfg.sweep.pairs():
        for setting in settings:
            thinking = setting.thinking_budget
            if thinking is not None and not 1024 <= thinking < budget:
                where = f"reasoning {setting.label}" if cfg.sweep.reasoning else "sampling.thinking_budget"
                raise ConfigError(
                    f"sweep cell (model {model!r}, budget {budget}, {where}): an Anthropic "
                    "thinking budget must be at least 1024 and below the cell's budget (its max_tokens)"
                )


def _enumerate(plan: Plan) -> Iterator[WorkItem]:
    cfg = plan.cfg
    samples = range(cfg.samples_per_task)
    if cfg.sweep.order == "group_major":
        # A group's samples one after another: groups complete from the first batches on.
        for task_id in plan.task_ids:
            for key in _cells_of(plan, task_id):
                for sample in samples:
                    yield _item(plan, task_id, sample, *key)
        return
    for sample in samples:
        for task_id in plan.task_ids:
            for key in _cells_of(plan, task_id):
                yield _item(plan, task_id, sample, *key)


def _cells_of(plan: Plan, task_id: str) -> Iterator[tuple[int, str, int, int | None]]:
    """(provider index, model, budget, reasoning index) of every cell `task_id` runs in."""
    cfg = plan.cfg
    settings: list[int | None] = list(range(len(cfg.sweep.reasoning))) if cfg.sweep.reasoning else [None]
    for p_index, provider in enumerate(plan.providers):
        for model, budget in cfg.sweep.pairs():
            if not plan._applies(task_id, model, plan._id_model(provider, model)):
                continue  # the task names the models it applies to
            for r_index in settings:
                yield p_index, model, budget, r_index


def _item(plan: Plan, task_id: str, sample: int, p_index: int, model: str, budget: int,
          r_index: int | None) -> WorkItem:
    cfg = plan.cfg
    id_key = plan._id_model(plan.providers[p_index], model)
    if r_index is not None and cfg.sweep.reasoning is not None:
        # A reasoning axis keeps the ids of its cells apart, as a provider axis does.
        id_key = f"{id_key}@{cfg.sweep.reasoning[r_index].label}"
    eid = episode_id(plan.run_id, task_id, sample, id_key, budget)
    return WorkItem(eid, model, budget, p_index, task_id, sample, episode_seed(cfg.seed, eid), r_index)

"""Work planning: deterministic episode ids and seeds, every cell covered, provider sweeps kept apart."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import pytest

from collector.config import RunConfig
from collector.data.record import episode_id
from collector.envs.base import MAX_GENERATED_TASKS, Environment, EpisodeWorld, Task
from collector.errors import ConfigError
from collector.run import plan as plan_mod
from collector.run.plan import plan_work


def cfg(**extra: object) -> RunConfig:
    data: dict[str, object] = {
        "name": "p",
        "sweep": {"models": ["a", "b"], "budgets": [16, 32]},
        "env": {"name": "arithmetic", "tasks": 3},
        "samples_per_task": 2,
    }
    data.update(extra)
    return RunConfig.model_validate(data)


def test_plan_is_deterministic_and_complete() -> None:
    """Two plans of one config are identical; ids match record.episode_id and are unique."""
    first, second = plan_work(cfg()), plan_work(cfg())
    assert first.items == second.items
    assert len(first.items) == 2 * 2 * 3 * 2
    assert len({i.episode_id for i in first.items}) == len(first.items)
    item = first.items[0]
    assert item.episode_id == episode_id(first.run_id, item.task_id, item.sample, item.model, item.budget)


def test_samples_get_different_seeds() -> None:
    """Two samples of the same cell and task get different per-episode seeds."""
    items = plan_work(cfg()).items
    a = [i for i in items if (i.model, i.budget, i.task_id) == ("a", 16, items[0].task_id)]
    assert len(a) == 2
    assert a[0].seed != a[1].seed


def test_first_items_cover_every_cell() -> None:
    """Items are sample-major, so the first batch already touches every model x budget cell."""
    items = plan_work(cfg()).items
    assert {(i.model, i.budget) for i in items[:4]} == {("a", 16), ("a", 32), ("b", 16), ("b", 32)}


def test_provider_sweep_keeps_ids_apart() -> None:
    """Two providers serving the same model name give distinct episode ids (by provider label)."""
    providers = [
        {"kind": "chat", "base_url": "http://one/v1", "label": "one"},
        {"kind": "chat", "base_url": "http://two/v1", "label": "two"},
    ]
    plan = plan_work(cfg(sweep={"models": ["m"], "budgets": [16], "providers": providers}))
    assert len(plan.items) == 2 * 3 * 2
    assert len({i.episode_id for i in plan.items}) == len(plan.items)
    assert {i.provider_index for i in plan.items} == {0, 1}


def test_validate_reports_a_big_sweep_without_enumerating_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan of a million episodes describes itself from its shape alone: `collector validate`
    answers at once, whatever the sweep's size (the ids are only made when a run asks for them)."""

    def no_ids(*_: object) -> str:
        raise AssertionError("validate enumerated the episodes")

    monkeypatch.setattr(plan_mod, "episode_id", no_ids)
    big = cfg(samples_per_task=50_000, env={"name": "arithmetic", "tasks": 20},
              sweep={"models": ["a"], "budgets": [16]})
    plan = plan_work(big)
    assert plan.size == 1_000_000
    assert "= 1000000 episodes" in plan.describe()


class EndlessEnv(Environment):
    """An environment whose task stream never ends; it fails if read past `allowed` tasks."""

    name = "endless"

    def __init__(self, allowed: int) -> None:
        self.allowed = allowed

    def tasks(self) -> Sequence[Task]:
        def stream() -> Iterator[Task]:
            for i in itertools.count():
                assert i < self.allowed, "the planner read the whole task stream"
                yield Task(f"t{i}", "What is 1 + 1? Use the calculator tool")
        return stream()  # type: ignore[return-value]

    def start(self, task: Task) -> EpisodeWorld:
        raise NotImplementedError


def test_tasks_are_read_only_up_to_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """An environment with more tasks than MAX_TASKS is refused in one line without being read to
    its end; with env.tasks set only the first N (+1) are read."""
    monkeypatch.setattr(plan_mod, "MAX_TASKS", 50)
    with pytest.raises(ConfigError, match=r"more than 50 tasks; set env\.tasks"):
        plan_work(cfg(env={"name": "endless"}), env=EndlessEnv(allowed=52))
    plan = plan_work(cfg(env={"name": "endless", "tasks": 10}), env=EndlessEnv(allowed=12))
    assert len(plan.task_ids) == 10


def test_a_plan_over_the_episode_limit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real task count times the sweep may not pass MAX_EPISODES: one line, before any id is made."""
    monkeypatch.setattr(plan_mod, "MAX_EPISODES", 100)
    with pytest.raises(ConfigError, match=r"plans 240 episodes \(30 tasks\), more than 100"):
        plan_work(cfg(env={"name": "arithmetic", "options": {"num_tasks": 30}}))


@pytest.mark.parametrize("env", ["arithmetic", "support_desk"])
def test_builtin_environments_bound_the_tasks_they_generate(env: str) -> None:
    """`num_tasks` of a built-in environment above MAX_GENERATED_TASKS is a one-line config error."""
    too_many = {"name": env, "options": {"num_tasks": MAX_GENERATED_TASKS + 1}}
    with pytest.raises(ConfigError, match=r"env\.options\.num_tasks: must be an integer from 1 to 10,000"):
        plan_work(cfg(env=too_many))

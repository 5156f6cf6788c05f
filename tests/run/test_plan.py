"""Work planning: deterministic episode ids and seeds, every cell covered, provider sweeps kept apart."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import pytest

from collector.config import RunConfig, config_from_dict
from collector.envs.arithmetic import ArithmeticEnv
from collector.envs.base import MAX_GENERATED_TASKS, Environment, EpisodeWorld, Task
from collector.errors import ConfigError
from collector.record.episode import episode_id
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
def test_ids_of_an_existing_config_are_pinned() -> None:
    """The demo config's run id, episode ids and seeds never change: committed runs resume."""
    import hashlib

    from collector.config import load_config

    plan = plan_work(load_config("configs/demo.toml", ["env.options={num_tasks=5}"]))
    listing = "\n".join(f"{i.episode_id} {i.seed}" for i in plan.items)
    # Pinned at the schema-3 release (this release's new loop, redaction and sampling fields
    # changed every fingerprint once; CHANGELOG): from here on a change is deliberate.
    assert plan.run_id == "demo-a43a595b"
    assert len(plan.items) == 240
    assert (plan.items[0].episode_id, plan.items[0].seed) == ("01fc0bb796ec3cf471875477", 349141034)
    assert hashlib.sha256(listing.encode()).hexdigest() == (
        "6deb13182189d193df85050d2cae0d1231f0b5c41cc3418e50db3db672248246"
    )
    # Token-in changes what every later turn saw (ids sent, not text): a run of its own.
    token_in = plan_work(load_config("configs/demo.toml",
                                     ["env.options={num_tasks=5}", "sampling.token_in=true"]))
    assert token_in.run_id != plan.run_id


def _ids(plan: object) -> dict[tuple[str, int, str, int], str]:
    return {(i.model, i.budget, i.task_id, i.sample): i.episode_id for i in plan.items}  # type: ignore[attr-defined]


def test_paired_sweeps_run_only_their_cells_with_the_product_ids() -> None:
    """`pairing = "zip"` and explicit `cells` run exactly the listed (model, budget) cells, each
    episode under the id (and run id) the full product gives it, so resume works across them."""
    product = plan_work(cfg())
    zipped = plan_work(cfg(sweep={"models": ["a", "b"], "budgets": [16, 32], "pairing": "zip"}))
    cells = plan_work(cfg(sweep={"cells": [{"model": "b", "budget": 16}, {"model": "a", "budget": 32}]}))
    assert zipped.run_id == cells.run_id == product.run_id
    full = _ids(product)
    assert {(m, b) for m, b, _, _ in _ids(zipped)} == {("a", 16), ("b", 32)}
    assert {(m, b) for m, b, _, _ in _ids(cells)} == {("b", 16), ("a", 32)}
    for plan in (zipped, cells):
        assert len(plan.items) == 2 * 3 * 2
        assert all(full[key] == eid for key, eid in _ids(plan).items())
    assert cells.cfg.sweep.models == ["b", "a"]  # the axes default to what the cells use
    assert "2 (model, budget) cell(s)" in cells.describe()


class _NamedModelsEnv(Environment):
    name = "named"

    def tasks(self) -> list[Task]:
        base = ArithmeticEnv(num_tasks=3).tasks()
        return [base[0], Task(base[1].id, base[1].prompt, base[1].metadata, ("b",)), base[2]]

    def start(self, task: Task, context: object = None) -> EpisodeWorld:
        raise AssertionError("not started when planning")


def test_tasks_that_name_their_models_run_only_in_those_cells() -> None:
    """A task with `models` is planned only in cells of those models; its ids do not change."""
    full = _ids(plan_work(cfg()))
    plan = plan_work(cfg(), _NamedModelsEnv())
    restricted = [key for key in _ids(plan) if key[2] == "arith-0001"]
    assert restricted
    assert {m for m, _, _, _ in restricted} == {"b"}
    assert len(plan.items) == 2 * 2 * 2 * 2 + 2 * 2
    assert all(full[key] == eid for key, eid in _ids(plan).items())


@pytest.mark.parametrize(
    ("sweep", "message"),
    [
        ({"models": ["a", "b"], "budgets": [16], "pairing": "zip"}, "as many models as budgets"),
        ({"models": ["a"], "budgets": [16], "cells": [{"model": "z", "budget": 16}]}, "cells.0"),
        ({"cells": [{"model": "a", "budget": 16}, {"model": "a", "budget": 16}]}, "listed twice"),
    ],
)
def test_bad_paired_sweeps_are_one_line_errors(sweep: dict[str, object], message: str) -> None:
    """A zip of unequal axes, a cell outside the listed axes, a repeated cell: one line each."""
    with pytest.raises(ConfigError, match=message) as info:
        config_from_dict({"sweep": sweep}, "x.toml")
    assert str(info.value).startswith("x.toml: sweep")
    assert "\n" not in str(info.value)

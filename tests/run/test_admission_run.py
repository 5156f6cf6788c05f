"""End to end on the rate-limited preset: adaptive admission loses no episode to throttling,
and the throttled requests are counted by cause as `collector stats` counts them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from collector.analysis.stats import aggregate
from collector.record.shards import episodes_to_table
from collector.sim.capacity import Capacity
from collector.sim.presets import PRESETS
from collector.sim.server import SimServer
from collector.stop import StopReason
from tests.run.helpers import small_config
from tests.run.test_worker import run_plan


def test_rate_limited_run_has_no_error_and_counts_429s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sim-hosted with a token budget whose bucket holds less than one request (a 0.025 s burst):
    the two requests the gate's slow start sends together meet a 429 whatever the machine's
    speed; the gate pauses on their Retry-After, cuts its limit, and every episode still ends
    normally. A bucket this small is not fair (a request can lose the refill to others several
    times running), so the run allows more retries than the default 4: the subject is that the
    gate paces itself and the 429s are counted, not how many retries starvation takes."""
    tight = dataclasses.replace(PRESETS["sim-hosted"], capacity=Capacity(
        slots=1024, queue_limit=0, refuse_status=429, refuse_retry_after_s=1.0,
        tokens_per_minute=72_000, burst_s=0.025))
    monkeypatch.setitem(PRESETS, "sim-hosted", tight)
    cfg = small_config(tmp_path / "run", sweep__models=["sim-hosted"], sweep__budgets=[32],
                       ray__admission="adaptive", ray__episodes_in_flight=12,
                       provider__retry={"max_retries": 12})
    episodes = run_plan(cfg)
    assert len(episodes) == 12
    assert not [e for e in episodes if e.stop_reason == StopReason.ERROR]
    stats = aggregate(episodes_to_table(episodes), ["model"])
    (group,) = stats.groups
    assert group.errors == 0
    assert group.retries.get("429", 0) > 0  # the budget was really hit, and counted by cause


def test_adaptive_admission_keeps_token_in_and_the_declared_version(tmp_path: Path) -> None:
    """The gated provider is the one the static path builds: with `sampling.token_in` every
    later turn's prompt goes as ids (it was the plain chat adapter behind the gate), and a
    declared policy version is still recorded per turn."""
    with SimServer(seed=3) as sim:
        cfg = small_config(
            tmp_path / "run", sweep__models=["sim-drift"], sweep__budgets=[512],
            env__name="support_desk", env__tasks=4, samples_per_task=1,
            provider={"kind": "chat", "base_url": f"{sim.base_url}/llamacpp/sim-drift/v1",
                      "policy_version": "step-7"},
            sampling__token_in=True, ray__admission="adaptive")
        episodes = run_plan(cfg)
    later = [t for e in episodes for t in e.turns[1:]]
    assert later
    assert all(t.prompt_sent_as_ids for t in later)
    assert {t.policy_version for e in episodes for t in e.turns} == {"step-7"}

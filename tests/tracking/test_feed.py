"""The progress feed's metric names and rates, the missing-package preflight error, and a
failing tracker behind `Tracking` costing one scrubbed warning.

Tests for `collector.tracking.summary.LiveFeed`, `collector.tracking.check_tracking` and
`collector.tracking.Tracking`,
with plain stand-ins for committed episodes and an injected clock (no tracker SDK).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import pytest

from collector.config import RunConfig
from collector.errors import ConfigError
from collector.tracking import check_tracking
from collector.tracking.summary import LiveFeed


@dataclass
class Done:
    model: str
    budget: int
    stop_reason: str
    provider: str = "sim"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_points_count_by_stop_reason_and_cell_at_most_once_per_interval() -> None:
    clock = Clock()
    feed = LiveFeed(planned=10, already=2, interval_s=5.0, clock=clock)
    feed.add([Done("m", 16, "length"), Done("m", 16, "done"), Done("m", 16, "error"),
              Done("m/x", 128, "done")])
    assert feed.due()
    assert not feed.due()  # within the interval
    clock.now += 4.0
    point = feed.point()
    assert point.step == 6  # earlier runs' episodes included
    assert point.metrics["episodes/committed"] == 6.0
    assert point.metrics["episodes/planned"] == 10.0
    assert point.metrics["episodes/fraction"] == 0.6
    assert point.metrics["episodes/per_s"] == 1.0  # this run's 4 in 4 s
    assert point.metrics["stop_reason/length"] == 1.0
    assert point.metrics["stop_reason/done"] == 2.0
    assert point.metrics["stop_reason/error"] == 1.0
    assert point.metrics["cell/m/16/episodes"] == 3.0
    assert point.metrics["cell/m/16/truncation_rate"] == 0.5  # the error left out
    assert point.metrics["cell/m/x/128/truncation_rate"] == 0.0
    clock.now += 1.0
    assert feed.due()


def test_a_configured_tracker_without_its_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = RunConfig.model_validate({"sweep": {"models": ["m"], "budgets": [16]},
                                    "tracking": {"mlflow": {"experiment": "x"}}})
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "mlflow" else real(name, *a))
    with pytest.raises(ConfigError) as caught:
        check_tracking(cfg)
    assert "tracking.mlflow" in str(caught.value)
    assert "pip install 'collector[mlflow]'" in str(caught.value)
    assert "\n" not in str(caught.value)


class LeakyRaising:
    """Raises on every call, with the run's key in its message (an SDK echoing its request)."""

    name = "leaky"

    def __init__(self, secret: str) -> None:
        self.secret = secret
        self.calls = 0

    def _boom(self, *_: object) -> None:
        self.calls += 1
        raise ConnectionError(f"POST https://tracker.invalid/?token={self.secret} refused")

    start = progress = finish = _boom


def test_a_failing_tracker_costs_the_run_one_scrubbed_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    from collector.tracking import Tracking

    secret = "sk-PLANTED-feed-key-0123456789"
    monkeypatch.setenv("FEED_TEST_KEY", secret)
    cfg = RunConfig.model_validate({"sweep": {"models": ["m"], "budgets": [16]},
                                    "provider": {"kind": "chat", "base_url": "http://llm.invalid/v1",
                                                 "api_key_env": "FEED_TEST_KEY"},
                                    "tracking": {"log_interval_s": 0.001}})
    warnings: list[str] = []
    tracker = LeakyRaising(secret)
    tracking = Tracking(cfg, [tracker], run_id="r-1", run_dir="/runs/r-1", planned=3, already=0,
                        warn=warnings.append)
    for _ in range(3):
        tracking.committed([Done("m", 16, "done")])
    tracking.finish()  # returns: the tracker is off, nothing waits on it
    assert tracker.calls == 1
    assert len(warnings) == 1
    assert warnings[0].startswith("tracker leaky: ConnectionError: ")
    assert secret not in warnings[0]

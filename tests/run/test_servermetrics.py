"""The engine's `/metrics` as an admission signal: parsing vLLM's and SGLang's exposition text,
the verdicts against the previous scrape, and a gate that scrapes on the back of finished
requests (a fake fetch, a stepped clock; no server, no sleeps)."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import logging
from pathlib import Path

import httpx
import pytest

from collector.config import ProviderConfig, RunConfig
from collector.providers.base import Endpoint
from collector.record.episode import Episode
from collector.run.admission import DECREASE, Admission, AdmissionTransport, AimdController
from collector.run.endpoints import endpoint_for
from collector.run.plan import plan_work
from collector.run.servermetrics import (
    KV_FULL,
    MAX_FAILURES,
    MAX_METRICS_BYTES,
    EngineLoad,
    LoadVerdict,
    MetricsReader,
    metrics_reader,
    parse_load,
)
from collector.run.simlaunch import provider_urls
from collector.run.worker import EpisodeWorker, WorkerSetup
from collector.sim.capacity import Capacity, CapacityModel, vllm_metrics
from collector.sim.presets import PRESETS
from collector.stop import StopReason
from tests.run.helpers import small_config

# The shape vLLM's v1 engine publishes (two engines of one model: samples are summed).
VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="qwen"} 12.0
vllm:num_requests_running{engine="1",model_name="qwen"} 4.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="qwen"} 3.0
vllm:num_requests_waiting{engine="1",model_name="qwen"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="qwen"} 0.42
vllm:kv_cache_usage_perc{engine="1",model_name="qwen"} 0.97
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="qwen"} 7.0
vllm:num_preemptions_total{engine="1",model_name="qwen"} 1.0
vllm:num_preemptions_created{engine="0",model_name="qwen"} 1.7e9
"""

SGLANG = """\
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",tp_rank="0"} 9.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m",tp_rank="0"} 0.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m",tp_rank="0"} 0.5
"""


def test_vllm_text_sums_engines_and_takes_the_fullest_cache() -> None:
    assert parse_load(VLLM, "vllm") == EngineLoad(waiting=3.0, running=16.0, kv_usage=0.97, preemptions=8.0)


def test_older_vllm_cache_name_and_sglang_names() -> None:
    old = "vllm:gpu_cache_usage_perc{model_name=\"x\"} 0.5\nvllm:num_requests_waiting 0\n"
    assert parse_load(old, "vllm") == EngineLoad(0.0, None, 0.5, None)
    assert parse_load(SGLANG, "sglang") == EngineLoad(waiting=0.0, running=9.0, kv_usage=0.5,
                                                      preemptions=None)


@pytest.mark.parametrize(
    "text", ["", "<html>not found</html>", "other_metric 1\n", "vllm:num_requests_waiting NaN\n"])
def test_text_without_the_engines_metrics_is_no_reading(text: str) -> None:
    assert parse_load(text, "vllm") is None


def reader_of(*texts: str) -> MetricsReader:
    queue = list(texts)

    async def fetch() -> str:
        item = queue.pop(0)
        if item == "raise":
            raise httpx.ConnectError("refused")
        return item

    return MetricsReader("vllm", fetch, "http://127.0.0.1:1/metrics")


def load(waiting: float = 0, kv: float = 0.5, preempted: float = 0) -> str:
    return (f"vllm:num_requests_waiting {waiting}\nvllm:num_requests_running 2\n"
            f"vllm:kv_cache_usage_perc {kv}\nvllm:num_preemptions_total {preempted}\n")


def test_verdicts_against_the_previous_scrape() -> None:
    """Preemptions since the last scrape and a queue that does not drain cut; any queue or a
    full cache holds; room changes nothing."""
    reader = reader_of()
    judge = reader.judge
    assert judge(EngineLoad(0, 16, 0.5, 4)) == LoadVerdict(False, False, "room")  # first: counters unknown
    assert judge(EngineLoad(0, 16, 0.5, 5)).overloaded  # the counter rose
    assert not judge(EngineLoad(0, 16, 0.5, 5)).overloaded  # and stayed
    # A short queue (under QUEUE_HOLD x running: 8 of 16) keeps the slots busy: room.
    assert judge(EngineLoad(7, 16, 0.5, 5)) == LoadVerdict(False, False, "room")
    assert judge(EngineLoad(8, 16, 0.5, 5)) == LoadVerdict(False, True, "queued")
    assert judge(EngineLoad(9, 16, 0.5, 5)) == LoadVerdict(True, True, "queue not draining")
    assert judge(EngineLoad(8.5, 16, 0.5, 5)) == LoadVerdict(False, True, "queued")  # draining
    assert judge(EngineLoad(1, 0, 0.5, 5)) == LoadVerdict(False, True, "queued")  # nothing runs
    assert judge(EngineLoad(0, 16, KV_FULL, 5)) == LoadVerdict(False, True, "kv cache full")
    assert judge(EngineLoad(0, 16, 0.2, 5)) == LoadVerdict(False, False, "room")


def test_controller_holds_while_full_and_cuts_once_per_scrape() -> None:
    now = [100.0]
    ctl = AimdController(64, lambda: now[0], initial=10)
    ctl.server_load(LoadVerdict(False, True, "queued"))
    for _ in range(5):
        t = ctl.start()
        now[0] += 0.1
        ctl.done(t, False, waiting=True)
    assert ctl.limit == 10.0  # held: pressed, healthy, and yet no increase
    ctl.server_load(LoadVerdict(True, True, "preempted"))
    assert ctl.limit == pytest.approx(10 * DECREASE)
    # A 503 of a request sent after that cut cuts again (a new congestion event)...
    ctl.done(ctl.start(), True)
    assert ctl.limit == pytest.approx(10 * DECREASE * DECREASE)
    limit = ctl.limit
    # ... and the next scrape, still overloaded, does not cut on top of it: the same event.
    ctl.server_load(LoadVerdict(True, True, "queue not draining"))
    assert ctl.limit == pytest.approx(limit)
    ctl.server_load(LoadVerdict(True, True, "queue not draining"))
    assert ctl.limit == pytest.approx(limit * DECREASE)
    assert ctl.throttled == 4
    ctl.server_load(LoadVerdict(False, False, "room"))
    t = ctl.start()
    now[0] += 0.1
    ctl.done(t, False, waiting=True)
    assert ctl.limit > limit * DECREASE  # released: it grows again


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def _one_request(gate: Admission, clock: Clock) -> None:
    ticket = await gate.admit(10)
    clock.now += 0.05
    await gate.release(ticket, 200, httpx.Headers(), timed_out=False)


async def test_gate_scrapes_at_most_once_per_interval_and_applies_the_verdict() -> None:
    clock = Clock()
    fetched: list[float] = []
    texts = [load(preempted=0), load(preempted=3), load(waiting=0)]

    async def fetch() -> str:
        fetched.append(clock.now)
        return texts[len(fetched) - 1]

    gate = Admission(64, clock=clock, metrics=MetricsReader("vllm", fetch, "here"))
    await _one_request(gate, clock)
    await asyncio.sleep(0)  # let the scrape task run
    await _one_request(gate, clock)  # within the interval: no second scrape
    await asyncio.sleep(0)
    assert len(fetched) == 1
    limit = gate.controller.limit
    clock.now += 1.0
    await _one_request(gate, clock)
    for _ in range(3):
        await asyncio.sleep(0)
    assert len(fetched) == 2
    assert gate.controller.limit < limit  # the preemptions cut it
    await gate.aclose()


async def test_a_failing_endpoint_is_dropped_after_a_few_tries_and_never_fails_a_request(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    reader = reader_of(*(["raise", "<html>404</html>"] * MAX_FAILURES))
    gate = Admission(64, clock=clock, metrics=reader)
    gate.controller.held = True
    with caplog.at_level(logging.WARNING, logger="collector.run.servermetrics"):
        for _ in range(MAX_FAILURES + 3):
            await _one_request(gate, clock)
            for _ in range(3):
                await asyncio.sleep(0)
            clock.now += 2.0
    assert reader.stopped
    assert reader.scrapes == MAX_FAILURES
    assert not gate.controller.held  # no more readings: the hold is lifted
    assert [r.getMessage() for r in caplog.records if "server metrics" in r.getMessage()] == [
        "server metrics at http://127.0.0.1:1/metrics: 5 scrapes in a row failed or held no vllm "
        "metrics; admission goes on without them"]


async def test_closing_the_transport_cancels_a_scrape_in_flight() -> None:
    started = asyncio.Event()

    async def fetch() -> str:
        started.set()
        await asyncio.Event().wait()  # a server that never answers
        return ""

    clock = Clock()
    gate = Admission(64, clock=clock, metrics=MetricsReader("vllm", fetch, "here"))
    transport = AdmissionTransport(httpx.MockTransport(lambda r: httpx.Response(200)), gate)
    await _one_request(gate, clock)
    await started.wait()
    await asyncio.wait_for(transport.aclose(), 5)
    assert gate._scraping is None


def test_server_metrics_need_adaptive_admission() -> None:
    base = {"provider": {"kind": "chat", "base_url": "http://h/v1", "server_metrics": "vllm"},
            "sweep": {"models": ["m"], "budgets": [8]}}
    with pytest.raises(ValueError, match=r"server_metrics = 'vllm' needs ray\.admission = \"adaptive\""):
        RunConfig.model_validate(base)
    cfg = RunConfig.model_validate({**base, "ray": {"admission": "adaptive"}})
    assert cfg.provider.server_metrics == "vllm"


async def test_reader_fetches_the_root_metrics_with_the_providers_key_and_bounds_the_body(
        caplog: pytest.LogCaptureFixture) -> None:
    seen: list[httpx.Request] = []
    body = {"text": VLLM}

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, text=body["text"])

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    config = ProviderConfig(kind="chat", base_url="http://u:PLANTED-pw@127.0.0.1:8000/v1",
                            server_metrics="vllm")
    reader = metrics_reader(config, endpoint_for(config, config.base_url or "", "sk-PLANTED"), client)
    assert reader is not None
    assert await reader.scrape() == LoadVerdict(False, True, "kv cache full")
    assert str(seen[0].url) == "http://127.0.0.1:8000/metrics"
    assert seen[0].headers["authorization"] == "Bearer sk-PLANTED"
    # Without a key, the base URL's user info goes as Basic, as to the model endpoint.
    basic = metrics_reader(config, endpoint_for(config, config.base_url or "", None), client)
    assert basic is not None
    assert await basic.scrape() is not None
    assert seen[1].headers["authorization"] == "Basic " + base64.b64encode(b"u:PLANTED-pw").decode()
    body["text"] = "#" * (MAX_METRICS_BYTES + 10)
    with caplog.at_level(logging.WARNING, logger="collector.run.servermetrics"):
        for _ in range(MAX_FAILURES):
            assert await reader.scrape() is None
    assert reader.stopped
    assert "http://127.0.0.1:8000/metrics" in caplog.text
    assert "PLANTED" not in caplog.text
    off = ProviderConfig(kind="chat", base_url="http://h/v1")
    assert metrics_reader(off, Endpoint("http://h/v1"), client) is None
    await client.aclose()


async def test_the_simulators_gpu_server_publishes_its_load_in_vllms_names() -> None:
    """`GET /metrics` of a simulated GPU server reads back as what it holds: the contract
    between `collector.sim.capacity` and this reader."""
    model = CapacityModel(Capacity(slots=2, queue_limit=8, kv_tokens=1000))
    await model.acquire(300)
    await model.acquire(300)
    queued = [asyncio.ensure_future(model.acquire(100)) for _ in range(3)]
    await asyncio.sleep(0)
    assert parse_load(vllm_metrics({"sim-gpu": model}), "vllm") == EngineLoad(
        waiting=3.0, running=2.0, kv_usage=0.6, preemptions=0.0)
    model.release(300)
    await asyncio.sleep(0)
    assert parse_load(vllm_metrics({"sim-gpu": model}), "vllm") == EngineLoad(2.0, 2.0, 0.4, 0.0)
    for q in queued:
        q.cancel()


def test_a_worker_reads_the_simulated_engines_metrics(tmp_path: Path) -> None:
    """The worker's gate for (provider, model) scrapes the simulator's `/metrics` (the default
    URL beside `/v1`) through an ungated client, every scrape reads as the engine's load, and
    every episode ends normally. (What a verdict does is tested above without a server: which
    verdict a scrape meets depends on when it lands.)"""
    small = dataclasses.replace(PRESETS["sim-gpu"], capacity=Capacity(slots=2, queue_limit=64, slowdown=0.0),
                                latency_ms_median=30.0)
    cfg = small_config(tmp_path / "run", sweep__models=["sim-gpu"], sweep__budgets=[64], env__tasks=16,
                       ray__admission="adaptive", ray__episodes_in_flight=16,
                       provider__server_metrics="vllm")
    plan = plan_work(cfg)

    async def run() -> tuple[list[Episode], MetricsReader]:
        with provider_urls(plan.providers, cfg.seed) as urls:
            worker = EpisodeWorker(WorkerSetup(cfg, plan.run_id, urls, "w"))
            try:
                episodes = await worker.run_batch(plan.items)
                (gate,) = worker._gates.values()
                assert gate.metrics is not None
                return episodes, gate.metrics
            finally:
                await worker.close()

    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(PRESETS, "sim-gpu", small)
        episodes, reader = asyncio.run(run())
    assert len(episodes) == len(plan.items)
    assert not [e for e in episodes if e.stop_reason == StopReason.ERROR]
    assert reader.failures == 0
    assert not reader.stopped
    assert reader.scrapes >= 1
    assert sum(reader.verdicts.values()) == reader.scrapes  # every scrape read the engine's load

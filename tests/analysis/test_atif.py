"""`collector export --format atif` (collector.analysis.atif): valid ATIF, and a lossless round trip."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path

import httpx
import jsonschema
import pytest
from nat.atif import Trajectory

from collector.analysis.atif import ATIF_VERSION, read_atif, trajectory_messages, validate_trajectory
from collector.analysis.committed import read_committed
from collector.analysis.trainer import full_prompts
from collector.cli import main
from collector.config import LoopConfig
from collector.envs.support_desk import SupportDeskEnv
from collector.episode.loop import EpisodeSpec, run_episode
from collector.providers import Endpoint, base_url_for, build_provider
from collector.record.episode import Episode
from collector.sim.app import create_app
from collector.stop import StopReason
from collector.storage.local import LocalRunStore
from collector.turn import SamplingParams
from tests.record.factory import make_batch

S = StopReason
_KEYS = ("role", "text", "call_id", "name", "is_error", "turn_index")
_CALL_KEYS = ("id", "name", "arguments_json", "status", "unparsed_chars")


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("atif")
    run = root / "run"
    with LocalRunStore.open(run, "fp", {}, "arrow", 8) as st:
        st.commit(make_batch(10, stops=(S.DONE, S.LENGTH, S.MALFORMED_TOOL_CALL, S.ERROR, S.MAX_STEPS)))
    out = root / "episodes.atif.jsonl"
    assert main(["export", str(run), str(out), "--format", "atif"]) == 0
    return run, out


async def _sim_episodes() -> list[Episode]:
    """Real episodes from the simulator's chat wire with token capture: tool turns, cut turns
    (budget 24), malformed calls (sim-sloppy), reasoning (sim-thinker), re-rendered prompts."""
    env = SupportDeskEnv(num_tasks=4)
    sampling = SamplingParams(token_ids=True, temperature=1.0)
    out = []
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(seed=0))) as client:
        endpoint = Endpoint(base_url_for("chat", "http://sim.test"), api_key="k")
        provider = build_provider("chat", endpoint, client)
        for model in ("sim-terse", "sim-sloppy", "sim-thinker", "sim-rerender"):
            for budget in (24, 256):
                for task in env.tasks()[:2]:
                    spec = EpisodeSpec("atif", model, "chat", budget, task, seed=1, env_name=env.name,
                                       sampling=sampling)
                    out.append(await run_episode(spec, provider, env, LoopConfig()))
    return out


@pytest.fixture(scope="module")
def sim_export(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("atif-sim")
    run = root / "run"
    with LocalRunStore.open(run, "fp", {}, "parquet", 8) as st:
        st.commit(asyncio.run(_sim_episodes()))
    out = root / "sim.atif.jsonl"
    assert main(["export", str(run), str(out), "--format", "atif"]) == 0
    return run, out


def test_exports_validate_against_an_independent_atif_implementation(
        exported: tuple[Path, Path], sim_export: tuple[Path, Path]) -> None:
    """NVIDIA NeMo Agent Toolkit's ATIF-v1.7 models (unknown fields forbidden, step ids and call
    references checked) and the JSON Schema they generate accept every exported trajectory."""
    schema = Trajectory.model_json_schema()
    trajectories = read_atif(exported[1]) + read_atif(sim_export[1])
    for t in trajectories:
        Trajectory.model_validate(t)
        jsonschema.validate(t, schema)
    stops = {t["extra"]["stop_reason"] for t in read_atif(sim_export[1])}
    assert {"length", "done"} <= stops, stops  # the sim run really holds cut episodes
    assert any(s.get("reasoning_content") for t in trajectories for s in t["steps"])
    # The check has teeth: a field ATIF does not define, or a wrong type, is refused.
    broken = copy.deepcopy(trajectories[0])
    broken["steps"][0]["turn_index"] = 0
    with pytest.raises(ValueError, match="turn_index"):
        Trajectory.model_validate(broken)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema)


def test_token_ids_are_the_whole_prompt_and_the_sampled_output(sim_export: tuple[Path, Path]) -> None:
    run, out = sim_export
    stored = {r["episode_id"]: r for r in read_committed(run, ["episode_id", "turns"]).to_pylist()}
    checked = 0
    for t in read_atif(out):
        turns = sorted(stored[t["session_id"]]["turns"], key=lambda x: x["index"])
        prompts = dict(zip((x["index"] for x in turns), full_prompts(turns), strict=True))
        outputs = {x["index"]: x["output_token_ids"] for x in turns}
        for step in t["steps"]:
            if step["source"] != "agent" or "metrics" not in step:
                continue
            k = step["extra"]["turn_index"]
            metrics = step["metrics"]
            assert metrics.get("prompt_token_ids") == prompts[k]
            assert metrics.get("completion_token_ids") == outputs[k]
            if k == 0:  # the first prompt is stored whole: no delta to rebuild
                assert metrics["prompt_token_ids"] == turns[0]["prompt_token_ids"]
            checked += prompts[k] is not None
    assert checked > 20


def _stored(message: dict[str, object]) -> dict[str, object]:
    calls = message["tool_calls"] or []
    return {**{k: message[k] for k in _KEYS},
            "tool_calls": [{k: c[k] for k in _CALL_KEYS} for c in calls]}  # type: ignore[attr-defined]


def test_every_trajectory_is_valid_atif(exported: tuple[Path, Path]) -> None:
    _, out = exported
    trajectories = read_atif(out)
    assert len(trajectories) == 10
    for t in trajectories:
        assert validate_trajectory(t) == [], t["session_id"]
        assert t["schema_version"] == ATIF_VERSION
        assert t["final_metrics"]["total_steps"] == len(t["steps"])


def test_round_trip_gives_every_message_back(exported: tuple[Path, Path]) -> None:
    run, out = exported
    stored = {r["episode_id"]: r for r in read_committed(run, ["episode_id", "messages", "stop_reason",
                                                                "reward"]).to_pylist()}
    for t in read_atif(out):
        row = stored[t["session_id"]]
        back = trajectory_messages(t)
        assert [_stored(m) for m in back] == [_stored(m) for m in row["messages"]]
        assert (t["extra"]["stop_reason"], t["extra"]["reward"]) == (row["stop_reason"], row["reward"])


def test_the_validator_rejects_broken_trajectories(exported: tuple[Path, Path]) -> None:
    good = next(t for t in read_atif(exported[1]) if any(s.get("tool_calls") for s in t["steps"]))
    breaks = {
        "schema_version": lambda t: t.update(schema_version="v1"),
        "session_id": lambda t: t.pop("session_id"),
        "agent": lambda t: t["agent"].pop("version"),
        "step_id": lambda t: t["steps"][1].update(step_id=7),
        "source": lambda t: t["steps"][0].update(source="tool"),
        "message": lambda t: t["steps"][0].update(message=None),
        "only agent steps": lambda t: t["steps"][0].update(tool_calls=[]),
        "names no call": lambda t: next(s for s in t["steps"] if s.get("observation"))
        ["observation"]["results"][0].update(source_call_id="nope"),
        "object arguments": lambda t: next(s for s in t["steps"] if s.get("tool_calls"))
        ["tool_calls"][0].update(arguments="{}"),
    }
    for needle, mutate in breaks.items():
        broken = copy.deepcopy(good)
        mutate(broken)
        problems = validate_trajectory(broken)
        assert any(needle in p for p in problems), (needle, problems)

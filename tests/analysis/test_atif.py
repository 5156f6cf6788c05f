"""`collector export --format atif` (collector.analysis.atif): valid ATIF, and a lossless round trip."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from collector.analysis.atif import ATIF_VERSION, read_atif, trajectory_messages, validate_trajectory
from collector.analysis.committed import read_committed
from collector.cli import main
from collector.stop import StopReason
from collector.storage.local import LocalRunStore
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

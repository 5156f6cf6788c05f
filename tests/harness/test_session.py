"""One harness episode's session, driven directly: the loop's limits and fault rules at the gateway."""

from __future__ import annotations

import asyncio
import dataclasses

import httpx
import pytest

from collector.config import LoopConfig
from collector.episode.loop import EpisodeSpec
from collector.harness.request import HarnessRequest, Refused
from collector.harness.session import NO_RESULT, HarnessSession
from collector.providers import build_provider
from collector.providers.base import Endpoint
from collector.sim.app import create_app
from collector.sim.presets import PRESETS
from collector.stop import StopReason
from collector.turn import AssistantMessage, ToolResultMessage, ToolSpec, UserMessage
from tests.harness.helpers import CALCULATOR_PARAMETERS, TASKS

TOOLS = [ToolSpec("calculator", "Evaluate integer arithmetic.", CALCULATOR_PARAMETERS)]
#: Every call's arguments are not JSON (the simulator's malformed fault, always on).
ALWAYS_MALFORMED = {
    **PRESETS,
    "always-malformed": dataclasses.replace(
        PRESETS["sim-perfect"], name="always-malformed", malformed_prob=1.0
    ),
}


async def _session_turns(
    model: str, settings: LoopConfig, requests: int, *, presets: object = None, answer: bool = True
) -> tuple[HarnessSession, list[object]]:
    """Send up to `requests` requests like a harness that answers every returned call with "7"."""
    app = create_app(0) if presets is None else create_app(0, presets=presets)  # type: ignore[arg-type]
    outcomes: list[object] = []
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app)) as sim:
        spec = EpisodeSpec(run_id="r", model=model, provider_kind="sim", budget=400, task=TASKS[0])
        session = HarnessSession(spec, build_provider("chat", Endpoint("http://sim/v1"), sim), settings)
        messages: list[object] = [UserMessage(str(TASKS[0].prompt))]
        for _ in range(requests):
            try:
                turn = await session.complete(HarnessRequest(list(messages), TOOLS, None, False, "m"))  # type: ignore[arg-type]
            except Refused as exc:
                outcomes.append(exc)
                break
            outcomes.append(turn)
            messages.append(AssistantMessage(turn.text, turn.returned))
            if answer:
                messages += [ToolResultMessage(c.id, c.name, "7") for c in turn.returned]
        session.finish()
    return session, outcomes


def test_max_steps_refuses_the_request_past_it_and_ends_the_episode() -> None:
    """A harness asking for more turns than `loop.max_steps` gets a 403 and the episode ends `max_steps`."""
    session, outcomes = asyncio.run(_session_turns("sim-perfect", LoopConfig(max_steps=1), 3))
    assert len(session.state.turns) == 1
    refused = outcomes[-1]
    assert isinstance(refused, Refused)
    assert refused.status == 403
    assert "loop.max_steps = 1" in str(refused)
    assert session.reason is StopReason.MAX_STEPS


def test_a_malformed_turn_ends_the_episode_under_stop_on_with_its_calls_withheld() -> None:
    """Under stop_on, a malformed turn reaches the harness without calls and ends the episode."""
    session, outcomes = asyncio.run(
        _session_turns("always-malformed", LoopConfig(), 3, presets=ALWAYS_MALFORMED)
    )
    first = outcomes[0]
    assert getattr(first, "returned", None) == []
    assert getattr(first, "finish_reason", None) == "length"
    assert session.reason is StopReason.MALFORMED_TOOL_CALL
    assert session.state.turns[0].calls_withheld == 1
    results = [m for m in session.state.records if m.role == "tool"]
    assert [r.text.startswith("not executed") for r in results] == [True]  # settled in the record


def test_without_malformed_in_stop_on_the_episode_goes_on_until_the_fault_streak() -> None:
    """Out of stop_on, a malformed call is withheld but the episode goes on, ending at the fault streak."""
    settings = LoopConfig(stop_on=frozenset({StopReason.LENGTH}), max_consecutive_faults=2)
    session, outcomes = asyncio.run(_session_turns("always-malformed", settings, 5, presets=ALWAYS_MALFORMED))
    assert len(session.state.turns) == 2
    assert [t.calls_withheld for t in session.state.turns] == [1, 1]
    assert session.reason is StopReason.MALFORMED_TOOL_CALL
    assert isinstance(outcomes[-1], Refused)


def test_calls_the_harness_never_answered_are_settled_in_the_record() -> None:
    """A returned call whose result the harness never sent gets one result in the record, at its turn."""
    session, _ = asyncio.run(_session_turns("sim-perfect", LoopConfig(), 1, answer=False))
    results = [m for m in session.state.records if m.role == "tool"]
    assert [(r.text, r.turn_index) for r in results] == [(NO_RESULT, 0)]


def test_a_provider_failure_ends_the_episode_as_error_without_the_key() -> None:
    """A provider that fails ends the episode `error`, and the harness's error names no credential."""

    async def go() -> tuple[HarnessSession, Refused]:
        def refuse(request: httpx.Request) -> httpx.Response:
            return httpx.Response(401, json={"error": {"message": "bad key sk-provider-secret-0123456789"}})

        async with httpx.AsyncClient(transport=httpx.MockTransport(refuse)) as client:
            spec = EpisodeSpec(
                run_id="r",
                model="m",
                provider_kind="chat",
                budget=50,
                task=TASKS[0],
                credentials=("sk-provider-secret-0123456789",),
            )
            endpoint = Endpoint("http://p/v1", api_key="sk-provider-secret-0123456789")
            session = HarnessSession(spec, build_provider("chat", endpoint, client), LoopConfig())
            with pytest.raises(Refused) as info:
                await session.complete(HarnessRequest([UserMessage("hi")], [], None, False, "m"))
        return session, info.value

    session, refused = asyncio.run(go())
    assert session.reason is StopReason.ERROR
    assert refused.status == 502
    assert "sk-provider-secret" not in str(refused)
    assert session.error is not None
    assert "sk-provider-secret" not in session.error.message

"""The seed scenarios end to end: loop + real adapters + strict simulator, four transports x two modes.

Everything runs in-process through `httpx.ASGITransport`; no socket is opened. Worlds are
captured so the assertions read what actually happened to the orders and tickets.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import httpx
import pytest

from collector.config import LoopConfig
from collector.envs.base import Task
from collector.envs.support_desk import SupportDeskEnv, SupportDeskWorld
from collector.episode.loop import EpisodeSpec, run_episode
from collector.providers import base_url_for, build_provider
from collector.providers.arguments import has_template_opener
from collector.providers.base import Endpoint, Provider
from collector.record.episode import Episode
from collector.sim.app import create_app
from collector.sim.presets import PRESETS
from collector.stop import StopReason
from collector.turn import ArgStatus, Turn, TurnRequest
from tests.episode.helpers import assert_settled

PATHS = list(itertools.product(["chat", "responses", "anthropic", "gemini"], [False, True]))
IDS = [f"{k}-{'sse' if s else 'json'}" for k, s in PATHS]

_LEAK_FAMILIES = ("trailing", "wrapped", "concatenated", "hermes_content")
_PRESETS = {
    **PRESETS,
    **{
        f"leak-{family}": dataclasses.replace(
            PRESETS["sim-perfect"], name=f"leak-{family}", leak_prob=1.0, leak_families=(family,)
        )
        for family in _LEAK_FAMILIES
    },
    "always-malformed": dataclasses.replace(
        PRESETS["sim-perfect"], name="always-malformed", malformed_prob=1.0
    ),
}

REFUND = Task(
    "refund-1000",
    "Order A-1001 for customer C-77 arrived damaged. Refund the full amount of 1000 dollars.",
    {"kind": "refund", "order_id": "A-1001", "customer_id": "C-77", "amount": 1000},
)
CLOSE = Task(
    "close-77",
    "Customer C-77 wants every ticket older than 30 days closed.",
    {"kind": "close", "customer_id": "C-77", "days": 30},
)
APPROVAL = Task(
    "approval-900",
    "Order A-2002 for customer C-12 needs a refund of 900 dollars; refunds over 500 need approval first.",
    {"kind": "approval", "order_id": "A-2002", "customer_id": "C-12", "amount": 900},
)


class CapturingEnv(SupportDeskEnv):
    """support_desk, keeping every world it starts so tests can inspect the final state."""

    def __init__(self) -> None:
        super().__init__(num_tasks=10)
        self.worlds: list[SupportDeskWorld] = []

    def start(self, task: Task) -> SupportDeskWorld:
        world = super().start(task)
        self.worlds.append(world)
        return world


class Recording:
    """Wraps a real adapter: keeps every turn, and may rewrite a turn (to inject faults)."""

    def __init__(self, inner: Provider, rewrite: Callable[[int, Turn], Turn] | None = None) -> None:
        self.inner = inner
        self.kind = inner.kind
        self.rewrite = rewrite
        self.turns: list[Turn] = []

    async def complete(self, request: TurnRequest) -> Turn:
        turn = await self.inner.complete(request)
        if self.rewrite is not None:
            turn = self.rewrite(len(self.turns), turn)
        self.turns.append(turn)
        return turn


class Harness:
    def __init__(self, client: httpx.AsyncClient, kind: str, stream: bool, bodies: list[bytes]) -> None:
        self.client, self.kind, self.stream, self.bodies = client, kind, stream, bodies

    def provider(self, rewrite: Callable[[int, Turn], Turn] | None = None) -> Recording:
        async def no_sleep(seconds: float) -> None:
            return None

        endpoint = Endpoint(
            base_url_for(self.kind, "http://sim.test"), api_key="sk-sim", streaming=self.stream
        )
        return Recording(build_provider(self.kind, endpoint, self.client, sleep=no_sleep), rewrite)

    async def episode(
        self, task: Task, model: str, budget: int, provider: Recording | None = None, **loop: Any
    ) -> tuple[Episode, SupportDeskWorld, Recording]:
        env = CapturingEnv()
        provider = provider or self.provider()
        spec = EpisodeSpec("e2e", model, self.kind, budget, task, env_name=env.name)
        episode = await run_episode(spec, provider, env, LoopConfig.model_validate(loop))
        assert episode.stop_reason is not StopReason.ERROR, episode.error
        assert_settled(episode)
        return episode, env.worlds[-1], provider


@pytest.fixture(params=PATHS, ids=IDS)
async def sim(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    kind, stream = request.param
    bodies: list[bytes] = []

    async def keep(req: httpx.Request) -> None:
        bodies.append(req.content)

    transport = httpx.ASGITransport(app=create_app(seed=0, presets=_PRESETS))
    async with httpx.AsyncClient(transport=transport, event_hooks={"request": [keep]}) as client:
        yield Harness(client, kind, stream, bodies)


def _cut_fragments(provider: Recording) -> list[str]:
    return [
        c.raw_arguments
        for t in provider.turns
        if t.is_length
        for c in t.tool_calls
        if c.raw_arguments and len(c.raw_arguments) > 6
    ]


async def test_refund_never_runs_with_a_cut_amount(sim: Harness) -> None:
    """Across budgets that cut the refund call anywhere, no refund ever runs but the full 1000."""
    cuts = 0
    for budget in range(4, 30, 2):
        episode, world, provider = await sim.episode(REFUND, "sim-perfect", budget)
        assert world.refunds in ([], [("A-1001", 1000.0)])
        if episode.stop_reason is StopReason.LENGTH:
            cuts += 1
            assert world.refunds == []
            assert episode.reward == 0.0
            # The tools column is the schema offered (`{"order_id": ...}`), not model output: a
            # short fragment like `{"order_` is a prefix of it, so it is left out of the search.
            dumped = repr(dataclasses.replace(episode, tools=""))
            assert not any(fragment in dumped for fragment in _cut_fragments(provider))
    assert cuts > 0
    episode, world, _ = await sim.episode(REFUND, "sim-perfect", 256)
    assert world.refunds == [("A-1001", 1000.0)]
    assert episode.reward == 1.0


def _stored_texts(episode: Episode) -> list[str]:
    """Every free-text field of the record: message texts and any kept fragment."""
    out: list[str] = []
    for m in episode.messages:
        out.append(m.text)
        out.extend(x for x in [m.raw_text, *(c.raw_fragment for c in m.tool_calls)] if x)
    return out


def _text_blocks(provider: Recording) -> list[str]:
    """The unparsed tool-call blocks the gateway left in the text of each turn (opener onwards)."""
    blocks = []
    for t in provider.turns:
        starts = [t.text.find(o) for o in ("<tool_call>", "<|python_tag|>", "[TOOL_CALLS]") if o in t.text]
        if starts:
            blocks.append(t.text[min(starts) :])
    return blocks


@pytest.mark.parametrize("model", ["sim-leaky", "leak-hermes_content"])
async def test_no_fragment_reaches_any_text_column(sim: Harness, model: str) -> None:
    """At small budgets no cut argument fragment nor unparsed text block is stored in any text column."""
    blocks = 0
    for budget in range(4, 40, 3):
        for task in (REFUND, CLOSE):
            episode, _, provider = await sim.episode(task, model, budget, stop_on=[])
            fragments = _cut_fragments(provider) + [b for b in _text_blocks(provider) if len(b) > 6]
            blocks += len(_text_blocks(provider))
            stored = _stored_texts(episode)
            for fragment in fragments:
                assert not any(fragment in text for text in stored), fragment
            assert not any(has_template_opener(text) for text in stored)
            for m in episode.messages:  # a call that did not parse is stored as its length only
                for c in m.tool_calls:
                    assert c.status != "malformed" or c.arguments_json is None
    if model == "leak-hermes_content" and sim.kind == "chat" and not sim.stream:
        assert blocks > 0  # vLLM's non-streaming leak really put cut blocks in the text


async def test_close_tickets_never_runs_with_defaults(sim: Harness) -> None:
    """A cut or retried close_tickets call never closes other customers' tickets (continue mode too)."""
    cuts = 0
    for budget in range(4, 30, 3):
        episode, world, _ = await sim.episode(CLOSE, "sim-perfect", budget, stop_on=[])
        closed = {t.customer_id for t in world.tickets if not t.open}
        assert closed <= {"C-77"}
        for executed in episode.executed_tool_calls:
            assert json.loads(executed.arguments_json)["customer_id"] == "C-77"
        cuts += any(t.finish_class == "length" for t in episode.turns)
    assert cuts > 0


@pytest.mark.parametrize("family", _LEAK_FAMILIES)
async def test_leaked_delimiter_call_runs_once_with_the_intended_arguments(sim: Harness, family: str) -> None:
    """A call whose arguments carry a leaked chat-template delimiter runs once, exactly as meant."""
    episode, world, _ = await sim.episode(REFUND, f"leak-{family}", 256)
    assert episode.stop_reason is StopReason.DONE
    if sim.kind in ("chat", "responses") and family != "hermes_content":
        assert episode.turns[0].repairs  # the leak really reached the arguments, and was repaired
    assert world.refunds == [("A-1001", 1000.0)]
    assert [json.loads(e.arguments_json) for e in episode.executed_tool_calls] == [
        {"order_id": "A-1001", "amount": 1000}
    ]
    assert episode.reward == 1.0


async def test_malformed_gate_holds_its_sibling_and_the_replay_is_accepted(sim: Harness) -> None:
    """A malformed approval defers the refund beside it; the replayed history carries "{}" and is accepted."""
    fragment = '{"action": "refund", "order_id": "A-2002", "rea'

    def break_gate(index: int, turn: Turn) -> Turn:
        if index == 0:
            gate = turn.tool_calls[0]
            assert gate.name == "request_approval"
            turn.tool_calls[0] = dataclasses.replace(
                gate, arguments=None, status=ArgStatus.MALFORMED, raw_arguments=fragment, raw_object=None
            )
        return turn

    provider = sim.provider(break_gate)
    episode, world, _ = await sim.episode(APPROVAL, "sim-perfect", 256, provider=provider, stop_on=[])
    first_turn = [m for m in episode.messages if m.role == "tool" and m.turn_index == 0]
    assert [m.name for m in first_turn] == ["request_approval", "refund"]
    assert all(m.is_error for m in first_turn)
    assert "nothing was approved" in first_turn[1].text
    assert all(e.turn_index > 0 for e in episode.executed_tool_calls)
    # The model recovered: approval, then the refund, in a later turn; graded on the final state.
    assert episode.stop_reason is StopReason.DONE
    assert episode.reward == 1.0
    assert world.refunds == [("A-2002", 900.0)]
    replay = sim.bodies[1].decode()
    assert fragment not in replay
    assert fragment not in repr(episode)


async def test_malformed_arguments_replay_as_empty_object(sim: Harness) -> None:
    """Broken arguments are replayed as "{}" and the strict simulator accepts the history."""
    fragment = '{"order_id": "A-1001", "amount": 10'

    def break_call(index: int, turn: Turn) -> Turn:
        if index == 0:
            call = turn.tool_calls[0]
            turn.tool_calls[0] = dataclasses.replace(
                call, arguments=None, status=ArgStatus.MALFORMED, raw_arguments=fragment, raw_object=None
            )
        return turn

    provider = sim.provider(break_call)
    episode, world, _ = await sim.episode(REFUND, "sim-perfect", 256, provider=provider, stop_on=[])
    assert episode.stop_reason is StopReason.DONE
    assert episode.reward == 1.0
    assert world.refunds == [("A-1001", 1000.0)]  # only the re-issued, complete call ran
    replay = json.loads(sim.bodies[1])
    assert fragment not in json.dumps(replay)
    assert re.search(r'"(arguments|input|args)": ("\{\}"|\{\})', json.dumps(replay))
    assert fragment not in repr(episode)
    stored = episode.messages[1].tool_calls[0]
    assert (stored.arguments_json, stored.unparsed_chars) == (None, len(fragment))


async def test_sloppy_model_ends_as_malformed_where_the_transport_can_carry_it(sim: Harness) -> None:
    """A model whose every call is malformed ends as malformed_tool_call; nothing runs."""
    episode, world, _ = await sim.episode(REFUND, "always-malformed", 256)
    if sim.kind == "anthropic":  # the Messages API always returns an object: nothing to break
        assert episode.stop_reason is StopReason.DONE
    else:
        assert episode.stop_reason is StopReason.MALFORMED_TOOL_CALL
        assert episode.reward == 0.0
        assert world.refunds == []


@pytest.mark.parametrize(
    ("model", "budget"),
    [("sim-terse", 24), ("sim-sloppy", 96), ("sim-leaky", 96)]
    # Budgets 1-3: turns cut before any text or call (content null), replayed or not.
    + [("sim-perfect", b) for b in (1, 2, 3)],
)
async def test_transcripts_replay_against_the_strict_simulator(sim: Harness, model: str, budget: int) -> None:
    """With faults answered rather than fatal, every episode's history is accepted turn after turn."""
    env = CapturingEnv()
    tasks: Sequence[Task] = env.tasks()[:5]
    for task in tasks:
        episode, _, _ = await sim.episode(task, model, budget, stop_on=[])
        assert episode.stop_reason in (StopReason.DONE, StopReason.LENGTH, StopReason.MALFORMED_TOOL_CALL)


async def test_secrets_never_reach_the_record(sim: Harness) -> None:
    """A secret slipped into a call's arguments is refused by validation and stored redacted."""

    def add_secret(index: int, turn: Turn) -> Turn:
        for i, c in enumerate(turn.tool_calls):
            if c.arguments is not None and index == 0:
                turn.tool_calls[i] = dataclasses.replace(c, arguments={**c.arguments, "password": "hunter2"})
        return turn

    episode, world, _ = await sim.episode(
        REFUND, "sim-perfect", 256, provider=sim.provider(add_secret), stop_on=[]
    )
    assert "hunter2" not in repr(episode)
    assert world.refunds == [("A-1001", 1000.0)]  # the model retried without it


@pytest.mark.parametrize("budget", [1, 2, 3])
async def test_empty_cut_turns_replay_when_the_episode_goes_on(sim: Harness, budget: int) -> None:
    """A cut turn with no text and no call stays in the record, is not replayed, and the episode goes on."""
    # Going on after a cut turn without a call is the opt-in (a cut final answer ends the episode).
    episode, world, _ = await sim.episode(REFUND, "sim-perfect", budget, stop_on=[], retry_cut_answers=True)
    assert episode.stop_reason is StopReason.LENGTH  # the consecutive-fault cap, not an error
    assert world.refunds == []
    assert len(episode.turns) > 1
    empty = [m for m in episode.messages if m.role == "assistant" and not m.text and not m.tool_calls]
    if budget == 1:
        assert empty  # the empty turns are kept in the record
    assert not any(_replays_an_empty_assistant(json.loads(body)) for body in sim.bodies)


def _replays_an_empty_assistant(body: dict[str, Any]) -> bool:
    """True when a request replays an assistant turn with no text and no call (any dialect)."""
    for item in body.get("messages", []) + body.get("contents", []) + body.get("input", []):
        if item.get("role") not in ("assistant", "model"):
            continue
        content = item.get("content", item.get("parts"))
        if item.get("tool_calls"):
            continue
        if content is None or content == "":
            return True
        if isinstance(content, list) and all(
            set(block) <= {"type", "text"} and not block.get("text") for block in content
        ):
            return True
    return False


async def test_duplicate_call_ids_replay_against_the_strict_simulator(sim: Harness) -> None:
    """A turn whose two calls share an id runs only the first; the replay (renamed id) is accepted."""

    def same_id(index: int, turn: Turn) -> Turn:
        if index == 0:
            assert len(turn.tool_calls) == 2
            first, second = turn.tool_calls
            turn.tool_calls[1] = dataclasses.replace(second, id=first.id)
        return turn

    provider = sim.provider(same_id)
    episode, world, _ = await sim.episode(APPROVAL, "sim-perfect", 256, provider=provider, stop_on=[])
    first_turn = [m for m in episode.messages if m.role == "tool" and m.turn_index == 0]
    assert [m.is_error for m in first_turn] == [False, True]
    assert len({m.call_id for m in first_turn}) == 2
    assert [e.name for e in episode.executed_tool_calls if e.turn_index == 0] == ["request_approval"]
    assert episode.stop_reason is StopReason.DONE
    assert world.refunds == [("A-2002", 900.0)]

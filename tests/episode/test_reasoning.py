"""Reasoning end to end: captured on every wire, stored in the shard, replayed faithfully.

Loop + real adapters + the strict simulator (which refuses a call replayed without its
reasoning, or with an altered signature, as the real APIs do), four transports x two modes,
in-process over `httpx.ASGITransport`.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from collector.config import LoopConfig
from collector.envs.support_desk import SupportDeskEnv
from collector.episode.loop import EpisodeSpec, run_episode
from collector.errors import ProviderError
from collector.providers import base_url_for, build_provider
from collector.providers.base import Endpoint, Provider
from collector.providers.gemini import build_gemini_body
from collector.record.episode import Episode
from collector.record.shards import episodes_from_table, episodes_to_table
from collector.sim.app import create_app
from collector.sim.thinking import text_signature
from collector.stop import StopReason
from collector.turn import AssistantMessage, Message, SamplingParams, Turn, TurnRequest, UserMessage
from tests.episode.test_sim_e2e import APPROVAL

PATHS = list(itertools.product(["chat", "responses", "anthropic", "gemini"], [False, True]))
IDS = [f"{k}-{'sse' if s else 'json'}" for k, s in PATHS]
REPLAYED = [(k, s) for k, s in PATHS if k != "chat"]  # Chat Completions has no opaque items
REPLAYED_IDS = [f"{k}-{'sse' if s else 'json'}" for k, s in REPLAYED]

Rewrite = Callable[[Turn], Turn]


class Thinking:
    """A real adapter asking for reasoning the way a user's config would, optionally
    rewriting each reply before the loop sees it (to break the replay on purpose)."""

    def __init__(self, inner: Provider, rewrite: Rewrite | None) -> None:
        self.inner, self.kind, self.rewrite = inner, inner.kind, rewrite
        self.turns: list[Turn] = []

    async def complete(self, request: TurnRequest) -> Turn:
        if self.kind == "anthropic":
            request.params.thinking_budget = 1024
        else:
            request.params.reasoning_effort = "low"
        turn = await self.inner.complete(request)
        self.turns.append(turn)
        return self.rewrite(turn) if self.rewrite is not None else turn


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(seed=0))
    async with httpx.AsyncClient(transport=transport) as c:
        yield c


async def _episode(
    client: httpx.AsyncClient,
    kind: str,
    stream: bool,
    rewrite: Rewrite | None = None,
    model: str = "sim-thinker",
) -> tuple[Episode, Thinking]:
    async def no_sleep(seconds: float) -> None:
        return None

    endpoint = Endpoint(base_url_for(kind, "http://sim.test"), streaming=stream)
    provider = Thinking(build_provider(kind, endpoint, client, sleep=no_sleep), rewrite)
    env = SupportDeskEnv(num_tasks=10)
    spec = EpisodeSpec("reasoning", model, kind, 2048, APPROVAL, env_name=env.name)
    episode = await run_episode(spec, provider, env, LoopConfig.model_validate({}))
    return episode, provider


@pytest.mark.parametrize(("kind", "stream"), PATHS, ids=IDS)
async def test_reasoning_episode_replays_and_lands_in_the_shard(
    client: httpx.AsyncClient, kind: str, stream: bool
) -> None:
    """A thinking model's multi-turn episode replays to the strict simulator without a 400, and
    the shard keeps each turn's reasoning text, reasoning tokens and replay items."""
    episode, provider = await _episode(client, kind, stream)
    assert episode.stop_reason is StopReason.DONE, episode.error
    assert episode.num_turns >= 2  # the calls turn is replayed with the answer turn's request
    (stored,) = episodes_from_table(episodes_to_table([episode]))
    for turn, record in zip(provider.turns, stored.turns, strict=True):
        assert turn.reasoning_tokens > 0 or kind == "anthropic"  # Anthropic reports no count
        assert record.reasoning_tokens == turn.reasoning_tokens
        assert record.reasoning_text
        assert record.reasoning_text == turn.reasoning_text
        if kind == "chat":
            assert record.reasoning_items is None
        else:
            assert record.reasoning_items is not None
            assert json.loads(record.reasoning_items) == turn.reasoning_items
    if kind != "gemini":  # Gemini signs the call part itself (`ToolCall.signature`)
        assert all(t.reasoning_items for t in provider.turns if kind != "chat")


def _drop(turn: Turn) -> Turn:
    calls = [dataclasses.replace(c, signature=None) for c in turn.tool_calls]
    return dataclasses.replace(turn, reasoning_items=[], tool_calls=calls)


def _alter(turn: Turn) -> Turn:
    items = [dict(i) for i in turn.reasoning_items]
    for item in items:
        for key in ("signature", "encrypted_content"):
            if isinstance(item.get(key), str):
                item[key] = item[key][:-2] + ("00" if not item[key].endswith("00") else "11")
    calls = [
        dataclasses.replace(c, signature=c.signature + "x" if c.signature else None) for c in turn.tool_calls
    ]
    return dataclasses.replace(turn, reasoning_items=items, tool_calls=calls)


@pytest.mark.parametrize("mutate", [_drop, _alter], ids=["dropped", "altered"])
@pytest.mark.parametrize(("kind", "stream"), REPLAYED, ids=REPLAYED_IDS)
async def test_a_broken_replay_is_refused_like_the_real_api(
    client: httpx.AsyncClient, kind: str, stream: bool, mutate: Rewrite
) -> None:
    """A call replayed without its reasoning (or with its signature altered) is a 400 from the
    strict simulator, so the episode fails: the replay of the intact items is what passes."""
    episode, _ = await _episode(client, kind, stream, mutate)
    assert episode.stop_reason is StopReason.ERROR
    assert episode.error is not None
    assert "400" in episode.error.message


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_chat_reads_the_older_reasoning_content_name(client: httpx.AsyncClient, stream: bool) -> None:
    """A server that still says `reasoning_content` (SGLang, llama.cpp, DeepSeek) has its
    reasoning text and count captured like vLLM's `reasoning`."""
    episode, provider = await _episode(client, "chat", stream, model="sim-thinker-legacy")
    assert episode.stop_reason is StopReason.DONE, episode.error
    assert all(t.reasoning_text and t.reasoning_tokens > 0 for t in provider.turns)
    assert all(r.reasoning_text for r in episode.turns)


@pytest.mark.parametrize(("kind", "stream"), PATHS, ids=IDS)
async def test_a_cap_spent_on_thinking_is_a_length_turn_flagged_as_such(
    client: httpx.AsyncClient, kind: str, stream: bool
) -> None:
    """At a cap the thinking fills, the turn shows no text and no call: it is a length turn with
    the `reasoning` signal, nothing runs, and the episode is counted as a thinking cut."""

    async def no_sleep(seconds: float) -> None:
        return None

    endpoint = Endpoint(base_url_for(kind, "http://sim.test"), streaming=stream)
    provider = build_provider(kind, endpoint, client, sleep=no_sleep)
    env = SupportDeskEnv(num_tasks=10)
    spec = EpisodeSpec("reasoning", "sim-thinker", kind, 8, APPROVAL, env_name=env.name)
    episode = await run_episode(spec, provider, env, LoopConfig.model_validate({}))
    assert episode.stop_reason is StopReason.LENGTH
    assert "reasoning" in episode.turns[0].length_signals
    assert episode.turns[0].discarded
    assert episode.executed_tool_calls == []
    assert episode.thinking_cut
    (stored,) = episodes_from_table(episodes_to_table([episode]))
    assert stored.thinking_cut


def _without_text_signature(items: list[dict[str, object]]) -> list[dict[str, object]]:
    return [i for i in items if i.get("thought") or "thoughtSignature" not in i]


def _with_altered_text_signature(items: list[dict[str, object]]) -> list[dict[str, object]]:
    return [i if i.get("thought") else {**i, "thoughtSignature": f"{i['thoughtSignature']}x"} for i in items]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_gemini_text_part_signature_is_replayed_on_that_part(
    client: httpx.AsyncClient, stream: bool
) -> None:
    """A Gemini thinking turn without a call signs its text part: the signature is kept with the
    turn's reasoning items and sent back on the text part, turn after turn, and a replay that
    drops or alters it is the dialect's 400."""

    async def no_sleep(seconds: float) -> None:
        return None

    endpoint = Endpoint(base_url_for("gemini", "http://sim.test"), streaming=stream)
    provider = build_provider("gemini", endpoint, client, sleep=no_sleep)
    params = SamplingParams(reasoning_effort="low")
    messages: list[Message] = [UserMessage("Tell me about the weather, briefly.")]
    for _ in range(3):  # each request replays every earlier signed text turn
        turn = await provider.complete(TurnRequest("sim-thinker", list(messages), [], 512, params))
        assert turn.text
        assert not turn.tool_calls
        signed = [i for i in turn.reasoning_items if not i.get("thought")]
        assert signed == [{"text": turn.text, "thoughtSignature": text_signature(turn.text)}]
        assert turn.reasoning_text
        assert all(i.get("thought") for i in turn.reasoning_items[:-1])
        messages += [AssistantMessage(turn.text, [], reasoning_items=turn.reasoning_items),
                     UserMessage("And tomorrow?")]
    body = build_gemini_body(TurnRequest("sim-thinker", messages, [], 512, params))
    model_turns = [c for c in body["contents"] if c["role"] == "model"]
    replayed = [p for c in model_turns for p in c["parts"] if not p.get("thought")]
    assert len(replayed) == 3
    assert [p.get("thoughtSignature") for p in replayed] == [text_signature(p["text"]) for p in replayed]

    for mutate, words in ((_without_text_signature, "missing a thought_signature"),
                          (_with_altered_text_signature, "Corrupted thought signature")):
        last = messages[-2]
        assert isinstance(last, AssistantMessage)
        broken = [*messages[:-2], dataclasses.replace(last, reasoning_items=mutate(last.reasoning_items)),
                  messages[-1]]
        with pytest.raises(ProviderError) as refused:
            await provider.complete(TurnRequest("sim-thinker", broken, [], 512, params))
        assert refused.value.status == 400
        assert words in str(refused.value)

"""Token-in mode against the simulator's llama-server endpoints: the loop, the token-in adapter and
`collector.sim.completion`, on the preset whose template drifts (sim-drift) and on a faithful one."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from collector.analysis.trainer import full_prompts, trainer_rows
from collector.config import LoopConfig
from collector.envs.support_desk import SupportDeskEnv
from collector.episode.loop import EpisodeSpec, run_episode
from collector.providers import build_provider
from collector.providers.base import Endpoint
from collector.record.episode import Episode
from collector.record.shards import episodes_to_table
from collector.sim import vocab
from collector.sim.app import create_app
from collector.stop import StopReason
from collector.turn import SamplingParams

ENV = SupportDeskEnv(num_tasks=12)
TOKEN_IN = SamplingParams(token_ids=True, temperature=0.7, token_in="llama.cpp")


class Recording(httpx.AsyncBaseTransport):
    """The simulator in process, keeping each `/completion` exchange (the prompt sent, the reply)."""

    def __init__(self) -> None:
        self.inner = httpx.ASGITransport(app=create_app(seed=3))
        self.completions: list[tuple[Any, dict[str, Any]]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if request.url.path.endswith("/completion"):
            body = await response.aread()
            self.completions.append((json.loads(request.content)["prompt"], json.loads(body)))
            return httpx.Response(response.status_code, headers=response.headers, content=body)
        return response


@pytest.fixture
async def sim() -> AsyncIterator[tuple[Recording, httpx.AsyncClient]]:
    transport = Recording()
    async with httpx.AsyncClient(transport=transport) as client:
        yield transport, client


async def token_in_episodes(client: httpx.AsyncClient, model: str) -> list[Episode]:
    """One token-in episode per support_desk task, against `/llamacpp/{model}`."""
    provider = build_provider("token_in", Endpoint(f"http://sim.test/llamacpp/{model}/v1"), client)
    out = []
    for task in ENV.tasks():
        spec = EpisodeSpec("tok", model, "chat", 256, task, env_name=ENV.name, sampling=TOKEN_IN)
        out.append(await run_episode(spec, provider, ENV, LoopConfig()))
    return out


async def test_token_in_on_the_drifting_template_is_one_sequence_per_episode(
        sim: tuple[Recording, httpx.AsyncClient]) -> None:
    """sim-drift re-renders history unlike what was sampled; sent as ids, every later turn extends
    the previous prompt + output: no fallback, prefix-consistent, one trainer row per episode
    whose ids are the last prompt sent + its output."""
    transport, client = sim
    episodes = await token_in_episodes(client, "sim-drift")
    multi = [ep for ep in episodes if ep.num_turns > 1]
    assert len(multi) >= 6
    assert all(ep.stop_reason is StopReason.DONE for ep in episodes)
    turns = [t for ep in episodes for t in ep.turns]
    assert all(t.prompt_sent_as_ids and t.token_in_fallback is None for t in turns)
    assert all(t.prefix_consistent is True for ep in multi for t in ep.turns[1:])
    # The server's own re-rendering of the same history drifts (reasoning stripped, tojson):
    # the drift fields say where it would have departed from what was sent.
    assert all(t.drift_offset is not None for ep in multi for t in ep.turns[1:])
    rows = episodes_to_table(episodes).to_pylist()
    prompts = [p for row in rows for p in full_prompts(row["turns"])]
    assert prompts == [sent for sent, _ in transport.completions]  # stored == sent, id for id
    view = trainer_rows(rows, "sequence")
    assert not view.skipped
    assert Counter(r["episode_id"] for r in view.rows) == Counter({ep.episode_id: 1 for ep in episodes})
    by_id = {r["episode_id"]: r for r in view.rows}
    for ep, row in zip(episodes, rows, strict=True):
        last_prompt = full_prompts(row["turns"])[-1] or []
        assert by_id[ep.episode_id]["input_ids"] == last_prompt + (ep.turns[-1].output_token_ids or [])


async def test_sent_ids_detokenize_to_the_conversation_and_outputs_to_the_raw_text(
        sim: tuple[Recording, httpx.AsyncClient]) -> None:
    transport, client = sim
    episodes = await token_in_episodes(client, "sim-drift")
    exchanges = iter(transport.completions)
    for ep, task in zip(episodes, ENV.tasks(), strict=True):
        for k, turn in enumerate(ep.turns):
            sent, reply = next(exchanges)
            text = (await client.post("http://sim.test/llamacpp/sim-drift/detokenize",
                                      json={"tokens": sent})).json()["content"]
            assert text.startswith("<|begin|><|tool_def|>")
            assert text.endswith("<|end|><|assistant|>")  # the generation prompt
            assert text.count("<|user|>") == 1
            assert str(task.prompt) in text
            # Every earlier turn is in it as sampled: its raw text, then the results in order.
            pos = 0
            calls = 0
            for earlier in ep.turns[:k]:
                raw = vocab.detokenize(earlier.output_token_ids or [])
                pos = text.index(raw, pos) + len(raw)
                calls += raw.count("}</tool_call>")
            assert text.count("<|tool|>") == calls  # one result per call made
            assert vocab.detokenize(turn.output_token_ids or []) == reply["content"]  # the raw text


async def test_on_a_faithful_template_the_sent_ids_equal_the_servers_rendering(
        sim: tuple[Recording, httpx.AsyncClient]) -> None:
    """sim-perfect renders history as sampled (and writes no preamble, which the adapter would
    strip before replaying it): the bridged ids and the server's own re-rendering agree id for
    id, so the two modes train on the same sequence there."""
    _, client = sim
    episodes = await token_in_episodes(client, "sim-perfect")
    later = [t for ep in episodes for t in ep.turns[1:]]
    assert later
    # drift_offset stays None only when the re-rendered ids equal the sent ones exactly.
    assert all(t.prompt_sent_as_ids and t.prefix_consistent and t.drift_offset is None for t in later)


async def test_a_stop_string_inside_a_token_leaves_no_ids_that_lie(
        sim: tuple[Recording, httpx.AsyncClient]) -> None:
    """The simulator's call ends in one `}</tool_call>` token, so `stop = ["</tool_call>"]`
    ends inside it and llama.cpp's trim (as many probabilities as the stop string's own
    tokens) cuts real tokens: those turns keep no ids, the next turn goes as text, and every
    id a turn does keep spells its raw text."""
    transport, client = sim
    provider = build_provider("token_in", Endpoint("http://sim.test/llamacpp/sim-perfect/v1"), client)
    params = SamplingParams(token_ids=True, temperature=0.7, token_in="llama.cpp", stop=["</tool_call>"])
    episodes = []
    for task in ENV.tasks():
        spec = EpisodeSpec("tok", "sim-perfect", "chat", 256, task, env_name=ENV.name, sampling=params)
        episodes.append(await run_episode(spec, provider, ENV, LoopConfig()))
    assert all(ep.stop_reason is StopReason.DONE for ep in episodes)
    replies = iter(reply for _, reply in transport.completions)
    cut = 0
    for ep in episodes:
        for k, turn in enumerate(ep.turns):
            reply = next(replies)
            if turn.output_token_ids is not None:
                assert vocab.detokenize(turn.output_token_ids) == reply["content"]
            elif reply.get("stopping_word"):
                cut += 1
                assert ep.turns[k + 1].token_in_fallback == "no_previous_ids"
    assert cut > 0  # the case arose

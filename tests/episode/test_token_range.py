"""Token ids outside the model's vocabulary are never stored as sampled, and `collector check`
flags any stored id outside its turn's range (collector.episode.tokens,
collector.analysis.check_tokens, the llama.cpp dialect's `vocab_size`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from collector.analysis.check import check_run
from collector.analysis.trainer import trainer_rows
from collector.config import LoopConfig
from collector.envs.support_desk import SupportDeskEnv
from collector.episode.loop import EpisodeSpec, run_episode
from collector.providers import build_provider
from collector.providers.base import Endpoint
from collector.record.episode import TOKEN_ID_LIMIT, Episode
from collector.record.shards import episodes_to_table
from collector.sim import vocab
from collector.sim.app import create_app
from collector.storage.local import LocalRunStore
from collector.turn import SamplingParams
from tests.record.factory import make_episode

ENV = SupportDeskEnv(num_tasks=2)
TOKEN_IN = SamplingParams(token_ids=True, temperature=0.7, token_in="llama.cpp")
#: The simulator's id space (`collector.sim.vocab`): reported as the model's n_vocab.
N_VOCAB = vocab.HASHED_BASE + (1 << 30)


class HostileIds(httpx.AsyncBaseTransport):
    """The simulator's llama-server, reporting its vocabulary in `/v1/models` metadata (as
    llama-server does) and returning `bad_id` among the ids of its first completion."""

    def __init__(self, bad_id: int, n_vocab: int | None = N_VOCAB) -> None:
        self.inner = httpx.ASGITransport(app=create_app(seed=3))
        self.bad_id = bad_id
        self.n_vocab = n_vocab
        self.completions = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET" and request.url.path.endswith("/v1/models"):
            if self.n_vocab is None:
                return httpx.Response(404, json={"error": {"code": 404, "message": "File Not Found"}})
            entry = {"id": "sim-perfect", "meta": {"vocab_type": 2, "n_vocab": self.n_vocab}}
            return httpx.Response(200, json={"object": "list", "data": [entry]})
        response = await self.inner.handle_async_request(request)
        if not request.url.path.endswith("/completion"):
            return response
        payload: dict[str, Any] = json.loads(await response.aread())
        self.completions += 1
        if self.completions == 1 and payload.get("tokens"):
            payload["tokens"][0] = self.bad_id
        return httpx.Response(response.status_code, json=payload)


async def _episode(transport: HostileIds) -> Episode:
    async with httpx.AsyncClient(transport=transport) as client:
        provider = build_provider("token_in", Endpoint("http://sim.test/llamacpp/sim-perfect/v1"), client)
        task = ENV.tasks()[0]
        spec = EpisodeSpec("tok", "sim-perfect", "chat", 256, task, env_name=ENV.name, sampling=TOKEN_IN)
        return await run_episode(spec, provider, ENV, LoopConfig())


@pytest.mark.parametrize(("bad_id", "n_vocab"), [
    (-1, N_VOCAB),
    (2**40, N_VOCAB),
    (N_VOCAB, N_VOCAB),  # the first id past the reported vocabulary, still below 2**31
    (-7, None),
    (2**40, None),  # no vocabulary reported: 2**31 bounds the ids
])
async def test_an_id_outside_the_vocabulary_keeps_the_turn_from_storing_ids(
    bad_id: int, n_vocab: int | None, tmp_path: Path
) -> None:
    """A server returning a negative id, or one not below its vocabulary, gets that turn stored
    with no ids and the reason; the next turn extends nothing (goes as text), the trainer view
    leaves the episode out, and `collector check` is clean (nothing false was stored)."""
    ep = await _episode(HostileIds(bad_id, n_vocab))
    first = ep.turns[0]
    assert first.tokens_rejected == "id_out_of_range"
    assert first.output_token_ids is None
    assert first.prompt_token_ids is None
    assert first.token_vocab_size == n_vocab
    assert first.output_logprobs  # numbers, kept
    stored = [i for t in ep.turns for seq in (t.output_token_ids, t.prompt_token_ids) if seq for i in seq]
    limit = n_vocab if n_vocab is not None else TOKEN_ID_LIMIT
    assert all(0 <= i < limit for i in stored)
    if len(ep.turns) > 1:
        assert ep.turns[1].token_in_fallback == "no_previous_ids"
        assert ep.turns[1].tokens_rejected is None
    view = trainer_rows(episodes_to_table([ep]).to_pylist(), "sequence")
    assert view.rows == []
    assert view.skipped["no_token_ids"] == 1
    with LocalRunStore.open(tmp_path / "run", "fp", {}, "arrow", 8) as st:
        st.commit([ep])
    report = check_run(tmp_path / "run")
    assert report.ok, report.problems


async def test_ids_inside_the_vocabulary_are_kept() -> None:
    """The same server without the bad id: every turn keeps its ids and records the vocabulary."""
    ep = await _episode(HostileIds(bad_id=5))  # 5 is a real id: the markup's first tokens
    assert all(t.tokens_rejected is None for t in ep.turns)
    assert ep.turns[0].output_token_ids is not None
    assert {t.token_vocab_size for t in ep.turns} == {N_VOCAB}


def test_check_flags_stored_ids_outside_the_range(tmp_path: Path) -> None:
    """Ids a shard holds outside 0..vocabulary-1 (written by something else than this loop) are
    each named by `collector check`, with the episode, turn and column."""
    past_limit = make_episode(task="t-big")
    past_limit.turns[0].output_token_ids = [5, 2**40]
    negative = make_episode(task="t-neg")
    negative.turns[0].prompt_token_ids = [3, -2]
    past_vocab = make_episode(task="t-vocab")
    past_vocab.turns[0].output_token_ids = [10, 150]
    past_vocab.turns[0].token_vocab_size = 100
    fine = make_episode(task="t-fine")
    fine.turns[0].output_token_ids = [10, 99]
    fine.turns[0].token_vocab_size = 100
    with LocalRunStore.open(tmp_path / "run", "fp", {}, "arrow", 8) as st:
        st.commit([past_limit, negative, past_vocab, fine])
    problems = check_run(tmp_path / "run").problems
    assert len(problems) == 3, problems
    text = "\n".join(problems)
    assert f"episode {past_limit.episode_id} turn 0: output_token_ids holds id {2**40}" in text
    assert f"episode {negative.episode_id} turn 0: prompt_token_ids holds id -2" in text
    assert (f"episode {past_vocab.episode_id} turn 0: output_token_ids holds id 150, outside the "
            "vocabulary (0 to 99)") in text


async def test_the_vocabulary_comes_from_llama_servers_model_metadata() -> None:
    """`n_vocab` from `/v1/models` is the bound; a server that does not say (404, no meta, a
    string) leaves it unknown."""
    from collector.providers.http import Http
    from collector.providers.tokenin_llama import LlamaServer

    replies = iter([
        httpx.Response(200, json={"data": [{"id": "other", "meta": {"n_vocab": 7}},
                                           {"id": "m", "meta": {"n_vocab": 151936}}]}),
        httpx.Response(404, json={"error": {"message": "File Not Found"}}),
        httpx.Response(200, json={"data": [{"id": "m"}]}),
        httpx.Response(200, json={"data": [{"id": "m", "meta": {"n_vocab": "many"}}]}),
    ])
    endpoint = Endpoint("http://llama.test/v1")
    async with httpx.AsyncClient(transport=httpx.MockTransport(lambda r: next(replies))) as client:
        server = LlamaServer(Http(client, endpoint, "chat", {}), "http://llama.test")
        assert await server.vocab_size("m", {}) == 151936
        for _ in range(3):
            assert await server.vocab_size("m", {}) is None

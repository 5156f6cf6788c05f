"""Each episode's own base URL on the gateway: a request is answered only when its URL and its token agree."""

from __future__ import annotations

import asyncio

import httpx

from collector.config import LoopConfig
from collector.episode.loop import EpisodeSpec
from collector.harness.gateway import Gateway, episode_root
from collector.harness.session import HarnessSession
from collector.providers import build_provider
from collector.providers.base import Endpoint
from collector.sim.app import create_app
from tests.harness.helpers import TASKS, bearer


def _session(gateway: Gateway, sim: httpx.AsyncClient, i: int) -> HarnessSession:
    spec = EpisodeSpec(run_id="r", model="sim-perfect", provider_kind="sim", budget=400, task=TASKS[i])
    session = HarnessSession(spec, build_provider("chat", Endpoint("http://sim/v1"), sim), LoopConfig())
    gateway.open(session)
    return session


def _chat(task_index: int) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "user", "content": TASKS[task_index].prompt}]}


def test_a_token_is_answered_on_its_own_episodes_url_only() -> None:
    """A's key on B's URL is a 403 naming the cause (never echoing the key); on A's URL it gets a turn."""
    async def go() -> dict[str, httpx.Response]:
        gateway = Gateway()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(0))) as sim:
            a, b = _session(gateway, sim, 0), _session(gateway, sim, 1)
            nobody = "http://gw/e/nobody-0000/v1/models"
            chat_a, chat_b = (episode_root("http://gw", s) + "/v1/chat/completions" for s in (a, b))
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.app)) as c:
                out = {
                    "own": await c.post(chat_a, json=_chat(0), headers=bearer(a.token)),
                    "other": await c.post(chat_b, json=_chat(0), headers=bearer(a.token)),
                    "no_episode_for_it": await c.get(nobody, headers=bearer(a.token)),
                    "other_anthropic": await c.post(
                        episode_root("http://gw", b) + "/v1/messages", headers={"x-api-key": a.token},
                        json={**_chat(0), "max_tokens": 100}),
                    "unknown_token": await c.get(episode_root("http://gw", a) + "/v1/models",
                                                 headers=bearer("ep-not-a-token")),
                    "no_episode": await c.get(nobody, headers=bearer("ep-x")),
                    "flat": await c.get("http://gw/v1/models", headers=bearer(a.token)),
                }
                assert len(b.state.turns) == 0  # nothing of A's request reached B's episode
                out["tokens"] = httpx.Response(200, json=[a.token, b.token])
        return out

    out = asyncio.run(go())
    tokens = out.pop("tokens").json()
    assert out["own"].status_code == 200
    assert out["own"].json()["choices"][0]["message"]["content"] is not None
    for name in ("other", "other_anthropic", "no_episode_for_it"):
        reply = out[name]
        assert reply.status_code == 403, name
        assert "belongs to another episode" in reply.text
        assert not any(token in reply.text for token in tokens)
    assert out["other_anthropic"].json()["type"] == "error"  # in the Anthropic error shape
    assert out["unknown_token"].status_code == 401
    assert out["no_episode"].status_code == 404
    assert out["flat"].status_code == 404  # no route outside an episode's root


def test_after_an_episode_ends_its_url_and_its_token_are_refused() -> None:
    """Once an episode ended, its URL (with its own token) and its token (on a live episode's URL) are 403."""
    async def go() -> tuple[httpx.Response, httpx.Response, httpx.Response, str]:
        gateway = Gateway()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(0))) as sim:
            a, b = _session(gateway, sim, 0), _session(gateway, sim, 1)
            gateway.close(a)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.app)) as c:
                own = await c.post(episode_root("http://gw", a) + "/v1/chat/completions", json=_chat(0),
                                   headers=bearer(a.token))
                elsewhere = await c.get(episode_root("http://gw", b) + "/v1/models", headers=bearer(a.token))
                live = await c.get(episode_root("http://gw", b) + "/v1/models", headers=bearer(b.token))
        return own, elsewhere, live, a.token

    own, elsewhere, live, token = asyncio.run(go())
    assert own.status_code == 403
    assert "ended" in own.json()["error"]["message"]
    assert elsewhere.status_code == 403
    assert "ended" in elsewhere.json()["error"]["message"]
    assert token not in own.text + elsewhere.text
    assert live.status_code == 200


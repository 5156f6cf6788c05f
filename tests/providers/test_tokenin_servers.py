"""Token-in mode on vLLM and SGLang: the bridge proven on ids, through the loop, against fakes
shaped like their replies (tests/providers/tokenfakes.py)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from collector.analysis.trainer import full_prompts, trainer_rows
from collector.config import LoopConfig, RunConfig
from collector.episode.loop import EpisodeSpec, run_episode
from collector.errors import ProviderError
from collector.providers import build_provider
from collector.providers.base import Endpoint
from collector.providers.tokenin import TokenInProvider
from collector.record.shards import episodes_to_table
from collector.run.worker import sampling_params
from collector.stop import StopReason
from collector.turn import (
    AssistantMessage,
    SamplingParams,
    TokenPrefix,
    ToolResultMessage,
    TurnRequest,
    UserMessage,
)
from tests.episode import helpers
from tests.episode.helpers import ToyEnv
from tests.providers.tokenfakes import EOS, FakeSglang, FakeVllm, Model

STOP = ["</tool_call>"]
Fake = FakeVllm | FakeSglang


def params(server: str, stop: list[str] | None = STOP) -> SamplingParams:
    return SamplingParams(temperature=0.0, stop=stop, token_ids=True, token_in=server)


def fake(server: str, model: Model | None = None, **kw: Any) -> Fake:
    return FakeVllm(model, **kw) if server == "vllm" else FakeSglang(model, **kw)


async def episode(server: Fake, name: str, stop: list[str] | None = STOP, budget: int = 64,
                  key: str | None = None) -> Any:
    env = ToyEnv()
    sleeps: list[float] = []

    async def sleep(s: float) -> None:
        sleeps.append(s)

    async with httpx.AsyncClient(transport=httpx.MockTransport(server.handle)) as client:
        provider = build_provider("token_in", Endpoint("http://srv/v1", api_key=key), client, sleep=sleep)
        spec = EpisodeSpec("run", "qwen", "chat", budget, env.tasks()[0], env_name=env.name,
                           sampling=params(name, stop))
        return await run_episode(spec, provider, env, LoopConfig(max_steps=6))


@pytest.fixture(autouse=True)
def _refund_says_refunded(monkeypatch: pytest.MonkeyPatch) -> None:
    def refund(self: helpers.ToyWorld, order_id: str, amount: float) -> str:
        """Refund an order."""
        return f"refunded {order_id}"

    monkeypatch.setattr(helpers.ToyWorld, "refund", refund)


SERVERS = ["vllm", "sglang"]


@pytest.mark.parametrize("name", SERVERS)
async def test_bridge_on_ids_is_previous_prompt_output_closing_and_suffix(name: str) -> None:
    server = fake(name)
    ep = await episode(server, name)
    assert ep.stop_reason is StopReason.DONE
    assert len(ep.turns) == 4
    assert [t.token_in_fallback for t in ep.turns] == [None] * 4
    assert [t.prompt_sent_as_ids for t in ep.turns] == [True] * 4
    tok = server.model.tok
    # The first turn is the server's own render of the history.
    assert tok.decode(server.sent[0]).startswith("<|im_start|>system\n")
    assert tok.decode(server.sent[0]).endswith(
        "<|im_start|>user\ndo the thing<|im_end|>\n<|im_start|>assistant\n")
    for k in range(1, 4):
        previous, output = server.sent[k - 1], ep.turns[k - 1].output_token_ids or []
        # The ids hold the matched stop string (only the text loses it): nothing to add back.
        assert tok.decode(output).endswith("</tool_call>")
        assert ep.turns[k - 1].token_counts_ok  # ids, logprobs and the count agree
        bridge = server.sent[k][len(previous) + len(output):]
        assert server.sent[k][: len(previous) + len(output)] == previous + output
        assert tok.decode(bridge) == (f"<|im_end|>\n<|im_start|>user\nrefunded A{k - 1}<|im_end|>\n"
                                      "<|im_start|>assistant\n")
    assert [t.prefix_consistent for t in ep.turns[1:]] == [True] * 3
    rows = episodes_to_table([ep]).to_pylist()
    assert full_prompts(rows[0]["turns"]) == server.sent
    first = ep.turns[1]  # the server's re-rendering drifts (tojson spacing): the diagnostic
    assert tok.decode([first.drift_expected_id or 0]) == '"'
    assert tok.decode([first.drift_found_id or 0]) == " "
    (row,) = trainer_rows(rows, "sequence").rows
    assert sum(row["loss_mask"]) == sum(len(t.output_token_ids or []) for t in ep.turns)
    assert len(ep.executed_tool_calls) == 3


@pytest.mark.parametrize("name", SERVERS)
async def test_eos_seam_is_counted_once(name: str) -> None:
    """No stop strings: each call turn ends on EOS (vLLM keeps its id, SGLang trims it); the
    template closes the turn with that token, which the bridge writes exactly once."""
    server = fake(name)
    ep = await episode(server, name, stop=None)
    assert [t.token_in_fallback for t in ep.turns] == [None] * 4
    tok = server.model.tok
    for k in range(1, 4):
        assert tok.decode(server.sent[k]).count("<|im_end|>") == 2 + 2 * k  # system, user, k x (call + tool)
        assert server.sent[k][: len(server.sent[k - 1])] == server.sent[k - 1]
    held = ep.turns[0].output_token_ids or []
    assert (held[-1] == EOS) is (name == "vllm")
    assert [t.prefix_consistent for t in ep.turns[1:]] == [True] * 3


@pytest.mark.parametrize("name", SERVERS)
@pytest.mark.parametrize(("model", "kw", "reason"), [
    (Model(call_close="<eoc>"), {}, "suffix_unproven"),  # call turns closed unlike text turns
    (Model(content_newline=True), {}, "suffix_unproven"),  # "A\n" one id: the tail is not on a boundary
    (Model(closer="</tool_call >"), {}, "stop_text_unproven"),  # the template closes elsewhere
    (Model(), {"refuse_probes": True}, "render_failed"),
])
async def test_each_unproven_bridge_falls_back_to_the_servers_render(
        name: str, model: Model, kw: dict[str, Any], reason: str) -> None:
    server = fake(name, model, **kw)
    ep = await episode(server, name)
    assert [t.token_in_fallback for t in ep.turns[1:]] == [reason] * 3
    assert [t.prompt_sent_as_ids for t in ep.turns] == [True, False, False, False]
    # The fallback is the server's own render of the history (what its chat endpoint sees).
    assert server.sent == server.renders
    assert full_prompts(episodes_to_table([ep]).to_pylist()[0]["turns"]) == server.sent
    if reason != "stop_text_unproven":  # (the closer variant renders the sampled text back)
        assert [t.prefix_consistent for t in ep.turns[1:]] == [False] * 3


async def test_no_previous_ids_falls_back_then_extends_again() -> None:
    server = FakeVllm(no_ids_once=True)
    ep = await episode(server, "vllm")
    assert ep.turns[1].token_in_fallback == "no_previous_ids"
    assert ep.turns[2].token_in_fallback is None


def _request(server: str, messages: list[Any], prefix: TokenPrefix) -> TurnRequest:
    request = TurnRequest("qwen", messages, [], 16, params(server))
    request.token_prefix = prefix
    return request


@pytest.mark.parametrize("name", SERVERS)
async def test_unreplayed_turn_and_unknown_seam_fall_back(name: str) -> None:
    """A prefix whose assistant turn is not in the history, and one whose seam this episode
    never recorded (another episode's ids, say): both refuse to bridge, each says why."""
    server = fake(name)
    history = [UserMessage("do the thing"), AssistantMessage("", []), ToolResultMessage("c", "refund", "ok"),
               UserMessage("go on")]
    async with httpx.AsyncClient(transport=httpx.MockTransport(server.handle)) as client:
        provider = TokenInProvider(Endpoint("http://srv/v1"), client)
        turn = await provider.complete(_request(name, history, TokenPrefix([5, 6], "", 0)))
        assert turn.token_in_fallback == "assistant_not_replayed"
        history[1] = AssistantMessage("hello", [])
        request = _request(name, history, TokenPrefix([5, 6], "", 1))
        turn = await provider.complete(request)
        assert turn.token_in_fallback == "stop_text_unproven"
        assert turn.prompt_token_ids == turn.rerendered_prompt_ids
        # This episode's cache now has that turn's seam (it ended on EOS), but for ids of
        # another length: not the ids this prefix extends, so still unknown.
        again = _request(name, history, TokenPrefix([5, 6, 7], "", 1))
        again.wire_cache = request.wire_cache
        assert (await provider.complete(again)).token_in_fallback == "stop_text_unproven"


@pytest.mark.parametrize("name", SERVERS)
async def test_cut_call_at_the_cap_is_a_length_turn(name: str) -> None:
    ep = await episode(fake(name), name, budget=12)
    assert ep.stop_reason is StopReason.LENGTH
    assert ep.turns[0].finish_class == "length"
    assert ep.executed_tool_calls == []


@pytest.mark.parametrize("name", SERVERS)
async def test_malformed_call_is_never_run(name: str) -> None:
    ep = await episode(fake(name, Model(malformed=True, calls=1)), name)
    assert (ep.turns[0].num_tool_calls, ep.turns[0].malformed_calls) == (1, 1)
    assert ep.executed_tool_calls == []


async def test_sglang_abort_is_sent_again_and_version_read() -> None:
    server = FakeSglang(abort_once=True)
    ep = await episode(server, "sglang")
    assert ep.stop_reason is StopReason.DONE
    assert ep.turns[0].retries == ["abort"]
    assert len(server.sent) == 5  # the aborted request and its re-send, then three turns
    assert ep.turns[0].policy_version == "7"


@pytest.mark.parametrize("name", SERVERS)
@pytest.mark.parametrize("status", [400, 200])
async def test_secret_never_reaches_an_error(name: str, status: int) -> None:
    """An error body, and a 200 reply of no known shape, that echo the key: the error names
    the failure, never the key."""
    key = "sk-live-123456789abcdef"
    server = fake(name, error_with=(status, key))

    async def sleep(s: float) -> None:
        pass

    async with httpx.AsyncClient(transport=httpx.MockTransport(server.handle)) as client:
        provider = TokenInProvider(Endpoint("http://srv/v1", api_key=key), client, sleep=sleep)
        with pytest.raises(ProviderError) as caught:
            await provider.complete(TurnRequest("qwen", [UserMessage("hi")], [], 16, params(name)))
    assert key not in str(caught.value)
    assert "bad key [redacted]" in str(caught.value) or "reply is not" in str(caught.value)


@pytest.mark.parametrize("name", SERVERS)
def test_token_in_server_config(name: str) -> None:
    base = {"provider": {"kind": "chat", "base_url": "http://h/v1"},
            "sweep": {"models": ["m"], "budgets": [8]},
            "sampling": {"token_in": True, "token_in_server": name}}
    assert sampling_params(RunConfig.model_validate(base)).token_in == name
    with pytest.raises(ValueError, match="token_in_server"):
        RunConfig.model_validate({**base, "sampling": {"token_in": True, "token_in_server": "tgi"}})

"""Token-in mode: the llama.cpp adapter end to end through the loop, against a fake llama-server.

The fake speaks llama-server's `/apply-template`, `/tokenize`, `/detokenize` and `/completion`
shapes (tools/server, checked on a real one by scripts/real_llama/token_truth.py), renders a
Hermes-style template that re-serializes call arguments the way Jinja `tojson` does (so a
re-rendered history drifts from what was sampled), tokenizes one id per character (template
markup one id each), and trims a matched stop string's ids as llama.cpp trims its logprobs.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from collector.analysis.trainer import full_prompts, trainer_rows
from collector.config import LoopConfig, RunConfig
from collector.episode.loop import EpisodeSpec, run_episode
from collector.providers import build_provider
from collector.providers.base import Endpoint
from collector.providers.textcalls import text_tool_calls
from collector.record.shards import episodes_to_table
from collector.run.worker import sampling_params
from collector.stop import StopReason
from collector.turn import ArgStatus, SamplingParams
from tests.episode import helpers
from tests.episode.helpers import ToyEnv

SPECIAL = ("<bos>", "<turn>", "<eot>", "<tool_call>", "</tool_call>", "<eoc>")
STOP = ["</tool_call>"]
PARAMS = SamplingParams(temperature=0.0, stop=STOP, token_ids=True, token_in="llama.cpp")


def tokenize(text: str) -> list[int]:
    out, i = [], 0
    while i < len(text):
        for k, s in enumerate(SPECIAL):
            if text.startswith(s, i):
                out.append(1 + k)
                i += len(s)
                break
        else:
            out.append(1000 + ord(text[i]))
            i += 1
    return out


N_VOCAB = 1000 + 0x110000
"""One id per Unicode code point above 1000, the markup below: every id `tokenize` makes."""


def detokenize(ids: list[int]) -> str:
    return "".join(SPECIAL[i - 1] if i < 1000 else chr(i - 1000) for i in ids)


class FakeLlama:
    """A llama-server in miniature. `call_close` is what the template writes after a call turn
    (a template that closes call turns unlike text turns cannot be bridged: `<eoc>`)."""

    def __init__(self, call_close: str = "<eot>\n", calls: int = 3, closer: str = "</tool_call>",
                 refuse_probes: bool = False) -> None:
        self.call_close = call_close
        self.closer = closer
        self.refuse_probes = refuse_probes
        self.calls = calls
        self.sent: list[Any] = []
        self.paths: list[str] = []

    def render(self, messages: list[dict[str, Any]], gen: bool = True) -> str:
        out = "<bos><turn>system\nYou call tools.<eot>\n"
        for m in messages:
            if m["role"] == "assistant" and m.get("tool_calls"):
                out += "<turn>assistant\n" + (m["content"] or "")
                for c in m["tool_calls"]:
                    args = json.dumps(json.loads(c["function"]["arguments"]))  # tojson: spaced
                    out += '<tool_call>\n{"name": "' + c["function"]["name"] + '", "arguments": ' + args
                    out += "}\n" + self.closer
                out += self.call_close
            else:
                role = "user" if m["role"] == "tool" else m["role"]
                out += f"<turn>{role}\n{m['content'] or ''}<eot>\n"
        return out + ("<turn>assistant\n" if gen else "")

    def generate(self, prompt: str, n_predict: int) -> tuple[str, str]:
        """(what the model writes, the stop word it ends on): `calls` compact calls, then text."""
        done = prompt.count("refunded")
        if done < self.calls:
            args = json.dumps({"order_id": f"A{done}", "amount": 5}, separators=(",", ":"))
            return '<tool_call>\n{"name":"refund","arguments":' + args + "}\n</tool_call>", "</tool_call>"
        return "done", ""

    async def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if request.method == "GET" and path == "/v1/models":  # the model's metadata, as llama-server's
            meta = {"vocab_type": 2, "n_vocab": N_VOCAB, "n_ctx_train": 4096}
            return httpx.Response(200, json={"object": "list", "data": [{"id": "fake", "meta": meta}]})
        body = json.loads(request.content)
        self.paths.append(path)
        if path == "/apply-template":
            if self.refuse_probes and any(m.get("content") in ("A", "B") for m in body["messages"]):
                return httpx.Response(400, json={"error": {"code": 400, "message": "bad template input"}})
            return httpx.Response(200, json={"prompt": self.render(body["messages"])})
        if path == "/tokenize":
            ids = tokenize(body["content"])
            if not body.get("add_special") and ids[:1] == [1]:
                ids = ids[1:]
            elif body.get("add_special") and ids[:1] != [1]:
                ids = [1, *ids]
            return httpx.Response(200, json={"tokens": ids})
        if path == "/detokenize":
            return httpx.Response(200, json={"content": detokenize(body["tokens"])})
        assert path == "/completion", path
        self.sent.append(body["prompt"])
        prompt = body["prompt"] if isinstance(body["prompt"], str) else detokenize(body["prompt"])
        sampled, word = self.generate(prompt, body["n_predict"])
        ids = tokenize(sampled)[: body["n_predict"]]
        kept = len(ids) - (len(tokenize(word)) if word and len(ids) == len(tokenize(sampled)) else 0)
        stop_type = "word" if word else ("limit" if len(ids) >= body["n_predict"] else "eos")
        content = detokenize(ids[:kept])
        return httpx.Response(200, json={
            "content": content, "tokens": ids, "tokens_predicted": len(ids),
            "tokens_evaluated": len(tokenize(prompt)), "stop_type": stop_type,
            "stopping_word": word if stop_type == "word" else "", "model": "fake",
            # llama.cpp's entries: the id, its text and bytes, the logprob.
            "completion_probabilities": [
                {"id": i, "token": detokenize([i]), "bytes": list(detokenize([i]).encode()), "logprob": -0.5}
                for i in ids[:kept]],
        })


@pytest.fixture
def fake() -> FakeLlama:
    return FakeLlama()


async def _episode(fake: FakeLlama, params: SamplingParams = PARAMS, budget: int = 64) -> Any:
    env = ToyEnv()
    async with httpx.AsyncClient(transport=httpx.MockTransport(fake.handle)) as client:
        provider = build_provider("token_in", Endpoint("http://llama/v1"), client)
        spec = EpisodeSpec("run", "fake", "chat", budget, env.tasks()[0], env_name=env.name, sampling=params)
        return await run_episode(spec, provider, env, LoopConfig(max_steps=6))


@pytest.fixture(autouse=True)
def _refund_says_refunded(monkeypatch: pytest.MonkeyPatch) -> None:
    def refund(self: helpers.ToyWorld, order_id: str, amount: float) -> str:
        """Refund an order."""
        return f"refunded {order_id}"

    monkeypatch.setattr(helpers.ToyWorld, "refund", refund)


async def test_token_in_episode_is_one_sequence_and_ids_are_what_was_sent(fake: FakeLlama) -> None:
    ep = await _episode(fake)
    assert ep.stop_reason is StopReason.DONE
    assert len(ep.turns) == 4
    assert [t.prompt_sent_as_ids for t in ep.turns] == [True] * 4
    assert [t.token_in_fallback for t in ep.turns] == [None] * 4
    assert [t.prefix_consistent for t in ep.turns[1:]] == [True] * 3
    rows = episodes_to_table([ep]).to_pylist()
    assert full_prompts(rows[0]["turns"]) == fake.sent  # stored prompts == the ids on the wire
    # The template re-serialized the compact arguments: the server's own re-rendering departs
    # from the sent ids inside the first replayed call; that is the drift diagnostic.
    first = ep.turns[1]
    assert first.drift_offset is not None
    assert detokenize([first.drift_expected_id or 0]) == '"'
    assert detokenize([first.drift_found_id or 0]) == " "
    view = trainer_rows(rows, "sequence")
    (row,) = view.rows
    assert detokenize(row["input_ids"]).count("</tool_call><eot>\n") == 3  # the closing, bridged
    assert sum(row["loss_mask"]) == sum(len(t.output_token_ids or []) for t in ep.turns)


async def test_unprovable_bridge_falls_back_to_text_and_breaks_the_sequence() -> None:
    """A template that closes call turns unlike text turns: the suffix cannot be proven, so
    each later turn goes as the server's own re-rendering (text), which drifts: not one sequence."""
    text_fake = FakeLlama(call_close="<eoc>")
    ep = await _episode(text_fake)
    assert [t.token_in_fallback for t in ep.turns] == [None, "suffix_unproven", "suffix_unproven",
                                                      "suffix_unproven"]
    assert [t.prompt_sent_as_ids for t in ep.turns] == [True, False, False, False]
    assert all(isinstance(p, str) for p in text_fake.sent[1:])  # fell back to the rendered text
    assert [t.prefix_consistent for t in ep.turns[1:]] == [False] * 3
    view = trainer_rows(episodes_to_table([ep]).to_pylist(), "sequence")
    assert len(view.rows) == 4  # one row per re-rendered turn


@pytest.mark.parametrize(("server", "reason"), [
    (FakeLlama(closer="</tool_call >"), "stop_text_unproven"),  # the template closes elsewhere
    (FakeLlama(refuse_probes=True), "render_failed"),
])
async def test_each_unproven_bridge_names_its_reason(server: FakeLlama, reason: str) -> None:
    ep = await _episode(server)
    assert [t.token_in_fallback for t in ep.turns[1:]] == [reason] * 3
    assert [t.prompt_sent_as_ids for t in ep.turns] == [True, False, False, False]


async def test_no_previous_ids_falls_back_to_text(fake: FakeLlama) -> None:
    """A turn whose output returned no ids leaves nothing to extend: text, reason named."""

    async def handle(request: httpx.Request) -> httpx.Response:
        response = await FakeLlama.handle(fake, request)
        if request.url.path == "/completion" and len(fake.sent) == 1:
            body = json.loads(response.content)
            body["tokens"], body["completion_probabilities"] = [], []
            return httpx.Response(200, json=body)
        return response

    env = ToyEnv()
    async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as client:
        provider = build_provider("token_in", Endpoint("http://llama"), client)
        spec = EpisodeSpec("run", "fake", "chat", 64, env.tasks()[0], env_name=env.name, sampling=PARAMS)
        ep = await run_episode(spec, provider, env, LoopConfig(max_steps=6))
    assert ep.turns[1].token_in_fallback == "no_previous_ids"
    assert ep.turns[2].token_in_fallback is None  # the turn after extends again


def test_text_tool_calls_parses_template_blocks() -> None:
    block = 'hi <tool_call>\n{"name": "f", "arguments": {"a": 1}}\n'
    text, calls = text_tool_calls(block, "</tool_call>", "c")
    assert text == "hi"
    assert [(c.name, c.arguments, c.status) for c in calls] == [("f", {"a": 1}, ArgStatus.OK)]
    assert not calls[0].had_wire_id
    assert calls[0].id == "c_0"
    # Unclosed (cut at the cap, no stop word): left in the text for the length checks.
    text, calls = text_tool_calls('<tool_call>\n{"name": "f", "argu', "", "c")
    assert calls == []
    assert text.startswith("<tool_call>")
    # Closed but not a call object: malformed, the name kept, never run.
    _, calls = text_tool_calls('<tool_call>{"name": "f", "arguments": {"a": }</tool_call>', "", "c")
    assert calls[0].status is ArgStatus.MALFORMED
    assert calls[0].name == "f"
    assert calls[0].arguments is None


async def test_cut_call_at_the_cap_is_a_length_turn(fake: FakeLlama) -> None:
    ep = await _episode(fake, budget=12)
    assert ep.stop_reason is StopReason.LENGTH
    assert ep.turns[0].finish_class == "length"
    assert ep.executed_tool_calls == []


def test_token_in_config() -> None:
    base = {"provider": {"kind": "chat", "base_url": "http://h/v1"},
            "sweep": {"models": ["m"], "budgets": [8]}, "sampling": {"token_in": True}}
    cfg = RunConfig.model_validate(base)
    params = sampling_params(cfg)
    assert params.token_ids
    assert params.token_in == "llama.cpp"
    with pytest.raises(ValueError, match=r"sampling\.token_in needs the chat wire; provider 'anthropic'"):
        RunConfig.model_validate({**base, "provider": {"kind": "anthropic", "base_url": "http://h"}})


async def test_secret_in_token_in_episode_withholds_ids(
        fake: FakeLlama, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ids that carried a secret were sent: the episode keeps none, the view names why."""
    def refund(self: helpers.ToyWorld, order_id: str, amount: float) -> str:
        """Refund an order."""
        return 'refunded {"api_key": "sk-live-123456789abcdef"}'

    monkeypatch.setattr(helpers.ToyWorld, "refund", refund)
    ep = await _episode(fake)
    assert all(t.tokens_withheld for t in ep.turns)
    assert all(t.prompt_token_ids is None and t.output_token_ids is None for t in ep.turns)
    view = trainer_rows(episodes_to_table([ep]).to_pylist(), "sequence")
    assert view.rows == []
    assert view.skipped == {"withheld_redacted": 1}

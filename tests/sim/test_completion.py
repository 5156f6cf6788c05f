"""llama-server's token endpoints on the simulator: shapes, the template's consistency with the chat
endpoint's prompt ids, exact detokenizing, and `/completion` generating like the chat endpoint."""

from __future__ import annotations

import dataclasses
import json
import random
import string
from typing import Any

import httpx
import pytest

from collector.sim import vocab
from collector.sim.app import create_app
from collector.sim.completion import read_prompt
from collector.sim.presets import PRESETS
from tests.sim.conftest import APPROVAL, ARITH, LOOKUP, REFUND, chat_body, chat_tools

VLLM = {"return_token_ids": True}


async def _ok(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = await client.post(path, json=body)
    assert r.status_code == 200, r.text
    result: dict[str, Any] = r.json()
    return result


async def _ids_of_template(client: httpx.AsyncClient, model: str,
                           messages: list[dict[str, Any]]) -> list[int]:
    """What the token-in client computes: the template's text, tokenized with BOS."""
    root = f"/llamacpp/{model}"
    render = {"messages": messages, "tools": chat_tools()}
    text = (await _ok(client, root + "/apply-template", render))["prompt"]
    tokenize = {"content": text, "add_special": True, "parse_special": True}
    ids: list[int] = (await _ok(client, root + "/tokenize", tokenize))["tokens"]
    return ids


def test_vocabulary_is_exact_where_the_hash_collided() -> None:
    """Every id detokenizes to its text: the old hash mod 100,000 mapped many pieces to one id."""
    rng = random.Random(5)
    alphabet = string.printable + "äé€😀"
    texts = {"".join(rng.choices(alphabet, k=rng.randint(1, 4))) for _ in range(150_000)}
    ids = {vocab.piece_id(t) for t in texts}
    assert len(ids) == len(texts)  # no two pieces share an id
    assert all(vocab.token_text(vocab.piece_id(t)) == t for t in texts)
    text = 'Order A-1 <|user|>über\n<tool_call>{"name": "refund", "arguments": {"a": 1}}</tool_call>'
    assert vocab.detokenize(vocab.tokenize(text)) == text
    assert vocab.detokenize(vocab.tokenize(text, parse_special=False)) == text
    with pytest.raises(ValueError, match="not in the vocabulary"):
        vocab.detokenize([vocab.HASHED_BASE - 1])


async def _history(client: httpx.AsyncClient, model: str, task: str) -> list[list[dict[str, Any]]]:
    """Each turn's messages of one chat-endpoint episode (results answered `ok`), to the answer."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
    out = []
    for _ in range(6):
        out.append(list(messages))
        reply = await _ok(client, "/v1/chat/completions", {**chat_body(model, task, 512, **VLLM),
                                                           "messages": messages})
        message = reply["choices"][0]["message"]
        calls = message.get("tool_calls") or []
        messages.append({"role": "assistant", "content": message["content"], "tool_calls": calls})
        if not calls:
            return out
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": '{"status": "ok"}'} for c in calls]
    return out


@pytest.mark.parametrize("model", ["sim-drift", "sim-rerender", "sim-terse", "sim-verbose"])
async def test_template_tokenizes_to_the_chat_endpoints_prompt_ids(client: httpx.AsyncClient,
                                                                   model: str) -> None:
    """/apply-template + /tokenize (BOS added) == the chat endpoint's `prompt_token_ids` for the same
    messages, drift included: a re-rendering run and a token-in run on one preset compare."""
    turns = 0
    for task in (ARITH, REFUND, APPROVAL, LOOKUP):
        for messages in await _history(client, model, task):
            reply = await _ok(client, "/v1/chat/completions", {**chat_body(model, task, 512, **VLLM),
                                                               "messages": messages})
            assert await _ids_of_template(client, model, messages) == reply["prompt_token_ids"]
            turns += 1
    assert turns >= 8  # every task, its first turn and at least one replayed call


async def test_detokenize_renders_the_template_and_read_back_gives_the_conversation(
        client: httpx.AsyncClient) -> None:
    messages = (await _history(client, "sim-drift", APPROVAL))[-1]
    ids = await _ids_of_template(client, "sim-drift", messages)
    text = (await _ok(client, "/llamacpp/sim-drift/detokenize", {"tokens": ids}))["content"]
    rendered = (await _ok(client, "/llamacpp/sim-drift/apply-template", {"messages": messages,
                                                                        "tools": chat_tools()}))["prompt"]
    assert text == "<|begin|>" + rendered
    assert text.endswith("<|end|><|assistant|>")
    conversation = read_prompt(ids)
    assert conversation.tools == tuple(t["function"]["name"] for t in chat_tools())
    kinds = [item[0] for item in conversation.history]
    assert kinds == ["user", "call", "call", "result", "result"]  # approval and refund in one turn
    assert [item[2] for item in conversation.history if item[0] == "call"] == ["request_approval", "refund"]
    # Each result answers its call, in order (the template writes no ids).
    assert [item[1] for item in conversation.history if item[0] == "result"] == ["call_0", "call_1"]


async def test_completion_writes_the_chat_endpoints_turn_as_raw_text(client: httpx.AsyncClient) -> None:
    """Same policy and preset: the call the chat endpoint makes, as a Hermes block in raw text,
    then the answer from the result; ids detokenize to the text, one logprob each."""
    ids = await _ids_of_template(client, "sim-perfect", [{"role": "user", "content": ARITH}])
    body = {"prompt": ids, "n_predict": 64, "return_tokens": True, "n_probs": 1, "temperature": 0.0,
            "seed": 1}
    first = await _ok(client, "/llamacpp/sim-perfect/completion", body)
    call = '{"name": "calculator", "arguments": {"expression": "37 * 12 + 5"}}'
    assert first["content"] == "<tool_call>" + call + "</tool_call>"
    assert vocab.detokenize(first["tokens"]) == first["content"]
    assert first["stop_type"] == "eos"
    assert first["stopping_word"] == ""
    assert first["tokens_predicted"] == len(first["tokens"])
    assert first["tokens_evaluated"] == len(ids)
    assert first["model"] == "sim-perfect"
    assert [p["id"] for p in first["completion_probabilities"]] == first["tokens"]
    for p in first["completion_probabilities"]:
        assert p["logprob"] <= 0
        assert p["top_logprobs"][0]["id"] == p["id"]
    chat = await _ok(client, "/v1/chat/completions", chat_body("sim-perfect", ARITH, 64, **VLLM))
    assert chat["choices"][0]["token_ids"] == first["tokens"]  # the same turn, the same ids
    suffix = "<|end|><|tool|>449<|end|><|assistant|>"
    later = ids + first["tokens"] + vocab.tokenize(suffix)
    second = await _ok(client, "/llamacpp/sim-perfect/completion", {**body, "prompt": later})
    assert second["content"] == "449"
    assert second["prompt"] == vocab.detokenize(later)


async def test_completion_cut_at_n_predict_is_a_limit(client: httpx.AsyncClient) -> None:
    ids = await _ids_of_template(client, "sim-perfect", [{"role": "user", "content": REFUND}])
    reply = await _ok(client, "/llamacpp/sim-perfect/completion",
                      {"prompt": ids, "n_predict": 5, "return_tokens": True, "n_probs": 1})
    assert reply["stop_type"] == "limit"
    assert reply["tokens_predicted"] == len(reply["tokens"]) == 5
    assert reply["content"].startswith('<tool_call>{"name": "refund"')
    assert "</tool_call>" not in reply["content"]
    assert vocab.detokenize(reply["tokens"]) == reply["content"]


async def test_a_matched_stop_string_leaves_content_keeps_its_ids_but_not_their_probabilities(
        client: httpx.AsyncClient) -> None:
    ids = await _ids_of_template(client, "sim-perfect", [{"role": "user", "content": ARITH}])
    body = {"prompt": ids, "n_predict": 64, "return_tokens": True, "n_probs": 1,
            "stop": ["}</tool_call>", "zzz"]}
    reply = await _ok(client, "/llamacpp/sim-perfect/completion", body)
    assert reply["stop_type"] == "word"
    assert reply["stopping_word"] == "}</tool_call>"
    block = '<tool_call>{"name": "calculator", "arguments": {"expression": "37 * 12 + 5"}'
    assert reply["content"] == block  # the stop string removed
    assert reply["tokens"] == ids_of(block + "}</tool_call>")  # its ids kept
    assert reply["tokens"][-1] == vocab.CALL_CLOSE
    assert [p["id"] for p in reply["completion_probabilities"]] == reply["tokens"][:-1]  # not its logprob
    # A stop string inside a token ends the turn with that token; llama.cpp trims as many
    # probabilities as the stop string has tokens (here more than the turn kept: none left).
    early = await _ok(client, "/llamacpp/sim-perfect/completion", {**body, "stop": [', "arg']})
    assert early["content"] == '<tool_call>{"name": "calculator"'
    assert early["tokens"] == ids_of('<tool_call>{"name": "calculator", "arguments": ')
    assert "completion_probabilities" not in early
    # Text prompts are tokenized with BOS and markup, as llama.cpp does: the same turn.
    text = vocab.detokenize(ids[1:])
    assert (await _ok(client, "/llamacpp/sim-perfect/completion", {**body, "prompt": text}))["tokens"] == \
        reply["tokens"]


def ids_of(text: str) -> list[int]:
    return vocab.tokenize(text)


async def test_apply_template_refuses_a_history_ending_on_an_assistant_turn(
        client: httpx.AsyncClient) -> None:
    """llama.cpp prefills a trailing assistant turn: refused for a thinking model, a call turn or
    two assistant turns at the end; a text turn of a plain model is continued."""
    user = {"role": "user", "content": ARITH}
    text = {"role": "assistant", "content": "The answer is"}
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": "{}"}}]}
    for model, messages, words in (
            ("sim-drift", [user, text], "prefill is incompatible with enable_thinking"),
            ("sim-terse", [user, call], "Cannot continue an assistant message that contains tool calls"),
            ("sim-terse", [user, text, text], "Cannot have 2 or more assistant messages")):
        r = await client.post(f"/llamacpp/{model}/apply-template", json={"messages": messages})
        assert r.status_code == 400
        error = r.json()["error"]
        assert words in error["message"]
        assert (error["code"], error["type"]) == (400, "invalid_request_error")
    prefilled = await _ok(client, "/llamacpp/sim-terse/apply-template", {"messages": [user, text]})
    assert prefilled["prompt"].endswith("<|end|><|assistant|>The answer is")


@pytest.mark.parametrize(("path", "body", "status", "words"), [
    ("/llamacpp/sim-nope/completion", {"prompt": "hi"}, 404, "model 'sim-nope' not found"),
    ("/completion", {"prompt": "hi"}, 400, '"model" is required'),
    ("/llamacpp/sim-terse/completion", {"n_predict": 4}, 400, '"prompt" must be provided'),
    ("/llamacpp/sim-terse/completion", {"prompt": [1, 10**12]}, 400, "invalid token id"),
    ("/llamacpp/sim-terse/completion", {"prompt": "hi", "n_predict": "4"}, 400,
     '"n_predict" must be an integer'),
    ("/llamacpp/sim-terse/tokenize", {"text": "hi"}, 400, '"content" must be provided'),
    ("/llamacpp/sim-terse/detokenize", {"tokens": [vocab.HASHED_BASE - 5]}, 400, "not in the vocabulary"),
    ("/llamacpp/sim-terse/apply-template", {"messages": []}, 400, "'messages' is required"),
    ("/llamacpp/sim-terse/apply-template", {"messages": [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "function": {"name": "f", "arguments": "{"}}]}, {"role": "user", "content": "x"}]},
     500, "failed to parse tool call arguments"),
])
async def test_bad_requests_get_llamas_error_shape(client: httpx.AsyncClient, path: str, body: dict[str, Any],
                                                   status: int, words: str) -> None:
    r = await client.post(path, json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert words in error["message"]
    assert error["code"] == status
    assert isinstance(error["type"], str)
    r = await client.post(path, content=b"{not json")
    assert r.status_code == 400
    assert r.json()["error"]["code"] == 400


async def test_model_in_the_body_selects_the_preset_at_the_root(client: httpx.AsyncClient) -> None:
    """llama-server's router mode: `model` in the body; the prefixed path and the body agree."""
    messages = [{"role": "user", "content": ARITH}]
    at_root = await _ok(client, "/apply-template", {"model": "sim-drift", "messages": messages})
    prefixed = await _ok(client, "/llamacpp/sim-drift/apply-template", {"messages": messages})
    assert at_root == prefixed
    reply = await _ok(client, "/completion", {"model": "sim-drift", "prompt": at_root["prompt"]})
    assert reply["model"] == "sim-drift"
    assert json.dumps(reply)  # plain JSON


async def test_context_overflow_and_injected_faults_come_in_llamas_shape() -> None:
    tiny = dataclasses.replace(PRESETS["sim-perfect"], name="tiny", context_window=8)
    transport = httpx.ASGITransport(app=create_app(seed=1, presets={"tiny": tiny}))
    async with httpx.AsyncClient(transport=transport, base_url="http://sim") as client:
        r = await client.post("/llamacpp/tiny/completion", json={"prompt": "<|user|>" + ARITH})
        assert r.status_code == 400
        error = r.json()["error"]
        assert error["type"] == "exceed_context_size_error"
        assert error["n_ctx"] == 8
        assert error["n_prompt_tokens"] == 1 + len(vocab.tokenize("<|user|>" + ARITH))
        r = await client.post("/llamacpp/tiny/completion", json={"prompt": "<|user|>hi"},
                              headers={"x-sim-fault": "server_error"})
        assert r.status_code == 500
        assert r.json()["error"]["code"] == 500
        calm = await client.post("/llamacpp/tiny/completion", json={"prompt": "<|user|>hi"})
        assert calm.status_code == 200

"""Fake vLLM and SGLang token endpoints, shaped exactly like their replies (token-in tests).

Shapes read from the servers' source (the provider modules' docstrings name the files):

- vLLM `/tokenize` (messages or prompt) -> `{"count", "max_model_len", "tokens",
  "token_strs"}`; `/v1/completions` with a token prompt -> `{"id", "object":
  "text_completion", "created", "model", "choices": [{"index", "text", "logprobs":
  {"text_offset", "token_logprobs", "tokens", "top_logprobs"}, "finish_reason",
  "stop_reason", "token_ids", "prompt_token_ids", "prompt_logprobs"}], "usage"}`; a matched
  stop string cut from `text` only, its ids (and an EOS id) kept in `token_ids`.
- SGLang `/v1/chat/completions` with `return_prompt_token_ids` -> a chat reply whose
  `choices[0].prompt_token_ids` is the render; `/v1/tokenize` -> `{"tokens", "count",
  "max_model_len"}`; `/generate` with `input_ids` -> `{"text", "output_ids", "meta_info":
  {"id", "finish_reason": {"type", "matched" | "length"}, "prompt_tokens",
  "completion_tokens", "cached_tokens", "output_token_logprobs", "weight_version",
  "e2e_latency"}}`; a matched stop string cut from `text` only, a matched stop token
  trimmed from `output_ids` (its detokenizer's `trim_matched_stop`).

Both render a Qwen-style template that re-serializes call arguments the way Jinja `tojson`
does (so a re-rendered history drifts from what was sampled) and tokenize one id per
character, template markup one id each, plus optional merges (a probe character fused with
the newline after it, as BPE merges do).
"""

from __future__ import annotations

import json
from typing import Any

import httpx

SPECIAL = ("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<eoc>")
EOS = 2
"""`<|im_end|>`: the model's end-of-turn token and the template's."""
HIDDEN = ("<|im_start|>", "<|im_end|>", "<eoc>")
"""Special tokens the text skips (`skip_special_tokens`); the call markup stays in the text."""


class Tokenizer:
    """One id per character, special tokens one id each, `merges` (text -> id) taken first."""

    def __init__(self, merges: dict[str, int] | None = None) -> None:
        self.merges = merges or {}

    def encode(self, text: str) -> list[int]:
        out, i = [], 0
        pieces = [*((s, 1 + k) for k, s in enumerate(SPECIAL)), *self.merges.items()]
        while i < len(text):
            for piece, tid in pieces:
                if text.startswith(piece, i):
                    out.append(tid)
                    i += len(piece)
                    break
            else:
                out.append(1000 + ord(text[i]))
                i += 1
        return out

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        back = {tid: piece for piece, tid in self.merges.items()}
        out = []
        for i in ids:
            piece = SPECIAL[i - 1] if i <= len(SPECIAL) else back.get(i) or chr(i - 1000)
            if not (skip_special and piece in HIDDEN):
                out.append(piece)
        return "".join(out)


class Model:
    """The template and the "model": `calls` compact refund calls, then a text answer."""

    def __init__(self, *, call_close: str = "<|im_end|>\n", closer: str = "</tool_call>", calls: int = 3,
                 content_newline: bool = False, malformed: bool = False) -> None:
        self.call_close = call_close
        self.closer = closer
        self.calls = calls
        self.content_newline = content_newline
        self.malformed = malformed
        self.tok = Tokenizer({"A\n": 500, "B\n": 501} if content_newline else None)

    def render(self, messages: list[dict[str, Any]]) -> str:
        end = ("\n" if self.content_newline else "") + "<|im_end|>\n"
        out = "<|im_start|>system\nYou call tools.<|im_end|>\n"
        for m in messages:
            if m["role"] == "assistant" and m.get("tool_calls"):
                out += "<|im_start|>assistant\n" + (m["content"] or "")
                for c in m["tool_calls"]:
                    args = json.dumps(json.loads(c["function"]["arguments"]))  # tojson: spaced
                    out += '<tool_call>\n{"name": "' + c["function"]["name"] + '", "arguments": ' + args
                    out += "}\n" + self.closer
                out += self.call_close
            else:
                role = "user" if m["role"] == "tool" else m["role"]
                out += f"<|im_start|>{role}\n{m['content'] or ''}{end}"
        return out + "<|im_start|>assistant\n"

    def sample(self, prompt: str, stops: list[str]) -> tuple[list[int], str]:
        """(the sampled ids, the matched stop string or "" for EOS)."""
        done = prompt.count("refunded")
        if done < self.calls:
            if self.malformed:
                text = '<tool_call>\n{"name":"refund","arguments":{"order_id": }}\n</tool_call>'
            else:
                args = json.dumps({"order_id": f"A{done}", "amount": 5}, separators=(",", ":"))
                text = '<tool_call>\n{"name":"refund","arguments":' + args + "}\n</tool_call>"
            if "</tool_call>" in stops:
                return self.tok.encode(text), "</tool_call>"
            return [*self.tok.encode(text), EOS], ""
        return [*self.tok.encode("done"), EOS], ""


def _prompt_text(model: Model, body: dict[str, Any], key: str) -> str:
    prompt = body[key]
    assert isinstance(prompt, list), "prompt is not ids"
    assert all(isinstance(i, int) for i in prompt), "prompt is not ids"
    return model.tok.decode(prompt)


class FakeVllm:
    """vLLM's `/tokenize` and `/v1/completions` (see the module docstring)."""

    def __init__(self, model: Model | None = None, *, refuse_probes: bool = False, no_ids_once: bool = False,
                 error_with: tuple[int, str] | None = None) -> None:
        self.model = model or Model()
        self.refuse_probes = refuse_probes
        self.no_ids_once = no_ids_once
        self.error_with = error_with
        self.sent: list[list[int]] = []
        self.renders: list[list[int]] = []
        """The renders of the real history (not the probes'), in order."""

    def _note(self, messages: list[dict[str, Any]], ids: list[int]) -> None:
        if not any(m.get("content") in ("A", "B") for m in messages):
            self.renders.append(ids)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        path = request.url.path
        tok = self.model.tok
        if path == "/tokenize":
            if "messages" in body:
                assert body["add_generation_prompt"] is True
                assert body["add_special_tokens"] is False
                if self.refuse_probes and any(m.get("content") in ("A", "B") for m in body["messages"]):
                    return httpx.Response(400, json={"object": "error", "message": "template error",
                                                     "type": "BadRequestError", "param": None, "code": 400})
                ids = tok.encode(self.model.render(body["messages"]))
                self._note(body["messages"], ids)
            else:
                ids = tok.encode(body["prompt"])
            return httpx.Response(200, json={"count": len(ids), "max_model_len": 32768, "tokens": ids,
                                             "token_strs": None})
        assert path == "/v1/completions", path
        if self.error_with is not None:  # an error body (or, 200, a reply of no known shape) echoing the key
            status, key = self.error_with
            return httpx.Response(status, json={"object": "error", "message": f"bad key {key}",
                                                "type": "BadRequestError", "param": None, "code": status})
        assert body["return_token_ids"] is True
        self.sent.append(body["prompt"])
        ids, word = self.model.sample(_prompt_text(self.model, body, "prompt"), body.get("stop") or [])
        cap = body["max_tokens"]
        cut = len(ids) > cap
        ids = ids[:cap]
        text = tok.decode(ids, skip_special=True)
        if word and not cut:
            text = text[: text.rfind(word)]  # the stop string leaves the text, not the ids
        if self.no_ids_once:
            self.no_ids_once = False
            ids = []
        return httpx.Response(200, json={
            "id": "cmpl-1", "object": "text_completion", "created": 1, "model": body["model"],
            "choices": [{
                "index": 0, "text": text,
                "logprobs": {"text_offset": list(range(len(ids))), "token_logprobs": [-0.5] * len(ids),
                             "tokens": [tok.decode([i]) for i in ids],
                             "top_logprobs": [{tok.decode([i]): -0.5} for i in ids]},
                "finish_reason": "length" if cut else "stop",
                "stop_reason": None if cut or not word else word,
                "token_ids": ids, "prompt_token_ids": body["prompt"], "prompt_logprobs": None,
            }],
            "usage": {"prompt_tokens": len(body["prompt"]), "total_tokens": len(body["prompt"]) + len(ids),
                      "completion_tokens": len(ids), "prompt_tokens_details": None},
        })


class FakeSglang:
    """SGLang's `/v1/chat/completions` (prompt ids), `/v1/tokenize` and `/generate`."""

    def __init__(self, model: Model | None = None, *, refuse_probes: bool = False, abort_once: bool = False,
                 error_with: tuple[int, str] | None = None) -> None:
        self.model = model or Model()
        self.refuse_probes = refuse_probes
        self.abort_once = abort_once
        self.error_with = error_with
        self.sent: list[list[int]] = []
        self.renders: list[list[int]] = []
        """The renders of the real history (not the probes'), in order."""

    def _note(self, messages: list[dict[str, Any]], ids: list[int]) -> None:
        if not any(m.get("content") in ("A", "B") for m in messages):
            self.renders.append(ids)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        path = request.url.path
        tok = self.model.tok
        if path == "/v1/chat/completions":
            assert body["return_prompt_token_ids"] is True
            if self.refuse_probes and any(m.get("content") in ("A", "B") for m in body["messages"]):
                return httpx.Response(400, json={"object": "error", "message": "template error",
                                                 "type": "Bad Request", "param": None, "code": 400})
            ids = tok.encode(self.model.render(body["messages"]))
            self._note(body["messages"], ids)
            return httpx.Response(200, json={
                "id": "c1", "object": "chat.completion", "created": 1, "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "x", "tool_calls": None,
                                                     "reasoning_content": None},
                             "logprobs": None, "finish_reason": "length", "matched_stop": None,
                             "prompt_token_ids": ids}],
                "usage": {"prompt_tokens": len(ids), "total_tokens": len(ids) + 1, "completion_tokens": 1},
                "metadata": {"weight_version": "7"}})
        if path == "/v1/tokenize":
            ids = tok.encode(body["prompt"])
            return httpx.Response(200, json={"tokens": ids, "count": len(ids), "max_model_len": 32768})
        assert path == "/generate", path
        if self.error_with is not None:  # an error body (or, 200, a reply of no known shape) echoing the key
            status, key = self.error_with
            return httpx.Response(status, json={"message": f"bad key {key}", "code": status})
        assert body["return_logprob"] is True
        self.sent.append(body["input_ids"])
        sampling = body["sampling_params"]
        ids, word = self.model.sample(_prompt_text(self.model, body, "input_ids"), sampling.get("stop") or [])
        cap = sampling["max_new_tokens"]
        cut = len(ids) > cap
        ids = ids[:cap]
        text = tok.decode(ids, skip_special=True)
        if cut:
            reason: dict[str, Any] = {"type": "length", "length": cap}
        elif word:
            reason = {"type": "stop", "matched": word}
            text = text[: text.find(word)]  # trim_matched_stop: the text only
        else:
            reason = {"type": "stop", "matched": EOS}
        sampled = len(ids)  # counted in completion_tokens, the stop token too
        if reason.get("matched") == EOS:
            ids = ids[:-1]  # trim_matched_stop: a matched stop token leaves the ids
        if self.abort_once:
            self.abort_once = False
            reason = {"type": "abort", "message": "weights updated", "status_code": 503,
                      "err_type": "ServiceUnavailable"}
        return httpx.Response(200, json={
            "text": text, "output_ids": ids,
            "meta_info": {"id": "r1", "finish_reason": reason, "prompt_tokens": len(body["input_ids"]),
                          "weight_version": "7", "completion_tokens": sampled, "cached_tokens": 0,
                          "e2e_latency": 0.01,
                          "output_token_logprobs": [[-0.5, i, None] for i in ids]}})

"""llama.cpp's token endpoints on the simulator: `/apply-template`, `/tokenize`, `/detokenize`, `/completion`.

Token-in mode (`collector.providers.tokenin`) talks to `llama-server` through these four
endpoints; the simulator serves them with llama.cpp's request and reply shapes (its
tools/server source: `to_json_non_oaicompat` for `/completion`), so a token-in run can be
checked against the same presets as a re-rendering run on the chat endpoint:

- `POST /apply-template` (`messages`, `tools`) -> `{"prompt": text}`: the simulated template
  (`collector.sim.tokens.render_prompt`) with the generation prompt, the preset's drift
  included, so `/tokenize` of it (BOS added) gives the chat endpoint's `prompt_token_ids`
  for the same messages. A history ending on an assistant turn is a prefill in llama.cpp:
  refused for a thinking model ("Assistant response prefill is incompatible with
  enable_thinking."), for a turn with calls, and for two assistant turns at the end; a plain
  text turn is continued (its content follows the generation prompt).
- `POST /tokenize` (`content`, `add_special` default false, `parse_special` default true,
  `with_pieces`) -> `{"tokens": [...]}`; `POST /detokenize` (`tokens`) -> `{"content": text}`,
  exact (`collector.sim.vocab`).
- `POST /completion` (`prompt` as ids, text, or both mixed; `n_predict`, `stop`,
  `return_tokens`, `n_probs`, `temperature`, `seed`, ...): the prompt is read back into the
  conversation it renders (roles, tool definitions, calls, results; results answer the
  calls in order, as in a Hermes template), and the same policy and preset as the chat
  endpoint write the turn. Ids sent are taken as given: no drift is applied to them. The
  reply is the raw text: the thought first (a thinking preset), then the preamble, then each
  call as a `<tool_call>{"name": ..., "arguments": ...}</tool_call>` block; `tokens` are its
  ids (as many as the chat endpoint's `completion_tokens` for that turn), `stop_type` is
  `limit` for a turn cut at `n_predict`, `word` when a stop string matched, else `eos`.
  A matched stop string is removed from `content`; `tokens` still hold the ids up to the
  one that completed it, and `completion_probabilities` lack as many entries as the stop
  string has tokens, as llama.cpp trims them.

The preset is the `model` of the body (llama-server's router mode), or the path prefix of
`/llamacpp/{model}/...`, so one simulator serves a llama-server per preset: the token-in
client's root is its base URL without `/v1`. Errors are llama.cpp's
`{"error": {"code", "message", "type"}}` with a non-2xx status.

Tests: tests/sim/test_completion.py, tests/episode/test_tokenin_sim.py.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

from collector.sim.errors import SimError
from collector.sim.generate import Generation, generate
from collector.sim.history import DEFAULT_CAP
from collector.sim.policy import HistoryItem, decide
from collector.sim.presets import ModelPreset
from collector.sim.tokens import OutputTokens, logprob_of, render_prompt
from collector.sim.vocab import BEGIN, SPECIALS, detokenize, token_text, tokenize

__all__ = ["OUTPUT_ONLY", "LlamaError", "apply_template", "complete", "context_overflow", "detokenize_body",
           "error_payload", "prompt_of", "read_prompt", "tokenize_body"]

_TYPES = {400: "invalid_request_error", 404: "not_found_error", 429: "unavailable_error",
          500: "server_error", 501: "not_supported_error", 503: "unavailable_error"}

OUTPUT_ONLY = frozenset({"return_tokens", "n_probs", "cache_prompt", "post_sampling_probs", "stream",
                         "model", "response_fields", "timings_per_token"})
"""`/completion` fields that change how a reply is rendered, never which turn is generated."""


LlamaError = SimError
"""A request llama-server refuses: its status and message (the simulator's one refusal type)."""


def error_payload(error: SimError, kind: str | None = None, **extra: int) -> dict[str, Any]:
    """llama.cpp's error body for `error`."""
    return {"error": {"code": error.status, "message": error.message,
                      "type": kind or _TYPES.get(error.status, "server_error"), **extra}}


def context_overflow(prompt_tokens: int, window: int) -> dict[str, Any]:
    """llama-server's answer (a 400) to a prompt longer than its context."""
    error = SimError(400, "the request exceeds the available context size, try increasing it")
    return error_payload(error, "exceed_context_size_error", n_prompt_tokens=prompt_tokens, n_ctx=window)


def _flag(body: dict[str, Any], key: str, default: bool) -> bool:
    value = body.get(key, default)
    if not isinstance(value, bool):
        raise LlamaError(400, f"\"{key}\" must be a boolean")
    return value


def _int(body: dict[str, Any], key: str, default: int) -> int:
    value = body.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise LlamaError(400, f"\"{key}\" must be an integer")
    return value


# --- /apply-template ---


def _checked_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise LlamaError(400, "'messages' is required and must be a non-empty array")
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise LlamaError(400, f"messages[{i}]: each message needs a string 'role'")
        content = msg.get("content")
        if content is not None and not isinstance(content, str | list):
            raise LlamaError(400, f"messages[{i}]: 'content' must be a string or an array of parts")
        calls = msg.get("tool_calls")
        if calls is None:
            continue
        if not isinstance(calls, list):
            raise LlamaError(400, f"messages[{i}]: 'tool_calls' must be an array")
        for j, call in enumerate(calls):
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise LlamaError(400, f"messages[{i}].tool_calls[{j}]: missing function.name")
            args = fn.get("arguments")
            if not isinstance(args, str):
                raise LlamaError(400, f"messages[{i}].tool_calls[{j}]: arguments must be a string")
            try:
                json.loads(args)
            except ValueError:
                # The template parses replayed arguments (tojson needs an object) and fails,
                # as the chat endpoint does on the same history.
                raise LlamaError(500, f"messages[{i}].tool_calls[{j}]: failed to parse tool call "
                                      "arguments as JSON") from None
    return messages


def _tool_names(body: dict[str, Any]) -> tuple[str, ...]:
    names: list[str] = []
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise LlamaError(400, "'tools' must be an array")
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise LlamaError(400, "tools[] entries need function.name")
        names.append(fn["name"])
    return tuple(names)


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return content if isinstance(content, str) else ""


def apply_template(preset: ModelPreset, body: dict[str, Any]) -> dict[str, Any]:
    """`/apply-template`'s reply: `{"prompt": the template's text}` (see the module docstring)."""
    messages = _checked_messages(body)
    tools = _tool_names(body)
    prefill = ""
    if messages[-1]["role"] == "assistant":
        last = messages[-1]
        if len(messages) > 1 and messages[-2]["role"] == "assistant":
            raise LlamaError(400, "Cannot have 2 or more assistant messages at the end of the list.")
        if preset.thinking is not None:
            raise LlamaError(400, "Assistant response prefill is incompatible with enable_thinking.")
        if last.get("tool_calls"):
            raise LlamaError(400, "Cannot continue an assistant message that contains tool calls")
        prefill = _text(last.get("content"))
        messages = messages[:-1]
    text = render_prompt(messages, tools, preset.rerender_history, preset.template_drift)
    return {"prompt": text + prefill}


# --- /tokenize, /detokenize ---


def tokenize_body(body: dict[str, Any]) -> dict[str, Any]:
    """`/tokenize`'s reply."""
    content = body.get("content")
    if not isinstance(content, str):
        raise LlamaError(400, "\"content\" must be provided")
    ids = tokenize(content, _flag(body, "parse_special", True))
    if _flag(body, "add_special", False):
        ids = [BEGIN, *ids]
    if not _flag(body, "with_pieces", False):
        return {"tokens": ids}
    return {"tokens": [{"id": i, "piece": token_text(i)} for i in ids]}


def _ids(value: Any, where: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise LlamaError(400, f"\"{where}\" must be an array of token ids")
    return value


def detokenize_body(body: dict[str, Any]) -> dict[str, Any]:
    """`/detokenize`'s reply."""
    ids = _ids(body.get("tokens"), "tokens")
    try:
        return {"content": detokenize(ids)}
    except ValueError as exc:
        raise LlamaError(400, str(exc)) from None


# --- /completion ---


def prompt_of(body: dict[str, Any]) -> list[int]:
    """The prompt's ids: token ids as given; text tokenized with BOS and markup, as llama.cpp does."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return [BEGIN, *tokenize(prompt)]
    if not isinstance(prompt, list) or not prompt:
        raise LlamaError(400, "\"prompt\" must be provided (text, or an array of token ids)")
    if any(isinstance(p, list) for p in prompt):
        raise LlamaError(501, "several prompts in one request are not simulated")
    ids: list[int] = [BEGIN] if isinstance(prompt[0], str) else []
    for part in prompt:
        if isinstance(part, str):
            ids += tokenize(part)
        elif isinstance(part, int) and not isinstance(part, bool):
            if token_text(part) is None:
                raise LlamaError(400, f"invalid token id {part} in the prompt")
            ids.append(part)
        else:
            raise LlamaError(400, "\"prompt\" must be text, or an array of token ids and text")
    return ids


@dataclass(slots=True)
class Conversation:
    """A prompt read back: the history the policy reads and the offered tools."""

    history: list[HistoryItem]
    tools: tuple[str, ...]


def _call_item(body: str, call_id: str) -> HistoryItem:
    try:
        value = json.loads(body)
    except ValueError:
        value = None
    if isinstance(value, dict) and isinstance(value.get("name"), str):
        args = value.get("arguments")
        return "call", call_id, value["name"], args if isinstance(args, dict) else None
    return "call", call_id, "", None


def read_prompt(ids: list[int]) -> Conversation:
    """The conversation a prompt of the simulated template renders (text outside it is ignored)."""
    tools: list[str] = []
    history: list[HistoryItem] = []
    pending: list[tuple[str, str]] = []
    role: int | None = None
    content: list[str] = []
    calls = 0

    def close() -> None:
        nonlocal calls
        text = "".join(content)
        content.clear()
        if role == SPECIAL_ID["<|user|>"]:
            history.append(("user", text))
        elif role == SPECIAL_ID["<|tool|>"]:
            call_id, name = pending.pop(0) if pending else ("", "")
            history.append(("result", call_id, name, text, False))
        elif role == SPECIAL_ID["<|assistant|>"]:
            pending.clear()
            for block in _blocks(text):
                item = _call_item(block, f"call_{calls}")
                calls += 1
                history.append(item)
                pending.append((item[1], item[2]))

    after_tool_def = False
    for token_id in ids:
        text = token_text(token_id) or ""
        if after_tool_def:
            tools.append(text)
            after_tool_def = False
            continue
        if token_id == SPECIAL_ID["<|tool_def|>"]:
            after_tool_def = True
        elif token_id in _ROLE_IDS:
            role = token_id
            content.clear()
        elif token_id == SPECIAL_ID["<|end|>"]:
            close()
            role = None
        elif token_id != BEGIN and role is not None:
            content.append(text)
    return Conversation(history, tuple(tools))


SPECIAL_ID = {text: token_id for token_id, text in SPECIALS.items()}
_ROLE_IDS = frozenset(SPECIAL_ID[t] for t in ("<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"))
_OPEN, _CLOSE = SPECIALS[SPECIAL_ID["<tool_call>"]], "</tool_call>"


def _blocks(text: str) -> list[str]:
    """The closed call blocks of an assistant turn, each `{"name", "arguments"}` JSON text."""
    out: list[str] = []
    pos = 0
    while True:
        start = text.find(_OPEN, pos)
        end = text.find(_CLOSE, start) if start >= 0 else -1
        if start < 0 or end < 0:
            return out
        out.append(text[start + len(_OPEN):end])
        pos = end + len(_CLOSE)


@dataclass(slots=True)
class Completion:
    """One `/completion` turn before rendering (the generation, the ids sampled, how it ended)."""

    gen: Generation
    toks: list[tuple[int, str]]
    content: str
    stop_type: str
    stopping_word: str
    probs: int
    """How many of `toks` have an entry in `completion_probabilities`."""


def _stops(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop") or []
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise LlamaError(400, "\"stop\" must be an array of strings")
    return [s for s in stop if s]


def run_completion(preset: ModelPreset, prompt: list[int], body: dict[str, Any],
                   rng: random.Random) -> Completion:
    """Generate the turn for `prompt` and end it as llama.cpp would (cap, stop strings)."""
    n_predict = _int(body, "n_predict", -1)
    cap = DEFAULT_CAP if n_predict < 0 else n_predict
    stops = _stops(body)
    conversation = read_prompt(prompt)
    gen = generate(decide(conversation.history, frozenset(conversation.tools)), preset, cap, rng)
    toks = OutputTokens(gen).flat()
    text = ""
    for k, (_, piece) in enumerate(toks):
        before = len(text)
        text += piece
        hits = [(text.find(s, max(0, before - len(s) + 1)), s) for s in stops]
        hits = [(at, s) for at, s in hits if at >= 0]
        if hits:
            at, word = min(hits)
            kept = toks[:k + 1]
            # llama.cpp trims as many probabilities as the stop string has tokens.
            return Completion(gen, kept, text[:at], "word", word, max(0, len(kept) - len(tokenize(word))))
    return Completion(gen, toks, text, "limit" if gen.cut else "eos", "", len(toks))


def _prob(token_id: int, text: str) -> dict[str, Any]:
    return {"id": token_id, "token": text, "bytes": list(text.encode()), "logprob": logprob_of(token_id)}


def complete(preset: ModelPreset, prompt: list[int], body: dict[str, Any],
             rng: random.Random) -> tuple[dict[str, Any], Generation]:
    """`/completion`'s reply (llama.cpp's non-OpenAI shape), and the generation behind it."""
    if body.get("stream") is True:
        raise LlamaError(501, "streamed /completion is not simulated; send \"stream\": false")
    n_probs = _int(body, "n_probs", 0)
    return_tokens = _flag(body, "return_tokens", False)
    done = run_completion(preset, prompt, body, rng)
    ids = [t for t, _ in done.toks]
    reply: dict[str, Any] = {
        "index": 0, "content": done.content, "tokens": ids if return_tokens else [], "id_slot": 0,
        "stop": True, "model": preset.name, "tokens_predicted": len(ids), "tokens_evaluated": len(prompt),
        "generation_settings": {
            "n_predict": _int(body, "n_predict", -1), "seed": body.get("seed", -1),
            "temperature": body.get("temperature", 0.8), "stop": _stops(body), "n_probs": n_probs,
        },
        "prompt": detokenize(prompt), "has_new_line": "\n" in done.content, "truncated": False,
        "stop_type": done.stop_type, "stopping_word": done.stopping_word, "tokens_cached": 0,
        "timings": {"prompt_n": len(prompt), "predicted_n": len(ids)},
    }
    if n_probs > 0 and done.probs:
        reply["completion_probabilities"] = [
            {**_prob(token_id, text), "top_logprobs": [_prob(token_id, text)][:n_probs]}
            for token_id, text in done.toks[:done.probs]
        ]
    return reply, done.gen

"""Token-in mode (`sampling.token_in`): every later turn's prompt sent as ids, llama.cpp dialect.

On a multi-turn episode a chat endpoint re-renders the whole history from messages at every
turn, and the ids of turn k+1's prompt need not extend turn k's prompt + output (templates
re-serialize tool calls, strip reasoning, merge seams: docs/tokens.md, "Drift diagnostic").
Here the client sends the prompt as ids instead, built by extending what was already sent
and sampled, so each turn's prompt is by construction the previous prompt + output + the
new tokens: the episode is one training sequence.

Server: llama.cpp `llama-server` (read from its tools/server source and checked against a
real one, `scripts/real_llama/token_truth.py`): `POST /apply-template` (chat messages and
tools -> the template's text, `add_generation_prompt` true), `POST /tokenize`
(`content`, `add_special`, `parse_special`), `POST /completion` (`prompt` as a token array or
text, `n_predict`, `stop`, `return_tokens`, `n_probs`; the reply's `content`, `tokens`,
`completion_probabilities`, `stop_type` `eos`/`word`/`limit`, `stopping_word`,
`tokens_predicted`, `tokens_evaluated`). The endpoint root is the configured chat base URL
without its `/v1`. vLLM (`/v1/completions` with a token prompt, `/tokenize` with messages)
and SGLang (`/generate` with `input_ids`) are not implemented: config accepts only
`token_in_server = "llama.cpp"`.

Per turn:

1. render the whole history with the server's template (`/apply-template`) and tokenize it
   (`/tokenize`, BOS added as the chat endpoint does: measured, the same count as its
   `prompt_tokens`): the server's own re-rendering, kept on the turn for the drift
   diagnostic (`Turn.rerendered_prompt_ids`). On the first turn these ids are the prompt.
2. later turns, the bridge: ids = the previous prompt ids + its output ids + ids(closing +
   suffix), where the suffix is what the template renders after the previous assistant turn
   (the tool results, notices, the next generation prompt) and the closing is the stop string
   that ended that turn when its ids do not hold it (llama.cpp's ids end before a matched
   stop string, like its logprobs; `stopping_word` names it). How the suffix is found and
   proven: the history is rendered twice more with the previous assistant message replaced
   by a one-character text turn ("A", then "B"); the two renders differ only in that
   character, so their common tail is exactly what the template writes after an assistant
   turn's content: its end-of-turn text + the later messages + the generation prompt. The
   bridge is safe when the real render ends with that tail (the template closes a call turn
   the way it closes a text turn) and, before it, with the stop string the ids lack (the
   template puts the closing where the model stopped). `/apply-template` refuses a history
   that ends on an assistant turn (llama.cpp prefills it), which is why the probes keep the
   later messages instead of rendering "through the assistant turn".
3. otherwise the turn falls back to text (the rendered prompt, as a chat endpoint would send
   it) and `Turn.token_in_fallback` says why: `no_previous_ids` (the previous turn returned
   none), `assistant_not_replayed` (the loop did not replay the previous turn: it showed
   nothing), `render_failed` (the server refused a probe render), `suffix_unproven`,
   `stop_text_unproven`.

Output: `/completion` returns raw text, so tool calls are parsed from the template's
`<tool_call>` blocks in it (`text_tool_calls`): a block closed in the text, or by the matched
stop string, is a call (`{"name", "arguments"}` JSON; anything else is malformed, never run);
an unclosed block stays in the text, where `finish_turn`'s `unclosed_template` finds it as
on the chat wire, with every other length signal (`limit` is the cap). The raw finish
reason is `stop_type` verbatim. Transport, retries and errors are `collector.providers.http`'s.

Tests: tests/providers/test_tokenin.py.
"""

from __future__ import annotations

import json
import math
import random
import re
from typing import Any

import httpx

from collector.errors import ProviderError
from collector.providers.base import Endpoint
from collector.providers.chat import chat_messages
from collector.providers.common import as_int, call_from_text, encode_body, finish_turn, merge_extra
from collector.providers.http import Http, Sleep
from collector.turn import (
    ArgStatus,
    FinishClass,
    JSONObject,
    TokenPrefix,
    ToolCall,
    Turn,
    TurnRequest,
    Usage,
)

__all__ = ["CALL_CLOSE", "CALL_OPEN", "TokenInProvider", "common_suffix", "text_tool_calls"]

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
"""The Hermes-style call block the templates served here write (Qwen, the real-llama Gemma)."""
_PARSE_ERRORS = (KeyError, TypeError, AttributeError, IndexError, ValueError)
_PROBES = ("A", "B")
_NAME = re.compile(r'"name"\s*:\s*"([^"\\]{1,200})"')


def common_suffix(a: str, b: str) -> int:
    """How many trailing characters `a` and `b` share."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[-1 - i] == b[-1 - i]:
        i += 1
    return i


def _call(block: str, call_id: str) -> ToolCall:
    """One `<tool_call>` block's body as a call; not `{"name": str, "arguments": object}`:
    malformed (never run), the name kept when one can be read."""
    try:
        value = json.loads(block)
    except ValueError:
        value = None
    if isinstance(value, dict) and isinstance(value.get("name"), str):
        args = value.get("arguments")
        if isinstance(args, str):  # some templates write the arguments as a JSON string
            return call_from_text(call_id, value["name"], args, False)
        if isinstance(args, dict):
            # The block parsed as a whole, so the arguments are valid JSON; their text is the
            # object re-encoded (what llama.cpp's own chat parser hands on, too).
            return call_from_text(call_id, value["name"], json.dumps(args, ensure_ascii=False), False)
    found = _NAME.search(block)
    return ToolCall(call_id, found.group(1) if found else "", None, ArgStatus.MALFORMED,
                    raw_arguments=block, had_wire_id=False)


def text_tool_calls(content: str, stop_text: str, id_prefix: str) -> tuple[str, list[ToolCall]]:
    """(the text outside complete call blocks, the calls), from raw completion text.

    A block is complete when its closer is in the text or is the stop string that ended the
    turn (the server removed it from `content`). An unclosed block is left in the text, so
    the length checks see it as on the chat wire. Call ids are `{id_prefix}_{k}` (the
    server sends none; `had_wire_id` is False)."""
    text = content + CALL_CLOSE if stop_text == CALL_CLOSE else content
    kept: list[str] = []
    calls: list[ToolCall] = []
    pos = 0
    while True:
        start = text.find(CALL_OPEN, pos)
        end = text.find(CALL_CLOSE, start + len(CALL_OPEN)) if start >= 0 else -1
        if start < 0 or end < 0:
            rest = text[pos:]
            if stop_text == CALL_CLOSE and rest.endswith(CALL_CLOSE):
                rest = rest[: -len(CALL_CLOSE)]  # a stray closer we added ourselves
            kept.append(rest)
            break
        kept.append(text[pos:start])
        calls.append(_call(text[start + len(CALL_OPEN):end].strip(), f"{id_prefix}_{len(calls)}"))
        pos = end + len(CALL_CLOSE)
    joined = "".join(kept)
    return (joined.strip() if calls else joined), calls


def _ints(value: Any) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ValueError("not a list of token ids")
    return value


class TokenInProvider:
    """The token-in adapter for llama.cpp's `llama-server` (see the module docstring)."""

    kind = "chat"

    def __init__(
        self,
        endpoint: Endpoint,
        client: httpx.AsyncClient,
        *,
        sleep: Sleep | None = None,
        rng: random.Random | None = None,
    ) -> None:
        headers = {"authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
        self._http = Http(client, endpoint, "chat", headers, sleep, rng)
        root = endpoint.base_url.rstrip("/")
        self._root = root[: -len("/v1")] if root.endswith("/v1") else root

    async def _post(self, path: str, body: JSONObject, extra: dict[str, str]) -> tuple[Any, float]:
        data = encode_body(body)
        return await self._http.retrying(lambda: self._http.post_json(self._root + path, data, extra))

    async def render(self, messages: list[JSONObject], tools: list[JSONObject] | None,
                     extra: dict[str, str]) -> str:
        """The server's template applied to `messages` (with the generation prompt)."""
        body: JSONObject = {"messages": messages}
        if tools:
            body["tools"] = tools
        payload, _ = await self._post("/apply-template", body, extra)
        prompt = payload.get("prompt") if isinstance(payload, dict) else None
        if not isinstance(prompt, str):
            raise self._http.protocol_error("apply-template reply has no prompt text")
        return prompt

    async def tokenize(self, text: str, add_special: bool, extra: dict[str, str]) -> list[int]:
        """The server's tokenizer on `text`, special tokens parsed (template markup is special)."""
        payload, _ = await self._post(
            "/tokenize", {"content": text, "add_special": add_special, "parse_special": True}, extra)
        try:
            return list(_ints(payload["tokens"]))
        except _PARSE_ERRORS:
            raise self._http.protocol_error("tokenize reply has no token ids") from None

    async def _bridge(self, prefix: TokenPrefix, messages: list[JSONObject], tools: list[JSONObject] | None,
                      rendered: str, extra: dict[str, str]) -> tuple[list[int] | None, str | None]:
        """(the prompt ids, None) when the bridge is proven safe, else (None, the reason)."""
        if prefix.ids is None:
            return None, "no_previous_ids"
        at = prefix.assistant_at
        if at >= len(messages) or messages[at].get("role") != "assistant":
            return None, "assistant_not_replayed"
        probes = []
        for char in _PROBES:
            probe = [*messages[:at], {"role": "assistant", "content": char}, *messages[at + 1:]]
            try:
                probes.append(await self.render(probe, tools, extra))
            except ProviderError:  # a template that refuses the probe: the bridge is unproven
                return None, "render_failed"
        tail = common_suffix(*probes)
        if tail == 0 or common_suffix(rendered, probes[0]) < tail:
            return None, "suffix_unproven"
        head = rendered[: len(rendered) - tail]
        if not head.endswith(prefix.stop_text):
            return None, "stop_text_unproven"
        closing = prefix.stop_text + rendered[len(rendered) - tail:]
        return prefix.ids + await self.tokenize(closing, False, extra), None

    async def complete(self, request: TurnRequest) -> Turn:
        p = request.params
        extra = dict(p.extra_headers)
        messages = chat_messages(request.messages)
        tools = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                   "parameters": t.parameters}}
                 for t in request.tools] or None
        rendered = await self.render(messages, tools, extra)
        server_ids = await self.tokenize(rendered, True, extra)
        fallback: str | None = None
        sent: list[int] | str = server_ids
        if request.token_prefix is not None:
            bridged, fallback = await self._bridge(request.token_prefix, messages, tools, rendered, extra)
            sent = bridged if bridged is not None else rendered
        body: JSONObject = {"prompt": sent, "n_predict": request.max_output_tokens, "return_tokens": True,
                            "n_probs": max(1, p.top_logprobs or 0), "cache_prompt": True}
        if p.temperature is not None:
            body["temperature"] = p.temperature
        if p.top_p is not None:
            body["top_p"] = p.top_p
        if p.seed is not None:
            body["seed"] = p.seed
        if p.stop:
            body["stop"] = list(p.stop)
        if p.extra_body:
            merge_extra(body, p.extra_body)
        payload, elapsed = await self._post("/completion", body, extra)
        try:
            turn = self._parse(payload, request, elapsed)
        except _PARSE_ERRORS:
            raise self._http.protocol_error("reply is not a llama.cpp completion") from None
        turn.prompt_token_ids = sent if isinstance(sent, list) else server_ids
        turn.prompt_sent_as_ids = isinstance(sent, list)
        turn.token_in_fallback = fallback
        turn.rerendered_prompt_ids = server_ids
        return turn

    def _parse(self, payload: Any, request: TurnRequest, elapsed: float) -> Turn:
        if payload.get("error"):
            raise self._http.stream_error(payload)
        content = payload["content"]
        if not isinstance(content, str):
            raise ValueError("content is not text")
        stop_type = payload.get("stop_type")
        stop_type = stop_type if isinstance(stop_type, str) else None
        word = payload.get("stopping_word")
        word = word if isinstance(word, str) and stop_type == "word" else ""
        tokens = _ints(payload.get("tokens") or [])
        logprobs: list[float] = []
        for entry in payload.get("completion_probabilities") or ():
            value = entry.get("logprob") if isinstance(entry, dict) else None
            if isinstance(value, int | float) and not isinstance(value, bool):
                logprobs.append(float(value))
            else:
                logprobs.append(math.nan)
        # llama.cpp's `tokens` hold the stop string's ids, its probabilities do not (it trims
        # them by tokenizing `stopping_word`): the ids are cut to the ones with a logprob, so
        # ids and logprobs stay aligned and the stop string is the bridge's closing text.
        if word and len(logprobs) < len(tokens):
            tokens = tokens[: len(logprobs)]
        text, calls = text_tool_calls(content, word, f"call_{len(request.messages)}")
        mapped = FinishClass.LENGTH if stop_type == "limit" else (
            FinishClass.TOOL_CALLS if calls else FinishClass.STOP)
        model = payload.get("model")
        turn = finish_turn(
            text=text,
            tool_calls=calls,
            raw_finish_reason=stop_type,
            mapped=mapped,
            says_length=stop_type == "limit",
            usage=Usage(as_int(payload.get("tokens_evaluated")), as_int(payload.get("tokens_predicted"))),
            max_output_tokens=request.max_output_tokens,
            latency_s=elapsed,
            token_ids=list(tokens) or None,
            logprobs=logprobs or None,
            response_model=model if isinstance(model, str) else None,
        )
        turn.unreturned_stop = word or None
        return turn


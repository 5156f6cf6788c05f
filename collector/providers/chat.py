"""OpenAI Chat Completions (`POST {base_url}/chat/completions`), also spoken by vLLM, SGLang,
llama.cpp's server, OpenRouter and most gateways.

`base_url` follows the OpenAI SDK convention and includes the version prefix
(`https://api.openai.com/v1`, `http://localhost:8000/v1`).

Arguments arrive as a JSON *string*, in fragments per `index` when streaming; they are
parsed once, at the end, by `collector.providers.arguments`. The finish reason is trusted for nothing
on its own: vLLM reports `tool_calls` for a call cut at the cap, which `CAP_REACHED` catches
(streams ask for `include_usage` so the count is there), and a Hermes block that the server
could not parse is left in `content`, which `UNCLOSED_TEMPLATE` catches. OpenRouter's
`finish_reason: "error"` and a top-level `error` chunk are mid-stream failures: retried whole.

Reasoning: `message.reasoning` (vLLM), else `reasoning_content` (older vLLM, SGLang,
llama.cpp, DeepSeek), streamed as deltas of the same names, and
`usage.completion_tokens_details.reasoning_tokens`; `reasoning_effort` is sent when set.
Nothing of it is replayed: the wire has no opaque reasoning item, and DeepSeek answers 400
to a `reasoning_content` sent back.

History: system / user / assistant (`tool_calls` with `arguments` as text, `"{}"` for a call
that did not parse) / one `tool` message per call id. The output cap goes in
`max_completion_tokens`, or in `Endpoint.cap_field` (many OSS servers want `max_tokens`).

Policy version: SGLang's `metadata.weight_version` becomes `Turn.policy_version` (source
`server`); a finish of `abort` is re-sent by `Http.retrying` (`collector.providers.finish`).
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import AsyncIterator
from typing import Any

import httpx

from collector.errors import ProviderError, ProviderUnavailable, RequestRejected
from collector.providers.base import Endpoint
from collector.providers.common import (
    as_int,
    call_from_text,
    finish_turn,
    logprob_or_nan,
    merge_extra,
    replay_text,
)
from collector.providers.finish import finish_class
from collector.providers.http import Headers, Http, Sleep
from collector.providers.relay import current_relay
from collector.providers.servercut import or_server_cut
from collector.providers.splice import encode_spliced
from collector.providers.sse import SSEEvent
from collector.turn import (
    AssistantMessage,
    FinishClass,
    JSONObject,
    Message,
    SystemMessage,
    ToolCall,
    ToolResultMessage,
    Turn,
    TurnRequest,
    Usage,
    UserMessage,
)

__all__ = ["ChatProvider", "build_chat_body", "chat_messages"]

_SERVER_ERROR = {"error": {"type": "server_error"}}
_PARSE_ERRORS = (KeyError, TypeError, AttributeError, IndexError, ValueError)


def chat_messages(messages: list[Message]) -> list[JSONObject]:
    """Provider-neutral history in the Chat Completions shape."""
    out: list[JSONObject] = []
    for m in messages:
        if isinstance(m, ToolResultMessage):
            out.append({"role": "tool", "tool_call_id": m.call_id, "content": m.content})
        elif isinstance(m, AssistantMessage):
            item: JSONObject = {"role": "assistant", "content": m.text or None}
            if m.tool_calls:
                item["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": replay_text(c)},
                    }
                    for c in m.tool_calls
                ]
            out.append(item)
        elif isinstance(m, UserMessage):
            out.append({"role": "user", "content": m.text})
        elif isinstance(m, SystemMessage):
            out.append({"role": "system", "content": m.text})
    return out


def build_chat_body(request: TurnRequest, cap_field: str, stream: bool) -> JSONObject:
    """The request body, sampling parameters included and `extra_body` merged last."""
    p = request.params
    body: JSONObject = {"model": request.model, "messages": chat_messages(request.messages)}
    body[cap_field] = request.max_output_tokens
    if request.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
            }
            for t in request.tools
        ]
        if p.tool_choice:
            if p.tool_choice in ("auto", "none", "required"):
                body["tool_choice"] = p.tool_choice
            else:
                body["tool_choice"] = {"type": "function", "function": {"name": p.tool_choice}}
    if p.temperature is not None:
        body["temperature"] = p.temperature
    if p.top_p is not None:
        body["top_p"] = p.top_p
    if p.seed is not None:
        body["seed"] = p.seed
    if p.stop:
        body["stop"] = list(p.stop)
    if p.logprobs or p.token_ids:
        body["logprobs"] = True  # with token_ids too: llama.cpp's ids ride in the logprobs entries
        if p.top_logprobs is not None:
            body["top_logprobs"] = p.top_logprobs
    if p.token_ids:
        body["return_token_ids"] = True  # vLLM (prompt + output ids) and SGLang (output ids)
        body["return_prompt_token_ids"] = True  # SGLang
    if p.reasoning_effort is not None:
        body["reasoning_effort"] = p.reasoning_effort
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    if p.extra_body:
        merge_extra(body, p.extra_body)
    return body


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # some servers send content parts
        return "".join(
            p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    return ""


def _logprobs_of(logprobs: Any, into: list[float], ids: list[int | None]) -> None:
    """Append one logprob per `logprobs.content[]` entry (NaN where the entry has none, so the
    list stays aligned with the tokens) and each entry's `id` (llama.cpp; None elsewhere)."""
    if isinstance(logprobs, dict):
        for entry in logprobs.get("content") or ():
            if not isinstance(entry, dict):
                continue
            into.append(logprob_or_nan(entry.get("logprob")))
            token_id = entry.get("id")
            ids.append(token_id if isinstance(token_id, int) and not isinstance(token_id, bool) else None)


def _ints(value: Any) -> list[int] | None:
    """A list of token ids from the wire, or None when it is not a list of plain ints."""
    if not isinstance(value, list):
        return None
    for v in value:
        if not isinstance(v, int) or isinstance(v, bool):
            return None
    return value


#: The request fields token capture adds; a 400 naming one of them is a refusal of capture.
_CAPTURE_FIELDS = ("logprobs", "return_token_ids", "return_prompt_token_ids")


def _output_ids(token_ids: list[int] | None, logprob_ids: list[int | None]) -> list[int] | None:
    """The sampled ids: the server's `token_ids` (vLLM, SGLang), else the ids its logprobs
    entries carry (llama.cpp), when every entry has one."""
    if token_ids:
        return list(token_ids)
    if logprob_ids and all(i is not None for i in logprob_ids):
        return [i for i in logprob_ids if i is not None]
    return None


def _usage(u: Any) -> Usage:
    if not isinstance(u, dict):
        return Usage()
    return Usage(as_int(u.get("prompt_tokens")), as_int(u.get("completion_tokens")))


def _reasoning_tokens(u: Any) -> int:
    details = u.get("completion_tokens_details") if isinstance(u, dict) else None
    return as_int(details.get("reasoning_tokens")) if isinstance(details, dict) else 0


def _reasoning_of(m: Any) -> str:
    # vLLM renamed `reasoning_content` to `reasoning` (vllm #27752); SGLang, llama.cpp and
    # DeepSeek still send the old name.
    value = m.get("reasoning")
    if not isinstance(value, str):
        value = m.get("reasoning_content")
    return value if isinstance(value, str) else ""


def _map(raw: str | None, has_calls: bool) -> FinishClass:
    # The one table (`collector.providers.finish`); a forced (named) tool choice finishes
    # with "stop" on OpenAI and vLLM, which it reads as tool_calls.
    return finish_class("chat", raw, has_calls)


def _versioned(turn: Turn, metadata: Any) -> None:
    """The server's policy version onto the turn: SGLang's `metadata.weight_version` (its
    non-streamed Chat replies; its stream chunks carry none). vLLM's OpenAI server reports no
    per-request version: there, only a declared one (`provider.policy_version*`) is known."""
    version = metadata.get("weight_version") if isinstance(metadata, dict) else None
    if isinstance(version, int) and not isinstance(version, bool):
        version = str(version)
    if isinstance(version, str) and version:
        turn.policy_version, turn.policy_version_source = version, "server"


class ChatProvider:
    """The Chat Completions adapter. Streaming or not per `Endpoint.streaming`."""

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
        self._url = endpoint.base_url.rstrip("/") + "/chat/completions"
        self._cap_field = endpoint.cap_field or "max_completion_tokens"
        self._streaming = endpoint.streaming
        self._capture_refused = False
        """The server refused the token-capture fields once: they are no longer sent."""

    async def complete(self, request: TurnRequest) -> Turn:
        params = request.params
        if params.token_ids and self._capture_refused:
            request = dataclasses.replace(request, params=dataclasses.replace(params, token_ids=False))
        try:
            return await self._complete(request)
        except RequestRejected as exc:
            # llama.cpp refuses logprobs on a streamed request with tools (HTTP 400 "logprobs is
            # not supported with tools + stream"); a server that knows none of the capture
            # fields (OpenAI: "Unrecognized request argument supplied: return_token_ids")
            # refuses them by name. Capture is on by default and must not fail the run: ask
            # again without it, and from now on; the turn records ids asked for, not returned.
            if not (request.params.token_ids and any(f in str(exc) for f in _CAPTURE_FIELDS)):
                raise
            self._capture_refused = True
            return await self.complete(request)

    async def _complete(self, request: TurnRequest) -> Turn:
        streaming = self._streaming or current_relay() is not None
        built = build_chat_body(request, self._cap_field, streaming)
        body = encode_spliced(built, "messages", request.wire_cache)
        cap = request.max_output_tokens
        extra = request.params.extra_headers
        once = self._stream_once if streaming else self._post_once
        return await or_server_cut(request, self._http.retrying(lambda: once(body, cap, extra)))

    async def _post_once(self, body: bytes, cap: int, extra: Headers) -> Turn:
        payload, elapsed = await self._http.post_json(self._url, body, extra)
        try:
            return self._parse(payload, cap, elapsed)
        except _PARSE_ERRORS:
            raise self._http.protocol_error("reply is not a chat completion") from None

    def _parse(self, payload: Any, cap: int, elapsed: float) -> Turn:
        if payload.get("error"):
            raise self._http.stream_error(payload)
        choice = payload["choices"][0]
        raw = choice.get("finish_reason")
        if raw == "error":
            raise self._http.stream_error(
                choice if "error" in choice else {"error": {"type": "server_error"}}
            )
        message = choice["message"]
        calls: list[ToolCall] = []
        for i, tc in enumerate(message.get("tool_calls") or ()):
            fn = tc["function"]
            wire_id = tc.get("id")
            call_id = wire_id if isinstance(wire_id, str) and wire_id else f"call_gen_{i}"
            calls.append(
                call_from_text(call_id, str(fn.get("name") or ""), fn.get("arguments"), bool(wire_id))
            )
        logprobs: list[float] = []
        logprob_ids: list[int | None] = []
        _logprobs_of(choice.get("logprobs"), logprobs, logprob_ids)
        # vLLM puts the prompt ids at the top level, SGLang on the choice.
        prompt_ids = _ints(payload.get("prompt_token_ids")) or _ints(choice.get("prompt_token_ids"))
        refusal = message.get("refusal")
        turn = finish_turn(
            text=_text_of(message.get("content")),
            tool_calls=calls,
            raw_finish_reason=raw,
            mapped=_map(raw, bool(calls)),
            says_length=raw == "length",
            usage=_usage(payload.get("usage")),
            max_output_tokens=cap,
            latency_s=elapsed,
            refusal=refusal if isinstance(refusal, str) else None,
            token_ids=_output_ids(_ints(choice.get("token_ids")), logprob_ids),
            logprobs=logprobs or None,
            response_id=payload.get("id"),
            response_model=payload.get("model"),
            system_fingerprint=payload.get("system_fingerprint"),
            reasoning=bool(message.get("reasoning_content") or message.get("reasoning")),
            prompt_token_ids=list(prompt_ids) if prompt_ids else None,
            reasoning_text=_reasoning_of(message) or None,
            reasoning_tokens=_reasoning_tokens(payload.get("usage")),
        )
        _versioned(turn, payload.get("metadata"))
        return turn

    async def _stream_once(self, body: bytes, cap: int, extra: Headers) -> Turn:
        acc, elapsed = await self._http.stream(self._url, body, self._consume, extra)
        try:
            return acc.turn(cap, elapsed)
        except _PARSE_ERRORS:
            raise self._http.protocol_error("stream is not chat completion chunks") from None

    async def _consume(self, events: AsyncIterator[SSEEvent]) -> _ChatStream:
        acc = _ChatStream()
        async for event in events:
            if event.data.startswith("[DONE]"):
                return acc
            try:
                acc.feed(json.loads(event.data), self._http)
            except ProviderError:
                raise
            except _PARSE_ERRORS:
                raise self._http.protocol_error("stream chunk is not JSON chat completion chunk") from None
        raise ProviderUnavailable("chat: stream ended without [DONE]")


class _ChatStream:
    """Accumulates chunks of choice 0: text, per-index call fragments, finish reason, usage."""

    __slots__ = (
        "calls",
        "fingerprint",
        "finish",
        "logprob_ids",
        "logprobs",
        "metadata",
        "model",
        "prompt_ids",
        "reasoning",
        "reasoning_text",
        "reasoning_tokens",
        "refusal",
        "relay",
        "response_id",
        "text",
        "token_ids",
        "usage",
    )

    def __init__(self) -> None:
        self.text: list[str] = []
        self.refusal: list[str] = []
        self.calls: dict[int, list[Any]] = {}  # index -> [id, name, [fragments]]
        self.finish: str | None = None
        self.usage = Usage()
        self.logprobs: list[float] = []
        self.token_ids: list[int] = []
        self.logprob_ids: list[int | None] = []
        self.prompt_ids: list[int] | None = None
        self.response_id: str | None = None
        self.model: str | None = None
        self.fingerprint: str | None = None
        self.reasoning = False
        self.reasoning_text: list[str] = []
        self.reasoning_tokens = 0
        self.metadata: Any = None
        self.relay = current_relay()

    def feed(self, chunk: Any, http: Http) -> None:
        # Called once per token on real servers: the common chunk (one choice, one short delta)
        # takes the fewest lookups.
        if chunk.get("error"):
            raise http.stream_error(chunk)
        if self.response_id is None and isinstance(chunk.get("id"), str):
            self.response_id = chunk["id"]
            self.model = chunk.get("model")
            self.fingerprint = chunk.get("system_fingerprint")
        usage = chunk.get("usage")
        if usage and isinstance(usage, dict):
            self.usage = _usage(usage)
            self.reasoning_tokens = _reasoning_tokens(usage)
        if "metadata" in chunk:  # no server streams a version today; kept if one does
            self.metadata = chunk["metadata"]
        if self.prompt_ids is None and "prompt_token_ids" in chunk:  # vLLM: first chunk only
            self.prompt_ids = _ints(chunk["prompt_token_ids"])
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            if delta:
                content = delta.get("content")
                if content and isinstance(content, str):
                    self.text.append(content)
                    if self.relay is not None:
                        self.relay.text(self, content)
                tool_calls = delta.get("tool_calls")
                if tool_calls:
                    self._calls(tool_calls)
                refusal = delta.get("refusal")
                if refusal and isinstance(refusal, str):
                    self.refusal.append(refusal)
                thought = _reasoning_of(delta)
                if thought:
                    self.reasoning = True
                    self.reasoning_text.append(thought)
                    if self.relay is not None:
                        self.relay.reasoning(self, thought)
            logprobs = choice.get("logprobs")
            if logprobs:
                _logprobs_of(logprobs, self.logprobs, self.logprob_ids)
            ids = choice.get("token_ids")
            if ids:
                # Not ints: skipped; the turn's count check (ids vs usage) then says so.
                self.token_ids.extend(_ints(ids) or ())
            finish = choice.get("finish_reason")
            if finish:
                if finish == "error":  # OpenRouter's in-band failure
                    raise http.stream_error(_SERVER_ERROR)  # (a chunk with `error` raised above)
                self.finish = finish

    def _calls(self, tool_calls: Any) -> None:
        for pos, tc in enumerate(tool_calls):
            index = tc.get("index", pos)
            slot = self.calls.get(index)
            if slot is None:
                slot = self.calls[index] = [None, "", []]
            if slot[0] is None and tc.get("id"):
                slot[0] = tc["id"]
            fn = tc.get("function")
            if fn:
                if not slot[1] and fn.get("name"):
                    slot[1] = fn["name"]
                fragment = fn.get("arguments")
                if fragment and isinstance(fragment, str):
                    slot[2].append(fragment)

    def turn(self, cap: int, elapsed: float) -> Turn:
        calls = [
            call_from_text(slot[0] or f"call_gen_{index}", slot[1], "".join(slot[2]), slot[0] is not None)
            for index, slot in sorted(self.calls.items())
        ]
        raw = self.finish
        turn = finish_turn(
            text="".join(self.text),
            tool_calls=calls,
            raw_finish_reason=raw,
            mapped=_map(raw, bool(calls)),
            says_length=raw == "length",
            usage=self.usage,
            max_output_tokens=cap,
            latency_s=elapsed,
            # [DONE] arrived but the choice never finished: the output was cut off.
            stream_cut=raw is None,
            refusal="".join(self.refusal) or None,
            token_ids=_output_ids(self.token_ids, self.logprob_ids),
            logprobs=self.logprobs or None,
            response_id=self.response_id,
            response_model=self.model,
            system_fingerprint=self.fingerprint,
            reasoning=self.reasoning,
            prompt_token_ids=list(self.prompt_ids) if self.prompt_ids else None,
            reasoning_text="".join(self.reasoning_text) or None,
            reasoning_tokens=self.reasoning_tokens,
        )
        _versioned(turn, self.metadata)
        return turn

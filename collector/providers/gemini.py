"""Gemini (`POST {base_url}/v1beta/models/{model}:generateContent`, and
`:streamGenerateContent?alt=sse`); `base_url` is the server root. The key goes in
`x-goog-api-key`, never in the `?key=` query (URLs end up in logs).

Calls arrive whole, as `functionCall` parts with `args` as an *object*, and a tool-call turn
ends with `finishReason: "STOP"` (there is no tool-specific reason): calls are recognised by
their parts. A call cut by `maxOutputTokens` never materialises on the Gemini API; the turn
ends `MAX_TOKENS`, which is a length turn whatever its parts hold. `CONTINUATION` (the
per-request token limit) is a length reason too. Thinking consumes the same cap on 2.5
models, so output tokens are `candidatesTokenCount + thoughtsTokenCount`.

Gemini 2.x often sends calls without `id`: the adapter makes a stable one from the response
id and the call's position (`had_wire_id=False`) and never sends it back; results are linked
by `name` (+ `id` only when the model gave one). Gemini 3 `thoughtSignature`s are kept on the
call and replayed beside it.

A stream has no end marker: the last chunk carries `finishReason`. A stream that closes
without one is a dropped stream (retried). Prompt-level blocks (`promptFeedback.blockReason`,
no candidates) are content_filter turns with the block reason as the incomplete reason.

Thinking: `thought: true` parts are kept verbatim (`Turn.reasoning_items`, their text the
reasoning text, `usageMetadata.thoughtsTokenCount` the count) and replayed first in the
model turn, each `thoughtSignature` on the part that carried it. A thinking turn without a
call may sign its text part instead (streamed, on any of its pieces): that part is kept as a
reasoning item too (`{"text", "thoughtSignature"}`, no `thought`) and replayed as the turn's
text part with its signature, in the text's place. A budget or level is sent
as `thinkingConfig` (`thinkingBudget` or `thinkingLevel`, not both) with `includeThoughts`.

History: system messages go to `systemInstruction`; assistant turns become `model` contents
(text, `functionCall` parts with `args` `{}` for a call that did not parse); tool results
become `functionResponse` parts (`{"output": ...}` or `{"error": ...}`) in a `user` content.

Tests: tests/providers/test_scenarios.py, tests/providers/test_wire_examples.py,
tests/providers/test_replay.py, tests/providers/test_real_servers.py.
"""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from typing import Any

import httpx

from collector.errors import ProviderError, ProviderUnavailable
from collector.providers.base import Endpoint
from collector.providers.common import (
    as_int,
    call_from_object,
    finish_turn,
    merge_extra,
    replay_object,
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
    SystemMessage,
    ToolCall,
    ToolResultMessage,
    Turn,
    TurnRequest,
    Usage,
    UserMessage,
)

__all__ = ["GeminiProvider", "build_gemini_body"]

_PARSE_ERRORS = (KeyError, TypeError, AttributeError, IndexError, ValueError)


def build_gemini_body(request: TurnRequest) -> JSONObject:
    """The request body, sampling parameters included and `extra_body` merged last."""
    system: list[str] = []
    contents: list[JSONObject] = []
    calls: dict[str, ToolCall] = {}

    def add(role: str, part: JSONObject) -> None:
        if contents and contents[-1]["role"] == role:
            contents[-1]["parts"].append(part)
        else:
            contents.append({"role": role, "parts": [part]})

    for m in request.messages:
        if isinstance(m, ToolResultMessage):
            call = calls.get(m.call_id)
            response: JSONObject = {
                "name": m.name,
                "response": {"error" if m.is_error else "output": m.content},
            }
            if call is not None and call.had_wire_id:
                response = {"id": m.call_id, **response}
            add("user", {"functionResponse": response})
        elif isinstance(m, AssistantMessage):
            # Thought parts first, verbatim (each `thoughtSignature` on the part that carried it),
            # then the text part, with the signature it came with when it had one.
            text_part: JSONObject = {"text": m.text}
            for item in m.reasoning_items:
                if _is_signed_text(item):
                    text_part["thoughtSignature"] = item["thoughtSignature"]
                else:
                    add("model", dict(item))
            if m.text or not m.tool_calls:
                add("model", text_part)
            for c in m.tool_calls:
                calls[c.id] = c
                fc: JSONObject = {"name": c.name, "args": replay_object(c)}
                if c.had_wire_id:
                    fc["id"] = c.id
                part: JSONObject = {"functionCall": fc}
                if c.signature:
                    part["thoughtSignature"] = c.signature
                add("model", part)
        elif isinstance(m, UserMessage):
            add("user", {"text": m.text})
        elif isinstance(m, SystemMessage):
            system.append(m.text)
    p = request.params
    config: JSONObject = {"maxOutputTokens": request.max_output_tokens}
    if p.temperature is not None:
        config["temperature"] = p.temperature
    if p.top_p is not None:
        config["topP"] = p.top_p
    if p.seed is not None:
        config["seed"] = p.seed
    if p.stop:
        config["stopSequences"] = list(p.stop)
    if p.thinking_budget is not None or p.reasoning_effort is not None:
        # `thinkingBudget` or `thinkingLevel`, never both (the API refuses the pair).
        thinking: JSONObject = {"includeThoughts": True}
        if p.thinking_budget is not None:
            thinking["thinkingBudget"] = p.thinking_budget
        else:
            thinking["thinkingLevel"] = p.reasoning_effort
        config["thinkingConfig"] = thinking
    if p.logprobs:
        config["responseLogprobs"] = True
        if p.top_logprobs is not None:
            config["logprobs"] = p.top_logprobs
    body: JSONObject = {"contents": contents, "generationConfig": config}
    if system:
        body["systemInstruction"] = {"parts": [{"text": "\n\n".join(system)}]}
    if request.tools:
        body["tools"] = [
            {
                "functionDeclarations": [
                    {"name": t.name, "description": t.description, "parametersJsonSchema": t.parameters}
                    for t in request.tools
                ]
            }
        ]
        choice = p.tool_choice
        if choice in ("auto", "none", "required"):
            mode = {"auto": "AUTO", "none": "NONE", "required": "ANY"}[choice]
            body["toolConfig"] = {"functionCallingConfig": {"mode": mode}}
        elif choice:
            body["toolConfig"] = {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": [choice]}}
    if p.extra_body:
        merge_extra(body, p.extra_body)
    return body


def _is_signed_text(item: JSONObject) -> bool:
    """A reasoning item that is the turn's signed text part, not a thought part."""
    return not item.get("thought") and "text" in item and isinstance(item.get("thoughtSignature"), str)


class _Reply:
    """Parts of candidate 0 gathered over one body or many stream chunks."""

    __slots__ = ("block_reason", "calls", "finish", "logprobs", "model", "reasoning", "reasoning_items",
                 "reasoning_tokens", "relay", "response_id", "text", "text_signature", "usage")

    def __init__(self) -> None:
        self.text: list[str] = []
        self.calls: list[ToolCall] = []
        self.finish: str | None = None
        self.block_reason: str | None = None
        self.usage = Usage()
        self.logprobs: list[float] = []
        self.response_id: str | None = None
        self.model: str | None = None
        self.reasoning = False
        self.reasoning_items: list[JSONObject] = []
        self.reasoning_tokens = 0
        self.text_signature: str | None = None
        self.relay = current_relay()

    def feed(self, chunk: Any, http: Http) -> None:
        if chunk.get("error"):
            raise http.stream_error(chunk)
        if isinstance(chunk.get("responseId"), str):
            self.response_id = chunk["responseId"]
        if isinstance(chunk.get("modelVersion"), str):
            self.model = chunk["modelVersion"]
        u = chunk.get("usageMetadata")
        if isinstance(u, dict) and any(as_int(value) > 0 for value in u.values()):
            # Running totals: overwrite; but a report of all zeros (LiteLLM's stream sends only
            # those) counts nothing, and must not erase a real count sent before it.
            self.usage = Usage(
                as_int(u.get("promptTokenCount")),
                as_int(u.get("candidatesTokenCount")) + as_int(u.get("thoughtsTokenCount")),
            )
            self.reasoning_tokens = as_int(u.get("thoughtsTokenCount"))
        feedback = chunk.get("promptFeedback")
        if isinstance(feedback, dict) and isinstance(feedback.get("blockReason"), str):
            self.block_reason = feedback["blockReason"]
        candidates = chunk.get("candidates") or ()
        if not candidates:
            return
        candidate = candidates[0]
        for part in (candidate.get("content") or {}).get("parts") or ():
            if "functionCall" in part:
                fc = part["functionCall"]
                wire_id = fc.get("id")
                call_id = wire_id if isinstance(wire_id, str) and wire_id else self._made_id(len(self.calls))
                call = call_from_object(call_id, str(fc.get("name") or ""), fc.get("args"), bool(wire_id))
                signature = part.get("thoughtSignature")
                if isinstance(signature, str):
                    call.signature = signature
                self.calls.append(call)
            elif isinstance(part.get("text"), str) and not part.get("thought"):
                self.text.append(part["text"])
                if self.relay is not None:
                    self.relay.text(self, part["text"])
                if isinstance(part.get("thoughtSignature"), str):
                    self.text_signature = part["thoughtSignature"]
            elif part.get("thought"):
                self.reasoning = True
                self.reasoning_items.append(dict(part))
                if self.relay is not None and isinstance(part.get("text"), str):
                    self.relay.reasoning(self, part["text"])
        result = candidate.get("logprobsResult")
        if isinstance(result, dict):
            for entry in result.get("chosenCandidates") or ():
                value = entry.get("logProbability") if isinstance(entry, dict) else None
                if isinstance(value, int | float):
                    self.logprobs.append(float(value))
        if isinstance(candidate.get("finishReason"), str):
            self.finish = candidate["finishReason"]

    def _made_id(self, position: int) -> str:
        # Stable for a given reply; never sent back (had_wire_id=False).
        return f"gemini_{self.response_id or 'call'}_{position}"

    def turn(self, cap: int, elapsed: float) -> Turn:
        raw = self.finish
        if raw is None and self.block_reason:
            mapped = FinishClass.CONTENT_FILTER  # a blocked prompt: no candidate finished
        else:
            mapped = finish_class("gemini", raw, bool(self.calls))  # the one table (providers.finish)
        text = "".join(self.text)
        items = self.reasoning_items
        if self.text_signature is not None:
            # Kept with the reasoning items so the replay can put it back on the text part.
            items = [*items, {"text": text, "thoughtSignature": self.text_signature}]
        return finish_turn(
            text=text,
            tool_calls=self.calls,
            raw_finish_reason=raw,
            mapped=mapped,
            says_length=mapped is FinishClass.LENGTH,
            usage=self.usage,
            max_output_tokens=cap,
            latency_s=elapsed,
            incomplete_reason=self.block_reason,
            logprobs=self.logprobs or None,
            response_id=self.response_id,
            response_model=self.model,
            reasoning=self.reasoning,
            reasoning_text="".join(
                p["text"] for p in self.reasoning_items if isinstance(p.get("text"), str)
            ) or None,
            reasoning_tokens=self.reasoning_tokens,
            reasoning_items=items,
        )


class GeminiProvider:
    """The Gemini adapter. Streaming or not per `Endpoint.streaming`."""

    kind = "gemini"

    def __init__(
        self,
        endpoint: Endpoint,
        client: httpx.AsyncClient,
        *,
        sleep: Sleep | None = None,
        rng: random.Random | None = None,
    ) -> None:
        headers = {"x-goog-api-key": endpoint.api_key} if endpoint.api_key else {}
        self._http = Http(client, endpoint, "gemini", headers, sleep, rng)
        self._base = endpoint.base_url.rstrip("/") + "/v1beta/models/"
        self._streaming = endpoint.streaming

    def _url(self, model: str, streaming: bool) -> str:
        model = model.removeprefix("models/")
        if streaming:
            return f"{self._base}{model}:streamGenerateContent?alt=sse"
        return f"{self._base}{model}:generateContent"

    async def complete(self, request: TurnRequest) -> Turn:
        body = encode_spliced(build_gemini_body(request), "contents", request.wire_cache)
        streaming = self._streaming or current_relay() is not None
        url = self._url(request.model, streaming)
        cap = request.max_output_tokens
        extra = request.params.extra_headers
        once = self._stream_once if streaming else self._post_once
        return await or_server_cut(request, self._http.retrying(lambda: once(url, body, cap, extra)))

    async def _post_once(self, url: str, body: bytes, cap: int, extra: Headers) -> Turn:
        payload, elapsed = await self._http.post_json(url, body, extra)
        try:
            if isinstance(payload, list) and len(payload) == 1:
                payload = payload[0]
            reply = _Reply()
            reply.feed(payload, self._http)
            if reply.finish is None and reply.block_reason is None:
                raise self._http.protocol_error("reply has neither a finish reason nor a block reason")
            return reply.turn(cap, elapsed)
        except _PARSE_ERRORS:
            raise self._http.protocol_error("reply is not a GenerateContentResponse") from None

    async def _stream_once(self, url: str, body: bytes, cap: int, extra: Headers) -> Turn:
        reply, elapsed = await self._http.stream(url, body, self._consume, extra)
        try:
            return reply.turn(cap, elapsed)
        except _PARSE_ERRORS:
            raise self._http.protocol_error("stream is not GenerateContentResponse chunks") from None

    async def _consume(self, events: AsyncIterator[SSEEvent]) -> _Reply:
        reply = _Reply()
        async for event in events:
            try:
                reply.feed(json.loads(event.data), self._http)
            except ProviderError:
                raise
            except _PARSE_ERRORS:
                raise self._http.protocol_error("stream chunk is not a GenerateContentResponse") from None
        if reply.finish is None and reply.block_reason is None:
            raise ProviderUnavailable("gemini: stream ended without a finish reason")
        return reply

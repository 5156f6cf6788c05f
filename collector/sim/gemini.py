"""Gemini (`POST /v1beta/models/{model}:generateContent` and `:streamGenerateContent?alt=sse`).

Rendering follows provider-protocols.md section 4. Arguments are an *object* (`args`) and
a function-call turn ends with `finishReason: "STOP"` (Gemini has no tool-specific reason).

Choice for a call cut by `maxOutputTokens` (section 8 item 7): the Gemini API emits a
`functionCall` only as a whole part, so a call that did not close is dropped; the text
before it is kept and the candidate ends `MAX_TOKENS` (with `content: {"role": "model"}`
and no parts when nothing was produced). A call that did close before the cut, in a turn
with parallel calls, is still shown: only the finish reason says the turn was cut.
Malformed arguments come back the way Gemini reports them: no parts, finish reason
`MALFORMED_FUNCTION_CALL` and a `finishMessage`.

Empty content is refused as the real API refuses it (400 `INVALID_ARGUMENT`): a content with
no parts, and a part with no data (`{"text": ""}`, since proto3 cannot tell an empty string
from an unset one), whatever the role. A collector that replays a turn in which the model
said nothing must fail here, not first in production.

A thinking turn signs its first call part, or, when it has no call, its text part (the
last streamed piece carries it): either must come back on the same part, unchanged.

Calls carry an 8-character `id` (Gemini 3 style); a `functionResponse` is matched by `id`
when its call had one, else by name. The model comes from the URL path.
Streams are `data: <GenerateContentResponse>` events with no end marker; the last one has
the finish reason and the final usage.

Tests: tests/sim/test_validation.py, tests/sim/test_sdks.py.
"""

from __future__ import annotations

import json
from typing import Any

from collector.sim.errors import SimError
from collector.sim.generate import Generation
from collector.sim.history import DEFAULT_CAP, CallLedger, ParsedRequest, require
from collector.sim.policy import HistoryItem
from collector.sim.thinking import call_signature, check, text_signature
from collector.sim.tokenizer import count_tokens

PIECE = 64


def _response_text(response: object) -> tuple[str, bool]:
    if isinstance(response, dict):
        if "error" in response:
            err = response["error"]
            return (err if isinstance(err, str) else json.dumps(err)), True
        out = response.get("output", response)
        return (out if isinstance(out, str) else json.dumps(out)), False
    return json.dumps(response), False


_DATA_FIELDS = ("text", "inlineData", "fileData", "functionCall", "functionResponse", "executableCode",
                "codeExecutionResult")
"""The members of `Part`'s `data` oneof; exactly one must be set (an empty string is unset)."""


def _parts(content: object, where: str) -> list[Any]:
    """The parts of one content, refused the way the real API refuses them: a content without
    parts, and a part whose `data` is unset (`{"text": ""}` is unset in proto3 terms)."""
    if not isinstance(content, dict):
        raise SimError(400, f"* GenerateContentRequest.{where}: must be an object")
    parts = content.get("parts")
    if parts is None or parts == []:
        raise SimError(400, f"* GenerateContentRequest.{where}.parts: contents.parts must not be empty.")
    if not isinstance(parts, list):
        raise SimError(400, f"* GenerateContentRequest.{where}.parts: must be a list")
    for j, part in enumerate(parts):
        if isinstance(part, dict) and not any(part.get(k) not in (None, "") for k in _DATA_FIELDS):
            raise SimError(400, f"* GenerateContentRequest.{where}.parts[{j}].data: required oneof field "
                                "'data' must have one initialized field")
    return parts


def _missing_signature(name: str, position: int) -> str:
    return ("Function call is missing a thought_signature in functionCall parts. This is required for tools "
            "to work correctly, and missing thought_signature may lead to degraded model performance. "
            f"Additional data, function call `default_api:{name}`, position {position}. Please refer to "
            "https://ai.google.dev/gemini-api/docs/thought-signatures for more details.")


def _missing_text_signature(position: int) -> str:
    return ("Text part is missing a thought_signature in a model turn without function calls. Thought "
            "signatures must be returned on the part that carried them. Additional data, text part, "
            f"position {position}. Please refer to https://ai.google.dev/gemini-api/docs/thought-signatures "
            "for more details.")


def parse(body: dict[str, Any]) -> ParsedRequest:
    model = require(body, "model", str, "request")
    contents = require(body, "contents", list, "request")
    if not contents:
        raise SimError(400, "* GenerateContentRequest.contents: contents is not specified")
    history: list[HistoryItem] = []
    ledger = CallLedger()
    unreasoned: str | None = None
    for i, content in enumerate(contents):
        where = f"contents[{i}]"
        parts = _parts(content, where)
        role = content.get("role", "user")
        if role == "model":
            ledger.close_turn()
            first_call = True
            unsigned_text: int | None = None  # position of a text part sent without its signature
            for j, part in enumerate(parts):
                pw = f"{where}.parts[{j}]"
                if not isinstance(part, dict):
                    raise SimError(400, f"{pw}: parts must be objects")
                call = part.get("functionCall")
                if call is None:
                    if isinstance(part.get("text"), str) and not part.get("thought"):
                        if "thoughtSignature" in part:
                            check(part["thoughtSignature"], text_signature(part["text"]),
                                  f"* GenerateContentRequest.{pw}.thought_signature: Corrupted thought "
                                  "signature.")
                        elif unsigned_text is None:
                            unsigned_text = j + 1
                    continue
                name = require(call, "name", str, pw + ".functionCall")
                args = call.get("args", {})
                if not isinstance(args, dict):
                    raise SimError(400, f"{pw}.functionCall.args: must be an object")
                if "thoughtSignature" in part:
                    check(part["thoughtSignature"], call_signature(name, args),
                          f"* GenerateContentRequest.{pw}.thought_signature: Corrupted thought signature.")
                elif first_call and unreasoned is None:
                    unreasoned = _missing_signature(name, j + 1)
                first_call = False
                call_id = call.get("id")
                key = call_id if isinstance(call_id, str) else f"\0{name}\0{j}"
                ledger.open(key, name)
                history.append(("call", key, name, args))
            if first_call and unsigned_text is not None and unreasoned is None:
                unreasoned = _missing_text_signature(unsigned_text)  # no call: the text was signed
        elif role in ("user", "function"):
            texts: list[str] = []
            for j, part in enumerate(parts):
                pw = f"{where}.parts[{j}]"
                if not isinstance(part, dict):
                    raise SimError(400, f"{pw}: parts must be objects")
                resp = part.get("functionResponse")
                if resp is not None:
                    name = require(resp, "name", str, pw + ".functionResponse")
                    rid = resp.get("id")
                    if isinstance(rid, str):
                        ledger.settle(rid)
                        key = rid
                    else:
                        key = ledger.settle_by_name(name)
                    text, is_error = _response_text(resp.get("response"))
                    history.append(("result", key, name, text, is_error))
                elif isinstance(part.get("text"), str):
                    texts.append(part["text"])
            if ledger.pending:
                raise SimError(400, "Please ensure that the number of function response parts is equal to "
                                    "the number of function call parts of the function call turn.")
            if texts:
                history.append(("user", "\n".join(texts)))
        else:
            raise SimError(400, f"{where}.role: Please use a valid role: user, model.")
    ledger.close_turn()
    tools: set[str] = set()
    schemas: dict[str, Any] = {}
    for tool in body.get("tools") or []:
        for decl in (tool.get("functionDeclarations") or []) if isinstance(tool, dict) else []:
            if not isinstance(decl, dict) or not isinstance(decl.get("name"), str):
                raise SimError(400, "tools[].functionDeclarations[]: name is required")
            tools.add(decl["name"])
            schemas[decl["name"]] = decl.get("parametersJsonSchema", decl.get("parameters"))
    config = body.get("generationConfig") or {}
    if not isinstance(config, dict):
        raise SimError(400, "generationConfig must be an object")
    cap = config.get("maxOutputTokens", DEFAULT_CAP)
    if not isinstance(cap, int) or isinstance(cap, bool) or cap < 1:
        raise SimError(400, "generationConfig.maxOutputTokens must be a positive integer")
    thinking = config.get("thinkingConfig") or {}
    if not isinstance(thinking, dict):
        raise SimError(400, "generationConfig.thinkingConfig must be an object")
    if "thinkingBudget" in thinking and "thinkingLevel" in thinking:
        raise SimError(400, "You can only set only one of thinking budget and thinking level.")
    budget = thinking.get("thinkingBudget")
    if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool) or budget < -1):
        raise SimError(400, "generationConfig.thinkingConfig.thinkingBudget must be an integer")
    return ParsedRequest(model=model, history=history, tools=frozenset(tools), cap=cap, tool_schemas=schemas,
                         stream=body.get("stream") is True, unreasoned=unreasoned,
                         thinking_budget=budget if isinstance(budget, int) and budget >= 0 else None,
                         include_thoughts=thinking.get("includeThoughts") is True)


def finish_reason(gen: Generation) -> str:
    if gen.cut:
        return "MAX_TOKENS"
    if any(c.malformed for c in gen.calls):
        return "MALFORMED_FUNCTION_CALL"
    return "STOP"


def _usage(req: ParsedRequest, output_tokens: int, thoughts: int = 0) -> dict[str, Any]:
    # `candidatesTokenCount` excludes the thoughts, reported apart as `thoughtsTokenCount`.
    usage: dict[str, Any] = {"promptTokenCount": req.prompt_tokens}
    thoughts = min(thoughts, output_tokens)
    if output_tokens - thoughts:
        usage["candidatesTokenCount"] = output_tokens - thoughts
    if thoughts:
        usage["thoughtsTokenCount"] = thoughts
    usage["totalTokenCount"] = req.prompt_tokens + output_tokens
    return usage


def _thought_parts(req: ParsedRequest, gen: Generation) -> list[dict[str, Any]]:
    if gen.reasoning_tokens and req.include_thoughts:
        return [{"text": gen.reasoning_text, "thought": True}]
    return []


def _call_parts(gen: Generation) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    for c in gen.calls:
        if c.closed:
            call = {"id": c.call_id[:8], "name": c.name, "args": c.full_object}
            part: dict[str, Any] = {"functionCall": call}
            if gen.reasoning_tokens and not parts:
                # Gemini signs the first call of a thinking turn; it must come back on that part.
                part["thoughtSignature"] = call_signature(c.name, c.full_object)
            parts.append(part)
    return parts


def _text_part(gen: Generation, text: str, last: bool) -> dict[str, Any]:
    """A text part; a thinking turn without a call signs its (last) text part with the whole text."""
    part: dict[str, Any] = {"text": text}
    if last and gen.reasoning_tokens and not any(c.closed for c in gen.calls):
        part["thoughtSignature"] = text_signature(gen.text)
    return part


def _chunk(req: ParsedRequest, gen: Generation, content: dict[str, Any], reason: str | None,
           output_tokens: int) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": content}
    if reason is not None:
        candidate["finishReason"] = reason
    if reason == "MALFORMED_FUNCTION_CALL":
        bad = next(c for c in gen.calls if c.malformed)
        candidate["finishMessage"] = f"Malformed function call: {bad.name}({bad.arguments}"
    candidate["index"] = 0
    return {"candidates": [candidate], "usageMetadata": _usage(req, output_tokens, gen.reasoning_tokens),
            "modelVersion": req.model, "responseId": gen.hex_id[:22]}


def render(req: ParsedRequest, gen: Generation) -> dict[str, Any]:
    reason = finish_reason(gen)
    if reason == "MALFORMED_FUNCTION_CALL":
        return _chunk(req, gen, {}, reason, gen.output_tokens)
    parts = _thought_parts(req, gen)
    parts += [_text_part(gen, gen.text, True)] if gen.text else []
    parts += _call_parts(gen)
    content: dict[str, Any] = {"role": "model", "parts": parts} if parts else {"role": "model"}
    return _chunk(req, gen, content, reason, gen.output_tokens)


def render_stream(req: ParsedRequest, gen: Generation) -> list[str]:
    events: list[str] = []
    reason = finish_reason(gen)
    for part in _thought_parts(req, gen):
        chunk = _chunk(req, gen, {"role": "model", "parts": [part]}, None, gen.reasoning_tokens)
        events.append("data: " + json.dumps(chunk) + "\n\n")
    text = gen.text
    for i in range(0, len(text), PIECE):
        content = {"role": "model", "parts": [_text_part(gen, text[i:i + PIECE], i + PIECE >= len(text))]}
        chunk = _chunk(req, gen, content, None, gen.reasoning_tokens + count_tokens(text[:i + PIECE]))
        events.append("data: " + json.dumps(chunk) + "\n\n")
    if reason != "MALFORMED_FUNCTION_CALL":
        for part in _call_parts(gen):
            events.append("data: " + json.dumps(_chunk(req, gen, {"role": "model", "parts": [part]}, None,
                                                       gen.output_tokens)) + "\n\n")
    last: dict[str, Any] = {} if reason == "MALFORMED_FUNCTION_CALL" else {"role": "model"}
    events.append("data: " + json.dumps(_chunk(req, gen, last, reason, gen.output_tokens)) + "\n\n")
    return events

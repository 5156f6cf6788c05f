"""Anthropic Messages (`POST /v1/messages`): strict parsing and rendering.

Rendering follows provider-protocols.md section 3. `max_tokens` is required (400
`invalid_request_error` without it). Arguments are an *object* (`input`), so only the stop
reason shows a cut: `stop_reason: "max_tokens"`.

Choice for a cut `tool_use` in a non-streaming reply (section 8 item 4 leaves it open):
`input` holds the members that were finished, i.e. whose value was followed by `,` or `}`
before the cut; an unfinished value is dropped whole, never shortened (so `1000` cut after
`10` is absent, not `10`), and a call cut before its first member is `{}`. Streaming sends
the raw `input_json_delta` fragments, which simply stop, then `content_block_stop`,
`message_delta` with the stop reason and cumulative usage, and `message_stop`. Every event
carries its `event:` line (the SDK drops events without one), with a `ping` after the
first block starts, as the real API does.

Malformed arguments and template leaks do not apply: Anthropic's server returns objects.

Empty content is refused as the real API refuses it (400 `invalid_request_error`): a text
block that is empty or only whitespace, in any message, and a message with no content at
all unless it is the final assistant message (a prefill). A collector that replays a turn
in which the model said nothing as `{"type": "text", "text": ""}` must fail here, not first
in production.

Tests: tests/sim/test_validation.py, tests/sim/test_sdks.py.
"""

from __future__ import annotations

import json
from typing import Any

from collector.sim.errors import SimError
from collector.sim.generate import Generation
from collector.sim.history import CallLedger, ParsedRequest, require, text_of
from collector.sim.policy import HistoryItem
from collector.sim.thinking import check, sign

PIECE = 16


def _tool_result_text(block: dict[str, Any], where: str) -> str:
    return text_of(block.get("content"), where)


def _check_not_empty(content: object, blocks: list[Any], where: str, *, final_assistant: bool) -> None:
    """Anthropic's emptiness rules, in its words: no empty or blank text block in any message,
    and no message without content except a final assistant one (a prefill to continue)."""
    if content == "" or not blocks:
        if not final_assistant:
            raise SimError(400, f"{where}: all messages must have non-empty content except for the "
                                "optional final assistant message")
        return
    for block in blocks:
        if isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str):
            if not block["text"]:
                raise SimError(400, "messages: text content blocks must be non-empty")
            if block["text"].isspace():
                raise SimError(400, "messages: text content blocks must contain non-whitespace text")


def parse(body: dict[str, Any]) -> ParsedRequest:
    model = require(body, "model", str, "request")
    if "max_tokens" not in body:
        raise SimError(400, "max_tokens: Field required", param="max_tokens")
    cap = body["max_tokens"]
    if not isinstance(cap, int) or isinstance(cap, bool) or cap < 1:
        raise SimError(400, "max_tokens: must be a positive integer", param="max_tokens")
    messages = require(body, "messages", list, "request")
    if not messages:
        raise SimError(400, "messages: at least one message is required", param="messages")
    system = body.get("system")
    if system is not None:
        text_of(system, "system")
    budget = _thinking_budget(body.get("thinking"), cap)
    history: list[HistoryItem] = []
    ledger = CallLedger()
    unreasoned: str | None = None
    for i, msg in enumerate(messages):
        where = f"messages.{i}"
        role = require(msg, "role", str, where)
        content = msg.get("content")
        blocks: list[Any] = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list):
            raise SimError(400, f"{where}.content: must be a string or a list of blocks")
        final_assistant = role == "assistant" and i == len(messages) - 1
        _check_not_empty(content, blocks, where, final_assistant=final_assistant)
        if role == "assistant":
            ledger.close_turn()
            unreasoned = unreasoned or _check_thinking(blocks, where)
            for j, block in enumerate(blocks):
                bw = f"{where}.content.{j}"
                if isinstance(block, dict) and block.get("type") == "tool_use":
                    call_id = require(block, "id", str, bw)
                    name = require(block, "name", str, bw)
                    args = require(block, "input", dict, bw)
                    ledger.open(call_id, name)
                    history.append(("call", call_id, name, args))
                elif not isinstance(block, dict):
                    raise SimError(400, f"{bw}: content blocks must be objects")
        elif role == "user":
            texts: list[str] = []
            for j, block in enumerate(blocks):
                bw = f"{where}.content.{j}"
                if not isinstance(block, dict):
                    raise SimError(400, f"{bw}: content blocks must be objects")
                if block.get("type") == "tool_result":
                    call_id = require(block, "tool_use_id", str, bw)
                    try:
                        name = ledger.settle(call_id)
                    except SimError as exc:
                        raise SimError(400, f"{bw}: unexpected `tool_use_id` found in `tool_result` blocks: "
                                            f"{call_id}. Each `tool_result` block must have a corresponding "
                                            "`tool_use` block in the previous message.") from exc
                    history.append(("result", call_id, name, _tool_result_text(block, bw),
                                    block.get("is_error") is True))
                elif block.get("type") == "text" and isinstance(block.get("text"), str):
                    texts.append(block["text"])
            if ledger.pending:
                missing = ", ".join(ledger.pending)
                raise SimError(400, f"{where}: `tool_use` ids were found without `tool_result` blocks "
                                    f"immediately after: {missing}. Each `tool_use` block must have a "
                                    "corresponding `tool_result` block in the next message.")
            if texts:
                history.append(("user", "\n".join(texts)))
        else:
            raise SimError(400, f"{where}.role: Input should be 'user' or 'assistant'")
    ledger.close_turn()
    tools: set[str] = set()
    schemas: dict[str, Any] = {}
    for tool in body.get("tools") or []:
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise SimError(400, "tools: each tool needs a name", param="tools")
        tools.add(tool["name"])
        schemas[tool["name"]] = tool.get("input_schema")
    return ParsedRequest(model=model, history=history, tools=frozenset(tools), cap=cap, tool_schemas=schemas,
                         stream=body.get("stream") is True, thinking_budget=budget, unreasoned=unreasoned)


def _thinking_budget(thinking: object, cap: int) -> int | None:
    """`thinking: {type: "enabled", budget_tokens}` checked as the API checks it."""
    if thinking is None or (isinstance(thinking, dict) and thinking.get("type") == "disabled"):
        return None
    if not isinstance(thinking, dict) or thinking.get("type") != "enabled":
        raise SimError(400, "thinking: Input tag does not match any of the expected tags: "
                            "'disabled', 'enabled'")
    budget = thinking.get("budget_tokens")
    if not isinstance(budget, int) or isinstance(budget, bool):
        raise SimError(400, "thinking.enabled.budget_tokens: Field required")
    if budget < 1024:
        raise SimError(400, "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024")
    if budget >= cap:
        raise SimError(400, "`max_tokens` must be greater than `thinking.budget_tokens`.")
    return budget


def _check_thinking(blocks: list[Any], where: str) -> str | None:
    """Verify every thinking block's signature (400 if altered; the simulator issues no
    `redacted_thinking`, so those pass as they are); the 400 for a `tool_use`
    turn that does not start with thinking, for a thinking model (`ParsedRequest.unreasoned`)."""
    for j, block in enumerate(blocks):
        if not isinstance(block, dict):
            continue
        if block.get("type") == "thinking":
            text = block.get("thinking")
            check(block.get("signature"), sign("anthropic", text if isinstance(text, str) else ""),
                  f"{where}.content.{j}: Invalid `signature` in `thinking` block")
    uses_tools = any(isinstance(b, dict) and b.get("type") == "tool_use" for b in blocks)
    first = blocks[0].get("type") if blocks and isinstance(blocks[0], dict) else None
    if uses_tools and first not in ("thinking", "redacted_thinking"):
        return (f"{where}.content.0.type: Expected `thinking` or `redacted_thinking`, but found `{first}`. "
                "When `thinking` is enabled, a final `assistant` message must start with a thinking block "
                "(preceeding the lastmost set of `tool_use` and `tool_result` blocks). We recommend you "
                "include thinking blocks from previous turns.")
    return None


def stop_reason(gen: Generation) -> str:
    if gen.cut:
        return "max_tokens"
    return "tool_use" if gen.calls else "end_turn"


def _thinking_block(gen: Generation) -> dict[str, Any]:
    return {"type": "thinking", "thinking": gen.reasoning_text,
            "signature": sign("anthropic", gen.reasoning_text)}


def _content(gen: Generation) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if gen.reasoning_tokens:
        blocks.append(_thinking_block(gen))
    if gen.text:
        blocks.append({"type": "text", "text": gen.text})
    for c in gen.calls:
        blocks.append({"type": "tool_use", "id": "toolu_" + c.call_id, "name": c.name,
                       "input": c.full_object if c.closed else c.partial_object})
    return blocks


def _usage(req: ParsedRequest, output_tokens: int) -> dict[str, Any]:
    return {"input_tokens": req.prompt_tokens, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
            "output_tokens": output_tokens}


def render(req: ParsedRequest, gen: Generation) -> dict[str, Any]:
    return {"id": "msg_" + gen.hex_id, "type": "message", "role": "assistant", "model": req.model,
            "content": _content(gen), "stop_reason": stop_reason(gen), "stop_sequence": None,
            "usage": _usage(req, gen.output_tokens)}


def render_stream(req: ParsedRequest, gen: Generation) -> list[str]:
    events: list[str] = []

    def emit(kind: str, payload: dict[str, Any]) -> None:
        events.append(f"event: {kind}\ndata: {json.dumps({'type': kind, **payload})}\n\n")

    emit("message_start", {"message": {
        "id": "msg_" + gen.hex_id, "type": "message", "role": "assistant", "model": req.model, "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": _usage(req, 1)}})
    index = 0
    if gen.reasoning_tokens:
        block = _thinking_block(gen)
        emit("content_block_start", {"index": 0, "content_block": {"type": "thinking", "thinking": "",
                                                                   "signature": ""}})
        emit("ping", {})
        for i in range(0, len(gen.reasoning_text), PIECE):
            emit("content_block_delta", {"index": 0, "delta": {"type": "thinking_delta",
                                                               "thinking": gen.reasoning_text[i:i + PIECE]}})
        emit("content_block_delta", {"index": 0, "delta": {"type": "signature_delta",
                                                           "signature": block["signature"]}})
        emit("content_block_stop", {"index": 0})
        index = 1
    if gen.text:
        emit("content_block_start", {"index": index, "content_block": {"type": "text", "text": ""}})
        if index == 0:
            emit("ping", {})
        for i in range(0, len(gen.text), PIECE):
            emit("content_block_delta", {"index": index, "delta": {"type": "text_delta",
                                                                   "text": gen.text[i:i + PIECE]}})
        emit("content_block_stop", {"index": index})
        index += 1
    for c in gen.calls:
        emit("content_block_start", {"index": index, "content_block": {
            "type": "tool_use", "id": "toolu_" + c.call_id, "name": c.name, "input": {}}})
        if index == 0:
            emit("ping", {})
        emit("content_block_delta",
             {"index": index, "delta": {"type": "input_json_delta", "partial_json": ""}})
        args = c.clean_arguments[:len(c.arguments)]
        for i in range(0, len(args), PIECE):
            emit("content_block_delta", {"index": index, "delta": {"type": "input_json_delta",
                                                                   "partial_json": args[i:i + PIECE]}})
        emit("content_block_stop", {"index": index})
        index += 1
    emit("message_delta", {"delta": {"stop_reason": stop_reason(gen), "stop_sequence": None},
                           "usage": {"output_tokens": gen.output_tokens}})
    emit("message_stop", {})
    return events

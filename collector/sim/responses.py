"""OpenAI Responses (`POST /v1/responses`): strict parsing and rendering.

Rendering follows provider-protocols.md section 2. There is no finish reason: a cut turn is
`status: "incomplete"` with `incomplete_details.reason: "max_output_tokens"`, and the item
the cut landed in (a `message` or a `function_call`) has `status: "incomplete"`. Arguments
are strings, so the string-side leaks apply. Streams are `event: <type>` + `data:` pairs
with a growing `sequence_number`, ending with `response.completed` or
`response.incomplete`; for a cut call `response.function_call_arguments.done` is still sent
with the partial string (section 8 item 6 notes this is unverified; clients must key off
the terminal event, which is what a faithful client does anyway).

Tests: tests/sim/test_validation.py, tests/sim/test_sdks.py, tests/sim/test_llama_responses.py.
"""

from __future__ import annotations

import json
from typing import Any

from collector.sim.chat import shown_arguments
from collector.sim.errors import SimError
from collector.sim.generate import Generation
from collector.sim.history import (
    DEFAULT_CAP,
    CallLedger,
    ParsedRequest,
    check_json_arguments,
    optional_cap,
    require,
    text_of,
)
from collector.sim.policy import HistoryItem
from collector.sim.thinking import check, sign

PIECE = 16


def parse(body: dict[str, Any]) -> ParsedRequest:
    model = require(body, "model", str, "request")
    raw_input = body.get("input")
    history: list[HistoryItem] = []
    unreasoned: str | None = None
    short_assistant: str | None = None
    if isinstance(raw_input, str):
        history.append(("user", raw_input))
    elif isinstance(raw_input, list) and raw_input:
        ledger = CallLedger()
        after_outputs = False
        reasoned = False  # this turn's reasoning item came before its calls
        for i, item in enumerate(raw_input):
            where = f"input[{i}]"
            if not isinstance(item, dict):
                raise SimError(400, f"{where}: items must be objects.", param=where)
            kind = item.get("type", "message" if "role" in item else None)
            if "type" not in item and item.get("role") == "assistant" and short_assistant is None:
                short_assistant = f"{where}: Cannot determine type of 'item'"
            if kind == "function_call":
                if after_outputs:
                    ledger.close_turn()
                    after_outputs = False
                call_id = require(item, "call_id", str, where)
                if not reasoned and unreasoned is None:
                    unreasoned = (f"Item with call_id {call_id!r} of type 'function_call' was provided "
                                  "without its required 'reasoning' item.")
                name = require(item, "name", str, where)
                args = check_json_arguments(item.get("arguments"), where)
                ledger.open(call_id, name)
                history.append(("call", call_id, name, args))
            elif kind == "function_call_output":
                call_id = require(item, "call_id", str, where)
                name = ledger.settle(call_id)
                history.append(("result", call_id, name, text_of(item.get("output"), where), False))
                after_outputs = True
                reasoned = False
            elif kind == "message":
                role = require(item, "role", str, where)
                ledger.close_turn()
                after_outputs = False
                if role == "user":
                    history.append(("user", text_of(item.get("content"), where)))
                    reasoned = False
                elif role not in ("assistant", "system", "developer"):
                    raise SimError(400, f"{where}: unknown role {role!r}.", param=f"{where}.role")
            elif kind == "reasoning":
                _check_reasoning(item, where)
                reasoned = True
            else:
                raise SimError(400, f"{where}: unsupported item type {kind!r}.", param=f"{where}.type")
        ledger.close_turn()
    else:
        raise SimError(400, "input must be a non-empty string or list of items.", param="input")
    tools: set[str] = set()
    schemas: dict[str, Any] = {}
    for tool in body.get("tools") or []:
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise SimError(400, "tools[] entries need a name.", param="tools")
        tools.add(tool["name"])
        schemas[tool["name"]] = tool.get("parameters")
    cap = optional_cap(body, "max_output_tokens") or DEFAULT_CAP
    include = body.get("include")
    return ParsedRequest(model=model, history=history, tools=frozenset(tools), cap=cap, tool_schemas=schemas,
                         stream=body.get("stream") is True, unreasoned=unreasoned,
                         short_assistant=short_assistant,
                         include_thoughts=isinstance(include, list)
                         and "reasoning.encrypted_content" in include)


def _summary_text(item: dict[str, Any]) -> str:
    summary = item.get("summary")
    parts = summary if isinstance(summary, list) else []
    return "".join(p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))


def _check_reasoning(item: dict[str, Any], where: str) -> None:
    """A replayed reasoning item: its `encrypted_content`, when sent, must be the one issued."""
    item_id = require(item, "id", str, where)
    if "encrypted_content" in item and item["encrypted_content"] is not None:
        check(item["encrypted_content"], sign("responses", item_id, _summary_text(item)),
              f"{where}: The encrypted content for item {item_id} could not be verified.")


def _reasoning_item(req: ParsedRequest, gen: Generation, final: bool) -> dict[str, Any]:
    item_id = "rs_" + gen.hex_id
    summary = [{"type": "summary_text", "text": gen.reasoning_text}] if final else []
    item: dict[str, Any] = {"id": item_id, "type": "reasoning", "summary": summary}
    if req.include_thoughts:
        item["encrypted_content"] = sign("responses", item_id, gen.reasoning_text) if final else None
    return item


def _items(req: ParsedRequest, gen: Generation, final: bool) -> list[dict[str, Any]]:
    """Output items, final (`final=True`) or as first announced by `output_item.added`."""
    items: list[dict[str, Any]] = []
    if gen.reasoning_tokens:
        items.append(_reasoning_item(req, gen, final))
    if gen.text:
        text_cut = gen.cut and not gen.calls
        items.append({"id": "msg_" + gen.hex_id, "type": "message", "role": "assistant",
                      "status": ("incomplete" if text_cut and not _llamacpp(req) else "completed")
                      if final else "in_progress",
                      "content": [_text_part(gen.text)] if final else []})
    for c in gen.calls:
        items.append({"id": "fc_" + c.call_id, "type": "function_call",
                      "status": ("completed" if c.closed or _llamacpp(req) else "incomplete")
                      if final else "in_progress",
                      "arguments": shown_arguments(c, gen.leak) if final else "",
                      "call_id": "call_" + c.call_id, "name": c.name})
    return items


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _response(req: ParsedRequest, gen: Generation, status: str) -> dict[str, Any]:
    done = status != "in_progress"
    usage = None
    if done:
        usage = {"input_tokens": req.prompt_tokens,
                 "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                 "output_tokens": gen.output_tokens,
                 "output_tokens_details": {"reasoning_tokens": gen.reasoning_tokens},
                 "total_tokens": req.prompt_tokens + gen.output_tokens}
    return {
        "id": "resp_" + gen.hex_id, "object": "response", "created_at": gen.created, "status": status,
        "completed_at": gen.created + 1 if status == "completed" else None, "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": None, "max_output_tokens": req.cap, "model": req.model,
        "output": _items(req, gen, final=True) if done else [], "parallel_tool_calls": True,
        "previous_response_id": None, "tool_choice": "auto", "tools": [], "usage": usage,
    }


def _llamacpp(req: ParsedRequest) -> bool:
    return req.preset is not None and req.preset.responses_server == "llamacpp"


def _final_status(req: ParsedRequest, gen: Generation) -> str:
    # llama-server says `completed` for a cut turn too: only `usage.output_tokens` shows it.
    return "incomplete" if gen.cut and not _llamacpp(req) else "completed"


def render(req: ParsedRequest, gen: Generation) -> dict[str, Any]:
    return _response(req, gen, _final_status(req, gen))


def render_stream(req: ParsedRequest, gen: Generation) -> list[str]:
    events: list[str] = []

    no_index = _llamacpp(req)

    def emit(kind: str, payload: dict[str, Any]) -> None:
        if no_index:  # llama-server names items by `item_id` only
            payload = {k: v for k, v in payload.items() if k != "output_index"}
        data = {"type": kind, "sequence_number": len(events), **payload}
        events.append(f"event: {kind}\ndata: {json.dumps(data)}\n\n")

    emit("response.created", {"response": _response(req, gen, "in_progress")})
    emit("response.in_progress", {"response": _response(req, gen, "in_progress")})
    started = _items(req, gen, final=False)
    final = _items(req, gen, final=True)
    for index, (first, last) in enumerate(zip(started, final, strict=True)):
        emit("response.output_item.added", {"output_index": index, "item": first})
        item_id = last["id"]
        if last["type"] == "message":
            text = gen.text
            where = {"item_id": item_id, "output_index": index, "content_index": 0}
            emit("response.content_part.added", {**where, "part": _text_part("")})
            for i in range(0, len(text), PIECE):
                emit("response.output_text.delta", {**where, "delta": text[i:i + PIECE], "logprobs": []})
            emit("response.output_text.done", {**where, "text": text, "logprobs": []})
            emit("response.content_part.done", {**where, "part": _text_part(text)})
        elif last["type"] == "reasoning":
            pass  # announced empty, then whole at `output_item.done` (summary deltas not simulated)
        else:
            args = last["arguments"]
            for i in range(0, len(args), PIECE):
                emit("response.function_call_arguments.delta",
                     {"item_id": item_id, "output_index": index, "delta": args[i:i + PIECE]})
            emit("response.function_call_arguments.done",
                 {"item_id": item_id, "output_index": index, "arguments": args})
        emit("response.output_item.done", {"output_index": index, "item": last})
    status = _final_status(req, gen)
    emit(f"response.{status}", {"response": _response(req, gen, status)})
    return events

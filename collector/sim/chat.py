"""OpenAI Chat Completions (`POST /v1/chat/completions`): strict parsing and rendering.

Rendering follows provider-protocols.md section 1: arguments are always a *string*; a call
cut by the cap keeps its truncated argument string and the reply says `finish_reason:
"length"` (or `"tool_calls"` for the hidden-cut fault, as vLLM streaming and llama.cpp do);
`usage.completion_tokens` equals the cap exactly when the turn was cut. Streams are
`data: <chunk>` events ending with `data: [DONE]`, tool-call arguments arriving as string
fragments per `index`. Leaks (section 6) are rendered here: a delimiter around or after the
arguments, or, for vLLM non-streaming truncation, the raw Hermes block in `content` with
`tool_calls: []`.

Weights (issue 27, `collector.sim.weights`): an SGLang-shaped preset (`token_wire =
"sglang"`) reports the answering version as `metadata.weight_version` on non-streamed
replies (SGLang's streams carry none; vLLM reports none at all); a request aborted by a swap
answers `finish_reason: "abort"` with its partial text, streamed or not.

Tests: tests/sim/test_weights.py, tests/providers/test_sim.py.
"""

from __future__ import annotations

import json
from typing import Any

from collector.sim.errors import SimError
from collector.sim.generate import Generation, SimCall
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
from collector.sim.presets import LeakFamily
from collector.sim.tokens import OutputTokens, Tok, logprobs_block, prompt_ids

PIECE = 16
"""Characters per streamed fragment (four simulated tokens)."""


def parse(body: dict[str, Any]) -> ParsedRequest:
    model = require(body, "model", str, "request")
    messages = require(body, "messages", list, "request")
    if not messages:
        raise SimError(400, "messages must not be empty.", param="messages")
    history: list[HistoryItem] = []
    ledger = CallLedger()
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        role = require(msg, "role", str, where)
        if role == "tool":
            call_id = require(msg, "tool_call_id", str, where)
            name = ledger.settle(call_id)
            history.append(("result", call_id, name, text_of(msg.get("content"), where), False))
            continue
        ledger.close_turn()
        if role in ("user", "system", "developer"):
            text = text_of(msg.get("content"), where)
            if role == "user":
                history.append(("user", text))
        elif role == "assistant":
            calls = msg.get("tool_calls") or []
            if not isinstance(calls, list):
                raise SimError(400, f"{where}: tool_calls must be a list.")
            if msg.get("content") is None and not calls:
                raise SimError(400, f"{where}: an assistant message needs content or tool_calls.")
            for j, call in enumerate(calls):
                cw = f"{where}.tool_calls[{j}]"
                call_id = require(call, "id", str, cw)
                fn = require(call, "function", dict, cw)
                name = require(fn, "name", str, cw)
                args = check_json_arguments(fn.get("arguments"), cw)
                ledger.open(call_id, name)
                history.append(("call", call_id, name, args))
        else:
            raise SimError(400, f"{where}: unknown role {role!r}.", param=f"{where}.role")
    ledger.close_turn()
    tools: list[str] = []
    schemas: dict[str, Any] = {}
    for tool in body.get("tools") or []:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise SimError(400, "tools[] entries need function.name.", param="tools")
        tools.append(fn["name"])
        schemas[fn["name"]] = fn.get("parameters")
    cap = optional_cap(body, "max_completion_tokens", "max_tokens") or DEFAULT_CAP
    stream = body.get("stream") is True
    opts = body.get("stream_options")
    include_usage = stream and isinstance(opts, dict) and opts.get("include_usage") is True
    return ParsedRequest(model=model, history=history, tools=frozenset(tools), cap=cap, stream=stream,
                         include_usage=include_usage, raw_messages=messages, tool_names=tuple(tools),
                         tool_schemas=schemas,
                         return_token_ids=body.get("return_token_ids") is True,
                         return_prompt_token_ids=body.get("return_prompt_token_ids") is True,
                         logprobs=body.get("logprobs") is True)


def refusal(req: ParsedRequest) -> SimError | None:
    """What this server refuses once the model is known: llama.cpp's logprobs + tools + stream."""
    preset = req.preset
    if preset is not None and preset.token_wire == "llamacpp" and req.stream and req.logprobs and req.tools:
        return SimError(400, "logprobs is not supported with tools + stream")
    return None


def shown_arguments(call: SimCall, leak: LeakFamily | None) -> str:
    """The argument string as the (possibly leaky) gateway shows it."""
    args = call.arguments
    if leak == "trailing":
        return args + "<tool_call|>" if call.closed else args
    if leak == "wrapped":
        return "<tool_call>" + args + ("</tool_call>" if call.closed else "")
    if leak == "concatenated" and call.closed:
        return args + '<tool_call|>{"name": ' + json.dumps(call.name) + "}"
    return args


def hermes_block(gen: Generation) -> str:
    """The raw Hermes template text of the turn's calls, as vLLM leaves it in `content`."""
    out = []
    for call in gen.calls:
        block = '<tool_call>\n{"name": ' + json.dumps(call.name) + ', "arguments": ' + call.arguments
        out.append(block + "}\n</tool_call>\n" if call.closed else block)
    return "".join(out)


def swallowed(gen: Generation) -> bool:
    """The server's parser gave up on this whole call turn (the `swallowed` leak)."""
    return gen.leak == "swallowed" and bool(gen.calls) and not gen.cut


def finish_reason(gen: Generation) -> str:
    if swallowed(gen):
        return "stop"
    if gen.cut:
        return "tool_calls" if gen.hidden_cut else "length"
    return "tool_calls" if gen.calls else "stop"


def _usage(req: ParsedRequest, gen: Generation) -> dict[str, Any]:
    return {"prompt_tokens": req.prompt_tokens, "completion_tokens": gen.output_tokens,
            "total_tokens": req.prompt_tokens + gen.output_tokens,
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": gen.reasoning_tokens, "audio_tokens": 0,
                                          "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}}


def render(req: ParsedRequest, gen: Generation) -> dict[str, Any]:
    """The non-streaming `chat.completion` object."""
    message: dict[str, Any] = {"role": "assistant", "content": gen.text or None}
    if gen.reasoning_tokens:
        message[gen.reasoning_field] = gen.reasoning_text
    reason = finish_reason(gen)
    if gen.leak == "hermes_content" and gen.cut_in_call:
        # vLLM's Hermes parser failed on the cut block: raw text in content, no calls, engine's reason.
        message["content"] = gen.text + hermes_block(gen)
        message["tool_calls"] = []
        reason = "length"
    elif swallowed(gen):
        # The stop word matched inside the first call: its block, unclosed, stays in content.
        first = gen.calls[0]
        message["content"] = gen.text + '<tool_call>\n{"name": ' + json.dumps(first.name) + ', "arguments": '
        message["content"] += first.arguments
        message["tool_calls"] = []
    elif gen.calls:
        message["tool_calls"] = [
            {"id": "call_" + c.call_id, "type": "function",
             "function": {"name": c.name, "arguments": shown_arguments(c, gen.leak)}}
            for c in gen.calls
        ]
    message["refusal"] = None
    message["annotations"] = []
    choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": None, "finish_reason": reason}
    reply: dict[str, Any] = {
        "id": "chatcmpl-" + gen.hex_id, "object": "chat.completion", "created": gen.created,
        "model": req.model, "choices": [choice],
        "usage": _usage(req, gen), "service_tier": "default", "system_fingerprint": "fp_sim",
    }
    wire = req.preset.token_wire if req.preset is not None else "vllm"
    if req.logprobs or req.return_token_ids:
        toks = OutputTokens(gen).flat()
        if req.logprobs:
            choice["logprobs"] = logprobs_block(toks, wire == "llamacpp")
        if wire == "vllm" and req.return_token_ids:
            reply["prompt_token_ids"] = _prompt_ids(req)
            choice["token_ids"] = [t for t, _ in toks]
        elif wire == "sglang":
            if req.return_prompt_token_ids:
                choice["prompt_token_ids"] = _prompt_ids(req)
            if req.return_token_ids:
                choice["token_ids"] = [t for t, _ in toks]
    return reply


def _prompt_ids(req: ParsedRequest) -> list[int]:
    preset = req.preset
    rerender = preset is not None and preset.rerender_history
    drift = preset is not None and preset.template_drift
    return prompt_ids(req.raw_messages or [], req.tool_names, rerender, drift)


def render_stream(req: ParsedRequest, gen: Generation) -> list[str]:
    """The SSE events of the streamed reply, `[DONE]` last.

    With token capture each chunk carries the ids (and logprobs) of what it shows: four
    tokens per text or argument piece, a call's head ids on its first chunk, its tail on the
    next chunk; vLLM's `prompt_token_ids` ride on the first chunk.
    """
    head = ('{"id":"chatcmpl-' + gen.hex_id + '","object":"chat.completion.chunk","created":'
            + str(gen.created) + ',"model":' + json.dumps(req.model) + ',"system_fingerprint":"fp_sim",')
    tail = ',"usage":null}' if req.include_usage else "}"
    events: list[str] = []
    preset = req.preset
    wire = preset.token_wire if preset is not None else "vllm"
    drops = preset is not None and preset.stream_drops_token_ids
    with_ids = req.return_token_ids and wire == "vllm" and not drops
    with_logprobs = req.logprobs
    pending: list[Tok] = []

    def chunk(delta: dict[str, Any], reason: str | None = None, toks: list[Tok] | None = None,
              extra: str = "") -> None:
        nonlocal pending
        toks = pending + (toks or [])
        pending = []
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
        if with_logprobs and toks:
            choice["logprobs"] = logprobs_block(toks, wire == "llamacpp")
        if with_ids:
            choice["token_ids"] = [t for t, _ in toks]
        events.append("data: " + head + extra + '"choices":[' + json.dumps(choice) + "]" + tail + "\n\n")

    out = OutputTokens(gen) if (with_ids or with_logprobs) else None
    first_extra = ""
    if with_ids:
        first_extra = '"prompt_token_ids":' + json.dumps(_prompt_ids(req)) + ","
    # The reasoning ids ride on the first chunk, so a stream's ids are in the JSON reply's order.
    pending = list(out.reasoning) if out else []
    chunk({"role": "assistant", "content": "", "refusal": None}, extra=first_extra)
    for i in range(0, len(gen.reasoning_text), PIECE):
        chunk({gen.reasoning_field: gen.reasoning_text[i:i + PIECE]})
    text = gen.text
    per = PIECE // 4  # tokens per piece
    for n, i in enumerate(range(0, len(text), PIECE)):
        chunk({"content": text[i:i + PIECE]}, toks=out.text[n * per:(n + 1) * per] if out else None)
    calls = [] if swallowed(gen) else gen.calls  # held back, then dropped
    for j, c in enumerate(calls):
        call_head, call_args, call_tail = out.calls[j] if out else ([], [], [])
        chunk({"tool_calls": [{"index": c.index, "id": "call_" + c.call_id, "type": "function",
                               "function": {"name": c.name, "arguments": ""}}]}, toks=call_head)
        args = shown_arguments(c, gen.leak)
        starts = list(range(0, len(args), PIECE))
        for n, i in enumerate(starts):
            last = n == len(starts) - 1
            piece_toks = call_args[n * per:] if last else call_args[n * per:(n + 1) * per]
            chunk({"tool_calls": [{"index": c.index, "function": {"arguments": args[i:i + PIECE]}}]},
                  toks=piece_toks)
        pending = list(call_tail)
    chunk({}, finish_reason(gen), toks=out.stray if out else None)
    if req.include_usage:
        events.append("data: " + head + '"choices":[],"usage":' + json.dumps(_usage(req, gen)) + "}\n\n")
    events.append("data: [DONE]\n\n")
    return events


# --- issue 27: the weight version on a reply, and a request aborted by a weight swap ---


def reports_version(req: ParsedRequest) -> bool:
    """Whether this server reports the answering weights: SGLang does (`metadata`), vLLM not."""
    return req.preset is not None and req.preset.token_wire == "sglang" and not req.stream


def with_weight_version(reply: dict[str, Any], version: str) -> dict[str, Any]:
    """SGLang's non-streamed Chat reply: `metadata: {"weight_version": ...}` at the top level."""
    reply["metadata"] = {"weight_version": version}
    return reply


def _aborted_text(gen: Generation) -> tuple[str, int]:
    # What had been generated when the swap came: the first half of the visible text, and the
    # tokens it took (never the cap: an abort is not a cut).
    text = gen.text[: len(gen.text) // 2]
    return text, max(0, min(gen.output_tokens, gen.cap) // 2)


def render_abort(req: ParsedRequest, gen: Generation, version: str) -> dict[str, Any]:
    """The reply of a request aborted mid-generation, as vLLM and SGLang send it: a 200 with the
    partial output, no tool calls, `finish_reason: "abort"`."""
    text, tokens = _aborted_text(gen)
    choice = {"index": 0, "message": {"role": "assistant", "content": text or None, "refusal": None},
              "logprobs": None, "finish_reason": "abort"}
    reply: dict[str, Any] = {
        "id": "chatcmpl-" + gen.hex_id, "object": "chat.completion", "created": gen.created,
        "model": req.model, "choices": [choice],
        "usage": {"prompt_tokens": req.prompt_tokens, "completion_tokens": tokens,
                  "total_tokens": req.prompt_tokens + tokens},
    }
    return with_weight_version(reply, version) if reports_version(req) else reply


def render_abort_stream(req: ParsedRequest, gen: Generation) -> list[str]:
    """The streamed form: the partial text, a last chunk saying `abort`, usage, `[DONE]`."""
    text, tokens = _aborted_text(gen)
    head = {"id": "chatcmpl-" + gen.hex_id, "object": "chat.completion.chunk", "created": gen.created,
            "model": req.model}
    events = []
    for delta, reason in (({"role": "assistant", "content": text}, None), ({}, "abort")):
        chunk = {**head, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}]}
        events.append("data: " + json.dumps(chunk) + "\n\n")
    if req.include_usage:
        usage = {"prompt_tokens": req.prompt_tokens, "completion_tokens": tokens,
                 "total_tokens": req.prompt_tokens + tokens}
        events.append("data: " + json.dumps({**head, "choices": [], "usage": usage}) + "\n\n")
    events.append("data: [DONE]\n\n")
    return events

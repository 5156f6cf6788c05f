"""Tool calls parsed from raw completion text: the chat template's `<tool_call>` blocks.

The token-in endpoints (llama.cpp `/completion`, vLLM `/v1/completions`, SGLang `/generate`)
return the model's raw text, not parsed calls, so the calls are read here from the
Hermes-style blocks the served templates write (Qwen, the real-llama Gemma): a block closed
in the text, or by the matched stop string the server removed from the text, is a call
(`{"name", "arguments"}` JSON; anything else is malformed, never run); an unclosed block
stays in the text, where `finish_turn`'s `unclosed_template` finds it as on the chat wire.

Tests: tests/providers/test_tokenin.py, tests/providers/test_tokenin_servers.py.
"""

from __future__ import annotations

import json
import re

from collector.providers.common import call_from_text
from collector.turn import ArgStatus, ToolCall

__all__ = ["CALL_CLOSE", "CALL_OPEN", "text_tool_calls"]

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
"""The Hermes-style call block the templates served here write (Qwen, the real-llama Gemma)."""
_NAME = re.compile(r'"name"\s*:\s*"([^"\\]{1,200})"')


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

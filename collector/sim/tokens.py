"""Deterministic token ids and logprobs for the simulator's Chat Completions replies.

The ids follow the simulator's own tokenizer (`collector.sim.tokenizer`): one id per run of
up to 4 characters of a segment, two head ids per call (the opener and the name), one tail
id when the call closed. So a turn's output ids are exactly `usage.completion_tokens`
many, cut or not. A piece's id is a hash of its text, so the same text gives the same ids
in a reply and, replayed, in the next prompt.

The prompt is rendered from the request's messages with the same pieces, the way a chat
template would: a begin id, one id pair per offered tool, then per message a role id, its
content pieces (assistant: then each call's head, argument pieces and tail) and an end id,
and the assistant role id last (the generation prompt). A faithful server's next prompt
therefore starts with this prompt + this output; a preset with `rerender_history` inserts a
whitespace id after a replayed assistant role and re-serializes the arguments, as templates
that re-render tool calls do, and the prefix breaks.

A thinking model's output ids start with its reasoning tokens; the prompt renders only a
replayed message's content, so its reasoning block is stripped from history, as Qwen3- and
DeepSeek-style templates do. `template_drift` (preset `sim-drift`) adds the other two drifts
measured on real templates: arguments re-serialized the way Jinja ``tojson`` does (a
compact ``{"a":1}`` comes back ``{"a": 1}``), and a seam merge (a newline after the content
re-tokenized into its last piece). Only the re-rendering changes; the ids of a token prompt
sent by the client (token-in) are taken as given.

Tests: tests/sim/test_tokens.py.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from typing import Any

from collector.sim.generate import Generation
from collector.sim.tokenizer import CHARS_PER_TOKEN

Tok = tuple[int, str]
"""(id, text) of one token."""

BEGIN, SYSTEM, USER, ASSISTANT, TOOL, END, CALL_OPEN, CALL_CLOSE, TOOL_DEF, SPACE, THINK = range(1, 12)
_SPECIAL = {BEGIN: "<|begin|>", SYSTEM: "<|system|>", USER: "<|user|>", ASSISTANT: "<|assistant|>",
            TOOL: "<|tool|>", END: "<|end|>", CALL_OPEN: "<tool_call>", CALL_CLOSE: "</tool_call>",
            TOOL_DEF: "<|tool_def|>", SPACE: "\n", THINK: " "}
_ROLES = {"system": SYSTEM, "developer": SYSTEM, "user": USER, "assistant": ASSISTANT, "tool": TOOL}
_VOCAB = 100_000
_FIRST_PIECE_ID = 1000


@lru_cache(maxsize=65536)
def piece_id(text: str) -> int:
    """The id of one piece of text (stable across processes)."""
    h = hashlib.blake2b(text.encode(), digest_size=4).digest()
    return _FIRST_PIECE_ID + int.from_bytes(h, "big") % _VOCAB


def logprob_of(token_id: int) -> float:
    """A deterministic log-probability in (-2, 0] for a token id."""
    return -((token_id * 2654435761) % 2000) / 1000.0


def _pieces(text: str) -> list[Tok]:
    return [(piece_id(text[i:i + CHARS_PER_TOKEN]), text[i:i + CHARS_PER_TOKEN])
            for i in range(0, len(text), CHARS_PER_TOKEN)]


def _special(token_id: int) -> Tok:
    return token_id, _SPECIAL[token_id]


def _name(name: str) -> Tok:
    return piece_id("name:" + name), name


class OutputTokens:
    """A turn's output tokens by where they sit: text, then per call head, arguments, tail."""

    __slots__ = ("calls", "reasoning", "stray", "text")

    def __init__(self, gen: Generation) -> None:
        self.stray: list[Tok] = []
        # The thought comes first and costs exactly `reasoning_tokens` (the count it was cut
        # by); its text may be a few characters short of that (trailing space stripped), so
        # it is padded with the think-filler id rather than miscounted.
        thought = _pieces(gen.reasoning_text)[: gen.reasoning_tokens]
        self.reasoning = thought + [(THINK, " ")] * (gen.reasoning_tokens - len(thought))
        self.text = _pieces(gen.text)
        self.calls: list[tuple[list[Tok], list[Tok], list[Tok]]] = []
        for c in gen.calls:
            tail = [_special(CALL_CLOSE)] if c.closed else []
            self.calls.append(([_special(CALL_OPEN), _name(c.name)], _pieces(c.arguments), tail))
        # A cut that left a single token for a call's two head tokens: its opener only.
        missing = gen.output_tokens - len(self.flat())
        self.stray = [_special(CALL_OPEN)] * max(0, missing)
        assert len(self.flat()) == gen.output_tokens, "sim token layout disagrees with its count"

    def flat(self) -> list[Tok]:
        out = self.reasoning + self.text
        for head, args, tail in self.calls:
            out += head + args + tail
        return out + self.stray


def prompt_ids(raw_messages: list[Any], tool_names: tuple[str, ...], rerender: bool,
               template_drift: bool = False) -> list[int]:
    """The prompt as this simulated template renders it (see the module docstring)."""
    ids = [BEGIN]
    for name in tool_names:
        ids += [TOOL_DEF, _name(name)[0]]
    for msg in raw_messages:
        role = msg.get("role")
        ids.append(_ROLES.get(role, USER))
        if role == "assistant" and rerender:
            ids.append(SPACE)
        text = _text(msg.get("content"))
        if role == "assistant" and template_drift and text:
            # Seam merge: the template writes a newline after the content and the tokenizer
            # merges it into the content's last piece (or adds a piece) on re-tokenizing.
            text += "\n"
        ids += [t for t, _ in _pieces(text)]
        for call in (msg.get("tool_calls") or []) if role == "assistant" else ():
            fn = call.get("function") or {}
            args = fn.get("arguments") or ""
            if rerender:
                args = json.dumps(json.loads(args), sort_keys=True)
            elif template_drift:
                args = _tojson(args)
            ids += [CALL_OPEN, _name(str(fn.get("name")))[0]] + [t for t, _ in _pieces(args)] + [CALL_CLOSE]
        ids.append(END)
    ids.append(ASSISTANT)
    return ids


def _tojson(args: str) -> str:
    """Arguments as a Jinja ``tojson`` re-serializes them: parsed, then dumped with spaces."""
    try:
        return json.dumps(json.loads(args))
    except ValueError:
        return args  # not JSON: a template passes the string through


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def logprobs_block(toks: list[Tok], with_ids: bool) -> dict[str, Any]:
    """`choices[].logprobs` for these tokens; llama.cpp adds each token's `id`."""
    content = []
    for token_id, text in toks:
        entry: dict[str, Any] = {"token": text, "logprob": logprob_of(token_id),
                                 "bytes": list(text.encode()), "top_logprobs": []}
        if with_ids:
            entry = {"id": token_id, **entry}
        content.append(entry)
    return {"content": content}

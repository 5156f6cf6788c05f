"""Deterministic token ids and logprobs for the simulator's Chat Completions replies.

The ids follow the simulator's own tokenizer (`collector.sim.tokenizer`): one id per run of
up to 4 characters of a segment, two head ids per call (the opener and the name), one tail
id when the call closed. So a turn's output ids are exactly `usage.completion_tokens`
many, cut or not. Ids come from the vocabulary (`collector.sim.vocab`): a piece's id is a
function of its text, so the same text gives the same ids in a reply and, replayed, in the
next prompt, and every id detokenizes back to its text. A call's ids read as one Hermes
block: `<tool_call>`, `{"name": "...", "arguments": `, the argument pieces, `}</tool_call>`.

The prompt is rendered from the request's messages with the same pieces, the way a chat
template would (`render_prompt` writes it as text, whose tokenizing gives `prompt_ids`;
llama.cpp's `/apply-template` serves that text): a begin id, one id pair per offered tool,
then per message a role id, its content pieces (assistant: then each call's head, argument
pieces and tail) and an end id, and the assistant role id last (the generation prompt). A
faithful server's next prompt therefore starts with this prompt + this output; a preset
with `rerender_history` inserts a whitespace id after a replayed assistant role and
re-serializes the arguments, as templates that re-render tool calls do, and the prefix breaks.

A thinking model's output ids start with its reasoning tokens; the prompt renders only a
replayed message's content, so its reasoning block is stripped from history, as Qwen3- and
DeepSeek-style templates do. `template_drift` (preset `sim-drift`) adds the other two drifts
measured on real templates: arguments re-serialized the way Jinja ``tojson`` does (a
compact ``{"a":1}`` comes back ``{"a": 1}``), and a seam merge (a newline between the
content and the calls, re-tokenized into the content's last piece, as Qwen's template
writes it). Only the re-rendering changes; the ids of a token prompt
sent by the client (token-in) are taken as given.

Tests: tests/sim/test_tokens.py, tests/sim/test_completion.py.
"""

from __future__ import annotations

import json
from typing import Any

from collector.sim.generate import Generation
from collector.sim.tokenizer import CHARS_PER_TOKEN
from collector.sim.vocab import (
    ASSISTANT,
    BEGIN,
    CALL_CLOSE,
    CALL_OPEN,
    END,
    SPACE,
    SPECIALS,
    SYSTEM,
    THINK,
    TOOL,
    TOOL_DEF,
    USER,
    header_id,
    header_text,
    piece_id,
    tool_def_id,
)

__all__ = ["ASSISTANT", "BEGIN", "CALL_CLOSE", "CALL_OPEN", "END", "SPACE", "SYSTEM", "THINK", "TOOL",
           "TOOL_DEF", "USER", "OutputTokens", "Tok", "logprob_of", "logprobs_block", "piece_id",
           "prompt_ids", "prompt_tokens", "render_prompt"]

Tok = tuple[int, str]
"""(id, text) of one token."""

_ROLES = {"system": SYSTEM, "developer": SYSTEM, "user": USER, "assistant": ASSISTANT, "tool": TOOL}


def logprob_of(token_id: int) -> float:
    """A deterministic log-probability in (-2, 0] for a token id."""
    return -((token_id * 2654435761) % 2000) / 1000.0


def _pieces(text: str) -> list[Tok]:
    return [(piece_id(text[i:i + CHARS_PER_TOKEN]), text[i:i + CHARS_PER_TOKEN])
            for i in range(0, len(text), CHARS_PER_TOKEN)]


def _special(token_id: int) -> Tok:
    return token_id, SPECIALS[token_id]


def _header(name: str) -> Tok:
    return header_id(name), header_text(name)


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
            self.calls.append(([_special(CALL_OPEN), _header(c.name)], _pieces(c.arguments), tail))
        # A cut that left a single token for a call's two head tokens: its opener only.
        missing = gen.output_tokens - len(self.flat())
        self.stray = [_special(CALL_OPEN)] * max(0, missing)
        assert len(self.flat()) == gen.output_tokens, "sim token layout disagrees with its count"

    def flat(self) -> list[Tok]:
        out = self.reasoning + self.text
        for head, args, tail in self.calls:
            out += head + args + tail
        return out + self.stray


def prompt_tokens(raw_messages: list[Any], tool_names: tuple[str, ...], rerender: bool,
                  template_drift: bool = False) -> list[Tok]:
    """The prompt as this simulated template renders it (see the module docstring)."""
    toks = [_special(BEGIN)]
    for name in tool_names:
        toks += [_special(TOOL_DEF), (tool_def_id(name), name)]
    for msg in raw_messages:
        role = msg.get("role")
        toks.append(_special(_ROLES.get(role, USER)))
        if role == "assistant" and rerender:
            toks.append(_special(SPACE))
        text = _text(msg.get("content"))
        calls = (msg.get("tool_calls") or []) if role == "assistant" else []
        if role == "assistant" and template_drift and text and calls:
            # Seam merge: the template writes a newline between the content and the calls and
            # the tokenizer merges it into the content's last piece (or adds a piece).
            text += "\n"
        toks += _pieces(text)
        for call in calls:
            fn = call.get("function") or {}
            args = fn.get("arguments") or ""
            if rerender:
                args = json.dumps(json.loads(args), sort_keys=True)
            elif template_drift:
                args = _tojson(args)
            toks += [_special(CALL_OPEN), _header(str(fn.get("name"))), *_pieces(args), _special(CALL_CLOSE)]
        toks.append(_special(END))
    toks.append(_special(ASSISTANT))
    return toks


def prompt_ids(raw_messages: list[Any], tool_names: tuple[str, ...], rerender: bool,
               template_drift: bool = False) -> list[int]:
    """The prompt's ids as this simulated template renders it (see the module docstring)."""
    return [t for t, _ in prompt_tokens(raw_messages, tool_names, rerender, template_drift)]


def render_prompt(raw_messages: list[Any], tool_names: tuple[str, ...], rerender: bool,
                  template_drift: bool = False) -> str:
    """The same prompt as text, without the begin token (a tokenizer adds it, as llama.cpp's
    `add_special` adds BOS): `/apply-template`'s `prompt`."""
    return "".join(text for _, text in prompt_tokens(raw_messages, tool_names, rerender, template_drift)[1:])


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

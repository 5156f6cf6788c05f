"""One simulated turn: the policy's plan, written out by a preset and cut by the output cap.

This is the transport-neutral core every wire format renders. It decides, from one seeded
random stream, in a fixed order of draws: the preamble length, where in the filler text the
preamble comes from, whether an argument is wrong, whether the arguments are malformed,
whether a delimiter leaks, whether a cut is hidden. Then it lays the turn out in tokens
(`collector.sim.tokenizer`) and cuts it at the cap. The fixed order of draws is what makes
a reply a pure function of (server seed, request body): byte-identical on replay.

The ground-truth tests also call `generate` directly: it is the same function the HTTP
endpoints call, minus parsing and rendering.

Tests: tests/sim/test_truth.py, tests/sim/test_thinking_truth.py.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from collector.sim.policy import Plan, PlannedCall
from collector.sim.presets import LeakFamily, ModelPreset
from collector.sim.tokenizer import (
    CALL_HEAD_TOKENS,
    CALL_TAIL_TOKENS,
    CHARS_PER_TOKEN,
    count_tokens,
    prefix_chars,
)

_WORDS = (
    "let", "me", "check", "the", "request", "first", "and", "then", "call", "the", "right", "tool",
    "with", "exact", "arguments", "this", "looks", "like", "a", "task", "where", "i", "should",
    "be", "careful", "about", "every", "field", "before", "acting", "the", "user", "wants",
    "something", "specific", "so", "i", "will", "read", "the", "message", "again", "and", "plan",
    "it", "one", "step", "at", "a", "time", "making", "sure", "nothing", "is", "left", "out", "or",
    "guessed", "from", "context", "alone",
)


def _make_filler() -> str:
    rng = random.Random(20240611)
    words: list[str] = []
    size = 0
    while size < 40_000:
        w = rng.choice(_WORDS)
        words.append(w)
        size += len(w) + 1
    return " ".join(words).capitalize()


_FILLER = _make_filler()
"""Letters and spaces only: no digits (the arithmetic grader reads the last number of the
answer), no quotes, no delimiters."""


def preamble_text(tokens: int, u: float) -> str:
    """Exactly `tokens` tokens of prose ending in a blank line; `u` picks where it starts."""
    if tokens <= 0:
        return ""
    n = prefix_chars(tokens) - 2
    start = int(u * (len(_FILLER) - n - 64))
    start = _FILLER.index(" ", start) + 1  # begin on a word
    return _FILLER[start:start + n] + "\n\n"


def serialize(arguments: tuple[tuple[str, Any], ...], style: str) -> tuple[str, tuple[int, ...]]:
    """JSON text of the arguments in member order, and the end offset of each member's value."""
    colon, sep = (":", ",") if style == "compact" else (": ", ", ")
    parts = ["{"]
    pos = 1
    ends: list[int] = []
    for i, (key, value) in enumerate(arguments):
        if i:
            parts.append(sep)
            pos += len(sep)
        member = json.dumps(key) + colon + json.dumps(value)
        parts.append(member)
        pos += len(member)
        ends.append(pos)
    parts.append("}")
    return "".join(parts), tuple(ends)


def _padded(serialized: tuple[str, tuple[int, ...]], preset: ModelPreset, tool: str, rng: random.Random
            ) -> tuple[str, tuple[int, ...]]:
    """The arguments with the preset's whitespace for `tool` before the closing brace: exactly
    the drawn number of tokens more (`CHARS_PER_TOKEN` spaces each), the object unchanged.
    A draw only for a padded tool, so every other preset draws exactly as before."""
    dist = preset.padding_for(tool)
    if dist is None:
        return serialized
    args, ends = serialized
    extra = dist.sample(rng.random())
    return args[:-1] + " " * (CHARS_PER_TOKEN * extra) + args[-1:], ends


def _wrong(call: PlannedCall, u: float) -> PlannedCall:
    """One length-preserving wrong argument: a digit bumped, else a letter's case flipped."""
    members = list(call.arguments)
    order = sorted(range(len(members)), key=lambda i: not isinstance(members[i][1], int | str))
    i = order[int(u * len(order))] if u < 1.0 else order[-1]
    key, value = members[i]
    if isinstance(value, bool) or not isinstance(value, int | str):
        return call
    text = str(value)
    digits = [j for j, ch in enumerate(text) if ch.isdigit()]
    if digits:
        j = digits[-1]
        text = text[:j] + str((int(text[j]) + 1) % 10) + text[j + 1:]
    else:
        letters = [j for j, ch in enumerate(text) if ch.isalpha()]
        if not letters:
            return call
        j = letters[0]
        text = text[:j] + text[j].swapcase() + text[j + 1:]
    members[i] = (key, int(text) if isinstance(value, int) else text)
    return PlannedCall(call.name, tuple(members))


def _malform(args: str, u: float) -> str:
    """A same-length edit that makes the arguments invalid JSON."""
    kind = int(u * 3)
    if kind == 0 and args.endswith("}"):
        return args[:-1] + "]"
    if kind == 1 and args.startswith('{"'):
        return "{'" + args[2:]
    colon = args.find('":')
    if colon >= 0:
        return args[:colon + 1] + "=" + args[colon + 2:]
    return args[:-1] + "]"


@dataclass(slots=True)
class SimCall:
    """A tool call as far as the model got with it before the turn ended."""

    index: int
    name: str
    call_id: str
    """Random alphanumerics; each transport adds its own prefix (`call_`, `toolu_`, ...)."""
    full_arguments: str
    """The whole serialization the model meant to write (after any malformed edit)."""
    clean_arguments: str
    """The serialization without the malformed edit (same length): what an object transport's
    server-side constrained decoder would have produced."""
    arguments: str
    """The part actually emitted (a prefix of `full_arguments`)."""
    arguments_done: bool
    closed: bool
    """The closing template token was emitted: the call is whole."""
    partial_object: dict[str, Any]
    """Members whose value is finished and followed by a delimiter (Anthropic's cut `input`)."""
    full_object: dict[str, Any]
    malformed: bool


@dataclass(slots=True)
class Generation:
    """One turn as generated and cut; everything a transport needs to render it."""

    text: str
    calls: list[SimCall]
    planned_calls: int
    content_tokens: int
    """Tokens the whole turn needed (the count the cap is compared with)."""
    output_tokens: int
    """Tokens reported in usage: `cap` when cut, else `content_tokens`."""
    cap: int
    cut: bool
    leak: LeakFamily | None
    hidden_cut: bool
    hex_id: str
    created: int
    latency_s: float
    task: str
    extra: dict[str, Any] = field(default_factory=dict)
    reasoning_text: str = ""
    """The thought text (a thinking preset only); its tokens come first out of the cap."""
    reasoning_tokens: int = 0
    reasoning_field: str = "reasoning"
    """Chat Completions: where the reasoning text goes (`ModelPreset.reasoning_field`)."""

    @property
    def thinking_cut(self) -> bool:
        """The cap was spent on thinking: nothing visible and no call was emitted."""
        return self.cut and self.reasoning_tokens > 0 and not self.text and not self.calls

    @property
    def cut_in_call(self) -> bool:
        """Cut after a call started, before it closed."""
        return self.cut and bool(self.calls) and not self.calls[-1].closed


_ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def _alnum(rng: random.Random, n: int) -> str:
    return "".join(rng.choices(_ALNUM, k=n))


def generate(
    plan: Plan, preset: ModelPreset, cap: int, rng: random.Random, thinking_budget: int | None = None
) -> Generation:
    """Write the plan out as `preset` would and cut it at `cap` output tokens.

    A thinking preset first thinks (one more draw, after the others, so presets that do not
    think draw exactly as before), at most `thinking_budget` tokens, out of the same `cap`.
    """
    u_len, u_text, u_err, u_err_pick, u_mal, u_mal_kind, u_leak, u_leak_kind, u_hidden, u_lat = (
        rng.random() for _ in range(10)
    )
    think = 0
    thought = ""
    full_cap = cap
    if preset.thinking is not None:
        u_think = rng.random()
        think = max(1, preset.thinking.sample(u_think))
        if thinking_budget is not None:
            think = min(think, thinking_budget)
        think = min(think, cap)
        thought = preamble_text(think, u_think).rstrip()
        cap -= think  # what is left for the visible turn
    calls_planned = list(plan.calls)
    if calls_planned:
        text = preamble_text(preset.preamble.sample(u_len), u_text)
        if u_err < preset.error_rate:
            calls_planned[-1] = _wrong(calls_planned[-1], u_err_pick)
    else:
        text = preamble_text(preset.answer_preamble.sample(u_len), u_text) + plan.answer
    malformed = bool(calls_planned) and u_mal < preset.malformed_prob
    leak: LeakFamily | None = None
    if calls_planned and preset.leak_families and u_leak < preset.leak_prob:
        families = preset.leak_families
        leak = families[min(int(u_leak_kind * len(families)), len(families) - 1)]

    serialized = [_padded(serialize(c.arguments, preset.arg_style), preset, c.name, rng)
                  for c in calls_planned]
    text_tokens = count_tokens(text)
    content = text_tokens + sum(
        CALL_HEAD_TOKENS + count_tokens(s) + CALL_TAIL_TOKENS for s, _ in serialized
    )
    cut = content >= cap
    budget = cap if cut else content
    emitted_text_tokens = min(text_tokens, budget)
    out_text = text if emitted_text_tokens == text_tokens else text[:prefix_chars(emitted_text_tokens)]
    remaining = budget - emitted_text_tokens
    calls: list[SimCall] = []
    for i, (call, (args, ends)) in enumerate(zip(calls_planned, serialized, strict=True)):
        if remaining < CALL_HEAD_TOKENS:
            break
        remaining -= CALL_HEAD_TOKENS
        full = _malform(args, u_mal_kind) if malformed else args
        need = count_tokens(full)
        took = min(need, remaining)
        remaining -= took
        emitted = full if took == need else full[:prefix_chars(took)]
        done = took == need
        closed = done and remaining >= CALL_TAIL_TOKENS
        if closed:
            remaining -= CALL_TAIL_TOKENS
        full_object = dict(call.arguments)
        partial = {k: v for (k, v), end in zip(call.arguments, ends, strict=True) if len(emitted) > end}
        calls.append(SimCall(
            index=i, name=call.name, call_id=_alnum(rng, 24), full_arguments=full, clean_arguments=args,
            arguments=emitted,
            arguments_done=done, closed=closed, partial_object=partial, full_object=full_object,
            malformed=malformed,
        ))
    hidden = cut and bool(calls) and u_hidden < preset.hidden_cut_prob
    latency = 0.0
    if preset.latency_ms_median > 0:
        latency = preset.latency_ms_median / 1000.0
        if preset.latency_sigma > 0:
            latency *= random.Random(u_lat).lognormvariate(0.0, preset.latency_sigma)
    return Generation(
        text=out_text, calls=calls, planned_calls=len(calls_planned), content_tokens=think + content,
        output_tokens=think + budget, cap=full_cap, cut=cut, leak=leak, hidden_cut=hidden,
        hex_id=f"{rng.getrandbits(128):032x}", created=1_760_000_000 + rng.randrange(10_000_000),
        latency_s=latency, task=plan.task,
        reasoning_text=thought, reasoning_tokens=think, reasoning_field=preset.reasoning_field,
    )

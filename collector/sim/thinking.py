"""The simulator's reasoning: thought text, the signatures it hands out, and the replay rules.

A thinking preset (`ModelPreset.thinking`) thinks on every turn, on every wire, whether or
not the request asks for it: its reasoning tokens come out of the same output cap as the
visible turn (`collector.sim.generate`), so at small caps the cap is often spent on thinking.

Replays are checked as strictly as the real APIs check them. Every opaque item the
simulator hands out is signed with a keyed hash of what it covers, so an item sent back
altered (text or signature) is a 400, and a thinking model's call sent back without its
reasoning is a 400 in the dialect's words:

- Anthropic: a `thinking` block's `signature` covers its `thinking` text; a `redacted_thinking`
  block's `data` is itself a signature. An assistant message with `tool_use` blocks must start
  with a `thinking` or `redacted_thinking` block.
- Responses: a `reasoning` item's `encrypted_content` covers its id and summary text; every
  run of `function_call` items must follow a `reasoning` item.
- Gemini: the `thoughtSignature` on a model turn's first `functionCall` part covers that
  call's name and arguments; it must be there. A thinking turn without a call carries its
  signature on its text part instead (covering the text), and that one must come back too.

The parsers collect the "sent back without its reasoning" message in
`ParsedRequest.unreasoned`; the app applies it only for thinking presets (a model that never
thinks cannot require reasoning back). An altered signature is a 400 for every model.

Tests: tests/sim/test_thinking_replay.py, tests/sim/test_thinking_truth.py.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

from collector.sim.errors import SimError

_KEY = b"collector-sim-thinking-v1"
"""The simulator's private signing key (fixed: replies stay a pure function of the request)."""


def sign(*pieces: str) -> str:
    """A signature over `pieces`, opaque to the client."""
    mac = hmac.new(_KEY, "\0".join(pieces).encode(), hashlib.blake2b)
    return "sig_" + mac.hexdigest()[:48]


def call_signature(name: str, args: dict[str, Any]) -> str:
    """The Gemini `thoughtSignature` of a call (covers its name and arguments)."""
    return sign("gemini-call", name, json.dumps(args, sort_keys=True, ensure_ascii=False))


def text_signature(text: str) -> str:
    """The Gemini `thoughtSignature` of a thinking turn's text part when it has no call."""
    return sign("gemini-text", text)


def check(signature: object, expected: str, message: str) -> None:
    """400 with `message` unless `signature` is exactly `expected`."""
    if not isinstance(signature, str) or not hmac.compare_digest(signature, expected):
        raise SimError(400, message)

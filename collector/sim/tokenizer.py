"""The simulator's deterministic tokenizer, and the token layout of one generated turn.

Real tokenizers are model-specific and slow to load; the simulator only needs a count that
is stable, cheap and *the same count it cuts by*. So: one token is a run of up to
`CHARS_PER_TOKEN` characters of a segment, counted per segment (a token never spans the
preamble and a call). A tool call also costs template tokens the gateway never shows as
text: `CALL_HEAD_TOKENS` before its arguments (the opening delimiter and the name) and
`CALL_TAIL_TOKENS` after them (the closing delimiter). A leaked delimiter is therefore a
rendering fault of the gateway, not extra output: it never changes the count.

The turn ends with an end-of-turn token that must fit too, so a turn whose content needs
`n` tokens is cut by a cap `b` exactly when `n >= b`; a cut turn reports `b` output tokens
and an uncut one `n < b`. Hence "completion tokens == cap" holds exactly when the turn was
cut, and a cap of exactly `n` leaves the arguments whole but the turn still cut (the cut
lands right after the last closing brace).

Tests: tests/sim/test_truth.py.
"""

from __future__ import annotations

CHARS_PER_TOKEN = 4
CALL_HEAD_TOKENS = 2
CALL_TAIL_TOKENS = 1


def count_tokens(text: str) -> int:
    """Tokens of one text segment: ceil(len / CHARS_PER_TOKEN)."""
    return -(-len(text) // CHARS_PER_TOKEN)


def call_tokens(arguments: str) -> int:
    """Tokens of one tool call whose serialized arguments are `arguments`."""
    return CALL_HEAD_TOKENS + count_tokens(arguments) + CALL_TAIL_TOKENS


def prefix_chars(tokens: int) -> int:
    """How many characters of a segment the first `tokens` tokens cover."""
    return tokens * CHARS_PER_TOKEN

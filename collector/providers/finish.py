"""Every finish reason a server can send, and what the collector decides for it: one table.

Why one table: a finish reason nobody listed used to fall into `FinishClass.OTHER` and be
read as an end of turn. `abort` is the case that made it matter: vLLM and SGLang finish a
request with `abort` when it is cancelled (weights swapped under it by an RL trainer, a
`/abort_request`, a server draining), and the partial text of an aborted request is neither
a final answer nor a cut by the output cap. Listing every value each wire and the OSS
servers behind the Chat wire send, next to its decision, makes each one a reviewed choice
and lets a test walk the list (tests/providers/test_finish.py).

Decisions (`Decision`):

- `stop`, `tool_calls`, `length`, `content_filter`: the `FinishClass` of the same name (a
  `stop` with calls is `tool_calls`, as forced tool choices finish with `stop`); `length`
  is only where the length checks of `collector.providers.common` *start*: they add the
  other signals whatever the finish says.
- `retry`: the request did not finish, it was cancelled: the same request is sent again
  (`collector.providers.http.Http.retrying`, retry cause `abort`) within the endpoint's
  retry policy; past it the call fails with `ProviderUnavailable` and the episode is
  `error`. Never a turn, so never `done`, never `length`.
- `error`: an in-band server failure (OpenRouter's and vLLM's `finish_reason: "error"`,
  Responses `failed`). The adapter raises it as a
  server error: retried as a `5xx`, then `error`.
- `other`: listed values with no better reading (Gemini `MALFORMED_FUNCTION_CALL`, taken
  by the loop's unparsed-call rule; Anthropic `pause_turn`), and any value not in the table
  (a new server version's): `UNKNOWN`. Kept raw on the turn with
  `FinishClass.OTHER`, which the loop reads like a natural end without calls (the
  behaviour before this table). Documented here rather than guessed per value: an unknown
  reason is not evidence of a cut, and refusing every unknown value would make a new
  server release fail every episode.

Sources for the values (read from each project's source, not copied): OpenAI Chat
(`stop`, `length`, `tool_calls`, `content_filter`, the deprecated `function_call`);
vLLM's OpenAI server (`stop`, `length`, `tool_calls`, and the engine's `abort`, `error`,
`repetition`: `FINISH_REASON_STRINGS` in `vllm/v1/engine/__init__.py`); SGLang's (`stop`,
`length`, `tool_calls`, `abort`); llama.cpp's server (`stop`, `length`, `tool_calls`). A
streamed chat choice that never finished has `None`: the `STREAM_CUT` signal, decided in
`common.finish_turn`, not here. Anthropic `stop_reason` (`end_turn`, `stop_sequence`,
`tool_use`, `max_tokens`, `pause_turn`, `refusal`, `model_context_window_exceeded`).
Gemini `finishReason` (`STOP`, `MAX_TOKENS`, the safety family, `MALFORMED_FUNCTION_CALL`,
`UNEXPECTED_TOOL_CALL`, `OTHER`, `LANGUAGE`, `FINISH_REASON_UNSPECIFIED`). Responses has
no finish reason: the raw reason is the `status` (`completed`, `incomplete` with
`incomplete_details.reason`, `failed`, `cancelled`); keys here are `status` or
`status:reason`.

Tests: tests/providers/test_finish.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType

from collector.turn import FinishClass

__all__ = ["FINISH_TABLE", "UNKNOWN", "Decision", "decide", "finish_class", "is_abort"]


class Decision(StrEnum):
    """What a finish reason means for the turn (see the module docstring)."""

    STOP = "stop"
    TOOL_CALLS = "tool_calls"
    LENGTH = "length"
    CONTENT_FILTER = "content_filter"
    RETRY = "retry"
    """Cancelled under us (`abort`): re-send, cause `abort`; past the retries, `error`."""
    ERROR = "error"
    """An in-band server failure: raised as a server error (retried as `5xx`)."""
    OTHER = "other"
    """Not in the table: kept raw, `FinishClass.OTHER`."""


UNKNOWN = Decision.OTHER
"""The decision for a value the table does not list."""

_S, _T, _L, _F = Decision.STOP, Decision.TOOL_CALLS, Decision.LENGTH, Decision.CONTENT_FILTER
_GEMINI_FILTERS = (
    "SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "IMAGE_SAFETY",
    "IMAGE_PROHIBITED_CONTENT", "IMAGE_RECITATION", "MODEL_ARMOR",
)

FINISH_TABLE: Mapping[str, Mapping[str, Decision]] = MappingProxyType({
    "chat": MappingProxyType({
        "stop": _S,
        "tool_calls": _T,
        "function_call": _T,  # OpenAI's deprecated functions API
        "length": _L,
        "content_filter": _F,
        "abort": Decision.RETRY,  # vLLM and SGLang: the request was cancelled (weights swapped)
        "error": Decision.ERROR,  # OpenRouter and vLLM: an in-band failure
        # vLLM's repetition detection stopped a degenerate output: not the cap (so not a
        # length turn for the truncation tables), not a clean answer either; `other`, and
        # the length checks (an open call, an unclosed template) still apply to it.
        "repetition": Decision.OTHER,
    }),
    "anthropic": MappingProxyType({
        "end_turn": _S,
        "stop_sequence": _S,
        # A server-side tool loop paused: not a cut, not a final answer the loop can trust
        # more than before; kept as it was (other).
        "pause_turn": Decision.OTHER,
        "tool_use": _T,
        "max_tokens": _L,
        "model_context_window_exceeded": _L,
        "refusal": _F,
    }),
    "gemini": MappingProxyType({
        "STOP": _S,
        "MAX_TOKENS": _L,
        "CONTINUATION": _L,
        **dict.fromkeys(_GEMINI_FILTERS, _F),
        # A call Gemini could not parse or did not expect: no call on the turn, and the
        # loop's unparsed-call rule (`episode/state.py`, by raw reason) takes it; `other`.
        "MALFORMED_FUNCTION_CALL": Decision.OTHER,
        "UNEXPECTED_TOOL_CALL": Decision.OTHER,
        "LANGUAGE": Decision.OTHER,
        "OTHER": Decision.OTHER,
        "FINISH_REASON_UNSPECIFIED": Decision.OTHER,
    }),
    "responses": MappingProxyType({
        "completed": _S,
        "incomplete:max_output_tokens": _L,
        "incomplete:content_filter": _F,
        # Only background responses can be cancelled, and the adapter never asks for one.
        "cancelled": Decision.OTHER,
        "failed": Decision.ERROR,  # the adapter raises it (`response.failed`)
    }),
})
"""wire -> raw finish reason -> decision. The Chat wire lists the OSS servers' values too."""


def decide(wire: str, raw: str | None) -> Decision:
    """The decision for `raw` on `wire` (`UNKNOWN` for a value the table does not list)."""
    if raw is None:
        return UNKNOWN
    return FINISH_TABLE.get(wire, {}).get(raw, UNKNOWN)


def is_abort(wire: str, raw: str | None) -> bool:
    """The request was cancelled, not finished: it must be sent again (`Decision.RETRY`)."""
    return decide(wire, raw) is Decision.RETRY


_CLASSES = {
    Decision.STOP: FinishClass.STOP,
    Decision.TOOL_CALLS: FinishClass.TOOL_CALLS,
    Decision.LENGTH: FinishClass.LENGTH,
    Decision.CONTENT_FILTER: FinishClass.CONTENT_FILTER,
}


def finish_class(wire: str, raw: str | None, has_calls: bool) -> FinishClass:
    """The mapped `FinishClass` of a finished turn; a `stop` with calls is `tool_calls`.

    `retry` and `error` never reach a stored turn (the HTTP layer re-sends, the adapter
    raises); should one be asked for, it is `OTHER`, never a natural end or a cut.
    """
    mapped = _CLASSES.get(decide(wire, raw), FinishClass.OTHER)
    if has_calls and mapped is FinishClass.STOP:
        return FinishClass.TOOL_CALLS
    return mapped

"""A server's 5xx that says the tool-call arguments failed to parse: not retried, read as a cut.

The case (measured, ../shared/tools/real-gateway/README.md): LiteLLM's Anthropic route,
non-streamed, answers HTTP 500 "Failed to parse tool call arguments ..." when the engine's
call was cut mid-JSON at `max_tokens`: its adapter json-decodes the cut arguments while
translating the reply and fails. Retried as any 5xx, that cost 5 paid generations per turn
and ended the episode `error`, so the episodes cut at exactly the budgets where calls are cut
left the statistics (an `error` episode is not counted in the truncation rate), and the
stored message quoted the cut argument fragment.

Decisions:

1. **Never retried.** For one request the failure is deterministic at temperature 0; above
   it a retry re-samples *because* the first sample was cut, and keeping the first uncut
   sample biases the truncation rate down at exactly the budgets being measured (and pays for
   another generation). `http.classify_error_body` types any 5xx (or mid-stream error event)
   whose message says so as `UnparsedArguments`, which is not retryable.
2. **Read as this turn cut at the cap** (`cut_turn`), when all of these hold:
   a. the request offered tools (no call can be parsed from a request without them);
   b. no call in the request's history replays with arguments that fail to parse as a JSON
      object (the collector replays a malformed call as `{}`, so for its own histories this
      holds): the arguments that failed are then this turn's output, not a replay
      (llama-server's own 500 of the same wording is about a replayed history);
   c. every stop sequence the request set is a chat-template call-block closer
      (`</tool_call>` and the others of `arguments.CALL_CLOSERS`; a base model needs one, or
      it repeats calls until the cap): any other stop word can match inside a call's
      arguments and end them unfinished (llama-server with `stop: ["get_weather"]`,
      real-llama/README.md), which is not a cut. A closer ends a call after its arguments.
   The remaining explanation is the model ending a call on invalid JSON by itself at under the
   cap; this 500 cannot tell it apart, and the cap is the measured cause at these budgets
   (caps 14-35 of the weather sweep, where the Chat route of the same engine says `length`).
   Either way nothing from the turn may run and its reward is 0. The turn is a length turn
   with no text and no call, `raw_finish_reason` `"http_500"` (the status, what the server
   said), `incomplete_reason` `"tool_call_arguments_unparsed"`, the FINISH_REASON signal (the
   server's own way of reporting this cut), and unknown usage (`Usage.known` False: the 500
   counts nothing). When a condition fails, the error ends the episode `error`, unretried.
3. **No argument fragments in messages.** The body quotes the model's cut text after the
   wording; `withhold_fragment` keeps the message up to the wording and drops the rest, in
   every error message built from a body (HTTP or mid-stream), whatever its status.

Tests: tests/providers/test_real_servers.py (against LiteLLM's Anthropic shapes, streamed and not).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Awaitable

from collector.errors import ProviderUnavailable
from collector.providers.arguments import CALL_CLOSERS
from collector.providers.common import replay_text
from collector.turn import AssistantMessage, FinishClass, LengthSignal, Turn, TurnRequest, Usage

__all__ = ["UnparsedArguments", "cut_turn", "or_server_cut", "says_arguments_unparsed", "withhold_fragment"]

_WORDING = re.compile(r"failed to parse (?:the )?tool[ _-]?call arguments", re.IGNORECASE)
_WITHHELD = " [rest withheld: it may quote the model's arguments]"

RAW_REASON = "http_500"
INCOMPLETE_REASON = "tool_call_arguments_unparsed"


class UnparsedArguments(ProviderUnavailable):
    """A server failure saying the tool-call arguments failed to parse: deterministic for the
    request, so never retried (see the module docstring)."""

    retryable = False


def says_arguments_unparsed(message: str) -> bool:
    """Whether a server's error message is the arguments-failed-to-parse failure."""
    return _WORDING.search(message) is not None


def withhold_fragment(message: str) -> str:
    """The message up to the wording, without what follows it (the model's argument text)."""
    match = _WORDING.search(message)
    if match is None:
        return message
    return message[: match.end()] + _WITHHELD


def _replays_cleanly(request: TurnRequest) -> bool:
    for message in request.messages:
        if isinstance(message, AssistantMessage):
            for call in message.tool_calls:
                try:
                    value = json.loads(replay_text(call))
                except ValueError:
                    return False
                if not isinstance(value, dict):
                    return False
    return True


def cut_turn(error: UnparsedArguments, request: TurnRequest, latency_s: float = 0.0) -> Turn | None:
    """The length turn `error` stands for under rule 2, or None when a condition fails."""
    stops = request.params.stop or ()
    if not request.tools or any(s not in CALL_CLOSERS for s in stops) or not _replays_cleanly(request):
        return None
    return Turn(
        text="",
        tool_calls=[],
        raw_finish_reason=RAW_REASON,
        finish_class=FinishClass.LENGTH,
        usage=Usage(0, 0, known=False),
        max_output_tokens=request.max_output_tokens,
        latency_s=latency_s,
        incomplete_reason=INCOMPLETE_REASON,
        length_signals=(LengthSignal.FINISH_REASON,),
        retries=error.retries,
    )


async def or_server_cut(request: TurnRequest, reply: Awaitable[Turn]) -> Turn:
    """Await an adapter's reply; an `UnparsedArguments` that rule 2 reads as a cut becomes its turn."""
    started = time.perf_counter()
    try:
        return await reply
    except UnparsedArguments as error:
        turn = cut_turn(error, request, time.perf_counter() - started)
        if turn is None:
            raise
        return turn

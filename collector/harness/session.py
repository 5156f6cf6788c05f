"""One harness episode as the gateway sees it: a token, the turns, and the stop rules.

A `HarnessSession` is what the worker opens for each harness episode. Every request the
harness sends on the session's token becomes one turn, in this order:

1. refused if the episode already ended (a stop rule fired, or the harness was stopped):
   `Refused`, a 403 the SDKs do not retry, naming the episode and how it ended;
2. `loop.max_steps` and the episode output budget (`loop.episode_output_budget`) are checked
   as the loop checks them before a call; the turn's cap is the cell's budget (or what the
   episode budget leaves), whatever the harness asked (`TurnRecord.harness_asked_cap`);
3. the messages the harness sent are recorded; when they do not extend what it sent before
   plus the turn it got back, the turn is marked `history_rewritten`;
4. the run's provider adapter is called with the cell's model and the run's sampling
   (reasoning, token capture), so retries, length detection and token capture are the loop's;
5. the turn is classified by `collector.episode.verdict.classify_turn`, the loop's own
   steps 1-3. A cut turn, or a malformed one, reaches the harness with no tool calls: its
   calls are withheld (`TurnRecord.calls_withheld`), its finish reason is `length`, and when
   the verdict ends the episode, the session ends with that stop reason and `ended` is set
   for the runner to stop the harness. Only the malformed calls of a malformed turn that does
   not end the episode are withheld; the loop answers them with an error, a harness cannot be.

The calls returned to the harness are recorded in `executed_tool_calls`: the gateway cannot
see a harness run them, only that it was allowed to.

With `enforce` off (`env.options.enforce_stop_rules = false`) the session only records, as a
recording proxy does: every call goes back to the harness with the wire's own finish reason.
That mode exists to show what the stop rules prevent; the record still says where the
episode would have ended.

A streamed request is the same turn: the route sets a relay around `complete`
(`collector.harness.stream`) through which the adapter passes the text on as it reads it; the
calls are written only from the `GatewayTurn` this returns.

Tests: tests/harness/test_gateway_chat.py, tests/system/harness/test_harness_run.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import secrets

from collector.config import LoopConfig
from collector.envs.base import Task
from collector.episode.loop import EpisodeSpec
from collector.episode.notices import CUT, MALFORMED_END, SIBLING_END
from collector.episode.redact import Redactor
from collector.episode.state import EpisodeState
from collector.episode.tokens import TokenTracker
from collector.episode.verdict import Fault, FaultStreak, classify_turn, over_limits
from collector.errors import ContextOverflow, ProtocolViolation, ProviderError
from collector.harness.request import Finish, GatewayTurn, HarnessRequest, Refused
from collector.providers.base import Provider
from collector.record.chat import tools_json
from collector.record.episode import EpisodeError, ExecutedToolCall
from collector.stop import StopReason
from collector.turn import (
    ArgStatus,
    AssistantMessage,
    LengthSignal,
    Message,
    ToolCall,
    ToolResultMessage,
    TurnRequest,
    Usage,
)

__all__ = ["NO_RESULT", "HarnessSession"]

NO_RESULT = "no result: the harness sent none for this call"
"""The record's result for a call returned to the harness that it never answered."""


def _call_key(call: ToolCall) -> tuple[str, str, str]:
    args = json.dumps(call.arguments, sort_keys=True) if call.arguments is not None else "<malformed>"
    return call.id, call.name, args


def _message_key(m: Message) -> tuple[object, ...]:
    """What must be equal for a replayed message to count as the one sent before."""
    if isinstance(m, AssistantMessage):
        return ("assistant", m.text, tuple(_call_key(c) for c in m.tool_calls))
    if isinstance(m, ToolResultMessage):
        return ("tool", m.call_id, m.content)
    return (m.role, m.text)


class HarnessSession:
    """The gateway's side of one harness episode (see the module docstring)."""

    def __init__(self, spec: EpisodeSpec, provider: Provider, settings: LoopConfig, *, enforce: bool = True,
                 harness: str = "harness") -> None:
        self.token = "ep-" + secrets.token_urlsafe(24)
        # The episode's own path on the gateway (`/e/<key>`): its id, readable in a log, and a
        # random tail so that a rerun of the same episode id never reuses an ended URL.
        self.key = re.sub(r"[^A-Za-z0-9_.-]", "_", spec.episode_id)[:40] + "-" + secrets.token_hex(4)
        self.spec = spec
        self.provider = provider
        self.settings = settings
        self.enforce = enforce
        self.harness = harness
        # The episode's own token is a credential too: a harness that echoes it into a
        # message must not put it in a shard. Its redactor is the episode's own, not one of the
        # worker's shared ones (`redactor_for` keeps each credential set for the process's life:
        # with a fresh token per episode, that was one redactor kept per episode ever served).
        redaction = settings.redaction
        redactor = Redactor(redaction.secret_keys, redaction.keep_raw_fragments,
                            (*spec.credentials, self.token))
        self.state = EpisodeState(Task(spec.task.id, []), settings, redactor)
        params = spec.sampling
        if params.seed is None:
            params = dataclasses.replace(params, seed=spec.seed)
        self.params = params
        self.state.tokens = TokenTracker(params.token_ids, params.temperature, params.stop)
        self.streak = FaultStreak()
        self.seen: list[tuple[object, ...]] = []
        """Keys of what the harness has seen: its last request's messages + the turn returned."""
        self.reason: StopReason | None = None
        """Set when the episode ended at the gateway (a stop rule, a provider failure)."""
        self.would_end: StopReason | None = None
        """With `enforce` off: where the stop rules would have ended the episode."""
        self.error: EpisodeError | None = None
        self.ended = asyncio.Event()
        self.offered = "[]"
        self.requests = 0
        self._lock = asyncio.Lock()
        self._unanswered: list[ToolCall] = []
        """Calls returned to the harness whose result it has not sent yet (of turn `_unanswered_at`)."""
        self._unanswered_at = 0

    def _settle(self, calls: list[ToolCall], turn_index: int, fallback: str) -> None:
        self.state.open_calls, self.state.open_index = calls, turn_index
        self.state.settle(fallback)

    def finish(self) -> None:
        """The episode is over: calls returned to the harness that it never answered are settled
        in the record (every call has exactly one result, as in the loop's record)."""
        if self._unanswered:
            self._settle(self._unanswered, self._unanswered_at, NO_RESULT)
            self._unanswered = []

    def end(self, reason: StopReason, error: EpisodeError | None = None) -> None:
        """End the episode here: every later request on the token is refused."""
        if self.reason is None:
            self.reason, self.error = reason, error
        self.ended.set()

    @property
    def final_text(self) -> str | None:
        """The text of the last turn returned to the harness without calls (its final answer)."""
        turns = self.state.turns
        if not turns or self.reason is not None or turns[-1].num_tool_calls or turns[-1].discarded:
            return None
        last = self.state.records[-1]
        return last.text if last.role == "assistant" else None

    async def complete(self, request: HarnessRequest) -> GatewayTurn:
        """One turn for the harness, under the stop rules (steps 1-5 of the module docstring)."""
        # One turn at a time: a harness that sends requests concurrently gets them in order,
        # and the fault streaks and history stay those of one sequence.
        async with self._lock:
            self.requests += 1
            if self.reason is not None:  # 1
                raise Refused(f"{self.harness}: episode {self.spec.episode_id} ended ({self.reason}); "
                              "this token accepts no more requests", 403)
            state, settings = self.state, self.settings
            if len(state.turns) >= settings.max_steps:  # 2
                self.end(StopReason.MAX_STEPS)
                raise Refused(f"{self.harness}: episode {self.spec.episode_id} reached loop.max_steps = "
                              f"{settings.max_steps}; this token accepts no more requests", 403)
            cap = self.spec.budget
            if settings.episode_output_budget is not None:
                remaining = settings.episode_output_budget - state.output_used
                if remaining <= 0:
                    self.end(StopReason.LENGTH)
                    raise Refused(f"{self.harness}: episode {self.spec.episode_id} spent its output "
                                  "budget (loop.episode_output_budget)", 403)
                cap = min(cap, remaining)
            rewritten = self._record_request(request)  # 3
            self.offered = tools_json(request.tools)
            # An empty assistant message (a withheld turn with no text, replayed by the harness) is
            # not forwarded, as the loop never replays one: no dialect accepts it.
            forwarded = [m for m in request.messages
                         if not (isinstance(m, AssistantMessage) and not m.text and not m.tool_calls)]
            turn_request = TurnRequest(self.spec.model, forwarded, request.tools, cap, self.params, {})
            try:  # 4
                turn = await self.provider.complete(turn_request)
            except ContextOverflow as exc:
                state.retries.extend(exc.retries)
                self.end(StopReason.CONTEXT_OVERFLOW)
                raise Refused(f"{self.harness}: the conversation outgrew the model's context window",
                              400) from exc
            except ProviderError as exc:
                state.retries.extend(exc.retries)
                self.end(StopReason.ERROR, EpisodeError(type(exc).__name__, str(exc)))
                raise Refused(f"{self.harness}: the provider failed: {type(exc).__name__}", 502) from exc
            over = over_limits(turn, settings)
            if over is not None:  # 5 (step 1 of the loop's order)
                message = f"turn {len(state.turns)}: {over}"
                self.end(StopReason.ERROR, EpisodeError(ProtocolViolation.__name__, message))
                raise Refused(f"{self.harness}: {message}", 502)
            record = state.add_turn(turn, cap, bool(request.tools))
            record.harness_asked_cap = request.asked_cap
            record.history_rewritten = rewritten
            calls = state.open_calls
            state.open_calls = []  # the harness answers them, not the gateway
            verdict = classify_turn(turn, record, calls, settings, self.streak)
            returned, withheld = calls, []
            if verdict.fault is not Fault.NONE and verdict.ends is not None and self.would_end is None:
                self.would_end = verdict.ends
            if self.enforce and verdict.fault is Fault.CUT:
                returned, withheld = [], calls
            elif self.enforce and verdict.fault is Fault.MALFORMED:
                if verdict.ends is not None:
                    returned, withheld = [], calls
                else:
                    returned = [c for c in calls if c.status is not ArgStatus.MALFORMED]
                    withheld = [c for c in calls if c.status is ArgStatus.MALFORMED]
            finish: Finish
            if withheld or (self.enforce and verdict.fault is not Fault.NONE):
                finish = "length"
                record.discarded = verdict.ends is not None or verdict.fault is Fault.CUT
            elif not self.enforce and LengthSignal.FINISH_REASON in turn.length_signals:
                finish = "length"  # a recording proxy passes the wire's own reason through
            else:
                finish = "tool_calls" if returned else "stop"
            record.calls_withheld = len(withheld)
            if withheld:  # settled in the record at once, as the loop settles a call it does not run
                for call in withheld:
                    bad = call.status is ArgStatus.MALFORMED
                    result = MALFORMED_END if bad else SIBLING_END
                    state.answer(call, CUT if verdict.fault is Fault.CUT else result, True)
                self._settle(withheld, record.index, CUT)
            self._unanswered, self._unanswered_at = returned, record.index
            for call in returned:
                state.executed.append(ExecutedToolCall(
                    turn_index=record.index, call_id=call.id, name=call.name,
                    arguments_json=state.redactor.arguments_json(call.arguments or {}), is_error=False,
                ))
            self.seen = [*self.seen, _message_key(AssistantMessage(turn.text, returned))]
            if self.enforce and verdict.ends is not None:
                self.end(verdict.ends)
            return GatewayTurn(
                text=turn.text, returned=returned, withheld=withheld, finish_reason=finish,
                usage=Usage(turn.usage.input_tokens, turn.usage.output_tokens),
                response_id=turn.response_id or f"gw-{self.spec.episode_id[:12]}-{record.index}",
                reasoning_items=turn.reasoning_items,
            )

    def _record_request(self, request: HarnessRequest) -> bool:
        """Record the messages new in this request; True when they do not extend what came before."""
        keys = [_message_key(m) for m in request.messages]
        seen = self.seen
        rewritten = bool(seen) and keys[:len(seen)] != seen
        new = request.messages if rewritten or not seen else request.messages[len(seen):]
        state = self.state
        answered = {m.call_id for m in new if isinstance(m, ToolResultMessage)}
        left = [c for c in self._unanswered if c.id not in answered]
        if left:  # the harness went on without sending these calls' results
            self._settle(left, self._unanswered_at, NO_RESULT)
        self._unanswered = []
        index = len(state.turns) - 1 if state.turns else None
        state.history.extend(new)
        state.records.extend(state.redactor.message_records(new, index))
        self.seen = keys
        return rewritten

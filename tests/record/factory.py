"""Synthetic episodes for the data-side tests: built directly from `collector.record.episode`.

Each builder returns a well-formed episode (every call id settled once, nothing executed
from a cut turn, reward 0 for cut and malformed episodes, errors not trainable), so a test
that wants a violation breaks exactly one thing on top of it.
"""

from __future__ import annotations

import json

from collector.record.episode import (
    Episode,
    EpisodeError,
    ExecutedToolCall,
    MessageRecord,
    ToolCallRecord,
    TurnRecord,
    episode_id,
)
from collector.stop import StopReason

RUN_ID = "run-test"


def _turn(
    index: int,
    finish: str,
    out: int,
    cap: int,
    calls: int = 0,
    *,
    raw: str | None = None,
    discarded: bool = False,
    malformed: int = 0,
) -> TurnRecord:
    return TurnRecord(
        index=index,
        raw_finish_reason=raw if raw is not None else finish,
        finish_class=finish,
        length_signals=["finish_reason"] if finish == "length" else [],
        incomplete_reason=None,
        output_tokens=out,
        input_tokens=100 + 40 * index,
        max_output_tokens=cap,
        latency_s=0.05 * (index + 1),
        repairs=[],
        num_tool_calls=calls,
        malformed_calls=malformed,
        discarded=discarded,
    )


def make_episode(
    stop: StopReason = StopReason.DONE,
    *,
    model: str = "sim-perfect",
    budget: int = 128,
    task: str = "t0",
    sample: int = 0,
    reward: float | None = None,
    provider: str = "chat",
    run_id: str = RUN_ID,
) -> Episode:
    """One plausible episode that ended with `stop`: a tool call turn, then the ending turn."""
    eid = episode_id(run_id, task, sample, model, budget)
    args = json.dumps({"expression": "37 * 12 + 5"})
    call1 = ToolCallRecord(id="call_1", name="calculator", arguments_json=args, status="ok")
    messages = [
        MessageRecord(role="system", text="You are a careful assistant."),
        MessageRecord(role="user", text="What is 37 * 12 + 5? Use the calculator tool."),
        MessageRecord(role="assistant", text="", tool_calls=[call1], turn_index=0),
        MessageRecord(role="tool", text="449", call_id="call_1", name="calculator", turn_index=0),
    ]
    turns = [_turn(0, "tool_calls", 30, budget, calls=1)]
    executed = [ExecutedToolCall(turn_index=0, call_id="call_1", name="calculator", arguments_json=args,
                                 is_error=False)]
    error = None
    trainable = True
    graded: float | None = None
    if stop is StopReason.DONE:
        turns.append(_turn(1, "stop", 5, budget))
        messages.append(MessageRecord(role="assistant", text="449", turn_index=1))
        graded = 1.0
        value = graded if reward is None else reward
    elif stop is StopReason.LENGTH:
        turns.append(_turn(1, "length", budget, budget, calls=1, discarded=True))
        cut = ToolCallRecord(id="call_2", name="calculator", arguments_json=None, status="malformed",
                             unparsed_chars=17)
        messages.append(MessageRecord(role="assistant", text="", tool_calls=[cut], turn_index=1))
        messages.append(MessageRecord(role="tool", text="not executed: cut by the output-token limit",
                                      call_id="call_2", name="calculator", is_error=True, turn_index=1))
        value = 0.0
    elif stop is StopReason.MALFORMED_TOOL_CALL:
        turns.append(_turn(1, "tool_calls", 20, budget, calls=1, discarded=True, malformed=1))
        bad = ToolCallRecord(id="call_2", name="calculator", arguments_json=None, status="malformed",
                             unparsed_chars=9)
        messages.append(MessageRecord(role="assistant", text="", tool_calls=[bad], turn_index=1))
        messages.append(MessageRecord(role="tool", text="not executed: arguments are not valid JSON",
                                      call_id="call_2", name="calculator", is_error=True, turn_index=1))
        value = 0.0
    elif stop is StopReason.ERROR:
        error = EpisodeError(type="ProviderUnavailable", message="HTTP 503 after 4 retries")
        trainable = False
        value = 0.0
    elif stop is StopReason.TIMEOUT:  # the clock ran out after the first turn
        trainable = False
        value = 0.0
    else:  # max_steps: the episode simply stopped after the first turn
        value = 0.0 if reward is None else reward
    return Episode(
        episode_id=eid,
        run_id=run_id,
        model=model,
        provider=provider,
        budget=budget,
        env="arithmetic",
        task_id=task,
        sample=sample,
        seed=1234 + sample,
        stop_reason=stop,
        trainable=trainable,
        reward=value,
        graded_reward=graded,
        duration_s=0.25,
        turns=turns,
        messages=messages,
        executed_tool_calls=executed,
        tool_errors=0,
        error=error,
        worker="w0",
    )


def make_batch(
    n: int,
    *,
    model: str = "sim-perfect",
    budget: int = 128,
    stops: tuple[StopReason, ...] = (StopReason.DONE,),
    start: int = 0,
) -> list[Episode]:
    """`n` episodes of one model and budget, cycling through `stops`, tasks t{start}..."""
    return [
        make_episode(stops[i % len(stops)], model=model, budget=budget, task=f"t{start + i}")
        for i in range(n)
    ]

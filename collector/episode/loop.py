"""The episode loop: one task, one model, tools in a loop, one `Episode` record at the end.

Nothing the model or a tool does makes `run_episode` raise. A cut turn and a broken call
are data: they end the episode with a typed `StopReason` or are answered with an error
result. Provider failures (after the adapter's retries) and environment crashes end the
episode as `error`, recorded and marked not trainable. Only cancellation by the caller
(`asyncio.CancelledError`) propagates.

The world's life. `Environment.start` gets the `EpisodeContext` (`start_world`); the
world's `open` runs within the episode's time limit, its `close` runs once however the
episode ended (bounded by the tool timeout), and an async grader is bounded by the tool
timeout too. A tool raising `EnvironmentFailure` (its world broke: an MCP server died)
ends the episode as `error`, after the turn's other calls are settled without running.

Order of checks per turn. The order decides which stop reason a turn counts under, so it
is fixed and tested:

0. before the call: the episode output-token budget (`episode_output_budget`). The turn's
   cap is the smaller of the per-turn cap and what remains; when nothing remains the
   episode ends as `length`.
0b. before the call, with `provider.context_window` set: the context window. The turn's cap
   is clamped to what the window leaves after the prompt (the provider's count of the last
   turn plus ~4 characters a token for what was added since, and the tool schemas); when
   not one token is left the episode ends as `context_overflow` and no request is sent.
1. call the model. The provider's context-length error (`ContextOverflow`, not retried)
   ends the episode as `context_overflow`; any other `ProviderError` ends it as `error`.
   So does a reply over the
   loop's limits (more than `max_tool_calls_per_turn` calls, or a call whose arguments
   exceed `max_argument_bytes`): a `ProtocolViolation` error, recorded before the turn
   enters the record, so none of its calls runs or is stored. `error`, not
   `malformed_tool_call`: the limits sit far above what a model writes under any sane
   per-turn cap, so such a reply says something about the server (a runaway generation,
   a broken gateway, a hostile endpoint), not about the policy, and must not be trained on
   even at reward 0; as an `error` it stays out of the truncation denominators and
   `--retry-errors` collects it again.
2. length check (`Turn.is_length`, any length signal). Nothing from a cut turn ever runs,
   whatever its calls look like (an Anthropic `input` or Gemini `args` may parse perfectly
   and still be cut). Every call of the turn is settled with a result starting
   ``not executed: cut by the output-token limit``. A cut turn with no tool call (nor one
   left unparsed in its text), a cut final answer, ends the episode as `length` whatever
   `stop_on` says: asking again would put a turn the task never had into the data (peers
   label such an episode `length` too); `loop.retry_cut_answers` opts in to a notice asking
   for a shorter reply instead. Otherwise, with `length` in `stop_on`, or after
   `max_consecutive_faults` cut turns in a row, the episode ends as `length`; else the loop
   goes on and the model is asked for a shorter call.
3. argument status (`ToolCall.status`, set by the adapters). A turn with no calls whose
   text holds an unparsed chat-template call, or that Gemini ended with
   `MALFORMED_FUNCTION_CALL`, counts as malformed, never as a final answer. So does an
   *invisible* turn (`TurnRecord.invisible_output`): output tokens spent with no text, no
   call, no refusal and no reasoning while tools were offered, as when a server held back
   tool-call markup in a stream and then dropped it (the same generation unstreamed shows
   the block in its text). With
   `malformed_tool_call` in `stop_on`, or after `max_consecutive_faults` malformed turns in
   a row, the episode ends as `malformed_tool_call` and nothing from the turn runs.
   Otherwise a malformed call gets an error result naming the problem (never echoing the
   fragment) and its valid siblings go on to 4.
4. gate check: a call to a `gate` tool (approval, human review) that is malformed (or
   repeats an earlier call's id, below) holds every sibling of the turn: each gets a result
   saying nothing was approved. Valid gate calls run first, whatever their position, and
   one that fails holds the rest the same way.
5. dispatch: the remaining calls run one after another, in the model's order, each
   validated against its schema first (`collector.envs.toolkit.run_tool`).
6. a turn with no tool call is the final answer: the episode ends as `done`. With a
   text-action world (`collector.envs.textaction`) it is an action instead: its text goes
   to the world's `step`, which ends the episode as `done` or answers with the next user
   message. A cut or malformed turn never gets here, so it is never an action.
After a turn's calls are settled, a world that says it is `finished` (an OpenEnv
observation's ``done``) ends the episode as `done`.
After the last allowed turn (`max_steps`) the episode ends as `max_steps`. Around all of it
runs the episode's wall-clock limit (`episode_timeout_s`): on expiry the model or tool call
in flight is cancelled, the open calls are settled, and the episode ends as `timeout`.

Every call id is settled exactly once, at the turn where it arose: before the next model
call (or the end of the episode) each call of an assistant turn has exactly one
`ToolResultMessage`, in the order of the calls. The history therefore replays cleanly to
strict backends; the adapters replay a malformed call's arguments as ``"{}"``. Call ids are
unique within a turn: a call whose id repeats the id of an earlier call of the same turn is
never run, whatever its arguments (which of two calls a result answers would be a guess);
it is answered with an error naming the repeated id, and carries the id ``{id}_dup{n}`` (the
first suffix free in that turn) in the history and the record, because strict backends
reject a turn with duplicate ids. The first call with the id goes through the steps above
as usual. An assistant
turn with neither text nor a call (a reasoning model that spent the cap thinking, a cap of
1 token) is kept in the record (`messages`) but never sent back to the model: no dialect has
a valid empty assistant message. The notice that follows such a cut turn then comes right
after the previous user or tool message, which every dialect accepts.

Reward policy (`LoopConfig.reward`):
- `done`: the grader runs on the final answer and world state; reward = graded value.
- `max_steps`: graded the same way when `grade_max_steps` (the default), else 0.0.
- `length`, `malformed_tool_call`, `context_overflow`: reward 0.0 with policy "zero"; with "grade_then_clamp"
  the grader runs and reward = min(graded, 0.0). With `grade_cut_episodes` the grader runs
  and its value is kept in `graded_reward` (the reward is unchanged by it).
- `timeout`: reward 0.0, not graded, `trainable` False: a wall-clock limit depends on the
  infrastructure's load (a slow or retrying provider, a busy tool host), not on the model,
  so a zero reward there would punish the policy for the cluster's weather.
- `error`: reward 0.0, not graded, `trainable` False. All other episodes are trainable: a
  trainer filters by `stop_reason`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from collector.config import LoopConfig
from collector.envs.base import (
    Environment,
    EpisodeContext,
    EpisodeWorld,
    Task,
    Tool,
    start_world,
)
from collector.envs.textaction import TextActionWorld
from collector.envs.toolkit import tool_specs
from collector.episode.actions import take_action
from collector.episode.notices import (
    CUT,
    CUT_RETRY,
    CUT_TEXT_NOTICE,
    ENV_FAILED,
    INVISIBLE_NOTICE,
    MALFORMED_END,
    SIBLING_END,
    TIMED_OUT,
    UNPARSED_NOTICE,
)
from collector.episode.state import CHARS_PER_TOKEN, EpisodeState, Failure, env_failure, redactor_for
from collector.episode.tokens import TokenTracker, holds_secret, withhold
from collector.episode.verdict import Fault, FaultStreak, classify_turn, over_limits
from collector.errors import ContextOverflow, EnvironmentFailure, ProtocolViolation, ProviderError
from collector.providers.base import Provider
from collector.record.chat import chat_messages, system_prompt, tools_json
from collector.record.episode import (
    Episode,
    EpisodeError,
    EpisodeTiming,
    episode_id,
    policy_span,
)
from collector.stop import StopReason
from collector.turn import (
    ArgStatus,
    SamplingParams,
    TurnRequest,
)

__all__ = ["EpisodeSpec", "record_episode", "run_episode"]

#: Stop reasons that are not the model's doing (reward policy in the module docstring).
_NOT_TRAINABLE = frozenset({StopReason.ERROR, StopReason.TIMEOUT})


@dataclass(slots=True, frozen=True)
class EpisodeSpec:
    """What to run: one task, one sample, one model at one per-turn output cap (`budget`).

    `episode_id` is computed from (run_id, task id, sample, model, budget) when left empty.
    The episode `seed` is sent as the sampling seed unless `sampling.seed` is set, so that
    samples of one task differ on seeded backends (the simulator among them).
    """

    run_id: str
    model: str
    provider_kind: str
    budget: int
    task: Task
    sample: int = 0
    seed: int = 0
    env_name: str = ""
    sampling: SamplingParams = field(default_factory=SamplingParams)
    episode_id: str = ""
    credentials: tuple[str, ...] = field(default=(), repr=False)
    """Every credential value the run was given, in every form sent: none reaches the record."""
    context_window: int | None = None
    """`provider.context_window`: the cap is clamped to what it leaves (step 0b)."""
    reasoning: str | None = None
    """The sweep's reasoning setting for this episode (`ReasoningSetting.label`), if any."""

    def __post_init__(self) -> None:
        if not self.episode_id:
            eid = episode_id(self.run_id, self.task.id, self.sample, self.model, self.budget)
            object.__setattr__(self, "episode_id", eid)

    def context(self, env_name: str) -> EpisodeContext:
        """What `Environment.start` is told about this episode."""
        return EpisodeContext(
            episode_id=self.episode_id,
            run_id=self.run_id,
            task_id=self.task.id,
            model=self.model,
            provider=self.provider_kind,
            budget=self.budget,
            sample=self.sample,
            seed=self.seed,
            env=self.env_name or env_name,
        )


async def _drive(
    spec: EpisodeSpec, provider: Provider, world: EpisodeWorld, tools: Sequence[Tool], state: EpisodeState,
    params: SamplingParams,
) -> StopReason:
    """Turns until a stop reason; the numbered steps are those of the module docstring."""
    settings = state.settings
    budget = settings.episode_output_budget
    specs = tool_specs(tools)
    by_name = {t.name: t for t in tools}
    streak = FaultStreak()
    # The offered tools' share of the prompt, for the context-window clamp only: measured when
    # a window is set (it cost ~0.3 ms an episode, `dataclasses.asdict` deep-copying every
    # schema, in runs that never read it: BENCHMARKS.md §a).
    schema_tokens = 0
    if spec.context_window is not None:
        offered = [{"name": s.name, "description": s.description, "parameters": s.parameters} for s in specs]
        schema_tokens = len(json.dumps(offered)) // CHARS_PER_TOKEN
    for _ in range(settings.max_steps):
        cap = spec.budget
        if budget is not None:  # 0
            remaining = budget - state.output_used
            if remaining <= 0:
                return StopReason.LENGTH
            cap = min(cap, remaining)
        if spec.context_window is not None:  # 0b
            room = spec.context_window - state.prompt_estimate() - schema_tokens
            if room < 1:
                return StopReason.CONTEXT_OVERFLOW
            cap = min(cap, room)
        request = TurnRequest(spec.model, state.history, specs, cap, params, state.wire_cache)
        if params.token_in:  # token-in mode: what this turn's prompt ids extend (tokens.py)
            request.token_prefix = state.tokens.prefix(len(state.history))
        try:  # 1
            turn = await provider.complete(request)
        except ContextOverflow as exc:
            state.retries.extend(exc.retries)
            return StopReason.CONTEXT_OVERFLOW
        except ProviderError as exc:
            state.retries.extend(exc.retries)
            raise Failure(EpisodeError(type(exc).__name__, str(exc))) from exc
        # Broad on purpose: an adapter bug must cost one episode, not a worker's whole batch.
        except Exception as exc:
            raise Failure(EpisodeError(type(exc).__name__, "unexpected exception in the provider")) from exc
        over = over_limits(turn, settings)
        if over is not None:
            raise Failure(EpisodeError(ProtocolViolation.__name__, f"turn {len(state.turns)}: {over}"))
        record = state.add_turn(turn, cap, bool(specs))
        calls = state.open_calls  # the turn's calls, repeated ids renamed
        verdict = classify_turn(turn, record, calls, settings, streak)

        if verdict.fault is Fault.CUT:  # 2
            record.discarded = True
            state.settle(CUT if verdict.ends else CUT_RETRY)
            if verdict.ends is not None:
                return verdict.ends
            if not calls:
                state.notice(CUT_TEXT_NOTICE)
            continue
        if verdict.fault is Fault.MALFORMED:  # 3
            if verdict.ends is not None:
                record.discarded = True
                for call in calls:
                    bad = call.status is ArgStatus.MALFORMED
                    state.answer(call, MALFORMED_END if bad else SIBLING_END, True)
                state.settle(SIBLING_END)
                return verdict.ends
            if not calls:
                state.notice(INVISIBLE_NOTICE if record.invisible_output else UNPARSED_NOTICE)
                continue

        if not calls:  # 6
            state.final_text = turn.text
            if isinstance(world, TextActionWorld) and not await take_action(world, turn.text or "", state):
                continue
            return StopReason.DONE
        began = time.perf_counter()
        try:
            await state.dispatch(calls, by_name)  # 3 (continuing), 4, 5
        finally:  # a timeout or a broken world mid-call still counts the time it took
            record.tool_s = time.perf_counter() - began
        state.settle(TIMED_OUT)
        if world.finished:
            state.final_text = turn.text
            return StopReason.DONE
    return StopReason.MAX_STEPS


async def _reward(reason: StopReason, world: EpisodeWorld, state: EpisodeState) -> tuple[float, float | None]:
    """(reward, graded_reward) under the policy of the module docstring."""
    policy = state.settings.reward
    if reason is StopReason.DONE or (reason is StopReason.MAX_STEPS and policy.grade_max_steps):
        graded = await _grade(world, state.final_text if reason is StopReason.DONE else None, state)
        return graded, graded
    if reason in (StopReason.LENGTH, StopReason.MALFORMED_TOOL_CALL, StopReason.CONTEXT_OVERFLOW):
        clamp = policy.policy == "grade_then_clamp"
        if clamp or policy.grade_cut_episodes:
            graded = await _grade(world, None, state)
            return (min(graded, 0.0) if clamp else 0.0), (graded if policy.grade_cut_episodes else None)
    if reason is StopReason.TIMEOUT and world.grade_timed_out:
        # Diagnosis only: a timed-out episode that the verifier would pass is still reward 0
        # (training on it rewards running out the clock); a failing verifier changes nothing.
        try:
            return 0.0, await _grade(world, None, state)
        except Failure:
            return 0.0, None
    return 0.0, None


async def _grade(world: EpisodeWorld, final_text: str | None, state: EpisodeState) -> float:
    redactor = state.redactor
    try:
        result = world.grade(final_text)
        if inspect.isawaitable(result):  # an async grader (one asking a server) gets a tool's time
            limit = world.grade_timeout_s
            if limit is None:
                limit = state.settings.tool_timeout_s
            async with asyncio.timeout(limit):
                result = await result
        value = float(result)
    # Broad on purpose: a grader crash is the environment's failure, an `error` episode.
    except Exception as exc:
        raise env_failure("grade", exc, redactor) from exc
    if not math.isfinite(value):
        message = "grade: the grader returned a non-finite value"
        raise Failure(EpisodeError(EnvironmentFailure.__name__, message))
    return value


def _timing(state: EpisodeState, world: EpisodeWorld | None) -> EpisodeTiming:
    """The episode's time outside the model (`EpisodeTiming`), the world's part included."""
    outside = dict(world.time_outside()) if world is not None else {}
    known = {f for f in EpisodeTiming.__dataclass_fields__ if f not in ("model_s", "tools_s")}
    return EpisodeTiming(
        model_s=sum(t.latency_s for t in state.turns),
        tools_s=sum(t.tool_s or 0.0 for t in state.turns),
        **{k: v for k, v in outside.items() if k in known},  # type: ignore[arg-type]
    )


async def run_episode(
    spec: EpisodeSpec, provider: Provider, env: Environment, settings: LoopConfig
) -> Episode:
    """Run one episode to its end and return its record. See the module docstring."""
    started = time.perf_counter()
    redactor = redactor_for(settings.redaction, spec.credentials)
    state = EpisodeState(spec.task, settings, redactor)
    params = spec.sampling
    if params.seed is None:
        params = dataclasses.replace(params, seed=spec.seed)
    state.tokens = TokenTracker(params.token_ids, params.temperature, params.stop)
    error: EpisodeError | None = None
    reward, graded = 0.0, None
    offered = "[]"  # the tools column: none were offered when the environment failed to start
    state.context = spec.context(env.name)
    world: EpisodeWorld | None = None
    try:
        try:
            world = start_world(env, spec.task, state.context)
            async with asyncio.timeout(settings.episode_timeout_s):  # a world that never opens
                await world.open()
            tools = list(world.tools)
            offered = tools_json(tool_specs(tools))
            observation = world.initial_observation
            if observation:
                state.extend_prompt(observation)
        # Broad on purpose: the environment crashed setting up, an `error` episode.
        except Exception as exc:
            raise env_failure("start", exc, redactor) from exc
        limit = settings.episode_timeout_s
        if world.time_limit_s is not None:  # the task's own limit (a Harbor agent timeout)
            limit = min(limit, world.time_limit_s)
        deadline = asyncio.timeout(limit)
        try:
            async with deadline:
                reason = await _drive(spec, provider, world, tools, state, params)
        except TimeoutError:
            if not deadline.expired():
                raise
            state.settle(TIMED_OUT)
            reason = StopReason.TIMEOUT
        reward, graded = await _reward(reason, world, state)
    except Failure as failure:
        state.settle(ENV_FAILED)  # a tool's world broke mid-turn: its calls are settled once
        reason, error, reward, graded = StopReason.ERROR, failure.error, 0.0, None
    finally:
        if world is not None:
            # Bounded, and never the episode's outcome: a world that cannot close is its own leak.
            with contextlib.suppress(Exception):
                async with asyncio.timeout(settings.tool_timeout_s):
                    await world.close()
    return record_episode(spec, spec.env_name or env.name, state, reason, (reward, graded), error, offered,
                          time.perf_counter() - started, _timing(state, world))


def record_episode(
    spec: EpisodeSpec, env_name: str, state: EpisodeState, reason: StopReason,
    rewards: tuple[float, float | None], error: EpisodeError | None, offered: str, duration_s: float,
    timing: EpisodeTiming | None = None,
) -> Episode:
    """The finished episode's record, scrubbed of every credential and redacted value.

    Shared with the harness gateway (`collector.harness`), whose episodes are recorded turn by
    turn in an `EpisodeState` the same way. `timing`: the time outside the model, where the
    caller measured it (the loop does; a harness's time is its own)."""
    redactor = state.redactor
    reward, graded = rewards
    episode = Episode(
        episode_id=spec.episode_id,
        run_id=spec.run_id,
        model=spec.model,
        provider=spec.provider_kind,
        budget=spec.budget,
        env=env_name,
        task_id=spec.task.id,
        sample=spec.sample,
        seed=spec.seed,
        stop_reason=reason,
        trainable=reason not in _NOT_TRAINABLE,
        reward=reward,
        graded_reward=graded,
        duration_s=duration_s,
        turns=state.turns,
        messages=state.records,
        executed_tool_calls=state.executed,
        tool_errors=state.tool_errors,
        error=error,
        system_prompt=system_prompt(state.records),
        chat=chat_messages(state.records),
        tools=offered,
        reasoning=spec.reasoning,
        retries=state.retries,
        timing=timing,
    )
    (episode.policy_version_first, episode.policy_version_last,
     episode.policy_versions) = policy_span(state.turns)
    # No credential the run was given anywhere in the record, and no value redaction hid in
    # the history left in the stored reasoning.
    scrubbed = redactor.scrub(episode, state.history)
    captured = any(t.output_token_ids is not None or t.prompt_token_ids is not None for t in state.turns)
    if captured and (scrubbed or state.scrubbed or holds_secret(redactor, state.history)):
        # Token ids decode to the text as sampled: an episode whose record lost anything to
        # redaction (tokens.py) keeps none.
        withhold(state.turns)
    return episode

"""Stored reasoning is redacted like the rest of the record: a model's thinking that repeats a
secret-keyed tool argument, a secret pair of a tool result or a run credential stores none
of them, and a reasoning item changed by redaction says so; the live replay keeps the original."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from collector.config import LoopConfig
from collector.episode.loop import EpisodeSpec, run_episode
from collector.episode.redact import REDACTED_ITEM_KEY, Redactor
from collector.providers.scripted import ScriptedProvider, call, calls, text
from collector.storage.local import LocalRunStore
from collector.turn import AssistantMessage, ToolResultMessage, Turn, UserMessage
from tests.faults.secret_env import SecretEnv
from tests.faults.secret_scan import leaks_in

PASSWORD = "PLANTED-pw-hunter2"
TOKEN = "PLANTED-tok-93c1"
CREDENTIAL = "sk-PLANTED-run-credential"
INNOCENT = {"type": "thinking", "thinking": "The user wants to log in, then done.", "signature": "sig_a"}


def _thinking(turn: Turn, thought: str, *items: dict[str, object]) -> Turn:
    return dataclasses.replace(turn, reasoning_text=thought, reasoning_tokens=40, reasoning_items=list(items))


def _script() -> list[Turn]:
    leaky = f"I log in as bob with password {PASSWORD} and token {TOKEN}."
    first = calls(call("login", {"username": "bob", "password": PASSWORD, "api_token": TOKEN}))
    second = text("done")
    return [
        _thinking(first, leaky, dict(INNOCENT),
                  {"type": "thinking", "thinking": leaky, "signature": "sig_b"}),
        # A later turn's thinking repeats the first turn's secrets and the run's own key,
        # in a Gemini-style thought part (the signature beside the text).
        _thinking(second, f"Logged in with {PASSWORD}; key {CREDENTIAL}.",
                  {"text": f"used {TOKEN} and {CREDENTIAL}", "thought": True, "thoughtSignature": "sig_c"}),
    ]


async def test_thinking_that_repeats_a_secret_argument_stores_no_secret(tmp_path: Path) -> None:
    """The shard holds neither the password nor the token a call's thinking repeated (nor the
    run's credential), every item redaction changed is marked, an untouched one is not, and
    the provider was sent the original items."""
    env = SecretEnv()
    provider = ScriptedProvider(_script())
    spec = EpisodeSpec("run", "model", "scripted", 512, env.tasks()[1], env_name=env.name,
                       credentials=(CREDENTIAL,))
    episode = await run_episode(spec, provider, env, LoopConfig.model_validate({}))
    assert episode.num_turns == 2, episode.error
    run = tmp_path / "run"
    with LocalRunStore.open(run, "fp", {}, "arrow", 64) as store:
        store.commit([episode])

    assert leaks_in(run, [PASSWORD, TOKEN, CREDENTIAL]) == []
    first, second = (json.loads(t.reasoning_items or "[]") for t in episode.turns)
    assert first[0] == INNOCENT  # nothing to hide: stored as received, still replayable
    assert first[1][REDACTED_ITEM_KEY] is True
    assert first[1]["thinking"] == "I log in as bob with password [REDACTED] and token [REDACTED]."
    assert second[0][REDACTED_ITEM_KEY] is True
    assert episode.turns[1].reasoning_text == "Logged in with [REDACTED]; key [redacted credential]."

    # The live replay is untouched: the answer turn's request carried the original items.
    replayed = next(m for m in provider.requests[1].messages if isinstance(m, AssistantMessage))
    assert replayed.reasoning_items == _script()[0].reasoning_items
    assert PASSWORD in json.dumps(replayed.reasoning_items)


def test_values_hidden_in_results_and_prose_are_collected_for_the_reasoning_scrub() -> None:
    """What redaction hides in a JSON tool result, a `key=value` pair of a text result and a
    Bearer credential is what stored reasoning loses too; values under 4 characters are left."""
    history = [
        ToolResultMessage("c1", "lookup", json.dumps({"session_id": "PLANTED-sess-1", "name": "bob"})),
        ToolResultMessage("c2", "lookup", "ok, token=PLANTED-t2; pin: abc"),
        UserMessage("Authorization: Bearer PLANTED-bearer-xyz"),
        AssistantMessage("", [call("login", {"password": "abc", "user": "bob"})]),
    ]
    values = Redactor().redacted_values(history)
    assert {"PLANTED-sess-1", "PLANTED-t2", "PLANTED-bearer-xyz"} <= values
    assert "bob" not in values
    assert "abc" not in values  # too short to scrub from prose without hiding ordinary words

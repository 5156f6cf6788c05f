"""Redaction: what reaches the episode record, and what never does."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from collector.episode.redact import REDACTED, Redactor
from collector.providers.arguments import has_template_opener
from collector.providers.scripted import call, calls, cut, leaked, text
from collector.turn import ArgStatus, AssistantMessage, ToolCall, UserMessage
from tests.episode.helpers import run


def test_secret_keys_are_redacted_nested_and_case_insensitively() -> None:
    """Values under secret-like keys are replaced at any depth, whatever the key's case or dashes."""
    r = Redactor()
    value = {
        "order_id": "A-1",
        "Authorization": "Bearer abc",
        "nested": [{"X-Api-Key": "k1", "refresh_token": "t"}, {"ok": 1}],
        "cookie_jar": {"a": "b"},
    }
    out = r.redact_value(value)
    assert out == {
        "order_id": "A-1",
        "Authorization": REDACTED,
        "nested": [{"X-Api-Key": REDACTED, "refresh_token": REDACTED}, {"ok": 1}],
        "cookie_jar": REDACTED,
    }
    assert value["Authorization"] == "Bearer abc"  # the input is not modified


def test_configured_keys_replace_the_defaults() -> None:
    """A custom key list is honoured and the defaults no longer apply."""
    r = Redactor(["ssn"])
    assert r.redact_value({"SSN": "1", "password": "p"}) == {"SSN": REDACTED, "password": "p"}


def test_malformed_fragment_is_stored_only_as_its_length() -> None:
    """An unparseable fragment is never stored, only its length; the debug flag keeps it apart."""
    fragment = '{"token": "abc123", "amount": 10'
    bad = ToolCall("c", "refund", None, ArgStatus.MALFORMED, raw_arguments=fragment)
    record = Redactor().call_record(bad)
    assert record.arguments_json is None
    assert record.raw_fragment is None
    assert record.unparsed_chars == len(fragment)
    debug = Redactor(keep_raw_fragments=True).call_record(bad)
    assert debug.raw_fragment == fragment
    assert debug.arguments_json is None


def test_text_redaction_for_json_and_prose() -> None:
    """JSON text gets key-based redaction; prose gets key=value and Bearer patterns hidden."""
    r = Redactor()
    assert json.loads(r.redact_text('{"password": "p", "a": 1}')) == {"password": REDACTED, "a": 1}
    assert r.redact_text("login with password=hunter2 now") == f"login with password={REDACTED} now"
    assert r.redact_text('cfg "api_key": "sk-1234"') == f'cfg "api_key": {REDACTED}'
    assert r.redact_text("Authorization: Bearer abcdefghijkl") == f"Authorization: {REDACTED}"
    assert r.redact_text("header bearer abcdefghijkl") == f"header bearer {REDACTED}"
    assert r.redact_text("plain text stays") == "plain text stays"


async def test_no_secret_and_no_fragment_reaches_the_record() -> None:
    """Secrets in executed and cut calls and in tool results never appear anywhere in the Episode."""
    script = [
        calls(call("refund", {"order_id": "A-1", "amount": 5, "api_token": "SECRET-A"})),
        cut(call("refund", '{"order_id": "A-1", "password": "SECRET-B", "note": "FRAGTAIL')),
    ]
    ep, _, _ = await run(script)
    dumped = repr(ep)
    assert "SECRET-A" not in dumped
    assert "SECRET-B" not in dumped
    assert "FRAGTAIL" not in dumped
    assert ep.executed_tool_calls == []  # api_token is not a refund argument: refused by validation
    stored = ep.messages[1].tool_calls[0].arguments_json
    assert stored is not None
    assert json.loads(stored)["api_token"] == REDACTED


async def test_executed_calls_store_redacted_arguments() -> None:
    """The executed_tool_calls column stores the redacted arguments of calls that ran."""
    from collector.envs.base import Environment, EpisodeWorld, Task, Tool
    from collector.envs.toolkit import tool

    class World(EpisodeWorld):
        def login(self, user: str, password: str) -> str:
            """Log in."""
            return f'{{"session_token": "TOK-SECRET", "user": "{user}"}}'

        @property
        def tools(self) -> list[Tool]:
            return [tool(self.login, inline=True)]

        def grade(self, final_text: str | None) -> float:
            return 1.0

    class Env(Environment):
        name = "login"

        def tasks(self) -> list[Task]:
            return [Task("t", "log in")]

        def start(self, task: Task) -> World:
            return World()

    ep, provider, _ = await run(
        [calls(call("login", {"user": "u", "password": "PW-SECRET"})), text("done")], env=Env()
    )
    assert json.loads(ep.executed_tool_calls[0].arguments_json) == {"user": "u", "password": REDACTED}
    dumped = repr(ep)
    assert "PW-SECRET" not in dumped
    assert "TOK-SECRET" not in dumped
    # The model itself saw the real result: only the record is redacted.
    assert "TOK-SECRET" in provider.requests[1].messages[-1].content  # type: ignore[union-attr]


_BLOCK = '<tool_call>\n{"name": "refund", "arguments": {"order_id": "A-1001", "amount":'


def test_unparsed_block_in_text_is_stored_as_its_length() -> None:
    """A tool-call block left in assistant text is cut at its opener and stored only as its length."""
    message = AssistantMessage("I will refund it now.\n" + _BLOCK, [])
    record = Redactor().message_record(message, 0)
    assert record.text == f"I will refund it now.\n[unparsed tool-call block: {len(_BLOCK)} chars]"
    assert record.raw_text is None
    assert "amount" not in record.text
    debug = Redactor(keep_raw_fragments=True).message_record(message, 0)
    assert debug.text == record.text
    assert debug.raw_text == _BLOCK


def test_unparsed_block_cut_at_the_first_opener_of_any_family() -> None:
    """The stored text ends before the earliest opener, whatever the template family and the rest."""
    openers = ["<tool_call>", "<|python_tag|>", "[TOOL_CALLS]", "<|tool_call>", "<function=", "<|tool_call|>"]
    for opener in openers:
        for later in ("", " then <tool_call>{}</tool_call>", " [TOOL_CALLS]"):
            text = f"Sure, password=hunter2 now {opener}" + '{"token": "abc' + later
            stored = Redactor().message_record(AssistantMessage(text, []), 1).text
            assert stored.startswith("Sure, password=[REDACTED] now [unparsed tool-call block: ")
            assert not has_template_opener(stored)
            assert "abc" not in stored


def test_text_without_an_opener_is_unchanged_and_other_roles_are_not_cut() -> None:
    """Plain assistant text keeps its words; a user prompt quoting an opener is not an unparsed block."""
    r = Redactor()
    assert r.message_record(AssistantMessage("The refund is done.", []), 0).text == "The refund is done."
    quoted = "explain <tool_call> please"
    assert r.message_record(UserMessage(quoted), None).text == quoted


async def test_loop_stores_a_leaked_block_as_its_length() -> None:
    """Through the loop, a leaked template call is malformed and its block never reaches the record."""
    ep, _, _ = await run([leaked("Refunding.\n" + _BLOCK), text("done")], stop_on=[])
    stored = [m.text for m in ep.messages if m.role == "assistant"]
    assert stored[0] == f"Refunding.\n[unparsed tool-call block: {len(_BLOCK)} chars]"
    assert "A-1001" not in repr(ep)


@given(
    prefix=st.text(st.characters(blacklist_characters="<[", blacklist_categories=("Cs",)), max_size=60),
    opener=st.sampled_from(["<tool_call>", "<|python_tag|>", "[TOOL_CALLS]", "<｜tool▁calls▁begin｜>"]),
    tail=st.text(max_size=60),
)
def test_stored_text_is_the_prefix_and_the_block_length(prefix: str, opener: str, tail: str) -> None:
    """For any text before an opener, the record keeps exactly that text (redacted) and the block's length."""
    r = Redactor()
    stored = r.message_record(AssistantMessage(prefix + opener + tail, []), 0).text
    assert stored == r.redact_text(prefix) + f"[unparsed tool-call block: {len(opener) + len(tail)} chars]"


def test_default_names_match_by_word_parts_not_substrings() -> None:
    """The defaults hide passwd, pwd, private_key, auth, session_id, credentials.*; not author, keyboard."""
    r = Redactor()
    hidden = [
        "passwd", "pwd", "db_password", "passphrase", "private_key", "access_key", "AWS_ACCESS_KEY",
        "auth", "authToken", "X-Auth-Token", "oauth", "x-api-key", "x-goog-api-key", "apiKey",
        "session_id", "sessionId", "credentials", "credentials.user", "client_secret", "jwt",
        "Authorization", "cookie", "accesstoken", "refresh_token",
    ]  # fmt: skip
    kept = ["author", "keyboard", "tokenizer", "monkey", "secretary", "session", "order_id", "authority"]
    assert [k for k in hidden if not r.is_secret_key(k)] == []
    assert [k for k in kept if r.is_secret_key(k)] == []
    nested = {"credentials": {"user": "bob", "pin": "1234"}, "author": "Ann", "keyboard": "qwerty"}
    assert r.redact_value(nested) == {"credentials": REDACTED, "author": "Ann", "keyboard": "qwerty"}


def test_default_list_is_the_configs_default() -> None:
    """`loop.redaction.secret_keys` defaults to the list this module documents (one list, two layers)."""
    from collector.config import RedactionConfig
    from collector.episode.redact import DEFAULT_SECRET_KEYS

    assert tuple(RedactionConfig().secret_keys) == DEFAULT_SECRET_KEYS


def test_prose_pairs_use_the_same_word_rule() -> None:
    """In free text, `pwd=...`, `session_id: ...` and `authToken=...` are hidden; `author: ...` is not."""
    r = Redactor()
    text = "pwd=hunter2 session_id: abc123 authToken=t0k author: Ann note: passwd=x9"
    assert r.redact_text(text) == (
        f"pwd={REDACTED} session_id: {REDACTED} authToken={REDACTED} author: Ann note: passwd={REDACTED}"
    )
    assert r.redact_text("Authorization: Basic Ym9iOmh1bnRlcjI=") == f"Authorization: {REDACTED}"
    assert r.redact_text("sent basic Ym9iOmh1bnRlcjI= along") == f"sent basic {REDACTED} along"
    assert r.redact_text("basic arithmetic first") == "basic arithmetic first"


CREDENTIAL = 'sk-PLANTED"run\\key-0123'  # a quote and a backslash: escaped inside JSON text


async def test_no_credential_of_the_run_reaches_the_record() -> None:
    """A run credential in text, plain-keyed arguments, a fragment, a tool name or an error is replaced."""
    from collector.config import LoopConfig
    from collector.episode.loop import EpisodeSpec, run_episode
    from collector.episode.redact import REDACTED_CREDENTIAL
    from collector.errors import RequestRejected
    from collector.providers.scripted import ScriptedProvider
    from collector.turn import TurnRequest
    from tests.episode.helpers import ToyEnv

    def rejected(request: TurnRequest) -> Any:
        raise RequestRejected(f"the server says: key {CREDENTIAL} is wrong", 400)

    script: list[Any] = [
        calls(
            call("refund", {"order_id": "A-1", "amount": 5, "note": f"my key is {CREDENTIAL}"}),
            call(f"tool_{CREDENTIAL}", {"x": 1}),
            text=f"Using {CREDENTIAL} now",
        ),
        cut(call("refund", '{"order_id": "A-1", "memo": "' + json.dumps(CREDENTIAL)[1:-1])),
        rejected,
    ]
    env = ToyEnv()
    spec = EpisodeSpec("run", "model", "scripted", 64, env.tasks()[0], credentials=(CREDENTIAL,))
    debug = LoopConfig.model_validate({"stop_on": [], "redaction": {"keep_raw_fragments": True}})
    episode = await run_episode(spec, ScriptedProvider(script), env, debug)
    assert "PLANTED" not in repr(episode)  # raw, JSON-escaped, or quoted in a tool error
    assert episode.messages[1].text == f"Using {REDACTED_CREDENTIAL} now"
    stored = episode.messages[1].tool_calls[0].arguments_json
    assert stored is not None
    assert json.loads(stored)["note"] == f"my key is {REDACTED_CREDENTIAL}"
    assert episode.error is not None
    assert REDACTED_CREDENTIAL in episode.error.message
    assert CREDENTIAL not in repr(spec)  # not in the spec's repr either


def test_credential_values_cover_every_form_an_endpoint_sends() -> None:
    """The key, a URL password, user:pass, its Basic base64 and a query key are credentials; others not."""
    from collector.episode.redact import credential_values

    values = credential_values("sk-k", ("bob", "p@ss"), [("key", "AIzaQ"), ("api-version", "2024-06-01")])
    assert set(values) >= {"sk-k", "p@ss", "p%40ss", "bob:p@ss", "Ym9iOnBAc3M=", "AIzaQ"}
    assert "bob" not in values
    assert "2024-06-01" not in values
    assert credential_values(None, ("tok-in-user", ""), [])[0] == "tok-in-user"

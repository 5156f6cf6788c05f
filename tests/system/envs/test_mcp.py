"""The MCP environment against a real MCP server (tests/envs/mcp_server.py) over stdio and
streamable HTTP on loopback: tools from tools/list, isError, one session per episode, crashes."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import json
import logging
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from collector.config import LoopConfig
from collector.envs import mcplog
from collector.envs.loading import load_environment
from collector.envs.mcp import MCPEnvironment, MCPWorld
from collector.episode.loop import EpisodeSpec, run_episode
from collector.errors import EnvironmentFailure
from collector.providers.scripted import ScriptedProvider, call, calls, cut, text
from collector.stop import StopReason
from tests.episode.helpers import assert_settled

SERVER = Path(__file__).resolve().parents[2] / "envs" / "mcp_server.py"
STDIO = ["python", str(SERVER), "stdio"]
TASK = {"id": "status-a1", "prompt": "What is the status of order A-1?", "metadata": {"expected": "shipped"}}


@contextlib.contextmanager
def _http_server() -> Iterator[str]:
    """The test server over streamable HTTP on a free loopback port, yielded once it accepts."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, str(SERVER), "http", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        while process.poll() is None:  # ready when the port accepts; a start-up crash ends the loop
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        assert process.poll() is None, "the test MCP server exited while starting"
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def http_url() -> Iterator[str]:
    """One HTTP server for the tests that do not kill it."""
    with _http_server() as url:
        yield url


def _env(server: str | list[str], **options: object) -> MCPEnvironment:
    env = load_environment("mcp", {"server": server, "tasks": [TASK], **options})
    assert isinstance(env, MCPEnvironment)
    return env


async def _run(env: MCPEnvironment, script: list[object], sample: int = 0, **loop: object):  # type: ignore[no-untyped-def]
    provider = ScriptedProvider(script)  # type: ignore[arg-type]
    spec = EpisodeSpec("run", "m", "sim", 64, env.tasks()[0], sample=sample, env_name="mcp")
    episode = await run_episode(spec, provider, env, LoopConfig.model_validate(loop))
    return episode, provider


def _results(episode: object) -> list[tuple[str, bool]]:
    return [(m.text, m.is_error) for m in episode.messages if m.role == "tool"]  # type: ignore[attr-defined]


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_tools_come_from_the_server_and_is_error_is_an_error_result(
    transport: str, request: pytest.FixtureRequest
) -> None:
    """The model is offered the server's tools/list (schemas as listed, the grade tool hidden);
    a call runs on the server, an isError result is an error result, and the episode goes on."""
    server = STDIO if transport == "stdio" else request.getfixturevalue("http_url")
    env = _env(server)
    script = [
        calls(
            call("lookup_order", {"order_id": "A-1"}, id="c1"),
            call("lookup_order", {"order_id": "Z-9"}, id="c2"),
        ),
        text("Order A-1 is shipped."),
    ]
    episode, provider = await _run(env, script)
    assert episode.stop_reason is StopReason.DONE, episode.error
    offered = {t.name: t.parameters for t in provider.requests[0].tools}
    assert set(offered) == {
        "lookup_order",
        "calculator",
        "approve",
        "variable",
        "variable_digest",
        "big",
        "crash",
        "grade",
    }
    assert offered["lookup_order"]["required"] == ["order_id"]
    (ok, ok_error), (bad, bad_error) = _results(episode)
    assert json.loads(ok)["status"] == "shipped"
    assert not ok_error
    assert bad_error
    assert "no order Z-9" in bad
    assert [(c.call_id, c.is_error) for c in episode.executed_tool_calls] == [("c1", False), ("c2", True)]
    assert episode.reward == 1.0  # the default grader: metadata.expected in the answer
    assert_settled(episode)


async def test_one_session_per_episode_and_the_grade_tool_reads_it() -> None:
    """Each episode gets its own server session (over stdio, its own process), so state never
    crosses episodes; `grade_tool` grades from the session's state and is not offered."""
    env = _env(STDIO, grade_tool="grade")
    looked_up = [calls(call("lookup_order", {"order_id": "A-1"}, id="c1")), text("It is shipped.")]
    first, provider = await _run(env, looked_up)
    second, _ = await _run(env, looked_up, sample=1)
    never, _ = await _run(env, [text("It is shipped.")], sample=2)  # no lookup in this session
    assert "grade" not in {t.name for t in provider.requests[0].tools}
    assert (first.reward, second.reward, never.reward) == (1.0, 1.0, 0.0)
    pids = {json.loads(e.messages[2].text)["pid"] for e in (first, second)}
    assert len(pids) == 2


async def grade_by_asking_the_server(world: MCPWorld, final_text: str | None) -> float:
    """A `grader` hook: half from the answer, half from the session's state on the server."""
    from_server = float(await world.call("grade", {"final_text": final_text or ""}))
    return 0.5 * from_server + (0.5 if world.task.metadata["expected"] in (final_text or "") else 0.0)


async def test_a_python_grader_hook_can_ask_the_server() -> None:
    """`grader = "module:function"` grades with the episode's own session still open."""
    env = _env(STDIO, grader="tests.system.envs.test_mcp:grade_by_asking_the_server")
    looked_up, _ = await _run(env, [calls(call("lookup_order", {"order_id": "A-1"})), text("It is shipped.")])
    guessed, _ = await _run(env, [text("It is shipped.")], sample=1)
    assert (looked_up.reward, guessed.reward) == (1.0, 0.5)


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_a_server_that_dies_mid_episode_is_an_error_episode(transport: str) -> None:
    """A server killed mid-call ends the episode as `error` naming the cause, its sibling call
    is settled without running, and the episode returns instead of hanging."""
    script = [calls(call("crash", {}, id="c1"), call("lookup_order", {"order_id": "A-1"}, id="c2"))]
    with contextlib.ExitStack() as stack:
        server = STDIO if transport == "stdio" else stack.enter_context(_http_server())  # killed: its own
        episode, _ = await _run(_env(server), script, tool_timeout_s=20)
    assert episode.stop_reason is StopReason.ERROR
    assert not episode.trainable
    assert episode.error is not None
    assert episode.error.type == "EnvironmentFailure"
    assert "tool crash" in episode.error.message
    assert "MCP server" in episode.error.message
    if transport == "stdio":  # the server's own last words are quoted
        assert "its stderr ended: test-orders: crashing on purpose" in episode.error.message
    assert [c.call_id for c in episode.executed_tool_calls] == ["c1"]
    assert_settled(episode)


async def test_a_server_that_cannot_start_is_an_error_episode() -> None:
    """A command that exits at once (its stderr's last line quoted), or a URL nothing listens
    on, is an `error` episode saying the MCP server failed to start."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}/mcp"
    for server in (["python", "-c", "import no_such_module_zz"], closed):
        episode, _ = await _run(_env(server, startup_timeout_s=20), [text("never asked")])
        assert episode.stop_reason is StopReason.ERROR, server
        assert episode.error is not None
        assert "start: EnvironmentFailure: MCP server" in episode.error.message
        assert "failed to start" in episode.error.message
        if isinstance(server, list):
            assert "its stderr ended: ModuleNotFoundError: No module named 'no_such_module_zz'" in (
                episode.error.message
            )


async def test_no_call_from_a_cut_turn_reaches_the_server() -> None:
    """A complete-looking MCP call in a turn cut by the cap is never sent to the server."""
    env = _env(STDIO, grade_tool="grade")
    episode, _ = await _run(env, [cut(call("lookup_order", {"order_id": "A-1"}, id="c1"))])
    assert episode.stop_reason is StopReason.LENGTH
    assert episode.executed_tool_calls == []
    assert_settled(episode)


async def test_a_failed_gate_call_holds_its_siblings_from_the_server() -> None:
    """A server tool named in `gates` whose call returns isError holds every other call of the
    turn: none of them is sent to the server."""
    env = _env(STDIO, gates=["approve"])
    script = [
        calls(
            call("lookup_order", {"order_id": "A-1"}, id="c1"), call("approve", {"order_id": "B-2"}, id="g1")
        ),
        text("Not approved."),
    ]
    episode, _provider = await _run(env, script)
    assert episode.stop_reason is StopReason.DONE
    assert [(c.call_id, c.is_error) for c in episode.executed_tool_calls] == [("g1", True)]
    held = next(m for m in episode.messages if m.role == "tool" and m.call_id == "c1")
    assert held.text.startswith("not executed: the approve call of this turn did not go through")
    assert_settled(episode)


async def test_pass_env_hands_a_stdio_server_a_variable_of_the_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`pass_env` copies a worker variable (a key) into the server's environment by name; a
    variable the worker lacks fails the episode's start naming it."""
    monkeypatch.setenv("MCP_TEST_TOKEN", "tok-123")
    env = _env(STDIO, pass_env=["MCP_TEST_TOKEN"])
    script = [calls(call("variable_digest", {"name": "MCP_TEST_TOKEN"}, id="c1")), text("done")]
    episode, _ = await _run(env, script)
    assert _results(episode) == [(hashlib.sha256(b"tok-123").hexdigest(), False)]
    assert "tok-123" not in json.dumps(env.variables)
    monkeypatch.delenv("MCP_TEST_TOKEN")
    episode, _ = await _run(env, script)
    assert episode.error is not None
    assert "pass_env: MCP_TEST_TOKEN not set on this worker" in episode.error.message


def test_bad_options_are_one_line_config_errors() -> None:
    """A server that is neither a command nor a URL, or a grader that does not import, is refused."""
    from collector.errors import ConfigError

    for options, message in (
        ({"server": "localhost:8000"}, "env.options.server"),
        ({"server": STDIO, "grader": "no_such_module_q:grade"}, "env.options.grader: cannot import"),
    ):
        with pytest.raises(ConfigError, match=message):
            load_environment("mcp", options)


async def test_a_pass_env_value_the_server_prints_or_returns_is_never_stored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A server that returns its `pass_env` key in a tool result, or prints it on stderr as it
    fails to start (the tail is quoted in the error), hands on `[redacted credential]`: the
    key reaches neither the model nor the record, and `credentials()` lists it for the worker."""
    secret = 'sk-mcp-"quoted"-4f2a9'
    monkeypatch.setenv("MCP_TEST_TOKEN", secret)
    env = _env(STDIO, pass_env=["MCP_TEST_TOKEN"])
    assert secret in env.credentials()
    assert json.dumps(secret)[1:-1] in env.credentials()  # as it sits inside JSON text
    script = [calls(call("variable", {"name": "MCP_TEST_TOKEN"}, id="c1")), text("done")]
    episode, provider = await _run(env, script)
    assert _results(episode) == [("[redacted credential]", False)]
    assert "4f2a9" not in repr(dataclasses.asdict(episode))
    assert "4f2a9" not in repr(provider.requests[-1])
    leaky = [
        "python",
        "-c",
        "import os, sys; print('key', os.environ['MCP_TEST_TOKEN'], file=sys.stderr); sys.exit(1)",
    ]
    episode, _ = await _run(_env(leaky, pass_env=["MCP_TEST_TOKEN"], startup_timeout_s=20), [text("never")])
    assert episode.error is not None
    assert "its stderr ended: key [redacted credential]" in episode.error.message
    assert "4f2a9" not in repr(dataclasses.asdict(episode))
    # A long line: the tail is cut at 300 characters, through the key, after it is scrubbed.
    code = "import os, sys; print('z' * 290, os.environ['MCP_TEST_TOKEN'], file=sys.stderr); sys.exit(1)"
    long_line = _env(["python", "-c", code], pass_env=["MCP_TEST_TOKEN"], startup_timeout_s=20)
    world = long_line.start(long_line.tasks()[0])
    with pytest.raises(EnvironmentFailure) as failed:  # the whole message, before the loop's own cut
        await world.open()
    await world.close()
    assert "zzz [redacted" in str(failed.value)
    assert "sk-mcp" not in str(failed.value)


async def test_credentials_in_an_mcp_url_are_listed_and_kept_out_of_messages() -> None:
    """`http://user:PASS@host/mcp?api_key=KEY`: PASS, KEY and the Basic form are the env's
    credentials, and a server that cannot be reached is named by its public URL, neither
    credential in the episode's error."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://ann:pw-Secret-77@127.0.0.1:{port}/mcp?api_key=key-Secret-88&team=blue"
    env = _env(url, startup_timeout_s=20)
    listed = env.credentials()
    assert {
        "pw-Secret-77",
        "ann:pw-Secret-77",
        base64.b64encode(b"ann:pw-Secret-77").decode(),
        "key-Secret-88",
    } <= set(listed)
    assert "ann" not in listed
    assert "blue" not in listed
    episode, _ = await _run(env, [text("never asked")])
    assert episode.error is not None
    assert f"MCP server http://127.0.0.1:{port}/mcp failed to start" in episode.error.message
    assert "Secret" not in episode.error.message


async def test_a_tool_whose_schema_cannot_be_compiled_fails_open_naming_it() -> None:
    """A listed tool whose inputSchema is `{"$ref": "#"}` (RecursionError in the validator at the
    first call, every rerun) is refused when the session opens: an `error` episode whose one
    line names the tool, never an exception out of the episode (the worker's batch)."""
    env = _env(["python", str(SERVER), "stdio", "bad-schema"])
    script = [calls(call("calculator", {"expression": "1+1"}, id="c1")), text("2")]
    episode, provider = await _run(env, script)
    assert episode.stop_reason is StopReason.ERROR
    assert episode.error is not None
    assert "tool 'calculator': its schema is refused: a $ref cycle" in episode.error.message
    assert "\n" not in episode.error.message
    assert provider.requests == []  # nothing was asked of the model


async def test_a_result_over_the_size_bound_is_that_calls_error_result() -> None:
    """A 2 MB MCP result (over the 1 MiB default of loop.max_tool_result_bytes) is neither stored
    nor replayed: the call's result is an error naming the size, and the episode goes on."""
    script = [
        calls(call("big", {"size": 2_000_000}, id="c1"), call("big", {"size": 1000}, id="c2")),
        text("done"),
    ]
    episode, provider = await _run(_env(STDIO), script)
    assert episode.stop_reason is StopReason.DONE, episode.error
    (over, over_error), (ok, ok_error) = _results(episode)
    assert over_error
    assert over == "error: big returned 2,000,000 bytes, over loop.max_tool_result_bytes = " \
        "1,048,576; the result was dropped"
    assert (ok, ok_error) == ("x" * 1000, False)
    assert len(repr(provider.requests[-1].messages)) < 10_000  # what is replayed to the model


async def test_a_stdio_server_flooding_stdout_cannot_flood_the_logs(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """4,000 non-JSON stdout lines (2 MB, each of which the SDK logs with a traceback) reach the
    logs as a few bounded records with no traceback, the key they quote scrubbed, and the
    session still works."""
    monkeypatch.setenv("MCP_TEST_TOKEN", "tok-flood-5150")
    env = _env(["python", str(SERVER), "stdio", "flood", "4000"], pass_env=["MCP_TEST_TOKEN"])
    script = [calls(call("lookup_order", {"order_id": "A-1"}, id="c1")), text("Order A-1 is shipped.")]
    with caplog.at_level(logging.DEBUG, logger="mcp"):
        episode, _ = await _run(env, script)
    assert episode.stop_reason is StopReason.DONE, episode.error
    sdk = [r for r in caplog.records if r.name.startswith("mcp")]
    parse = [r for r in sdk if "Failed to parse JSONRPC message" in r.getMessage()]
    assert 1 <= len(parse) <= mcplog.BURST
    assert all(r.exc_info is None for r in sdk)
    logged = "\n".join(caplog.handler.format(r) for r in sdk)
    assert len(logged) < 100_000
    assert "tok-flood-5150" not in caplog.text


def test_the_log_guard_rate_limits_truncates_and_counts_what_it_dropped() -> None:
    """Per message template: BURST records per window pass, each cut to max_chars; the first
    one of the next window says how many were dropped."""
    guard = mcplog.SDKLogGuard(burst=2, window_s=0.2, max_chars=100)
    guard.add_secrets(["sekrit-value"])

    def record(text: str) -> logging.LogRecord:
        try:
            raise ValueError(text)
        except ValueError:
            return logging.LogRecord("mcp.client.stdio", logging.ERROR, __file__, 1, "Failed %s", ("x",),
                                     sys.exc_info())

    passed = [r for r in (record("sekrit-value " + "z" * 5000) for _ in range(50)) if guard.filter(r)]
    assert len(passed) == 2
    assert all(len(r.getMessage()) < 200 and r.exc_info is None for r in passed)
    assert "sekrit-value" not in passed[0].getMessage()
    assert "[redacted credential]" in passed[0].getMessage()
    time.sleep(0.25)
    later = record("short")
    assert guard.filter(later)
    assert "[48 more like this dropped]" in later.getMessage()

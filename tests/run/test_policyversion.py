"""The declared policy version (`collector.run.policyversion`): its config, its readers (a
constant, a file rewritten between steps, a URL), the rule against a server's own version,
and the record's columns (per turn, and the episode's span) through a shard and back."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import httpx
import pytest

from collector.config import ProviderConfig, RunConfig
from collector.errors import ConfigError
from collector.providers.scripted import ScriptedProvider, text
from collector.record.episode import TurnRecord, policy_span
from collector.record.shards import SCHEMA, episodes_from_table, episodes_to_table
from collector.run.policyversion import (
    DeclaredVersion,
    VersionedProvider,
    declared_version,
    version_from_reply,
)
from collector.turn import Turn, TurnRequest, UserMessage


def _request() -> TurnRequest:
    return TurnRequest("m", [UserMessage("hi")], [], 64)


def _client(handler: httpx.MockTransport | None = None) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=handler or httpx.MockTransport(lambda r: httpx.Response(500)))


@pytest.mark.parametrize(("content", "version"), [
    (b'{"weight_version": "step-3"}', "step-3"),
    (b'{"policy_version": 12}', "12"),
    (b"42\n", "42"),
    (b'"ckpt-9"', "ckpt-9"),
    (b"  step-4 \n", "step-4"),
    (b"", None),
    (b"{}", None),
    (b"true", None),
    (b"[1]", None),
    (b"x" * 201, None),
])
def test_a_version_from_a_file_or_reply(content: bytes, version: str | None) -> None:
    assert version_from_reply(content) == version


def test_config_declares_at_most_one_version_named_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="set at most one of policy_version, policy_version_file"):
        ProviderConfig(policy_version="v1", policy_version_file=str(tmp_path / "v"))
    with pytest.raises(ValueError, match="policy_version_url"):
        ProviderConfig(policy_version_url="file:///etc/passwd")
    assert declared_version(ProviderConfig()) is None
    config = ProviderConfig(policy_version_url="http://127.0.0.1:1/v", policy_version_timeout_s=0.5)
    reader = declared_version(config)
    assert reader is not None
    assert reader.url == "http://127.0.0.1:1/v"
    assert reader.timeout_s == 0.5


def test_a_bad_declared_version_in_a_run_config_is_a_one_line_config_error(tmp_path: Path) -> None:
    from collector.config.loading import load_config

    path = tmp_path / "run.toml"
    path.write_text('name = "x"\n[sweep]\nmodels = ["sim-terse"]\nbudgets = [32]\n'
                    '[env]\nname = "arithmetic"\n[provider]\npolicy_version = "v1"\npolicy_version_url = "http://127.0.0.1:9/v"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "\n" not in str(info.value)
    assert "policy_version" in str(info.value)


def test_declared_fields_leave_the_run_id_alone(tmp_path: Path) -> None:
    """A version file or URL is how turns are labelled, not what the run is: resume keeps its id."""
    from collector.config.identity import run_id

    base = {"name": "x", "sweep": {"models": ["sim-terse"], "budgets": [32]}, "env": {"name": "arithmetic"}}
    plain = RunConfig.model_validate(base)
    declared = RunConfig.model_validate({**base, "provider": {"policy_version_file": str(tmp_path / "v")}})
    assert run_id(plain) == run_id(declared)


async def test_the_file_is_read_again_only_when_it_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "version"
    reader = DeclaredVersion(path=str(path))
    async with _client() as client:
        with caplog.at_level(logging.WARNING):
            assert await reader.read(client) is None  # not written yet: unknown, said once
            assert await reader.read(client) is None
        assert len([r for r in caplog.records if "policy_version_file" in r.getMessage()]) == 1
        path.write_text("step-1\n")
        assert await reader.read(client) == "step-1"
        reads: list[str] = []
        real_open = open

        def counting_open(file: str, *args: object, **kwargs: object) -> object:
            reads.append(file)
            return real_open(file, *args, **kwargs)  # type: ignore[call-overload]

        monkeypatch.setattr("builtins.open", counting_open)
        assert await reader.read(client) == "step-1"
        assert reads == []
        path.write_text("step-22\n")
        os.utime(path, ns=(1, 2))  # a rewrite within the clock's resolution still differs in size
        assert await reader.read(client) == "step-22"
        assert reads == [str(path)]


async def test_the_url_is_fetched_with_its_bound_and_a_failure_is_unknown() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"weight_version": "v5"})

    reader = DeclaredVersion(url="http://trainer/get_weight_version", timeout_s=0.25)
    async with _client(httpx.MockTransport(answer)) as client:
        assert await reader.read(client) == "v5"
    assert seen[0].extensions["timeout"]["read"] == 0.25
    async with _client() as client:  # HTTP 500
        assert await reader.read(client) is None

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    async with _client(httpx.MockTransport(refuse)) as client:
        assert await reader.read(client) is None


class _Swapping(DeclaredVersion):
    """A declared reader whose value changes between reads, as a trainer's file would."""

    def __init__(self, *values: str) -> None:
        super().__init__(path="unused")
        self.values = list(values)

    async def read(self, client: httpx.AsyncClient) -> str | None:
        return self.values.pop(0)


def _turn(version: str | None = None, retries: tuple[str, ...] = ()) -> Turn:
    turn = text("fine")
    turn.retries = retries
    if version is not None:
        turn.policy_version, turn.policy_version_source = version, "server"
    return turn


async def test_the_server_wins_and_a_change_during_the_call_is_unknown() -> None:
    async with _client() as client:
        async def one(declared: DeclaredVersion, turn: Turn) -> Turn:
            return await VersionedProvider(ScriptedProvider([turn]), declared, client).complete(_request())

        served = await one(_Swapping("d1", "d1"), _turn("s9"))
        assert (served.policy_version, served.policy_version_source) == ("s9", "server")
        steady = await one(_Swapping("d1", "d1"), _turn())
        assert (steady.policy_version, steady.policy_version_source) == ("d1", "declared")
        changed = await one(_Swapping("d1", "d2"), _turn())
        assert (changed.policy_version, changed.policy_version_source) == (None, None)
        after_abort = await one(_Swapping("d1", "d2"), _turn(retries=("abort",)))
        assert after_abort.policy_version == "d2"
        constant = await one(DeclaredVersion(constant="c1"), _turn())
        assert (constant.policy_version, constant.policy_version_source) == ("c1", "declared")


def test_the_span_and_the_columns_through_a_shard() -> None:
    from tests.record.factory import make_episode

    assert policy_span([]) == (None, None, 0)
    episode = make_episode()
    episode.turns = [TurnRecord(**{**_record_fields(episode.turns[0]), "index": i, "policy_version": v,
                                   "policy_version_source": "server" if v else None})
                     for i, v in enumerate(["v1", None, "v2", "v1"])]
    span = policy_span(episode.turns)
    assert span == ("v1", "v1", 2)
    episode.policy_version_first, episode.policy_version_last, episode.policy_versions = span
    first = SCHEMA.names.index("policy_version_first")
    assert SCHEMA.names[first:first + 3] == ["policy_version_first", "policy_version_last", "policy_versions"]
    back = episodes_from_table(episodes_to_table([episode]))[0]
    assert [t.policy_version for t in back.turns] == ["v1", None, "v2", "v1"]
    assert [t.policy_version_source for t in back.turns] == ["server", None, "server", "server"]
    assert (back.policy_version_first, back.policy_version_last, back.policy_versions) == ("v1", "v1", 2)


def _record_fields(record: TurnRecord) -> dict[str, object]:
    import dataclasses

    return {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}

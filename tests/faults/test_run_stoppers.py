"""Provider answers that fail every episode alike stop the run instead of filling it with errors.

A quota 429 (`insufficient_quota`), a refused key (401/403) and an unknown model name (404)
say nothing about the model's behaviour and a rerun must retry them once fixed. So the run
stops handing out work, commits the episodes that finished, commits none of the failed ones
and exits 2 with one line naming the cause (never the key). All through `collector.cli.main`
against loopback servers.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from collector.cli import main
from collector.config import load_config
from collector.run.plan import plan_work
from tests.checking import committed_ids, committed_rows
from tests.faults.storm import StormProxy
from tests.loopback import serving

pytestmark = pytest.mark.timeout(240)

#: Keys the refusing server was sent (echoed back in its reply, like OpenAI does).
RECEIVED_KEYS: list[str] = []

CONFIG = """
name = "stopper"
samples_per_task = 2
[provider]
kind = "chat"
base_url = "{base_url}"
{key_line}
retry = {{ max_retries = 1, initial_backoff_s = 0.01, max_backoff_s = 0.02 }}
[sweep]
models = {models}
budgets = [64, 256]
[env]
name = "arithmetic"
tasks = 10
[ray]
pool = "in_process"
workers = 2
episodes_in_flight = 4
batch_size = 4
cpus_per_worker = 0.5
[output]
path = "{run_dir}"
rows_per_shard = 4
"""


def write_config(
    tmp_path: Path, base_url: str, models: str = '["sim-terse"]', key_env: str | None = None
) -> Path:
    key_line = f'api_key_env = "{key_env}"' if key_env else ""
    path = tmp_path / "stopper.toml"
    path.write_text(
        CONFIG.format(base_url=base_url, key_line=key_line, models=models, run_dir=tmp_path / "run")
    )
    return path


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("collector: error: ")]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture
def sim_proxy() -> Iterator[StormProxy]:
    """A calm storm proxy in front of a fresh simulator (faults only when the test asks)."""
    from collector.sim.server import SimServer

    with SimServer(seed=0) as sim:
        proxy = StormProxy(sim.base_url, seed=1).up()
        proxy.calm = True
        try:
            yield proxy
        finally:
            proxy.down()


def test_quota_stops_the_run_and_the_rerun_completes_exactly_once(
    tmp_path: Path, sim_proxy: StormProxy, capsys: pytest.CaptureFixture[str]
) -> None:
    """A quota 429 mid-run: exit 2, one line, finished kept, quota'd ones absent; a rerun completes once."""
    config = write_config(tmp_path, sim_proxy.base_url + "/v1")
    planned = {item.episode_id for item in plan_work(load_config(config)).items}
    sim_proxy.quota_after = 30  # about a third of the run's model calls, then out of credit

    assert main(["run", str(config), "--quiet"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "quota" in line
    rows = committed_rows(tmp_path / "run")
    assert 0 < len(rows) < len(planned)
    assert not [r for r in rows if r["error"] is not None and r["error"]["type"] == "QuotaExhausted"]
    assert sim_proxy.counts["quota"] > 0
    first = set(committed_ids(tmp_path / "run"))

    sim_proxy.quota_after = None  # the quota reset
    assert main(["run", str(config), "--quiet"]) == 0
    assert f"{len(planned)}/{len(planned)} episodes committed" in capsys.readouterr().err
    counts = committed_ids(tmp_path / "run")
    assert set(counts) == planned
    assert set(counts.values()) == {1}
    assert first < set(counts)


def test_unknown_model_stops_the_run_naming_it(
    tmp_path: Path, sim_proxy: StormProxy, capsys: pytest.CaptureFixture[str]
) -> None:
    """A misspelt model (404) exits 2 naming it; the good model's finished episodes are kept, no bad ones."""
    config = write_config(tmp_path, sim_proxy.base_url + "/v1", models='["sim-terse", "sim-trese"]')
    assert main(["run", str(config), "--quiet"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "'sim-trese'" in line
    assert "HTTP 404" in line
    assert "sweep.models" in line
    rows = committed_rows(tmp_path / "run")
    assert rows, "the good model's finished episodes were not committed"
    assert {r["model"] for r in rows} == {"sim-terse"}
    assert all(r["stop_reason"] != "error" for r in rows)

    # Fixed (the bad name dropped: a selection change), the run resumes and completes.
    assert main(["run", str(config), "--quiet", "--set", 'sweep.models=["sim-terse"]']) == 0
    counts = committed_ids(tmp_path / "run")
    assert len(counts) == 40
    assert set(counts.values()) == {1}


def test_base_url_without_v1_says_the_path_is_wrong(
    tmp_path: Path, sim_proxy: StormProxy, capsys: pytest.CaptureFixture[str]
) -> None:
    """A chat base_url without /v1 (404 on the path) exits 2 naming the path and base_url, not the model."""
    config = write_config(tmp_path, sim_proxy.base_url, models='["sim-terse"]')
    assert main(["run", str(config), "--quiet"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "HTTP 404 for /chat/completions" in line
    assert "the URL path is wrong" in line
    assert "provider.base_url" in line
    assert "/v1" in line  # the SDK convention it should follow
    assert "does not know model" not in line
    assert "sweep.models" not in line
    assert not committed_rows(tmp_path / "run")


async def _refuse(request: Request) -> JSONResponse:
    # Like OpenAI: the refused key echoed back in the message.
    key = request.headers.get("authorization", "").removeprefix("Bearer ")
    RECEIVED_KEYS.append(key)
    message = f"Incorrect API key provided: {key}."
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error",
                                   "code": "invalid_api_key"}}, 401)


@pytest.fixture
def refusing_provider() -> Iterator[str]:
    """A loopback server answering every chat request with 401; yields its /v1 base URL."""
    app = Starlette(routes=[Route("/v1/chat/completions", _refuse, methods=["POST"])])
    with serving(app) as root:
        yield root + "/v1"


def test_refused_key_stops_the_run_naming_the_variable_not_the_key(
    tmp_path: Path, refusing_provider: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 401 exits 2 with one line naming the key's variable, never the key; no episode is committed."""
    # The session's Ray workers were started before this test: a variable set now would not
    # reach them, so the "key" is one every process has. Its value must never be printed.
    config = write_config(tmp_path, refusing_provider, key_env="PATH")
    RECEIVED_KEYS.clear()
    assert main(["run", str(config), "--quiet"]) == 2
    captured = capsys.readouterr()
    line = one_error_line(captured.err)
    assert "the key in $PATH was refused (HTTP 401)" in line
    assert RECEIVED_KEYS
    assert all(RECEIVED_KEYS)
    assert not [k for k in set(RECEIVED_KEYS) if k in captured.err + captured.out]
    assert committed_rows(tmp_path / "run") == []

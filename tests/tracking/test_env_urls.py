"""URLs a tracker finds outside the config (the environment, a proxy, a server's message) are
printed without their credentials.

Tests for `collector.tracking.scrub` (`run_credentials`, `scrub_url_credentials`) and, with
the real MLflow client against a closed loopback port, the warning `Tracking` prints.
"""

from __future__ import annotations

import socket
import threading

import mlflow  # noqa: F401 - the real client, imported at collection (its import runs `uname -p`)
import pytest

from collector.config import RunConfig
from collector.tracking.scrub import MARKER, Scrubber, run_credentials, scrub_url_credentials

PASSWORD = "PLANTED-mlflow-Pw-0123"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _mlflow_config() -> RunConfig:
    return RunConfig.model_validate({"sweep": {"models": ["m"], "budgets": [16]},
                                     "tracking": {"mlflow": {"experiment": "env-uri"}}})


def test_the_mlflow_uri_from_the_environment_is_not_printed_in_the_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A password in MLFLOW_TRACKING_URI (environment, not config) never reaches the warning
    line printed when the MLflow server cannot be reached."""

    from collector.tracking import Tracking, configured_trackers

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://alice:{PASSWORD}@127.0.0.1:{_closed_port()}/")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    cfg = _mlflow_config()
    warned = threading.Event()
    lines: list[str] = []

    def warn(line: str) -> None:
        lines.append(line)
        warned.set()

    tracking = Tracking(cfg, configured_trackers(cfg), run_id="r-1", run_dir="/runs/r-1", planned=1,
                        already=0, warn=warn)
    assert warned.wait(60), "the MLflow tracker never failed against a closed port"
    tracking.finish()
    assert len(lines) == 1
    assert lines[0].startswith("tracker mlflow: ")
    assert "127.0.0.1" in lines[0]  # the line still says where
    assert PASSWORD not in lines[0]


def test_tracker_urls_in_the_environment_are_run_credentials() -> None:
    """The credentials of MLFLOW_TRACKING_URI, WANDB_BASE_URL and a proxy URL are secrets of the run."""
    env = {"MLFLOW_TRACKING_URI": f"https://bob:{PASSWORD}@mlflow.invalid",
           "WANDB_BASE_URL": "https://wandb.invalid/?api_key=PLANTED-wandb-query",
           "HTTPS_PROXY": "http://proxyuser:PLANTED-proxy-pw@proxy.invalid:3128"}
    found = run_credentials(_mlflow_config(), env)
    for secret in (PASSWORD, "PLANTED-wandb-query", "PLANTED-proxy-pw"):
        assert secret in found


@pytest.mark.parametrize(("text", "secret"), [
    ("GET https://user:hunter22@host.invalid/x failed", "hunter22"),
    ("redirected to https://ghp_PLANTEDtoken0@git.invalid/repo", "ghp_PLANTEDtoken0"),
    ("POST http://h.invalid/api?experiment=1&token=PLANTEDtok&x=2 refused", "PLANTEDtok"),
    ("url='https://h.invalid/v1?key=AIzaPLANTED' failed", "AIzaPLANTED"),
])
def test_credentials_of_a_url_no_list_knows_are_scrubbed(text: str, secret: str) -> None:
    """A URL the run never named (a redirect, an SDK's own endpoint) loses its user info and
    credential query values in any string a tracker handles, the rest of the line kept."""
    scrubbed = Scrubber([]).text(text)
    assert secret not in scrubbed
    assert MARKER in scrubbed
    assert ".invalid" in scrubbed


def test_urls_without_credentials_are_kept() -> None:
    """A URL with no credentials, and a non-secret query, pass through unchanged."""
    text = "see https://mlflow.invalid:5000/#/experiments/3?run=abc&step=2 and user@example.com"
    assert scrub_url_credentials(text) == text

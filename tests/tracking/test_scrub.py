"""The tracker payload scrub: a planted API key or URL credential is replaced at any depth.

Tests for `collector.tracking.scrub` (`Scrubber`, `run_credentials`), no tracker SDK needed.
"""

from __future__ import annotations

from urllib.parse import quote

from collector.config import RunConfig
from collector.tracking.scrub import MARKER, Scrubber, run_credentials

API_KEY = "sk-PLANTED-scrub-key-0123456789"
URL_PASSWORD = "PLANTED-pass@word!"
QUERY_KEY = "AIzaPLANTEDscrubQuery42"
SECRET_URL = f"http://svc:{quote(URL_PASSWORD, safe='')}@llm.invalid:9/v1?key={QUERY_KEY}"


def _config() -> RunConfig:
    return RunConfig.model_validate({
        "name": "scrubbed",
        "provider": {"kind": "chat", "base_url": SECRET_URL, "api_key_env": "SCRUB_TEST_KEY"},
        "sweep": {"models": ["m"], "budgets": [16]},
        "env": {"name": "arithmetic", "tasks": 1},
    })


def test_the_run_credentials_are_found_in_env_and_url() -> None:
    found = run_credentials(_config(), {"SCRUB_TEST_KEY": API_KEY, "WANDB_API_KEY": "wandb-PLANTED-key"})
    for secret in (API_KEY, QUERY_KEY, "wandb-PLANTED-key"):
        assert secret in found
    assert URL_PASSWORD in found or quote(URL_PASSWORD, safe="") in found


def test_a_planted_key_and_url_credential_are_replaced_in_nested_payloads() -> None:
    scrub = Scrubber(run_credentials(_config(), {"SCRUB_TEST_KEY": API_KEY}))
    payload = {
        "config": {"provider": {"base_url": SECRET_URL, "headers": [f"Bearer {API_KEY}"]}},
        "rows": [[1, f"the tool was called with api_key={API_KEY}", ("tuple", QUERY_KEY)]],
        f"key-{API_KEY}": 3.5,
        "count": 7,
    }
    text = repr(scrub.value(payload))
    for secret in (API_KEY, QUERY_KEY, URL_PASSWORD, quote(URL_PASSWORD, safe="")):
        assert secret not in text
    assert MARKER in text
    scrubbed = scrub.value(payload)
    assert scrubbed["count"] == 7  # non-strings kept
    assert scrubbed[f"key-{MARKER}"] == 3.5  # dict keys scrubbed too
    assert "llm.invalid:9/v1" in scrubbed["config"]["provider"]["base_url"]  # the rest of the URL kept


def test_short_values_are_not_treated_as_secrets() -> None:
    assert Scrubber(["abc"]).text("abcdef") == "abcdef"

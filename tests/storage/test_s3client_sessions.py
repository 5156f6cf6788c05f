"""Each S3 client a store or reader builds reads the environment as it is then, while botocore's
service descriptions are parsed once per process (`collector.storage.s3client.make_client`)."""

from __future__ import annotations

import pytest

from collector.storage import s3client


def test_clients_share_the_parsed_service_model_but_read_the_environment_each_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A second client reuses the first one's parsed S3 model (a client costs no model parsing),
    yet takes the endpoint set since, and the shared loader does not grow."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "first-key-id")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "first-secret")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9001")
    first = s3client.make_client()
    paths = list(s3client._loader.search_paths)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9002")
    clients = [s3client.make_client() for _ in range(3)]
    assert first.meta.endpoint_url == "http://127.0.0.1:9001"
    assert {c.meta.endpoint_url for c in clients} == {"http://127.0.0.1:9002"}
    assert all(c.meta.service_model.metadata is first.meta.service_model.metadata for c in clients)
    assert s3client._loader.search_paths == paths

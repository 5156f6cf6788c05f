"""Planted secrets reach no shard, log, message or token id of a `collector run` process (its stderr
included). The in-process secret checks: tests/faults/test_secrets.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from collector.cli import main
from tests.checking import assert_run_checked, committed_rows
from tests.faults.secret_env import TASKS
from tests.faults.secret_scan import leaks_in, strings_in
from tests.faults.test_secrets import (  # noqa: F401 - helpers and fixtures, by name
    API_KEY,
    CLEAN_TASK,
    KEY_VARIABLE,
    REPO,
    SECRETS,
    TOKENIZER,
    WITHHELD_TASKS,
    fake_provider,
    write_config,
)


@pytest.mark.timeout(240)
def test_planted_secrets_reach_no_shard_log_message_or_token_id(
    tmp_path: Path, fake_provider: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """No credential in any form sent, echoed, thought or given to a tool is in a decoded
    shard, a decoded token id, the trainer view, a Ray log or the output."""
    run_dir = tmp_path / "run"
    config = write_config(tmp_path / "secrets.toml", fake_provider, run_dir)
    ray_tmp = tempfile.mkdtemp(prefix="rays", dir="/tmp")  # Ray's socket paths must stay short
    env = {**os.environ, KEY_VARIABLE: API_KEY, "RAY_TMPDIR": ray_tmp,
           "RAY_AUTH_MODE": "disabled", "RAY_ADDRESS": ""}
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "collector.cli", "run", str(config)],
            capture_output=True, env=env, cwd=REPO, timeout=200,
        )
        output = proc.stdout.decode() + proc.stderr.decode()
        assert proc.returncode == 0, output[-3000:]
        rows = committed_rows(run_dir)
        assert len(rows) == 3 * TASKS
        # Searched first: with the token rule broken, this is what finds the secret, decoded.
        assert not leaks_in(run_dir, SECRETS, TOKENIZER.decode)
        for label in ("env-key", "url-user-pass", "query-key"):
            mine = [r for r in rows if r["provider"] == label]
            reasons = sorted(str(r["stop_reason"]) for r in mine)
            why = [(r["task_id"], str(r["stop_reason"]), r["error"]) for r in mine]
            assert reasons == ["done"] * (TASKS - 1) + ["error"], (label, why)
        # The credentials did reach the tools (both got every real value) but not the record.
        logins = [r for r in rows if r["task_id"] in ("login-1", "login-2", "login-3")]
        assert [r["reward"] for r in logins] == [1.0] * 9
        for row in rows:
            if row["stop_reason"] == "error":
                assert row["error"]["type"] == "RequestRejected"  # type: ignore[index]
                assert "[redacted]" in row["error"]["message"]  # type: ignore[index]
        # Every planted episode kept no id; the clean one kept its ids, which decode to its text.
        for row in rows:
            number = int(str(row["task_id"]).removeprefix("login-"))
            turns: list[dict[str, Any]] = row["turns"]  # type: ignore[assignment]
            assert all(t["tokens_requested"] for t in turns), row["task_id"]
            if number in WITHHELD_TASKS:
                assert [t["tokens_withheld"] for t in turns] == [True] * len(turns), row["task_id"]
                assert all(t["output_token_ids"] is None and t["prompt_token_ids"] is None for t in turns)
            elif number == CLEAN_TASK:
                (turn,) = turns
                assert turn["tokens_withheld"] is False
                assert TOKENIZER.decode(turn["output_token_ids"]) == "done"
                assert TOKENIZER.decode(turn["prompt_token_ids"]).startswith("<|begin|><|tool_def|>login")
        # The echoes were stored, as markers; the innocent names next to the widened ones were kept.
        stored = list(strings_in(rows))
        assert any("[redacted credential]" in s for s in stored)
        assert "Ann Author" in json.dumps(stored)
        assert "qwerty" in json.dumps(stored)
        assert_run_checked(run_dir, allow_notes=False)

        # The trainer view: the three clean episodes, every planted one left out and named.
        view = tmp_path / "view.parquet"
        capsys.readouterr()
        assert main(["trainer-view", str(run_dir), str(view)]) == 0
        said = capsys.readouterr().err
        assert "3 rows from 27 episodes" in said, said
        assert f"left out: 3 not_trainable, {3 * len(WITHHELD_TASKS)} withheld_redacted" in said, said
        view_rows = pq.read_table(view).to_pylist()
        decoded = [TOKENIZER.decode(r["input_ids"]) for r in view_rows]
        assert [d.endswith("<|assistant|>done") for d in decoded] == [True] * 3, decoded
        assert not leaks_in(tmp_path / "view.parquet", SECRETS, TOKENIZER.decode)
        output += said

        assert not [s for s in SECRETS if s in output], output[-3000:]
        logs = list(Path(ray_tmp).rglob("*.out")) + list(Path(ray_tmp).rglob("*.err"))
        assert logs, "no Ray log files were found to search"
        assert not leaks_in(Path(ray_tmp), SECRETS)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)

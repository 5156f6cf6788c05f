"""Token truth across turns, end to end: `collector run` on sim-drift, re-render mode vs token-in mode.

Both runs collect the same support-desk tool episodes from one simulator. Re-render mode (chat
endpoint, `sampling.token_ids`) gets each turn's prompt ids from the server's re-rendering of
the messages, which drifts on sim-drift's template: the trainer view breaks those episodes
into several sequences. Token-in mode (`sampling.token_in`, against the simulator's
llama-server endpoints) sends every later prompt as ids extending what was sent and sampled:
one sequence per kept episode, whose ids are what went on the wire.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from collector.analysis.trainer import full_prompts, trainer_rows
from collector.cli import main
from collector.sim.server import SimServer
from collector.sim.vocab import detokenize
from tests.checking import committed_rows

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def sim() -> Iterator[SimServer]:
    with SimServer(seed=4) as server:
        yield server


def write_config(path: Path, run_dir: Path, base_url: str, sampling: str) -> Path:
    path.write_text(f"""
name = "token-truth"

[sweep]
models = ["sim-drift"]
budgets = [512]

[[sweep.providers]]
kind = "chat"
base_url = "{base_url}"
label = "sim"

[sampling]
temperature = 0.7
{sampling}

[env]
name = "support_desk"
tasks = 8

[ray]
pool = "in_process"
workers = 1
episodes_in_flight = 4
batch_size = 4
cpus_per_worker = 0.5

[output]
path = "{run_dir}"
""")
    return path


def collect(tmp_path: Path, name: str, base_url: str, sampling: str) -> list[dict[str, Any]]:
    run_dir = tmp_path / name
    assert main(["run", str(write_config(tmp_path / f"{name}.toml", run_dir, base_url, sampling))]) == 0
    rows = committed_rows(run_dir)
    assert len(rows) == 8
    return rows


def test_rerender_drifts_and_token_in_is_one_sequence_per_episode(tmp_path: Path, sim: SimServer) -> None:
    rerender = collect(tmp_path, "rerender", sim.base_url + "/v1", "token_ids = true")
    multi = [r for r in rerender if len(r["turns"]) > 1]
    assert multi
    later = [t for r in multi for t in r["turns"][1:]]
    assert all(t["prefix_consistent"] is False and t["drift_offset"] is not None for t in later)
    assert all(t["prompt_sent_as_ids"] is None for r in rerender for t in r["turns"])
    view = trainer_rows(rerender, "sequence")
    pieces = Counter(row["episode_id"] for row in view.rows)
    assert all(pieces[r["episode_id"]] == len(r["turns"]) > 1 for r in multi)

    token_in = collect(tmp_path, "token-in", f"{sim.base_url}/llamacpp/sim-drift/v1",
                       'token_in = true\ntoken_in_server = "llama.cpp"')
    kept = [r for r in token_in if r["trainable"]]
    assert len([r for r in kept if len(r["turns"]) > 1]) >= len(multi) - 2
    for r in token_in:
        turns = r["turns"]
        assert all(t["prompt_sent_as_ids"] is True and t["token_in_fallback"] is None for t in turns)
        assert all(t["prefix_consistent"] is True for t in turns[1:])
    view = trainer_rows(token_in, "sequence")
    assert Counter(row["episode_id"] for row in view.rows) == Counter({r["episode_id"]: 1 for r in kept})
    by_id = {row["episode_id"]: row for row in view.rows}
    for r in kept:
        prompts = full_prompts(r["turns"])
        last = r["turns"][-1]
        # The sequence is the last prompt as sent + its output; every earlier prompt sent and
        # its output is a prefix of it, and it reads as the conversation.
        sequence = by_id[r["episode_id"]]["input_ids"]
        assert sequence == prompts[-1] + last["output_token_ids"]
        for prompt, turn in zip(prompts, r["turns"], strict=True):
            sampled = prompt + turn["output_token_ids"]
            assert sequence[: len(sampled)] == sampled
        text = httpx.post(f"{sim.base_url}/llamacpp/sim-drift/detokenize", json={"tokens": sequence}).json()
        raw = [detokenize(t["output_token_ids"]) for t in r["turns"]]
        assert text["content"].startswith("<|begin|><|tool_def|>")
        assert text["content"].endswith(raw[-1])
        assert text["content"].count("<|tool|>") == sum(out.count("}</tool_call>") for out in raw)

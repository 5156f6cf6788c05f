"""The trainer view: masks over random simulated episodes, Parquet that `datasets` loads, old shards."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collector.analysis import load_episodes, load_run
from collector.analysis.stats import compute_stats
from collector.analysis.trainer import (
    TRAINER_SCHEMA,
    full_prompts,
    sequence_runs,
    token_summary,
    trainer_rows,
    write_trainer_view,
)
from collector.cli import main
from collector.config import LoopConfig
from collector.envs.support_desk import SupportDeskEnv
from collector.episode.loop import EpisodeSpec, run_episode
from collector.episode.tokens import common_prefix
from collector.providers import base_url_for, build_provider
from collector.providers.base import Endpoint
from collector.record.episode import Episode, TurnRecord
from collector.record.shards import SCHEMA_VERSION_KEY, episodes_to_table, read_shard, write_shard
from collector.sim import tokens as sim_tokens
from collector.sim.app import create_app
from collector.storage.local import LocalRunStore
from collector.storage.manifest import committed_shard_paths
from collector.turn import SamplingParams

ENV = SupportDeskEnv(num_tasks=12)
TOKENS = SamplingParams(token_ids=True, temperature=1.0)
MODELS = ["sim-terse", "sim-verbose", "sim-sloppy", "sim-leaky", "sim-hidden-cut", "sim-rerender"]


async def _episodes(specs: list[tuple[str, int, int, bool, int]], stop_on: list[str] | None = None
                    ) -> list[Episode]:
    """Episodes on the simulator's chat wire: (model, budget, task index, stream, seed) each."""
    loop = LoopConfig() if stop_on is None else LoopConfig(stop_on=stop_on)  # type: ignore[arg-type]
    tasks = ENV.tasks()
    out = []
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(seed=0))) as client:
        for model, budget, task, stream, seed in specs:
            endpoint = Endpoint(base_url_for("chat", "http://sim.test"), api_key="k", streaming=stream)
            provider = build_provider("chat", endpoint, client)
            spec = EpisodeSpec("tv", model, "chat", budget, tasks[task % len(tasks)], seed=seed,
                               env_name=ENV.name, sampling=TOKENS)
            out.append(await run_episode(spec, provider, ENV, loop))
    return out


def _rows(episodes: list[Episode]) -> list[dict[str, Any]]:
    return episodes_to_table(episodes).to_pylist()


def _assert_masks(episode: dict[str, Any], rows: list[dict[str, Any]], mode: str) -> None:
    """Mask 1 exactly on the sampled tokens of kept turns, 0 on prompts and on discarded turns."""
    turns = episode["turns"]
    prompts = full_prompts(turns)
    if mode == "sequence":
        runs = sequence_runs(turns)
        assert len(rows) == len(runs) == 1 + sum(not t["prefix_consistent"] for t in turns[1:])
        for (first, last), row in zip(runs, rows, strict=True):
            assert row["turn_index"] == (None if len(runs) == 1 else turns[first]["index"])
            ones = 0
            expected_logprobs = [0.0] * len(row["input_ids"])
            for t, prompt in zip(turns[first:last + 1], prompts[first:last + 1], strict=True):
                assert prompt is not None
                start, out = len(prompt), t["output_token_ids"]
                keep = 0 if t["discarded"] else 1
                assert row["input_ids"][:start] == prompt  # each turn saw exactly this prefix
                assert row["input_ids"][start:start + len(out)] == out
                assert row["loss_mask"][start:start + len(out)] == [keep] * len(out)
                expected_logprobs[start:start + len(out)] = t["output_logprobs"]
                ones += keep * len(out)
            assert sum(row["loss_mask"]) == ones
            assert row["logprobs"] == pytest.approx(expected_logprobs, abs=1e-6)
            assert row["prompt_length"] == len(prompts[first] or [])
        return
    assert [r["turn_index"] for r in rows] == [t["index"] for t in turns]
    for t, prompt, row in zip(turns, prompts, rows, strict=True):
        assert prompt is not None
        keep = 0 if t["discarded"] else 1
        assert row["input_ids"] == prompt + t["output_token_ids"]
        assert row["loss_mask"] == [0] * len(prompt) + [keep] * len(t["output_token_ids"])
        assert row["logprobs"][: len(prompt)] == [0.0] * len(prompt)
        assert row["prompt_length"] == len(prompt)


def _drifting_episode(outputs: list[list[int]], suffixes: list[list[int]], drifts: dict[int, int]
                      ) -> dict[str, Any]:
    """A stored episode whose turn k re-renders history at position ``drifts[k]`` (mod its length).

    Built the way `TokenTracker` stores it: full prompts, then deltas from the common prefix.
    """
    turns = []
    previous: list[int] | None = None
    for k, (out, suffix) in enumerate(zip(outputs, suffixes, strict=True)):
        if previous is None:
            prompt = [1, *suffix]
        else:
            prompt = previous + suffix
            if k in drifts:
                at = drifts[k] % len(previous)
                prompt = [*previous[:at], -1 - k, *previous[at + 1:], *suffix]  # an id never sampled
        offset = common_prefix(previous, prompt) if previous is not None else 0
        turns.append({"index": k, "output_token_ids": out, "output_logprobs": [-0.5] * len(out),
                      "prompt_token_ids": prompt[offset:], "prompt_ids_offset": offset,
                      "prefix_consistent": None if previous is None else offset == len(previous),
                      "token_counts_ok": True, "tokens_withheld": False, "discarded": False,
                      "temperature": 1.0, "full": prompt})
        previous = prompt + out
    return {"episode_id": "e", "run_id": "r", "provider": "p", "model": "m", "budget": 8, "task_id": "t",
            "sample": 0, "stop_reason": "done", "trainable": True, "reward": 1.0, "turns": turns}


_IDS = st.lists(st.integers(100, 50_000), min_size=1, max_size=6)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), n=st.integers(1, 8))
def test_fewest_sequences_over_random_drift_points(data: st.DataObject, n: int) -> None:
    """Random drift points: rows = 1 + breaks, each row starts with its first turn's full prompt,
    and the rows' trainable tokens are every turn's output ids, once each, in order."""
    outputs = [data.draw(_IDS) for _ in range(n)]
    suffixes = [data.draw(_IDS) for _ in range(n)]
    drifts = data.draw(st.dictionaries(st.integers(1, max(1, n - 1)), st.integers(0, 10_000)))
    drifts = {k: v for k, v in drifts.items() if k < n}
    ep = _drifting_episode(outputs, suffixes, drifts)
    assert full_prompts(ep["turns"]) == [t["full"] for t in ep["turns"]]
    rows = trainer_rows([ep], "sequence").rows
    assert len(rows) == 1 + len(drifts)
    starts = [0, *sorted(drifts)]
    for row, first in zip(rows, starts, strict=True):
        p = row["prompt_length"]
        assert row["input_ids"][:p] == ep["turns"][first]["full"]
        assert row["loss_mask"][:p] == [0] * p
    trained = [i for row in rows for i, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m]
    assert trained == [i for out in outputs for i in out]
    assert [r["turn_index"] for r in rows] == ([None] if not drifts else starts)
    _assert_masks(ep, rows, "sequence")


_EPISODE = st.tuples(st.sampled_from(MODELS), st.integers(4, 160), st.integers(0, 11), st.booleans(),
                     st.integers(0, 10_000))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=st.lists(_EPISODE, min_size=1, max_size=4, unique_by=lambda s: s[:3]),  # one id each
       mode=st.sampled_from(["sequence", "stepwise"]),
       stop_on=st.sampled_from([None, [], ["length"], ["malformed_tool_call"]]))
def test_loss_mask_is_zero_on_every_discarded_turn(specs: list[tuple[str, int, int, bool, int]], mode: str,
                                                   stop_on: list[str] | None) -> None:
    """Random simulated episodes: the mask is 0 on prompts and every discarded turn, 1 on kept output."""
    episodes = _rows(asyncio.run(_episodes(specs, stop_on)))
    view = trainer_rows(episodes, mode)  # type: ignore[arg-type]
    assert sum(view.skipped.values()) == 0  # token capture worked on every episode
    by_episode: dict[str, list[dict[str, Any]]] = {}
    for row in view.rows:
        by_episode.setdefault(row["episode_id"], []).append(row)
    for ep in episodes:
        rows = by_episode[ep["episode_id"]]
        _assert_masks(ep, rows, mode)


async def test_a_discarded_turn_mid_sequence_is_masked() -> None:
    """A cut turn the loop went on from (stop_on empty) stays in the sequence with mask 0 on its tokens."""
    found = 0
    for budget in range(6, 40, 2):
        episodes = _rows(await _episodes([("sim-terse", budget, task, False, 1) for task in range(4)], []))
        for ep in episodes:
            view = trainer_rows([ep], "stepwise")
            discarded = [t["index"] for t in ep["turns"] if t["discarded"]]
            for row in view.rows:
                if row["turn_index"] in discarded:
                    found += 1
                    assert set(row["loss_mask"]) == {0}
                else:
                    assert row["loss_mask"][row["prompt_length"]:] == [1] * (
                        len(row["input_ids"]) - row["prompt_length"])
    assert found > 0


async def test_withheld_episodes_are_left_out_and_named() -> None:
    """An episode whose ids were withheld (it held a secret) is left out of the view, counted as such."""
    from tests.episode.test_tokens import _scripted

    secret = await _scripted({"order_id": "A-1", "amount": 5, "password": "hunter2"})
    clean = await _scripted({"order_id": "A-1", "amount": 5})
    view = trainer_rows(_rows([secret, dataclasses.replace(clean, episode_id="clean")]))
    assert view.skipped == {"withheld_redacted": 1}
    assert [r["episode_id"] for r in view.rows] == ["clean"]
    assert "hunter2" not in repr(view.rows)


def _commit(run: Path, episodes: list[Episode], fmt: str = "arrow") -> None:
    with LocalRunStore.open(run, "fp", {}, fmt, 7) as store:  # type: ignore[arg-type]
        store.commit(episodes)


@pytest.fixture(scope="module")
def token_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("tv") / "run"
    specs = [(m, b, t, s, 0) for m in ("sim-terse", "sim-rerender") for b in (24, 256) for t in range(6)
             for s in (False, True)]
    _commit(run, asyncio.run(_episodes(specs)))
    return run


def test_written_view_loads_with_datasets(token_run: Path, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The trainer-view Parquet loads with `datasets.load_dataset("parquet", ...)` offline, columns intact."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import datasets

    out = tmp_path / "view.parquet"
    rows = write_trainer_view(token_run, out, mode="sequence")
    assert rows == pq.read_metadata(out).num_rows > 0
    loaded = datasets.load_dataset("parquet", data_files=str(out), split="train",
                                   cache_dir=str(tmp_path / "hf" / "cache"))
    assert loaded.num_rows == rows
    assert set(loaded.column_names) == set(TRAINER_SCHEMA.names)
    first = loaded[0]
    assert len(first["input_ids"]) == len(first["loss_mask"]) == len(first["logprobs"])


def test_sequence_mode_has_one_row_per_consistent_episode(token_run: Path, tmp_path: Path) -> None:
    """Faithful episodes are one row each; a re-rendered one is one row per run of consistent turns."""
    table = pq.read_table(write_view_path(token_run, tmp_path, "sequence"))
    episodes = load_episodes(token_run)
    terse = [e for e in episodes if e.model == "sim-terse"]
    rerender = [e for e in episodes if e.model == "sim-rerender" and e.num_turns > 1]
    rows = table.to_pylist()
    per_episode = Counter(r["episode_id"] for r in rows)
    seq = {r["episode_id"] for r in rows if r["turn_index"] is None}
    assert {e.episode_id for e in terse} <= seq
    assert rerender
    assert not {e.episode_id for e in rerender} & seq
    for e in episodes:
        assert per_episode[e.episode_id] == 1 + sum(t.prefix_consistent is False for t in e.turns)
    assert any(per_episode[e.episode_id] > 1 for e in rerender)
    step = pq.read_table(write_view_path(token_run, tmp_path, "stepwise"))
    assert step.num_rows == sum(e.num_turns for e in episodes)
    by_model = token_summary(token_run)["by_model"]
    assert by_model["sim-terse"]["samples_per_episode"] == 1.0
    assert by_model["sim-terse"]["one_sequence_share"] == 1.0
    single = sum(e.num_turns == 1 for e in episodes if e.model == "sim-rerender")
    assert by_model["sim-rerender"]["one_sequence_share"] == single / (single + len(rerender))
    assert by_model["sim-rerender"]["samples_per_episode"] == pytest.approx(
        sum(per_episode[e.episode_id] for e in episodes if e.model == "sim-rerender")
        / (single + len(rerender)))


def test_drift_report_per_model_and_turn(token_run: Path) -> None:
    """The drift report: rate per turn index (re-rendering preset: every later turn; faithful: none)
    and the first-difference pairs, all found ids being the template's inserted whitespace id."""
    episodes = load_episodes(token_run)
    drift = token_summary(token_run)["drift"]
    for model in ("sim-terse", "sim-rerender"):
        later = [t for e in episodes if e.model == model for t in e.turns[1:]]
        assert set(drift[model]["rate_by_turn"]) == {t.index for t in later}
    assert set(drift["sim-terse"]["rate_by_turn"].values()) == {0.0}
    assert drift["sim-terse"]["top_pairs"] == []
    assert set(drift["sim-rerender"]["rate_by_turn"].values()) == {1.0}
    pairs = drift["sim-rerender"]["top_pairs"]
    drifted = Counter((t.drift_expected_id, t.drift_found_id) for e in episodes for t in e.turns
                      if t.prefix_consistent is False)
    assert pairs == [(e, f, n) for (e, f), n in drifted.most_common(5)]
    assert {f for _, f, _ in pairs} == {sim_tokens.SPACE}


def write_view_path(run: Path, tmp: Path, mode: str) -> Path:
    out = tmp / f"{mode}.parquet"
    write_trainer_view(run, out, mode=mode)  # type: ignore[arg-type]
    return out


def test_cli_trainer_view(token_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`collector trainer-view RUN OUT` writes the file and its row count; a bad run dir: one line, exit 2."""
    out = tmp_path / "v.parquet"
    assert main(["trainer-view", str(token_run), str(out), "--mode", "stepwise"]) == 0
    err = capsys.readouterr().err
    assert f"{pq.read_metadata(out).num_rows} rows" in err
    episodes = load_episodes(token_run)
    faithful = sum(1 for e in episodes if e.model == "sim-terse" and e.num_turns > 1)
    multi = sum(1 for e in episodes if e.num_turns > 1)
    assert f"prefix-consistent: {faithful} of {multi} multi-turn" in err
    assert "sim-terse: 12 episodes with ids, 1.00 samples per episode, 100% one sequence" in err
    assert "sim-rerender drift by turn: t1=100%" in err
    assert main(["trainer-view", str(tmp_path / "nope"), str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "Traceback" not in err


_NEW_TURN_FIELDS = [f.name for f in dataclasses.fields(TurnRecord)
                    if f.name not in {"index", "raw_finish_reason", "finish_class", "length_signals",
                                      "incomplete_reason", "output_tokens", "input_tokens",
                                      "max_output_tokens", "latency_s", "repairs", "num_tool_calls",
                                      "malformed_calls", "discarded", "unparsed_tool_call"}]


def _as_version_2(path: Path, fmt: str) -> None:
    """Rewrite a shard as schema version 2 wrote it: no token fields in `turns`, version 2."""
    table = read_shard(path)
    turns = table.column("turns").combine_chunks()
    keep = [f for f in turns.type.value_type if f.name not in _NEW_TURN_FIELDS]
    struct = pa.StructArray.from_arrays([turns.values.field(f.name) for f in keep], fields=keep)
    old = pa.ListArray.from_arrays(turns.offsets, struct)
    table = table.set_column(table.schema.get_field_index("turns"), pa.field("turns", old.type), old)
    write_shard(path, table.replace_schema_metadata({SCHEMA_VERSION_KEY: b"2"}), fmt)  # type: ignore[arg-type]


@pytest.mark.parametrize("fmt", ["arrow", "parquet"])
def test_version_2_shards_stay_readable(tmp_path: Path, fmt: str) -> None:
    """A run written before token capture still loads, computes stats, and gives an empty trainer view."""
    # Version 3 added 4 per-turn truth fields (issue 15), 3 reasoning fields (16), 9 token fields
    # (13), `usage_known` (31), 3 drift fields, `stop_tokens_uncounted` and the 2 token-in
    # fields `prompt_sent_as_ids`, `token_in_fallback` (26), `policy_version` with its
    # source (27), the id-range fields `tokens_rejected`, `token_vocab_size`, and the harness
    # gateway's `harness_asked_cap`, `calls_withheld`, `history_rewritten`, and a turn's `tool_s`.
    assert len(_NEW_TURN_FIELDS) == 31
    run = tmp_path / "run"
    _commit(run, asyncio.run(_episodes([("sim-terse", 256, t, False, 0) for t in range(5)])), fmt)
    for path in committed_shard_paths(run):
        _as_version_2(path, fmt)
    assert load_run(run).num_rows == 5
    episodes = load_episodes(run)
    assert all(t.output_token_ids is None and not t.tokens_requested for e in episodes for t in e.turns)
    assert compute_stats(run, by=("model", "budget")).episodes == 5
    view = trainer_rows(load_run(run).to_pylist())
    assert view.rows == []
    assert view.skipped == {"no_token_ids": 5}

"""The trainer view: a run's captured tokens as token-level training samples, one Parquet file.

From the committed episodes of a run directory (those collected with `sampling.token_ids`),
each kept episode becomes either one sequence or one sample per turn:

- ``sequence`` mode (the default): the FEWEST sequences: one row per maximal run of
  prefix-consistent turns (`sequence_runs`; each turn's prompt ids start with the previous
  turn's prompt + output ids). A row is its run's last prompt + output, holding every
  turn's sampled tokens of the run at their own positions; its `prompt_length` is the full
  prompt of the run's first turn. A faithful episode is one row (`turn_index` null); each
  turn where the server re-rendered history starts a new row (`turn_index`: that turn);
- ``stepwise`` mode: always one row per turn: that turn's full prompt + its output.

Columns (`TRAINER_SCHEMA`): `input_ids`; `loss_mask`, 1 on the sampled tokens of kept
turns and 0 on the prompt, tool results, notices, and on every token of a discarded turn
(cut by the cap, or ended malformed); `logprobs` aligned to `input_ids` (the sampler's
logprob on sampled tokens, 0 elsewhere and where the server sent none); `prompt_length`
(the tokens before the first sampled one); `reward` and `stop_reason` of the episode (a
step row carries its episode's); the group ids `group_id` (run, provider, model, budget,
task: the samples a group-relative advantage compares), `task_id`, `sample`; and
`episode_id`, `turn_index` (null on a sequence row), `model`, `budget`, `temperature`.

Left out, and counted in `TrainerView.skipped`: episodes that are not trainable (`error`,
`timeout`), with no turns, whose turns lack output or prompt ids (not asked for, not
returned, or withheld by the redaction rule), or with a turn whose ids disagree with the
server's token count. Reading goes through the manifest (`load_run`), so only committed
shards are read; shards of schema version 2 simply have no ids. With `annotation` (`collector
trainer-view --annotation NAME`) the `reward` column is a regrade's (cut episodes keep 0).
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Literal

import pyarrow as pa
import pyarrow.parquet as pq

from collector.analysis.output import write_output
from collector.analysis.source import Source
from collector.analysis.stats import read_committed
from collector.errors import OutputError

__all__ = [
    "TRAINER_SCHEMA",
    "TrainerMode",
    "TrainerView",
    "full_prompts",
    "sequence_runs",
    "summary_lines",
    "token_summary",
    "trainer_rows",
    "trainer_table",
    "write_trainer_view",
]

TrainerMode = Literal["sequence", "stepwise"]

#: The trainer view's columns (README: "Token-level training data").
TRAINER_SCHEMA = pa.schema([
    pa.field("episode_id", pa.string(), nullable=False),
    pa.field("turn_index", pa.int32()),
    pa.field("input_ids", pa.list_(pa.int64()), nullable=False),
    pa.field("loss_mask", pa.list_(pa.int8()), nullable=False),
    pa.field("logprobs", pa.list_(pa.float32()), nullable=False),
    pa.field("prompt_length", pa.int64(), nullable=False),
    pa.field("reward", pa.float64(), nullable=False),
    pa.field("stop_reason", pa.string(), nullable=False),
    pa.field("group_id", pa.string(), nullable=False),
    pa.field("task_id", pa.string(), nullable=False),
    pa.field("sample", pa.int64(), nullable=False),
    pa.field("model", pa.string(), nullable=False),
    pa.field("budget", pa.int64(), nullable=False),
    pa.field("temperature", pa.float64()),
])

_COLUMNS = ["episode_id", "run_id", "provider", "model", "budget", "task_id", "sample", "stop_reason",
            "trainable", "reward", "turns"]


@dataclass(slots=True)
class TrainerView:
    """The rows, and how many episodes were left out and why (see the module docstring)."""

    rows: list[dict[str, Any]]
    episodes: int = 0
    """Episodes read."""
    skipped: Counter[str] = field(default_factory=Counter)

    def table(self) -> pa.Table:
        return pa.Table.from_pylist(self.rows, schema=TRAINER_SCHEMA)


def full_prompts(turns: Sequence[dict[str, Any]]) -> list[list[int] | None]:
    """Each turn's whole prompt, rebuilt from the stored deltas (None where it cannot be).

    Turn k's prompt is ``(prompt[k-1] + output[k-1])[:prompt_ids_offset] + prompt_token_ids``.
    """
    out: list[list[int] | None] = []
    previous: list[int] | None = None
    for t in turns:
        delta = t.get("prompt_token_ids")
        offset = t.get("prompt_ids_offset") or 0
        if delta is None or (offset > 0 and (previous is None or len(previous) < offset)):
            out.append(None)
            previous = None
            continue
        prompt = (previous[:offset] if previous is not None else []) + list(delta)
        out.append(prompt)
        ids = t.get("output_token_ids")
        previous = prompt + list(ids) if ids is not None else None
    return out


def sequence_runs(turns: Sequence[dict[str, Any]]) -> list[tuple[int, int]]:
    """The maximal runs of prefix-consistent turns, as (first, last) positions, inclusive.

    A turn whose prompt does not start with the previous turn's prompt + output (the server
    re-rendered history: `prefix_consistent` false) starts a new run; every other turn
    extends the current one. So there are ``1 + breaks`` runs, the fewest sequences whose
    tokens are each exactly what the server saw and sampled.
    """
    runs: list[tuple[int, int]] = []
    first = 0
    for k in range(1, len(turns)):
        if turns[k].get("prefix_consistent") is not True:
            runs.append((first, k - 1))
            first = k
    if turns:
        runs.append((first, len(turns) - 1))
    return runs


def _group_id(ep: dict[str, Any]) -> str:
    key = "\x1f".join(str(ep[k]) for k in ("run_id", "provider", "model", "budget", "task_id"))
    return hashlib.blake2b(key.encode(), digest_size=8).hexdigest()


def _logprobs(t: dict[str, Any], n: int) -> list[float]:
    values = t.get("output_logprobs")
    if values is None or len(values) != n:
        return [0.0] * n
    return [0.0 if v is None or math.isnan(v) else float(v) for v in values]


def _why_left_out(ep: dict[str, Any], prompts: list[list[int] | None]) -> str | None:
    turns = ep["turns"]
    if not ep["trainable"]:
        return "not_trainable"
    if not turns:
        return "no_turns"
    if any(t.get("tokens_withheld") for t in turns):
        return "withheld_redacted"
    if any(t.get("output_token_ids") is None for t in turns) or any(p is None for p in prompts):
        return "no_token_ids"
    if any(t.get("token_counts_ok") is False for t in turns):
        return "count_mismatch"
    return None


def _rows_of(ep: dict[str, Any], mode: TrainerMode) -> list[dict[str, Any]]:
    turns = ep["turns"]
    prompts = [p for p in full_prompts(turns) if p is not None]
    common = {
        "episode_id": ep["episode_id"], "reward": float(ep["reward"]), "stop_reason": str(ep["stop_reason"]),
        "group_id": _group_id(ep), "task_id": ep["task_id"], "sample": ep["sample"], "model": ep["model"],
        "budget": ep["budget"], "temperature": turns[0].get("temperature"),
    }
    if mode == "sequence":
        runs = sequence_runs(turns)
        whole = len(runs) == 1
        rows = []
        for first, last in runs:
            input_ids = prompts[last] + list(turns[last]["output_token_ids"])
            mask = [0] * len(input_ids)
            logprobs = [0.0] * len(input_ids)
            for t, prompt in zip(turns[first:last + 1], prompts[first:last + 1], strict=True):
                out = t["output_token_ids"]
                start = len(prompt)
                keep = 0 if t["discarded"] else 1
                mask[start:start + len(out)] = [keep] * len(out)
                logprobs[start:start + len(out)] = _logprobs(t, len(out))
            # A row that is the whole episode has no turn index; a piece of a broken
            # episode names the turn it starts at, so the pieces stay ordered and findable.
            rows.append({**common, "turn_index": None if whole else turns[first]["index"],
                         "input_ids": input_ids, "loss_mask": mask, "logprobs": logprobs,
                         "prompt_length": len(prompts[first])})
        return rows
    rows = []
    for t, prompt in zip(turns, prompts, strict=True):
        out = list(t["output_token_ids"])
        keep = 0 if t["discarded"] else 1
        rows.append({**common, "turn_index": t["index"], "input_ids": prompt + out,
                     "loss_mask": [0] * len(prompt) + [keep] * len(out),
                     "logprobs": [0.0] * len(prompt) + _logprobs(t, len(out)),
                     "prompt_length": len(prompt)})
    return rows


def trainer_rows(episodes: Iterable[dict[str, Any]], mode: TrainerMode = "sequence") -> TrainerView:
    """The trainer view of episode rows (dicts with the shard's columns, `turns` as dicts)."""
    if mode not in ("sequence", "stepwise"):
        raise OutputError(f"trainer view mode must be sequence or stepwise, got {mode!r}")
    view = TrainerView(rows=[])
    for ep in episodes:
        view.episodes += 1
        why = _why_left_out(ep, full_prompts(ep["turns"]))
        if why is not None:
            view.skipped[why] += 1
            continue
        view.rows.extend(_rows_of(ep, mode))
    return view


def trainer_table(run_dir: str | Path, mode: TrainerMode = "sequence", annotation: str | None = None
                  ) -> TrainerView:
    """The trainer view of a run directory's committed episodes; `annotation` names a regrade
    (`collector regrade --out NAME`) whose rewards every row carries instead of the stored ones."""
    table = Source(Path(run_dir), None, annotation).read(_COLUMNS)
    return trainer_rows(table.to_pylist(), mode)


def write_trainer_view(run_dir: str | Path, out_path: str | Path, *, mode: TrainerMode = "sequence",
                       annotation: str | None = None) -> int:
    """Write the trainer view of `run_dir` to `out_path` as Parquet (zstd); returns its rows.

    Written under a temporary name and renamed into place: a reader never sees half a file.
    """
    view = trainer_table(run_dir, mode, annotation)
    write_view(view, out_path, run_dir=run_dir)
    return len(view.rows)


def write_view(view: TrainerView, out_path: str | Path, run_dir: str | Path | None = None) -> None:
    """Write an already built view to `out_path` (Parquet, zstd) the way `export` writes:
    atomic rename, symlinks resolved, FIFOs and devices in place, ``-`` for stdout, never
    inside a run directory (`collector.analysis.output.write_output`)."""

    def write(f: BinaryIO) -> int:
        pq.write_table(view.table(), f, compression="zstd")
        return len(view.rows)

    write_output(out_path, write, run_dir)


_SUMMARY_KEYS = ("episodes", "turns", "turns_requested", "turns_with_ids", "turns_withheld",
                 "turns_not_returned", "turns_count_mismatch", "multi_turn_with_prompt_ids",
                 "prefix_consistent")


_TOP_PAIRS = 5


def token_summary(run_dir: str | Path) -> dict[str, Any]:
    """Token capture in numbers: turns asked / returned / withheld / miscounted, the share
    of multi-turn episodes with ids whose every turn is prefix-consistent, and per model
    (`by_model`): episodes with ids on every turn, `samples_per_episode` (the sequence-mode
    rows such an episode becomes: 1 + its breaks) and `one_sequence_share`.

    `drift`, per model with prompt ids on later turns: `rate_by_turn` (turn index -> share of
    those turns whose prompt was re-rendered) and `top_pairs`, the most common first
    differences as (expected id, found id, turns): decode them with the model's tokenizer
    to see what the template changed (found None: the prompt ended there)."""
    table = read_committed(run_dir, ["model", "turns"])
    out: Counter[str] = Counter(dict.fromkeys(_SUMMARY_KEYS, 0))
    per_model: dict[str, Counter[str]] = {}
    drift: dict[str, dict[str, Counter[Any]]] = {}
    models, all_turns = table.column("model").to_pylist(), table.column("turns").to_pylist()
    for model, turns in zip(models, all_turns, strict=True):
        out["episodes"] += 1
        for t in turns:
            out["turns"] += 1
            out["turns_requested"] += bool(t.get("tokens_requested"))
            has_ids = t.get("output_token_ids") is not None
            out["turns_with_ids"] += has_ids
            out["turns_withheld"] += bool(t.get("tokens_withheld"))
            out["turns_not_returned"] += bool(
                t.get("tokens_requested") and not has_ids and not t.get("tokens_withheld"))
            out["turns_count_mismatch"] += t.get("token_counts_ok") is False
        flags = [t.get("prefix_consistent") for t in turns[1:]]
        if flags and all(f is not None for f in flags):
            out["multi_turn_with_prompt_ids"] += 1
            out["prefix_consistent"] += all(flags)
        m = per_model.setdefault(str(model), Counter())
        d = drift.setdefault(str(model), {"turns": Counter(), "drifted": Counter(), "pairs": Counter()})
        for t in turns[1:]:
            if t.get("prefix_consistent") is None:
                continue
            d["turns"][t["index"]] += 1
            if t.get("prefix_consistent") is False:
                d["drifted"][t["index"]] += 1
                d["pairs"][(t.get("drift_expected_id"), t.get("drift_found_id"))] += 1
        if turns and all(p is not None for p in full_prompts(turns)) and all(
                t.get("output_token_ids") is not None for t in turns):
            samples = len(sequence_runs(turns))
            m["episodes_with_ids"] += 1
            m["samples"] += samples
            m["one_sequence"] += samples == 1
    summary: dict[str, Any] = dict(out)
    known = out["multi_turn_with_prompt_ids"]
    summary["prefix_consistent_share"] = out["prefix_consistent"] / known if known else None
    summary["by_model"] = {
        model: {"episodes_with_ids": (n := c["episodes_with_ids"]),
                "samples_per_episode": c["samples"] / n if n else None,
                "one_sequence_share": c["one_sequence"] / n if n else None}
        for model, c in sorted(per_model.items())}
    summary["drift"] = {
        model: {"rate_by_turn": {k: d["drifted"][k] / n for k, n in sorted(d["turns"].items())},
                "top_pairs": [(exp, found, n) for (exp, found), n in d["pairs"].most_common(_TOP_PAIRS)]}
        for model, d in sorted(drift.items()) if d["turns"]}
    return summary


def missing_ids_reason(summary: dict[str, Any]) -> str | None:
    """Why a run has no token ids for a trainer, in one sentence; None when some turn has ids."""
    if summary["turns_with_ids"]:
        return None
    if not summary["turns"]:
        return "no committed turns"
    if not summary["turns_requested"]:
        return (f"none of its {summary['turns']} turns asked for token ids (collected with "
                "sampling.token_ids = false, or on a wire without ids: Responses, Anthropic, Gemini); "
                "collect on the Chat Completions wire with sampling.token_ids unset or true (docs/tokens.md)")
    return (f"{summary['turns_requested']} turns asked for token ids and the server returned none "
            f"({summary['turns_withheld']} withheld by redaction); the server must return them "
            "(vLLM, SGLang, llama.cpp: docs/tokens.md)")


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """The per-model part of `token_summary` as lines for `collector trainer-view`'s stderr."""
    lines = []
    for model, m in summary["by_model"].items():
        if not m["episodes_with_ids"]:
            lines.append(f"  {model}: no episode with ids on every turn")
            continue
        lines.append(f"  {model}: {m['episodes_with_ids']} episodes with ids, "
                     f"{m['samples_per_episode']:.2f} samples per episode, "
                     f"{m['one_sequence_share']:.0%} one sequence")
    for model, d in summary["drift"].items():
        rates = " ".join(f"t{k}={r:.0%}" for k, r in d["rate_by_turn"].items())
        pairs = ", ".join(f"{e}->{f} x{n}" for e, f, n in d["top_pairs"]) or "none"
        lines.append(f"  {model} drift by turn: {rates}; first differences (expected->found): {pairs}")
    return lines

"""`collector card RUN`: a Hugging Face dataset card whose every number can be checked.

The card is a ``README.md`` with a YAML header (the dataset card format the Hub renders),
written beside an export (`collector export RUN DIR/episodes.parquet --format parquet`), so
that the folder is ready for `huggingface_hub`'s ``upload_folder`` (docs/card.md). It says:
the run's identity (the episodes' ``run_id``, the store's ``store_id``) and the config's
fingerprint, the shard schema version, the episodes per stop reason, the truncation table
with Wilson 95% intervals, the per-tool budgets (`collector.analysis.toolstats`), the share
of infrastructure failures (``error`` and ``timeout``), and statements each with the number
it rests on: no tool call from a cut turn was executed (executed calls whose turn was cut),
every episode committed exactly once (rows against distinct episode ids).

Why checkable: a card is read long after the run, copied between repositories and edited
by hand; a number in it that no longer matches the data is worse than none (one public
report put truncation at 0% where it was 35%). So every line that states a number is a
*claim*: it ends with an HTML comment naming it (``<!-- claim:cell/sim-terse/64 -->``,
invisible on the Hub; in the YAML header a ``# claim:KEY`` comment), and
`collector check --card RUN CARD` (`check_card`) recomputes each claim from the committed
shards and names the card's line of any that does not hold: a number edited, a card of
another run (its ``run_id`` line fails first), a claim this run does not have. Lines
without a claim comment are prose the user may change freely.

Tests: tests/analysis/test_card.py.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.compute as pc

from collector.analysis.output import write_output
from collector.analysis.stats import compute_stats, read_columns
from collector.analysis.toolstats import compute_tool_stats, turn_fields
from collector.errors import ConfigError, OutputError
from collector.record.shards import read_shard, schema_version_of
from collector.storage.manifest import committed_shard_paths, read_manifest

__all__ = ["CardCheck", "card_lines", "check_card", "write_card"]

#: The per-tool budget target a card states unless told otherwise.
DEFAULT_TARGET = 0.05
_CLAIM = re.compile(r"(?:<!--\s*claim:(?P<md>\S+)\s*-->|#\s*claim:(?P<yaml>\S+))\s*$")


@dataclass(slots=True)
class _Line:
    text: str
    claim: str | None = None

    def render(self, header: bool) -> str:
        if self.claim is None:
            return self.text
        return f"{self.text}  # claim:{self.claim}" if header else f"{self.text} <!-- claim:{self.claim} -->"


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:.1f}%"


def _facts(run_dir: Path) -> dict[str, Any]:
    """What the claims rest on that the statistics tables do not compute."""
    manifest = read_manifest(run_dir)
    table = read_columns(run_dir, ["episode_id", "run_id", "turns", "executed_tool_calls"])
    versions = sorted({schema_version_of(read_shard(p, columns=["episode_id"]).schema) or 0
                       for p in committed_shard_paths(run_dir)})
    turns = turn_fields(table) if table.num_rows else None
    cut_turns: set[tuple[int, int]] = set()
    if turns is not None:
        cut_turns = set(zip(turns.row[turns.cut].tolist(), turns.index[turns.cut].tolist(), strict=True))
    executed_calls = table.column("executed_tool_calls").combine_chunks()
    executed_rows = pc.list_parent_indices(executed_calls).to_pylist()
    executed_turns = pc.list_flatten(executed_calls).field("turn_index").to_pylist()
    executed = len(executed_rows)
    from_cut = sum((row, index) in cut_turns
                   for row, index in zip(executed_rows, executed_turns, strict=True))
    run_ids = sorted(set(table.column("run_id").to_pylist())) if table.num_rows else []
    return {
        "store_id": manifest.get("store_id"),
        "fingerprint": manifest.get("fingerprint"),
        "schema_version": manifest.get("schema_version"),
        "shard_versions": versions,
        "run_ids": run_ids,
        "rows": table.num_rows,
        "distinct": pc.count_distinct(table.column("episode_id")).as_py() if table.num_rows else 0,
        "cut_turns": len(cut_turns),
        "executed": executed,
        "executed_from_cut": from_cut,
    }


def _size_category(n: int) -> str:
    bounds = ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M"))
    for bound, name in bounds:
        if n < bound:
            return name
    return "n>1M"


def _lines(run_dir: Path, target: float, data_files: str) -> Iterator[tuple[bool, _Line]]:
    """(in the YAML header, line) of the card, in order."""
    facts = _facts(run_dir)
    stats = compute_stats(run_dir)
    tools = compute_tool_stats(run_dir, target=target)
    run_ids = ", ".join(facts["run_ids"]) or "(no episodes)"
    yield True, _Line("---")
    yield True, _Line(f"pretty_name: collector rollouts {run_ids}")
    yield True, _Line(f"size_categories: [{_size_category(facts['rows'])}]")
    yield True, _Line("task_categories: [reinforcement-learning]")
    yield True, _Line("tags: [agents, tool-use, rollouts, truncation, collector]")
    yield True, _Line("configs:")
    yield True, _Line("- config_name: default")
    yield True, _Line(f'  data_files: "{data_files}"')
    yield True, _Line("collector:")
    yield True, _Line(f"  run_id: {run_ids}", "run_id")
    yield True, _Line(f"  store_id: {facts['store_id']}", "store_id")
    yield True, _Line(f"  config_fingerprint: {facts['fingerprint']}", "config_fingerprint")
    yield True, _Line(f"  schema_version: {facts['schema_version']}", "schema_version")
    yield True, _Line(f"  episodes: {facts['rows']}", "episodes")
    yield True, _Line("---")
    yield False, _Line(f"# Rollouts of {run_ids}")
    yield False, _Line("")
    yield False, _Line("LLM-agent episodes collected by `collector`: one row per episode, a typed "
                       "`stop_reason`, zero reward for an episode ended by a cut or malformed turn. Every "
                       "line below that states a number is a claim `collector check --card` recomputes from "
                       "the run's shards.")
    yield False, _Line("")
    yield False, _Line("## Run")
    yield False, _Line("")
    versions = ", ".join(str(v) for v in facts["shard_versions"]) or "-"
    yield False, _Line(f"- Shard schema version {facts['schema_version']} (shards written at version "
                       f"{versions}).", "shard_versions")
    yield False, _Line(f"- {facts['rows']} committed episodes.", "rows")
    yield False, _Line("")
    yield False, _Line("## Episodes per stop reason")
    yield False, _Line("")
    yield False, _Line("| stop reason | episodes | share |")
    yield False, _Line("|---|---:|---:|")
    reasons: Counter[str] = Counter()
    for g in stats.groups:
        reasons.update(g.reasons)
    for reason, n in sorted(reasons.items()):
        yield False, _Line(f"| {reason} | {n} | {_pct(n / facts['rows'])} |", f"stop/{reason}")
    yield False, _Line("")
    yield False, _Line("## Truncation")
    yield False, _Line("")
    yield False, _Line("Share of the episodes that did not end in error with at least one turn cut by the "
                       "output-token cap, with its Wilson 95% interval.")
    yield False, _Line("")
    yield False, _Line(f"| {' | '.join(stats.by)} | episodes | valid | truncated | rate | 95% CI |")
    yield False, _Line("|" + "---|" * len(stats.by) + "---:|---:|---:|---:|---|")
    for g in stats.groups:
        low, high = g.truncation_interval
        ci = "-" if math.isnan(low) else f"[{100 * low:.1f}%, {100 * high:.1f}%]"
        keys = [str(g.key[c]) for c in stats.by]
        yield False, _Line(f"| {' | '.join(keys)} | {g.episodes} | {g.valid} | {g.truncated} | "
                           f"{_pct(g.truncation_rate)} | {ci} |", "cell/" + "/".join(keys))
    yield False, _Line("")
    yield False, _Line("## Budget per tool")
    yield False, _Line("")
    yield False, _Line(f"The smallest output cap at which at most {_pct(target)} of a tool's calls are cut, "
                       "from the complete calls' sizes and the observed cuts (`collector stats --per tool`), "
                       "with its 95% interval.")
    yield False, _Line("")
    rest = [c for c in tools.by if c != "budget"]
    yield False, _Line(f"| {' | '.join([*rest, 'tool'])} | calls | budget | interval |")
    yield False, _Line("|" + "---|" * (len(rest) + 1) + "---:|---:|---|")
    for b in tools.budgets:
        keys = [str(b.key[c]) for c in (*rest, "tool")]
        if b.fits_no_budget:
            answer, interval = f"none up to {b.largest}", "-"
        else:
            upper = str(b.budget_high) if b.budget_high is not None else f"above {b.largest}"
            answer, interval = str(b.budget), f"[{b.budget_low}, {upper}]"
        yield False, _Line(f"| {' | '.join(keys)} | {b.calls} | {answer} | {interval} |",
                           f"tool/{target}/" + "/".join(keys))
    unknown = sum(n for _, n in tools.unattributed)
    yield False, _Line("")
    yield False, _Line(f"Cut turns with no recorded call (their tool cannot be known): {unknown}.",
                       "tool/unknown")
    yield False, _Line("")
    yield False, _Line("## Statements")
    yield False, _Line("")
    errors, timeouts = reasons.get("error", 0), reasons.get("timeout", 0)
    share = (errors + timeouts) / facts["rows"] if facts["rows"] else math.nan
    yield False, _Line(f"- Infrastructure failures: {errors + timeouts} of {facts['rows']} episodes "
                       f"({_pct(share)}): {errors} error, {timeouts} timeout; no truncation rate counts the "
                       "errors.", "infrastructure")
    if facts["executed_from_cut"]:
        statement = "A tool call from a cut turn WAS executed"
    else:
        statement = "No tool call from a cut turn was executed"
    yield False, _Line(f"- {statement}: {facts['executed_from_cut']} of the {facts['executed']} executed "
                       f"calls came from the {facts['cut_turns']} cut turns.", "cut_not_executed")
    once = "Every episode committed exactly once" if facts["rows"] == facts["distinct"] else \
        "NOT every episode committed exactly once"
    yield False, _Line(f"- {once}: {facts['rows']} rows, {facts['distinct']} distinct episode ids.",
                       "committed_once")


def card_lines(run_dir: str | Path, target: float = DEFAULT_TARGET, data_files: str = "*.parquet"
               ) -> list[tuple[str, str | None]]:
    """The card of `run_dir` as (rendered line, claim key or None)."""
    if not 0.0 < target < 1.0:
        raise ConfigError(f"target must be between 0 and 1 (got {target})")
    return [(line.render(header), line.claim) for header, line in _lines(Path(run_dir), target, data_files)]


def write_card(run_dir: str | Path, out: str | Path, target: float = DEFAULT_TARGET,
               data_files: str = "*.parquet") -> Path:
    """Write the card to `out`: a path ending in ``.md`` is the card itself; anything else is
    the folder it goes in as ``README.md`` (created if missing: the export can follow). Returns
    the file written."""
    path = Path(out)
    if path.is_dir() or path.suffix.lower() != ".md":
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"cannot create {path}: {exc.strerror or exc}") from None
        path = path / "README.md"
    text = "\n".join(line for line, _ in card_lines(run_dir, target, data_files)) + "\n"
    write_output(str(path), lambda f: f.write(text.encode()), run_dir)
    return path


@dataclass(slots=True)
class CardCheck:
    """What `check_card` found: the claims checked and the lines that do not hold."""

    checked: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _target_of(lines: list[str]) -> float:
    """The per-tool target the card was written with (its budget claims name it)."""
    for line in lines:
        m = _CLAIM.search(line)
        key = m and (m.group("md") or m.group("yaml"))
        if key and key.startswith("tool/") and key != "tool/unknown":
            try:
                return float(key.split("/")[1])
            except ValueError:
                break
    return DEFAULT_TARGET


def _data_files_of(lines: list[str]) -> str:
    for line in lines:
        m = re.match(r'\s*data_files:\s*"(.*)"\s*$', line)
        if m:
            return m.group(1)
    return "*.parquet"


def check_card(run_dir: str | Path, card: str | Path) -> CardCheck:
    """Recompute every claim of `card` from `run_dir`'s shards; a problem per line that does
    not hold, naming the card's path and line number. OutputError when the card cannot be read."""
    try:
        lines = Path(card).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise OutputError(f"{card}: cannot read the card ({exc})") from exc
    truth = {key: text for text, key in card_lines(run_dir, _target_of(lines), _data_files_of(lines))
             if key is not None}
    result = CardCheck()
    for number, line in enumerate(lines, start=1):
        m = _CLAIM.search(line)
        if m is None:
            continue
        key = m.group("md") or m.group("yaml")
        result.checked += 1
        expected = truth.get(key)
        if expected is None:
            result.problems.append(f"{card}:{number}: claim {key} is not a claim of this run")
        elif line.rstrip() != expected:
            result.problems.append(f"{card}:{number}: claim {key} does not hold: the card says "
                                   f"{line.strip()!r}; the shards give {expected.strip()!r}")
    if result.checked == 0:
        result.problems.append(f"{card}: no claim found (not a card written by `collector card`)")
    return result

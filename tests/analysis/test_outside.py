"""The time outside the model and the error causes, per cell, in records, `collector stats` and json."""

from __future__ import annotations

import json
import math
from pathlib import Path

from collector.analysis.stats import compute_stats, format_stats
from collector.cli import main
from collector.record.shards import episodes_from_table, read_shard
from collector.storage.manifest import committed_shard_paths

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "harbor"


def harbor_run(tmp_path: Path) -> Path:
    config = tmp_path / "harbor.toml"
    config.write_text(
        'name = "harbor_time"\n[provider]\nkind = "sim"\n'
        '[sweep]\nmodels = ["sim-perfect"]\nbudgets = [64, 4096]\n'
        f'[env]\nname = "harbor"\n[env.options]\npath = "{EXAMPLES}"\nbackend = "local_no_isolation"\n'
        f'[ray]\npool = "in_process"\nworkers = 1\n[output]\npath = "{tmp_path / "run"}"\n'
    )
    assert main(["run", str(config)]) == 0
    return tmp_path / "run"


def test_time_and_error_causes_are_recorded_and_shown_per_cell(tmp_path: Path) -> None:
    """Episodes store model, tool, sandbox and verifier time (per turn too); stats shows shares, causes."""
    run = harbor_run(tmp_path)
    episodes = [e for p in committed_shard_paths(run) for e in episodes_from_table(read_shard(p))]
    solved = next(e for e in episodes if e.task_id == "shell-steps" and e.budget == 4096)
    assert solved.timing is not None
    assert solved.timing.model_s == sum(t.latency_s for t in solved.turns)
    call_turn = solved.turns[0]
    assert call_turn.tool_s is not None
    assert call_turn.tool_s > 0
    assert solved.timing.tools_s == call_turn.tool_s
    assert solved.timing.verifier_s is not None
    assert solved.timing.verifier_s > 0
    assert solved.timing.sandbox_start_s is not None
    assert solved.timing.image_cached is False
    broken = next(e for e in episodes if e.task_id == "image-fails")
    assert broken.timing is not None
    assert broken.timing.image_build_s is not None
    assert broken.timing.verifier_s is None

    stats = compute_stats(run)
    cell = next(g for g in stats.groups if g.key["budget"] == 4096)
    assert cell.error_causes == {"ImageBuildFailed": 1, "VerifierTimeout": 1}
    row = cell.as_dict()
    shares = [row["model_share"], row["tools_share"], row["sandbox_share"], row["verifier_share"]]
    assert all(0 < s < 1 for s in shares[:1] + shares[2:])
    assert sum(shares) <= 1.0
    assert math.isclose(row["worker_hours_per_million"], row["mean_episode_s"] * 1e6 / 3600)
    assert row["images_built"] == 4

    table = format_stats(stats, "table")
    assert "errors by cause:" in table
    assert "sim-perfect, 4096: ImageBuildFailed 1, VerifierTimeout 1" in table
    assert "worker-hours per million episodes" in table
    rows = json.loads(format_stats(stats, "json"))["rows"]
    assert rows[1]["error_causes"] == "ImageBuildFailed 1, VerifierTimeout 1"

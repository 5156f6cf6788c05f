"""Weights & Biases as a tracker (`tracking.wandb`; the `wandb` extra).

Part of `collector.tracking` (tests: tests/system/tracking/test_end_to_end.py, offline).

`wandb` is imported in `start`, on the tracker's own thread: its import and `wandb.init`
(which spawns W&B's service process) take a second or more, and the driver never waits for
them. Progress points are `run.log(metrics, step=episodes committed)`; the summary logs the
truncation table and the transcript sample as `wandb.Table`s, each figure as `wandb.Html`,
the final metrics and the run directory (`run_dir`) into the run summary, and one artifact
of type `collector-report` holding `report.html` and the figures, with the run's manifest
(`.collector/manifest.json`, which names every committed shard) as a reference entry
(`file://...` or ``s3://...``, never checksummed). The manifest, not the directory: W&B
lists a referenced directory file by file, which on a run of 20,000 shards is the tracker
reading the whole run to say where it is.

What W&B would collect by itself is switched off, since it could carry a secret the
collector never hands over: the command line (`--set provider.base_url=https://user:pass@...`
is a command-line argument) and the rest of the metadata (`x_disable_meta`), git state
(`disable_git`: a remote URL may hold a token), the code (`save_code`), console capture
(`console="off"`) and the installed requirements. Its terminal chatter is silenced too
(`silent`): stdout is the stats table's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from collector.config import WandbConfig
from collector.storage.manifest import MANIFEST
from collector.tracking.base import ProgressPoint, RunInfo, Summary

__all__ = ["WandbTracker"]


class WandbTracker:
    name = "wandb"

    def __init__(self, cfg: WandbConfig) -> None:
        self.cfg = cfg
        self.run: Any = None
        self._wandb: Any = None

    def start(self, run: RunInfo) -> None:
        import wandb

        self._wandb = wandb
        settings = wandb.Settings(
            silent=True, console="off", disable_git=True, save_code=False, x_disable_meta=True,
            x_save_requirements=False, x_disable_stats=True, disable_job_creation=True,
        )
        self.run = wandb.init(
            project=self.cfg.project, entity=self.cfg.entity, mode=self.cfg.mode, dir=self.cfg.dir,
            name=self.cfg.name or run.run_id, tags=list(self.cfg.tags) or None,
            config={**run.config, "run_dir": run.run_dir}, settings=settings, reinit="create_new",
        )

    def progress(self, point: ProgressPoint) -> None:
        self.run.log(point.metrics, step=point.step)

    def finish(self, summary: Summary) -> None:
        wandb = self._wandb
        run = self.run
        logged: dict[str, Any] = {
            name: wandb.Table(columns=table.columns, data=table.rows)
            for name, table in summary.tables.items()
        }
        for path, text in summary.files.items():
            if path.endswith(".svg"):
                logged[path.removesuffix(".svg")] = wandb.Html(text, inject=False)
        run.log(logged)
        for key, value in summary.metrics.items():
            run.summary[key] = value
        run.summary["run_dir"] = summary.run_dir
        run.summary["status"] = summary.status
        artifact = wandb.Artifact(f"{run.name}-report".replace("/", "_"), type="collector-report")
        for path, text in summary.files.items():
            with artifact.new_file(path, encoding="utf-8") as f:
                f.write(text)
        artifact.add_reference(_reference(summary.run_dir), name=f"run_dir/{MANIFEST}", checksum=False)
        run.log_artifact(artifact)
        run.finish(exit_code=0 if summary.status == "finished" else 1)


def _reference(run_dir: str) -> str:
    """The run's manifest as a URI W&B records a reference to."""
    if "://" in run_dir:
        return f"{run_dir.rstrip('/')}/{MANIFEST}"
    return (Path(run_dir).resolve() / MANIFEST).as_uri()

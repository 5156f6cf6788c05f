"""MLflow as a tracker (`tracking.mlflow`; the `mlflow` extra, which installs `mlflow-skinny`).

Part of `collector.tracking` (tests: tests/system/tracking/test_end_to_end.py, a local file store).

Through `MlflowClient`, not the fluent `mlflow.start_run`: the client logs only what it is
given, while the fluent API adds tags from the process (the command line's script name, the
git commit and its remote) and keeps a global active run that a user's own MLflow code in
the same process would collide with. Imported in `start`, on the tracker's own thread.

Progress points are metrics at step = episodes committed; the summary logs the final
metrics, the tables as JSON artifacts in the shape `mlflow.log_table` writes
(`{"columns": [...], "data": [[...]]}` under `tables/`), the resolved config
(`config.resolved.json`), `report.html` and the figures, the run directory as the tag
`collector.run_dir`, and ends the run `FINISHED` or `FAILED`. A few params name the run
(name, models, budgets, environment). MLflow 3 refuses a `file:` store unless
`MLFLOW_ALLOW_FILE_STORE` is set; a config that names one asks for it, so it is set then.
"""

from __future__ import annotations

import os
from typing import Any

from collector.config import MlflowConfig
from collector.tracking.base import ProgressPoint, RunInfo, Summary

__all__ = ["MlflowTracker"]

#: MLflow takes at most this many metrics per `log_batch` call.
_BATCH = 1000


class MlflowTracker:
    name = "mlflow"

    def __init__(self, cfg: MlflowConfig) -> None:
        self.cfg = cfg
        self.client: Any = None
        self.run_id = ""
        self._entities: Any = None

    def start(self, run: RunInfo) -> None:
        uri = self.cfg.tracking_uri
        if uri is not None and (uri.startswith("file:") or "://" not in uri):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow import entities
        from mlflow.tracking import MlflowClient

        self._entities = entities
        self.client = MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(self.cfg.experiment)
        experiment_id = (experiment.experiment_id if experiment is not None
                         else self.client.create_experiment(self.cfg.experiment))
        tags = {"collector.run_dir": run.run_dir, "collector.run_id": run.run_id}
        created = self.client.create_run(experiment_id, run_name=self.cfg.run_name or run.run_id, tags=tags)
        self.run_id = created.info.run_id
        config = run.config
        params = {"name": config.get("name"), "env": (config.get("env") or {}).get("name"),
                  "models": ",".join(map(str, (config.get("sweep") or {}).get("models", []))),
                  "budgets": ",".join(map(str, (config.get("sweep") or {}).get("budgets", [])))}
        self.client.log_batch(self.run_id,
                              params=[entities.Param(k, str(v)[:6000]) for k, v in params.items()])
        self.client.log_dict(self.run_id, {**config, "run_dir": run.run_dir}, "config.resolved.json")

    def _metrics(self, metrics: dict[str, float], step: int) -> None:
        import time

        now = int(time.time() * 1000)
        items = [self._entities.Metric(k, float(v), now, step) for k, v in metrics.items()]
        for i in range(0, len(items), _BATCH):
            self.client.log_batch(self.run_id, metrics=items[i:i + _BATCH])

    def progress(self, point: ProgressPoint) -> None:
        self._metrics(point.metrics, point.step)

    def finish(self, summary: Summary) -> None:
        step = int(summary.metrics.get("episodes/committed", 0))
        self._metrics(summary.metrics, step)
        for name, table in summary.tables.items():
            self.client.log_dict(self.run_id, {"columns": table.columns, "data": table.rows},
                                 f"tables/{name}.json")
        for path, text in summary.files.items():
            self.client.log_text(self.run_id, text, path)
        self.client.set_terminated(self.run_id, "FINISHED" if summary.status == "finished" else "FAILED")

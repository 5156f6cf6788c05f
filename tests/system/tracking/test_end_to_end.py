"""`collector run --set tracking...` logs to an offline W&B run and an MLflow file store, and
neither holds a planted secret.

One run of the simulator through the CLI (`python -m collector run --in-process`: the trackers
live in the driver, so Ray's start-up would only add seconds and no coverage), both trackers on.
Read back: the `.wandb` file with `tests.tracking.wandbfile` (the records W&B's service wrote:
history, summary, config, artifacts), the MLflow store with `MlflowClient`. Planted: an API key
in the provider's key variable, user info and a `?key=` credential in the provider's base URL
(the simulator ignores it; the config keeps it), the same URL on the command line (the process's
argv, which W&B's metadata would capture), and W&B's own key in `WANDB_API_KEY`. Every file
under W&B's directories (run dir, artifact staging, cache, config) and the MLflow store is
searched decoded (`tests.faults.secret_scan.leaks_in`: JSON strings, Arrow, bytes), and so is
every reassembled record of the `.wandb` file (a string may straddle one of its block
boundaries).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pytest

from collector.cli import main
from tests.faults.secret_scan import leaks_in
from tests.tracking import wandbfile

KEY_VARIABLE = "COLLECTOR_TRACKING_TEST_KEY"
API_KEY = "sk-PLANTED-tracking-key-0123456789"
URL_PASSWORD = "PLANTED-url/pass@word!"
QUERY_KEY = "AIzaPLANTEDtrackingQuery42"
WANDB_KEY = "PLANTED" + "0" * 33  # W&B keys are 40 characters
SECRET_URL = f"http://svc:{quote(URL_PASSWORD, safe='')}@sim.invalid:9/v1?key={QUERY_KEY}"
SECRETS = (API_KEY, URL_PASSWORD, quote(URL_PASSWORD, safe=""), QUERY_KEY, WANDB_KEY, "PLANTED")

CONFIG = """
name = "tracked"
[provider]
kind = "sim"
api_key_env = "{key_variable}"
[sweep]
models = ["sim-terse"]
budgets = [16, 128]
[env]
name = "arithmetic"
tasks = 4
[ray]
workers = 1
cpus_per_worker = 0.5
[output]
path = "{run_dir}"
"""


# A separate process (W&B's service and the argv it would capture are a process's), its workers in
# that process (`--in-process`): they see the planted key variable, and no Ray cluster is started.
@pytest.mark.timeout(240)
def test_a_run_is_logged_to_wandb_offline_and_mlflow_with_no_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    config = tmp_path / "tracked.toml"
    config.write_text(CONFIG.format(key_variable=KEY_VARIABLE, run_dir=run_dir))
    wandb_dirs = {name: tmp_path / "wandb" / name for name in ("dir", "data", "cache", "config")}
    for variable, name in (("WANDB_DIR", "dir"), ("WANDB_DATA_DIR", "data"), ("WANDB_CACHE_DIR", "cache"),
                           ("WANDB_CONFIG_DIR", "config")):
        wandb_dirs[name].mkdir(parents=True)
        monkeypatch.setenv(variable, str(wandb_dirs[name]))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_API_KEY", WANDB_KEY)
    monkeypatch.setenv(KEY_VARIABLE, API_KEY)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    # The collector allows MLflow's file store in its own process; this one reads it back.
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    store = tmp_path / "mlruns"
    args = ["run", str(config), "--quiet", "--in-process",
            "--set", "tracking.wandb.project=collector-test",
            "--set", f"tracking.mlflow.tracking_uri='{store.as_uri()}'",
            "--set", "tracking.mlflow.experiment=truncation",
            "--set", f"provider.base_url='{SECRET_URL}'"]
    # The secret URL is on the command line too: what W&B's metadata would read from sys.argv.
    proc = subprocess.run([sys.executable, "-m", "collector", *args], capture_output=True, text=True,
                          timeout=200, check=False)
    out, err = proc.stdout, proc.stderr
    assert proc.returncode == 0, err
    assert "warning: tracker" not in err, err
    stats = json.loads(_stats_json(run_dir, capsys))
    rows = {(r["model"], r["budget"]): r for r in stats["rows"]}

    # --- W&B, offline: the documented metrics, the tables, the config, the report artifact ----
    (wandb_file,) = (wandb_dirs["dir"] / "wandb").glob("offline-run-*/run-*.wandb")
    history = wandbfile.history(wandb_file)
    last = history[-1]
    assert last["episodes/committed"] == 8
    assert last["episodes/planned"] == 8
    assert last["_step"] == 8
    assert last["stop_reason/done"] + last.get("stop_reason/length", 0) == 8
    for budget in (16, 128):
        assert last[f"cell/sim-terse/{budget}/episodes"] == 4
        assert last[f"cell/sim-terse/{budget}/truncation_rate"] == (
            rows[("sim-terse", budget)]["truncation_rate"])
    assert last["truncation_table/_type"] == "table-file"
    assert last["truncation_table/nrows"] == 2
    assert last["transcripts/_type"] == "table-file"
    assert last["transcripts/nrows"] == 8
    summary = wandbfile.summary(wandb_file)
    assert summary["final/sim-terse/16/trunc_high"] == rows[("sim-terse", 16)]["trunc_high"]
    assert summary["run_dir"] == str(run_dir)
    assert summary["status"] == "finished"
    records = wandbfile.records(wandb_file)
    (run_record,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run_record.project == "collector-test"
    assert run_record.display_name.startswith("tracked-")
    wandb_config = {i.key: json.loads(i.value_json) for i in run_record.config.update}
    assert wandb_config["provider"]["base_url"] == "http://sim.invalid:9/v1"  # the resolved form
    assert wandb_config["run_dir"] == str(run_dir)
    artifacts = {r.artifact.type: r.artifact for r in records if r.WhichOneof("record_type") == "artifact"}
    paths = {m.path: m.ref for m in artifacts["collector-report"].manifest.contents}
    assert {"report.html", "figures/truncation_sim-terse.svg"} <= set(paths)
    assert paths["run_dir/.collector/manifest.json"] == (run_dir / ".collector" / "manifest.json").as_uri()
    (table_file,) = wandb_file.parent.glob("files/media/table/truncation_table_*.table.json")
    table = json.loads(table_file.read_text())
    assert [row[table["columns"].index("budget")] for row in table["data"]] == [16, 128]

    # --- MLflow, a file store: the same metrics, the tables and the config as artifacts ------
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=store.as_uri())
    experiment = client.get_experiment_by_name("truncation")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.tags["collector.run_dir"] == str(run_dir)
    assert run.data.metrics["episodes/committed"] == 8
    for budget in (16, 128):
        assert run.data.metrics[f"cell/sim-terse/{budget}/truncation_rate"] == (
            rows[("sim-terse", budget)]["truncation_rate"])
        assert run.data.metrics[f"final/sim-terse/{budget}/trunc_low"] == (
            rows[("sim-terse", budget)]["trunc_low"])
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "episodes/committed")]
    assert steps
    assert steps[-1] == 8
    artifact_root = Path(run.info.artifact_uri.removeprefix("file://"))
    logged = json.loads((artifact_root / "tables" / "truncation_table.json").read_text())
    assert [row[logged["columns"].index("truncation_rate")] for row in logged["data"]] == [
        rows[("sim-terse", b)]["truncation_rate"] for b in (16, 128)]
    transcripts = json.loads((artifact_root / "tables" / "transcripts.json").read_text())
    assert len(transcripts["data"]) == 8
    endings = [(r[transcripts["columns"].index("budget")], r[transcripts["columns"].index("stop_reason")])
               for r in transcripts["data"]]
    assert ("16", "length") in {(str(b), s) for b, s in endings}, endings  # the sweep cut some
    for budget in (16, 128):  # per cell, the cut ones first
        cell = [s == "length" for b, s in endings if b == budget]
        assert cell == sorted(cell, reverse=True), endings
    assert (artifact_root / "report.html").read_text().startswith("<!DOCTYPE html>")
    saved = json.loads((artifact_root / "config.resolved.json").read_text())
    assert saved["provider"]["base_url"] == "http://sim.invalid:9/v1"
    assert saved["tracking"]["mlflow"]["tracking_uri"] == store.as_uri()

    # --- no planted secret anywhere either tracker wrote, nor in what the run printed ----------
    assert not leaks_in(tmp_path / "wandb", SECRETS)
    assert not leaks_in(store, SECRETS)
    assert not [s for s in SECRETS if any(s.encode() in raw for raw in wandbfile.raw_records(wandb_file))]
    assert not [s for s in SECRETS if s in out + err]


def _stats_json(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["stats", str(run_dir), "--format", "json"]) == 0
    return capsys.readouterr().out

"""The truncation analysis notebook runs headless over a small run and renders its six figures."""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from collector.stop import StopReason
from collector.storage.local import LocalRunStore
from tests.analysis.test_figures import reasoning_run
from tests.record.factory import make_batch
from tests.s3server import S3Bucket

S = StopReason
NOTEBOOK = Path(__file__).resolve().parents[3] / "notebooks" / "truncation_analysis.ipynb"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def small_run(run: Path) -> None:
    """Two models x three budgets; truncation falls with the budget; a few malformed and error episodes."""
    mixes = {
        64: (S.LENGTH, S.LENGTH, S.DONE, S.MALFORMED_TOOL_CALL, S.ERROR),
        128: (S.LENGTH, S.DONE, S.DONE, S.DONE, S.MAX_STEPS),
        256: (S.DONE, S.DONE, S.DONE, S.DONE, S.LENGTH, S.DONE, S.DONE, S.DONE, S.DONE, S.TIMEOUT),
    }
    with LocalRunStore.open(run, "fp", {}, "arrow", 64) as st:
        for model in ("sim-perfect", "sim-sloppy"):
            for budget, stops in mixes.items():
                extra = (S.LENGTH,) if model == "sim-sloppy" else ()  # the sloppy model is cut more often
                st.commit(make_batch(20, model=model, budget=budget, stops=stops + extra))


def test_notebook_renders_its_figures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Executed headless with RUN_DIR set, every cell runs and the seven figure cells each emit a PNG."""
    run = tmp_path / "run"
    small_run(run)
    monkeypatch.setenv("RUN_DIR", str(run))
    monkeypatch.setenv("MPLBACKEND", "Agg")  # the notebook's %matplotlib inline draws with Agg too
    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")  # jupyter_core's path-migration warning otherwise
    nb = nbformat.read(NOTEBOOK, as_version=4)
    resources = {"metadata": {"path": str(tmp_path)}}
    client = NotebookClient(nb, timeout=120, kernel_name="python3", resources=resources)
    client.execute()

    code_cells = [c for c in nb.cells if c.cell_type == "code"]
    assert not [o for c in code_cells for o in c.outputs if o.output_type == "error"]
    pngs = [
        base64.b64decode(o["data"]["image/png"])
        for c in code_cells
        for o in c.outputs
        if o.output_type == "display_data" and "image/png" in o.get("data", {})
    ]
    assert len(pngs) == 8  # the per-turn, error-rate, size and output-length figures among them
    assert all(p.startswith(PNG_MAGIC) and len(p) > 5_000 for p in pngs)
    first = "".join(o.get("text", "") for o in code_cells[0].outputs if o.output_type == "stream")
    assert "120 episodes, 2 models, budgets [64, 128, 256]" in first


def _execute(run: Path | str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[nbformat.NotebookNode]:
    """The notebook's code cells, executed headless over `run`."""
    monkeypatch.setenv("RUN_DIR", str(run))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    resources = {"metadata": {"path": str(tmp_path)}}
    NotebookClient(nb, timeout=120, kernel_name="python3", resources=resources).execute()
    return [c for c in nb.cells if c.cell_type == "code"]


def test_notebook_splits_a_reasoning_sweep_by_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over a run with two reasoning settings the notebook's table has a row per setting and
    budget with the thinking-cut and context-overflow rates, and every figure still renders."""
    code_cells = _execute(reasoning_run(tmp_path / "run"), tmp_path, monkeypatch)
    assert not [o for c in code_cells for o in c.outputs if o.output_type == "error"]
    first = "".join(o.get("text", "") for o in code_cells[0].outputs if o.output_type == "stream")
    assert "80 episodes, 1 models, budgets [64, 128], reasoning ['effort=high', 'effort=low']" in first
    (table,) = [o["data"]["text/html"] for o in code_cells[0].outputs if "text/html" in o.get("data", {})]
    header = re.search(r"<thead>(.*?)</thead>", table, re.S)
    assert header is not None
    for column in ("reasoning", "thinking_cut_rate", "context_overflow_rate"):
        assert f"<th>{column}</th>" in header.group(1)
    assert table.count("effort=high") == 2  # one row per budget
    assert table.count("effort=low") == 2
    pngs = [o for c in code_cells for o in c.outputs if "image/png" in o.get("data", {})]
    assert len(pngs) == 8


@pytest.mark.parametrize("cwd", [".", "notebooks"])
def test_jupyter_execute_finds_the_demo_run_from_root_and_notebooks(tmp_path: Path, cwd: str) -> None:
    """`jupyter execute` with no RUN_DIR reads runs/demo from the repository root and from notebooks/."""
    small_run(tmp_path / "runs" / "demo")
    (tmp_path / "notebooks").mkdir()
    shutil.copy(NOTEBOOK, tmp_path / "notebooks" / NOTEBOOK.name)
    where = tmp_path / cwd
    path = NOTEBOOK.name if cwd == "notebooks" else f"notebooks/{NOTEBOOK.name}"
    env = {k: v for k, v in os.environ.items() if k not in ("RUN_DIR", "TARGET")}
    env.update(MPLBACKEND="Agg", JUPYTER_PLATFORM_DIRS="1")
    jupyter = Path(sys.executable).parent / "jupyter"
    done = subprocess.run([str(jupyter), "execute", path, "--output", "executed"], cwd=where, env=env,
                          text=True, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    executed = nbformat.read(tmp_path / "notebooks" / "executed.ipynb", as_version=4)
    first = next(c for c in executed.cells if c.cell_type == "code")
    text = "".join(o.get("text", "") for o in first.outputs if o.output_type == "stream")
    assert "120 episodes, 2 models, budgets [64, 128, 256]" in text
    assert text.startswith(f"{tmp_path / 'runs' / 'demo'}: ")  # the kernel starts in notebooks/ either way


def test_analysis_extra_installs_what_the_notebook_needs() -> None:
    """The `analysis` extra brings a Jupyter front end, `jupyter execute`, a kernel and the plotting stack."""
    pyproject = tomllib.loads((NOTEBOOK.parents[1] / "pyproject.toml").read_text(encoding="utf-8"))
    extra = pyproject["project"]["optional-dependencies"]["analysis"]
    names = {re.split(r"[<>=\[ ;]", requirement, maxsplit=1)[0] for requirement in extra}
    assert {"jupyterlab", "nbclient", "ipykernel", "matplotlib", "pandas"} <= names


def test_notebook_reads_a_run_in_a_bucket(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3_bucket: S3Bucket
) -> None:
    """RUN_DIR=s3://bucket/prefix: the notebook reads the run through its synced mirror and
    prints the same summary as over the local directory."""
    run = tmp_path / "run"
    small_run(run)
    for path in sorted(p for p in run.rglob("*") if p.is_file()):
        key = f"runs/nb/{path.relative_to(run).as_posix()}"
        s3_bucket.client.put_object(Bucket=s3_bucket.name, Key=key, Body=path.read_bytes())
    monkeypatch.setenv("COLLECTOR_CACHE_DIR", str(tmp_path / "cache"))
    code_cells = _execute(s3_bucket.uri("runs/nb"), tmp_path, monkeypatch)
    assert not [o for c in code_cells for o in c.outputs if o.output_type == "error"]
    first = "".join(o.get("text", "") for o in code_cells[0].outputs if o.output_type == "stream")
    assert f"{s3_bucket.uri('runs/nb')}: 120 episodes, 2 models, budgets [64, 128, 256]" in first

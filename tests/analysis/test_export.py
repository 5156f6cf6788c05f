"""Where `collector export OUT` and `trainer-view OUT` write (`collector.analysis.output.write_output`):
symlinks resolved, FIFOs and devices written in place, `-` for stdout, never inside a run dir."""

from __future__ import annotations

import io
import json
import os
import stat
import threading
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from collector.analysis.export import export_run
from collector.analysis.trainer import trainer_rows, write_view
from collector.cli import main
from collector.errors import OutputError
from collector.storage.local import LocalRunStore
from tests.record.factory import make_batch


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A committed run of 3 episodes."""
    path = tmp_path / "run"
    with LocalRunStore.open(path, "fp", {}, "arrow", 10) as st:
        st.commit(make_batch(3))
    return path


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_a_symlinked_out_stays_a_link_and_its_target_is_replaced(run: Path, tmp_path: Path) -> None:
    """`latest.jsonl -> v3.jsonl`: the export replaces v3.jsonl (atomically, keeping its mode) and
    latest.jsonl is still the link; a dangling link gets its target created."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "v3.jsonl").write_text("old\n")
    (out / "v3.jsonl").chmod(0o640)
    (out / "latest.jsonl").symlink_to("v3.jsonl")
    assert export_run(run, out / "latest.jsonl", "chat-jsonl") == 3
    assert (out / "latest.jsonl").is_symlink()
    assert os.readlink(out / "latest.jsonl") == "v3.jsonl"
    assert _lines(out / "v3.jsonl") == 3
    assert stat.S_IMODE((out / "v3.jsonl").stat().st_mode) == 0o640
    assert sorted(p.name for p in out.iterdir()) == ["latest.jsonl", "v3.jsonl"]  # no temp left
    (out / "next.parquet").symlink_to("v4.parquet")
    assert export_run(run, out / "next.parquet", "parquet") == 3
    assert (out / "next.parquet").is_symlink()
    assert pq.read_table(out / "v4.parquet").num_rows == 3


def test_a_fifo_is_written_in_place(run: Path, tmp_path: Path) -> None:
    """A FIFO OUT is opened and written, not replaced by a regular file."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    assert export_run(run, fifo, "chat-jsonl") == 3
    reader.join(timeout=30)
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert len(got[0].decode().splitlines()) == 3
    assert all("messages" in json.loads(line) for line in got[0].decode().splitlines())


def _char_device(path: Path, minor: int) -> Path:
    """A char device node in tmp (1,3 is null, 1,7 is full): never the machine's own /dev."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, minor))
        with open(path, "wb"):
            pass
    except (PermissionError, OSError) as exc:
        pytest.skip(f"cannot make or open a device node here: {exc}")
    return path


def test_a_device_is_written_in_place_and_a_full_one_is_one_line(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A device OUT (like /dev/null, /dev/full as root) stays the device: null takes the export;
    full fails with one line naming OUT and the cause, exit 2."""
    null = _char_device(tmp_path / "null", 3)
    assert export_run(run, null, "parquet") == 3
    assert stat.S_ISCHR(null.lstat().st_mode)
    full = _char_device(tmp_path / "full", 7)
    assert main(["export", str(run), str(full), "--format", "chat-jsonl"]) == 2
    err = capsys.readouterr().err
    assert err == f"collector: error: cannot write {full}: No space left on device\n"
    assert stat.S_ISCHR(full.lstat().st_mode)


@pytest.mark.parametrize("fmt", ["chat-jsonl", "parquet"])
def test_dash_writes_to_stdout(run: Path, fmt: str, capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    """`export RUN -` writes the export on stdout (the count goes to stderr), no file named '-'."""
    assert main(["export", str(run), "-", "--format", fmt]) == 0
    out = capsysbinary.readouterr().out
    if fmt == "parquet":
        assert pq.read_table(io.BytesIO(out)).num_rows == 3
    else:
        assert len(out.decode().splitlines()) == 3
    assert not Path("-").exists()


def test_an_out_inside_a_run_directory_is_refused(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An OUT under the run's data/ (or any run dir, or reached through a symlink into one) is one
    line, exit 2, and nothing is written: readers of the run would count its episodes twice."""
    other = tmp_path / "other"
    LocalRunStore.open(other, "fp", {}, "arrow", 10).close()
    (tmp_path / "sneaky.parquet").symlink_to(run / "data" / "x.parquet")
    for out in (run / "data" / "x.parquet", run / "x.jsonl", other / "data" / "y.parquet",
                tmp_path / "sneaky.parquet"):
        assert main(["export", str(run), str(out), "--format", "parquet"]) == 2, out
        err = capsys.readouterr().err
        assert err.count("\n") == 1
        assert f"{out}: inside the run directory" in err
    assert sorted(p.name for p in (run / "data").iterdir() if not p.name.startswith("part-")) == []
    assert not (run / "x.jsonl").exists()
    with pytest.raises(OutputError, match="inside the run directory"):
        write_view(trainer_rows([]), run / "data" / "view.parquet", run)
    with pytest.raises(OutputError, match="inside the run directory"):
        write_view(trainer_rows([]), other / "view.parquet")  # found by its manifest alone


def test_the_trainer_view_writes_through_a_symlink_and_to_a_fifo(tmp_path: Path) -> None:
    """`trainer-view OUT` writes the way export does: a link's target replaced, a FIFO in place."""
    view = trainer_rows([])
    (tmp_path / "v1.parquet").write_bytes(b"old")
    (tmp_path / "view.parquet").symlink_to("v1.parquet")
    write_view(view, tmp_path / "view.parquet")
    assert (tmp_path / "view.parquet").is_symlink()
    assert pq.read_table(tmp_path / "v1.parquet").num_rows == 0
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    write_view(view, fifo)
    reader.join(timeout=30)
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert pq.read_table(io.BytesIO(got[0])).num_rows == 0

"""`collector card` and `collector check --card`: a dataset card whose every number is checked.

The card of a run round-trips (every claim holds), a number changed by hand fails naming its
line, and the card of another run fails on that run's identity, all through the command
line's own entry point in this process.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.analysis.card import card_lines, check_card
from collector.cli import main
from collector.run.job import run_job
from tests.run.helpers import small_config


def _run(root: Path, name: str) -> Path:
    cfg = small_config(root / name, name=name, sweep__models=["sim-terse"], sweep__budgets=[16, 64],
                       env__tasks=8, samples_per_task=2)
    run_job(cfg, show_progress=False)
    return root / name


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("card")
    return _run(root, "first"), _run(root, "second")


def test_card_round_trips_through_check(runs: tuple[Path, Path], tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """The card `collector card` writes beside an export passes `collector check --card`."""
    run, _ = runs
    export = tmp_path / "export"
    export.mkdir()
    assert main(["export", str(run), str(export / "episodes.parquet"), "--format", "parquet"]) == 0
    assert main(["card", str(run), "-o", str(export)]) == 0
    card = export / "README.md"
    text = card.read_text()
    assert text.startswith("---\n")
    assert "# claim:config_fingerprint" in text
    assert "No tool call from a cut turn was executed: 0 of the" in text
    assert "Every episode committed exactly once: 32 rows, 32 distinct episode ids." in text
    capsys.readouterr()
    assert main(["check", str(run), "--card", str(card)]) == 0
    assert "claims hold" in capsys.readouterr().out


def test_a_number_changed_by_hand_fails_naming_its_line(runs: tuple[Path, Path], tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Editing one truncation count makes check exit 1 and name that line of the card."""
    run, _ = runs
    card = tmp_path / "README.md"
    assert main(["card", str(run), "-o", str(card)]) == 0
    lines = card.read_text().splitlines()
    number = next(i for i, line in enumerate(lines) if "claim:cell/sim-terse/16" in line)
    cells = lines[number].split(" | ")
    cells[4] = str(int(cells[4]) + 1)  # the truncated count
    lines[number] = " | ".join(cells)
    card.write_text("\n".join(lines) + "\n")
    capsys.readouterr()
    assert main(["check", str(run), "--card", str(card)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1
    assert out[0].startswith(f"{card}:{number + 1}: claim cell/sim-terse/16 does not hold")


def test_another_runs_card_fails_on_its_identity(runs: tuple[Path, Path], tmp_path: Path) -> None:
    """A card written for one run does not pass for another: its run id line is named."""
    first, second = runs
    card = tmp_path / "README.md"
    assert main(["card", str(first), "-o", str(card)]) == 0
    result = check_card(second, card)
    assert not result.ok
    assert any(": claim run_id does not hold" in p for p in result.problems)
    assert any(": claim store_id does not hold" in p for p in result.problems)


def test_prose_may_change_and_a_card_without_claims_is_refused(runs: tuple[Path, Path],
                                                               tmp_path: Path) -> None:
    """Lines without a claim are the user's; a file with no claim at all is not a card."""
    run, _ = runs
    card = tmp_path / "README.md"
    lines = [text for text, _ in card_lines(run)]
    notes = ["", "## Notes", "", "Collected for the 12 ablations of section 4."]
    card.write_text("\n".join([*lines, *notes]) + "\n")
    assert check_card(run, card).ok
    card.write_text("# my dataset\n\n50% truncated\n")
    assert not check_card(run, card).ok

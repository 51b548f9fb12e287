"""A run is named by any unique part of its id (a prefix of its date, its random suffix), or by a
preset's name (that preset's newest run); an ambiguous part lists the runs it matches."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from ddptui.cli import main
from engine.core.common.statuses import RunStatus
from engine.core.runs.rundir import RunDirError, find_run, preset_of_run_id
from tests.fixtures.made_runs import make_run

IDS = (
    "20261202-101500-cpu-demo-c3d4",
    "20261202-103000-cpu-demo-ce56",
    "20261202-104500-fast-ddp-9a9a",
)


@pytest.fixture
def three_runs(runs_dir: Path) -> Path:
    for run_id in IDS:
        make_run(runs_dir, run_id, state=RunStatus.COMPLETED)
    (runs_dir / "notes").mkdir()  # not a run: never matched
    return runs_dir


def test_any_unique_part_of_an_id_names_its_run(three_runs: Path) -> None:
    assert find_run(three_runs, "ce56").run_id == IDS[1]  # the suffix
    assert find_run(three_runs, "9a9a").run_id == IDS[2]
    assert find_run(three_runs, "20261202-1015").run_id == IDS[0]  # a prefix of the date
    assert find_run(three_runs, "demo-c3").run_id == IDS[0]  # any part
    assert find_run(three_runs, IDS[1]).run_id == IDS[1]  # the whole id


def test_a_preset_name_names_its_newest_run(three_runs: Path) -> None:
    assert preset_of_run_id(IDS[0]) == "cpu-demo" and preset_of_run_id("notes") is None
    assert find_run(three_runs, "cpu-demo").run_id == IDS[1]
    assert find_run(three_runs, "fast-ddp").run_id == IDS[2]


def test_an_ambiguous_part_lists_the_runs_it_matches(three_runs: Path) -> None:
    with pytest.raises(RunDirError) as raised:
        find_run(three_runs, "20261202")
    assert str(raised.value) == "\n".join(
        [
            f"'20261202' matches 3 runs in {three_runs}; give more of one of these ids:",
            *(f"  {run_id}" for run_id in IDS),
        ]
    )
    for missing in ("nosuch", "notes"):  # "notes" is a directory, but no run
        with pytest.raises(RunDirError) as raised:
            find_run(three_runs, missing)
        assert str(raised.value) == f"no run {missing!r} in {three_runs}"


def test_show_and_kill_take_a_suffix(three_runs: Path) -> None:
    shown = CliRunner().invoke(main, ["show", "ce56", "--runs-dir", str(three_runs)])
    assert shown.exit_code == 0, shown.output
    assert shown.stdout.splitlines()[0].startswith(f"run        {IDS[1]}   (")
    killed = CliRunner().invoke(main, ["kill", "9a9a", "--runs-dir", str(three_runs)])
    assert killed.exit_code == 0, killed.output
    assert killed.stdout.splitlines()[0] == (
        f"run {IDS[2]} already finished (completed); nothing to stop."
    )
    ambiguous = CliRunner().invoke(main, ["kill", "2026", "--runs-dir", str(three_runs)])
    assert ambiguous.exit_code == 2
    assert ambiguous.stderr.splitlines()[1:] == [f"  {run_id}" for run_id in IDS]

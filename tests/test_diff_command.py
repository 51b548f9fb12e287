"""``ddptui diff``: two runs by any unique part of their ids (or one run against the newest
completed run of its preset before it), the report fitted to 80 columns, ``--json``, and bad
input in one sentence with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from ddptui.cli import main
from engine.core.common.statuses import RunStatus
from engine.core.runs.compare import compared_run
from tests.fixtures.diff_runs import (
    SLOWER_SENTENCE,
    make_ended_run,
)

A = "20261206-100000-cpu-demo-aaaa"
B = "20261206-110000-cpu-demo-bbbb"
WIDTH = 80


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    runs = tmp_path / "runs"
    make_ended_run(runs, A, overrides={"data.num_workers": 10})
    make_ended_run(runs, B, overrides={"data.num_workers": 2}, data_share=0.47, step_seconds=0.09)
    return runs


def diff(runs: Path, *args: str) -> Result:
    return CliRunner().invoke(
        main, ["diff", *args, "--runs-dir", str(runs)], env={"COLUMNS": str(WIDTH)}
    )


def test_two_runs_by_their_suffixes_fit_80_columns(runs: Path) -> None:
    result = diff(runs, "aaaa", "bbbb")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert [line for line in lines if len(line) > WIDTH] == []
    assert lines[:2] == [f"A  {A}", f"B  {B}"]
    text = " ".join(lines)
    assert SLOWER_SENTENCE in text
    assert "  data.num_workers  10  2" in lines
    assert "environment: the same" in lines
    assert any(line.split()[:2] == ["images/s", "5,120"] for line in lines)
    assert any(line.split()[:4] == ["data", "4→47", "%", "2.0→42.3"] for line in lines)


def test_one_run_is_compared_with_the_newest_completed_run_of_its_preset(runs: Path) -> None:
    make_ended_run(runs, "20261206-090000-cpu-demo-cccc")  # older: not the one
    result = diff(runs, "bbbb")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[:2] == [f"A  {A}", f"B  {B}"]


def test_a_failed_run_is_not_what_one_run_is_compared_with(runs: Path) -> None:
    newer_failed = make_ended_run(runs, "20261206-103000-cpu-demo-dddd")
    summary = newer_failed.read_summary()
    assert summary is not None
    from dataclasses import replace

    newer_failed.write_summary(replace(summary, status=RunStatus.FAILED))
    result = diff(runs, "bbbb")
    assert result.stdout.splitlines()[0] == f"A  {A}"


def test_json_for_scripts(runs: Path) -> None:
    result = diff(runs, "aaaa", "bbbb", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["sentence"].startswith("B is 1.8x slower")
    assert data["config"] == [{"key": "data.num_workers", "a": "10", "b": "2"}]


def _refused(result: Result) -> str:
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    return line


def test_bad_input_is_one_sentence_and_exit_2(runs: Path) -> None:
    assert _refused(diff(runs, "zzzz", "bbbb")) == f"ddptui: no run 'zzzz' in {runs}"
    assert _refused(diff(runs, "aaaa", "aaaa")).startswith("ddptui: 'aaaa' and 'aaaa' are the same")
    (runs / B / "summary.json").write_text(json.dumps({"schema": 9, "status": "completed"}))
    assert "written by a newer ddptui" in _refused(diff(runs, "aaaa", "bbbb"))


def test_an_ambiguous_id_lists_the_runs_it_matches(runs: Path) -> None:
    result = diff(runs, "2026", "bbbb")
    assert result.exit_code == 2
    assert "'2026' matches 2 runs" in result.stderr


def test_one_run_with_nothing_to_compare_with(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    make_ended_run(runs, A)
    line = _refused(diff(runs, "aaaa"))
    assert line.startswith("ddptui: no other completed run of cpu-demo in ")


def test_another_users_run_is_refused(runs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compared_run, "run_dir_owner", lambda run_dir: "mallory")
    assert "belongs to mallory: not compared" in _refused(diff(runs, "aaaa", "bbbb"))


def test_help_teaches_and_the_command_is_listed() -> None:
    help_text = CliRunner().invoke(main, ["diff", "--help"]).stdout
    assert "ddptui diff cpu-demo" in help_text and "within noise" in help_text
    assert "diff" in CliRunner().invoke(main, ["--help"]).stdout


def test_eight_ranks_and_hostile_values_fit_80_columns_and_show_as_text(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    make_ended_run(runs, A, world=8, variables={"NCCL_DEBUG": "INFO"})
    make_ended_run(
        runs, B, world=8, step_seconds=0.07, forward_factor=2.0,
        variables={"NCCL_DEBUG": "\x1b[2J" + "WARN" * 60},
        overrides={"model.factory_args": {"name": "x" * 300}},
    )  # fmt: skip
    result = diff(runs, "aaaa", "bbbb")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert [line for line in lines if len(line) > WIDTH] == []
    assert "\x1b" not in result.stdout and "\\x1b[2J" in result.stdout
    assert any(line.split() == ["PART", "SHARE", "MEAN", "MS", "MOVED", "MOST"] for line in lines)
    forward = next(line.split() for line in lines if line.startswith("  forward "))
    assert forward[1:] == ["38→55", "%", "19.2→53.8", "rank", "0", "19.2→53.8"]
    assert "it ran with model.factory_args.name xxxxxxxxxxxx" in " ".join(lines)
    assert "model.factory_args unset" not in result.stdout  # an empty table is no key

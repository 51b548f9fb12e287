"""The results database: benches recorded and read back, compared, and a newer schema refused."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddptui.cli import main
from engine.core.bench.result_history import (
    HISTORY_SCHEMA_VERSION,
    HistoryError,
    RecordedRun,
    ResultHistory,
    default_db_path,
)
from engine.core.bench.speedup_table import RowResult, SpeedupTable
from engine.core.bench.table_compute import build_speedup_table
from engine.core.host.machine_info import MachineInfo
from engine.core.runs.step_breakdown import StepBreakdown
from engine.core.runs.summary import EpochFigures, RunSummary

A100 = MachineInfo(
    host="gpu-box",
    os="Linux 6.8",
    python="3.11.7",
    cpu_model="AMD EPYC 7742",
    cpu_count=64,
    memory_gib=512,
    gpus=("NVIDIA A100-SXM4-40GB",) * 4,
    gpu_driver="550.54",
    torch="2.4.0+cu121",
    cuda="12.1",
    nccl="2.20.5",
)
LAPTOP = MachineInfo(host="laptop", cpu_model="AMD EPYC", cpu_count=2, torch="2.14.1", cuda="none")


def run_summary(run_id: str, seconds: float, devices: int = 1) -> RunSummary:
    epoch = EpochFigures(
        epoch=0,
        seconds=seconds + 1,
        data_wait_seconds=0.5,
        images=50_000,
        steps=195,
        warmup_steps=5,
        steady_images_per_s=50_000 / seconds,
        steady_epoch_seconds=seconds,
        train_loss=2.0,
        test_accuracy=0.27,
    )
    return RunSummary(
        run_id=run_id,
        preset="seed-ddp",
        status="completed",
        strategy="ddp",
        precision="fp32",
        model="resnet50",
        dataset="cifar10",
        devices="gpu:" + ",".join(map(str, range(devices))),
        device_count=devices,
        world_size=devices,
        global_batch=256 * devices,
        started=0.0,
        finished=seconds,
        epochs=(epoch,),
    )


def table_of(single: float, ddp4: float) -> tuple[SpeedupTable, list[RecordedRun]]:
    s, d = run_summary("r-single", single), run_summary("r-ddp4", ddp4, devices=4)
    results = [
        RowResult("single", "seed-single", "single", "gpu:0", 1, "fp32", 256, (s,)),
        RowResult("DDP x4", "seed-ddp", "ddp", "gpu:0,1,2,3", 4, "fp32", 1024, (d,)),
        RowResult("DDP x8", "seed-ddp", "ddp", "8 GPUs", 8, "fp32", 2048, skipped="needs 8 GPUs"),
    ]
    runs = [
        RecordedRun("single", 1, "runs/r-single", s),
        RecordedRun("DDP x4", 1, "runs/r-ddp4", d),
    ]
    return build_speedup_table(results, title="seed-table", baseline="single"), runs


def test_a_bench_is_recorded_and_read_back(tmp_path: Path) -> None:
    db = tmp_path / "deep" / "results.sqlite3"
    table, runs = table_of(13.2, 6.1)
    with ResultHistory(db) as history:
        bench_id = history.record(
            title="seed-table",
            command="ddptui bench --suite seed-table",
            machine=A100,
            table=table,
            runs=runs,
        )
    with ResultHistory(db, create=False) as history:
        record = history.get(bench_id)
        listing = history.list()
    assert record.table == table
    assert record.machine == A100
    assert record.command == "ddptui bench --suite seed-table"
    assert [r.summary for r in record.runs] == [r.summary for r in runs]
    assert [(b.id, b.host, b.gpus, b.rows, b.completed_rows) for b in listing] == [
        (bench_id, "gpu-box", "4x NVIDIA A100-SXM4-40GB", 3, 2)
    ]


def test_the_step_split_is_kept_and_a_bench_recorded_before_it_reads_back(tmp_path: Path) -> None:
    """The split lives in the stored JSON of the rows and summaries, so the SQLite schema (and
    its version) is unchanged: a file written before the split existed reads back without one."""
    db = tmp_path / "results.sqlite3"
    split = tuple(
        StepBreakdown(r, 50, 50, 0.01, 0.03, 0.05, 0.02 if r else 0.0, 0.004, 0.0) for r in range(4)
    )
    s = replace(run_summary("r-ddp4", 6.1, devices=4), step_breakdown=split, bottleneck="why")
    table = build_speedup_table(
        [RowResult("DDP x4", "seed-ddp", "ddp", "gpu:0,1,2,3", 4, "fp32", 1024, (s,))]
    )
    row = table.rows[0]
    assert (row.step_sync, row.bottleneck) == (pytest.approx(0.015), "why")
    with ResultHistory(db) as history:
        kept = history.record(
            title="t",
            command="c",
            machine=A100,
            table=table,
            runs=[RecordedRun("DDP x4", 1, "r", s)],
        )
        old = history.record(title="old", command="c", machine=A100, table=table)
    # Make the second bench what an earlier ddptui wrote: no step_* keys, no split in summaries.
    stored = table.to_json()
    for raw in stored["rows"]:
        for key in [k for k in raw if k.startswith("step_") or k == "bottleneck"]:
            del raw[key]
    with sqlite3.connect(db) as raw_db:
        raw_db.execute("UPDATE benches SET table_json = ? WHERE id = ?", (json.dumps(stored), old))
        raw_db.execute(
            "INSERT INTO bench_runs VALUES (?, 'DDP x4', 1, 'r-old', 'r', ?)",
            (old, json.dumps(run_summary("r-old", 6.1).to_json() | {"step_breakdown": None})),
        )
    with ResultHistory(db, create=False) as history:
        assert history.get(kept).table == table
        assert history.get(kept).runs[0].summary.step_breakdown == split
        before = history.get(old)
    assert before.table.rows[0].step_split() == {} and before.table.rows[0].bottleneck == ""
    assert before.runs[0].summary.step_breakdown == () and before.runs[0].summary.bottleneck == ""
    assert HISTORY_SCHEMA_VERSION == 1


def test_benches_list_newest_first_and_an_unknown_id_is_one_sentence(tmp_path: Path) -> None:
    db = tmp_path / "r.sqlite3"
    with ResultHistory(db) as history:
        first = history.record(title="a", command="", machine=A100, table=table_of(10, 5)[0])
        second = history.record(title="b", command="", machine=LAPTOP, table=table_of(10, 4)[0])
        assert [b.id for b in history.list()] == [second, first]
        with pytest.raises(HistoryError, match=r"no bench with id 99 \(ids 1 to 2\)"):
            history.get(99)


def test_a_database_from_a_newer_schema_is_refused_and_never_overwritten(tmp_path: Path) -> None:
    db = tmp_path / "results.sqlite3"
    with ResultHistory(db) as history:
        history.record(title="a", command="", machine=A100, table=table_of(10, 5)[0])
    with sqlite3.connect(db) as conn:
        conn.execute(f"PRAGMA user_version = {HISTORY_SCHEMA_VERSION + 1}")
        conn.execute("CREATE TABLE future_things (x)")
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    with pytest.raises(HistoryError) as err:
        ResultHistory(db)
    message = str(err.value)
    assert message.startswith(str(db))
    assert "written by a newer ddptui (schema 2, this one knows 1)" in message
    assert "left untouched" in message
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.sqlite3"]  # no journal left


def test_a_file_that_is_not_a_results_database_is_refused_untouched(tmp_path: Path) -> None:
    text = tmp_path / "notes.sqlite3"
    text.write_text("not a database at all " * 100)
    other = tmp_path / "other.sqlite3"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE mine (x)")
    for path in (text, other):
        before = path.read_bytes()
        with pytest.raises(HistoryError, match="not a ddptui results database"):
            ResultHistory(path)
        assert path.read_bytes() == before


def test_readers_do_not_create_a_database(tmp_path: Path) -> None:
    with pytest.raises(HistoryError, match="no results database here yet"):
        ResultHistory(tmp_path / "missing.sqlite3", create=False)
    assert not (tmp_path / "missing.sqlite3").exists()


def test_the_default_path_follows_the_data_directory_variables(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("DDPTUI_DATA_DIR", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_db_path() == tmp_path / "xdg" / "ddptui" / "results.sqlite3"
    monkeypatch.setenv("DDPTUI_DATA_DIR", str(tmp_path / "mine"))
    assert default_db_path() == tmp_path / "mine" / "results.sqlite3"
    monkeypatch.setenv("DDPTUI_RESULTS_DB", str(tmp_path / "set" / "history.db"))
    assert default_db_path() == tmp_path / "set" / "history.db"


def test_machine_info_names_this_machine_without_importing_torch_in_the_caller() -> None:
    probe = (
        "import sys, json; from engine.core.host.machine_info import collect_machine_info; "
        "info = collect_machine_info(); "
        "print(json.dumps({'torch_here': 'torch' in sys.modules, **info.to_json()}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    data = json.loads(done.stdout.strip().splitlines()[-1])
    assert data.pop("torch_here") is False
    info = MachineInfo.from_json(data)
    assert info.host and info.cpu_count >= 1 and info.cpu_model
    assert info.torch[:1].isdigit() and info.cuda and info.nccl  # from the probe subprocess
    assert MachineInfo.from_json(info.to_json()) == info


# ---- the results command -------------------------------------------------------------------------


@pytest.fixture
def two_benches(tmp_path: Path) -> Path:
    db = tmp_path / "results.sqlite3"
    with ResultHistory(db) as history:
        history.record(
            title="seed-table",
            command="ddptui bench --suite seed-table",
            machine=A100,
            table=table_of(13.2, 6.1)[0],
            runs=table_of(13.2, 6.1)[1],
        )
        history.record(
            title="seed-table",
            command="ddptui bench --suite seed-table",
            machine=LAPTOP,
            table=table_of(11.0, 5.5)[0],
        )
    return db


def test_results_lists_shows_and_compares(two_benches: Path) -> None:
    runner = CliRunner()
    listed = runner.invoke(main, ["results", "--db", str(two_benches)])
    assert listed.exit_code == 0, listed.output
    assert "gpu-box" in listed.output and "laptop" in listed.output and "2/3" in listed.output

    shown = runner.invoke(main, ["results", "show", "1", "--db", str(two_benches)])
    assert shown.exit_code == 0, shown.output
    assert "| DDP x4 " in shown.output and "2.16x" in shown.output
    assert "4x NVIDIA A100-SXM4-40GB" in shown.output and "550.54" in shown.output

    as_csv = runner.invoke(
        main, ["results", "show", "1", "--format", "csv", "--db", str(two_benches)]
    )
    assert as_csv.output.startswith("label,preset,status")

    compared = runner.invoke(main, ["results", "compare", "1", "2", "--db", str(two_benches)])
    assert compared.exit_code == 0, compared.output
    assert (
        "| host " in compared.output
        and "gpu-box" in compared.output
        and "differs" in compared.output
    )
    single = next(line for line in compared.output.splitlines() if line.startswith("| single "))
    assert "13.20" in single and "11.00" in single and f"{13.2 / 11.0 - 1:+.1%}" in single


def test_results_bad_input_is_exit_2_with_one_sentence(tmp_path: Path, two_benches: Path) -> None:
    runner = CliRunner()
    missing = runner.invoke(main, ["results", "show", "7", "--db", str(two_benches)])
    assert missing.exit_code == 2
    assert "no bench with id 7" in missing.stderr
    newer = tmp_path / "newer.sqlite3"
    with sqlite3.connect(newer) as conn:
        conn.execute("PRAGMA user_version = 5")
    refused = runner.invoke(main, ["results", "show", "1", "--db", str(newer)])
    assert refused.exit_code == 2
    assert "newer ddptui (schema 5" in refused.stderr
    empty = runner.invoke(main, ["results", "--db", str(tmp_path / "none.sqlite3")])
    assert empty.exit_code == 0 and "no benches recorded yet" in empty.output
    assert not (tmp_path / "none.sqlite3").exists()


def test_results_shows_the_history_path_and_it_can_be_set(tmp_path: Path) -> None:
    runner = CliRunner()
    default = runner.invoke(main, ["results"])
    assert default.exit_code == 0, default.output
    first = default.output.splitlines()[0]
    assert (
        first == f"results history: {default_db_path()} (--db or $DDPTUI_RESULTS_DB to use another)"
    )
    chosen = tmp_path / "chosen.sqlite3"
    moved = runner.invoke(main, ["results"], env={"DDPTUI_RESULTS_DB": str(chosen)})
    assert moved.output.splitlines()[0].startswith(f"results history: {chosen} ")


def test_tests_never_write_to_the_users_home() -> None:
    home = Path(os.path.expanduser("~")).resolve()
    assert home not in default_db_path().resolve().parents

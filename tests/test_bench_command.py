"""``ddptui bench`` end to end: real runs on CPU ranks, the table they make, and bad input refused."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner, Result

from ddptui.cli import main
from engine.core.bench.bench_runner import INTERRUPTED
from engine.core.runs.rundir import RunDir
from engine.core.runs.summary import RunSummary
from tests.fixtures.waiting import wait_for

# Tiny and quick: a full epoch of 1,024 synthetic images, the small CNN, one global batch of 64.
TINY = """
[set]
"model.name" = "small_cnn"
"data.dataset" = "synthetic"
"data.train_size" = 1024
"data.test_size" = 256
"training.epochs" = 1
"training.warmup_steps" = 2
"training.checkpoint" = false
"training.report_interval" = 0.5
"""


def bench(tmp_path: Path, *args: str) -> Result:
    return CliRunner().invoke(
        main,
        [
            "bench",
            *args,
            "--runs-dir",
            str(tmp_path / "runs"),
            "--db",
            str(tmp_path / "results.sqlite3"),
        ],
    )


def write_suite(tmp_path: Path, body: str, name: str = "tiny.toml") -> Path:
    """``body``'s top-level keys, then the TINY overrides, then its [[rows]]."""
    head, rows = body.split("[[rows]]", 1)
    path = tmp_path / name
    path.write_text(head + TINY + "\n[[rows]]" + rows, encoding="utf-8")
    return path


def summary_of(tmp_path: Path, run_id: str) -> RunSummary:
    summary = RunDir(tmp_path / "runs" / run_id).read_summary()
    assert summary is not None
    return summary


def still_running(pid: int, start_time: float) -> bool:
    try:
        return psutil.Process(pid).create_time() == start_time
    except psutil.NoSuchProcess:
        return False


def markdown_row(text: str, label: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith(f"| {label} "))
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


# ---- end to end (real launcher, real ranks) -----------------------------------------------------


@pytest.mark.slow
def test_a_two_row_cpu_suite_runs_and_its_speedup_follows_from_the_rows_times(
    tmp_path: Path, no_gpu: None
) -> None:
    suite = write_suite(
        tmp_path,
        """
baseline = "one rank"

[[rows]]
label = "one rank"
preset = "cpu-demo"
set = { "strategy.name" = "single", "devices.spec" = "cpu:1", "training.batch_size" = 64 }

[[rows]]
label = "two ranks"
preset = "cpu-demo"
set = { "strategy.name" = "ddp", "devices.spec" = "cpu:2", "training.batch_size" = 32 }
""",
    )
    result = bench(tmp_path, "--suite", str(suite), "--format", "json")
    assert result.exit_code == 0, result.output + result.stderr
    assert "[1/2] one rank (cpu-demo): single fp32 on cpu:1, global batch 64" in result.stderr
    assert "[2/2] two ranks (cpu-demo): completed" in result.stderr
    table = json.loads(result.stdout)
    one, two = table["rows"]
    assert [one["status"], two["status"]] == ["ok", "ok"]
    assert (one["device_count"], two["device_count"]) == (1, 2)
    assert one["global_batch"] == two["global_batch"] == 64

    # The figures are the runs' own: each row's last epoch in its summary.json.
    base = summary_of(tmp_path, one["run_ids"][0]).last_epoch
    other = summary_of(tmp_path, two["run_ids"][0]).last_epoch
    assert base is not None and other is not None
    assert one["epoch_seconds"] == pytest.approx(base.steady_epoch_seconds)
    assert two["epoch_seconds"] == pytest.approx(other.steady_epoch_seconds)
    assert two["data_wait_share"] == pytest.approx(other.data_wait_seconds / other.seconds)
    assert two["test_accuracy"] == pytest.approx(other.test_accuracy)
    # Speedup from the times (epochs of the same images here) and efficiency per device.
    assert base.images == other.images == 1024
    assert two["speedup"] == pytest.approx(base.steady_epoch_seconds / other.steady_epoch_seconds)
    assert two["efficiency"] == pytest.approx(two["speedup"] / 2)
    assert one["speedup"] == pytest.approx(1.0)

    # The bench was recorded; the printed markdown table says the same.
    shown = CliRunner().invoke(
        main, ["results", "show", "1", "--db", str(tmp_path / "results.sqlite3")]
    )
    assert shown.exit_code == 0, shown.output
    cells = markdown_row(shown.output, "two ranks")
    assert cells[5].startswith(f"{two['epoch_seconds']:.2f}")  # ◊ when others loaded the CPU
    # what other processes did meanwhile was measured for every row
    assert one["outside_load"] is not None and two["outside_load"] is not None
    assert cells[8].startswith(f"{two['speedup']:.2f}x")
    assert cells[9].startswith(f"{two['efficiency'] * 100:.0f}%")  # ‡ above 100 % under load
    assert "Machine:" in shown.output and "torch" in shown.output

    # Each row says where its steps go, beside its efficiency: its ranks' mean split (the sync
    # apart where the engine's DDP module timed it), its bottleneck, in the history too.
    ranks = summary_of(tmp_path, two["run_ids"][0]).step_breakdown
    assert [b.rank for b in ranks] == [0, 1]
    assert two["step_forward"] == pytest.approx((ranks[0].forward + ranks[1].forward) / 2)
    assert two["step_sync"] is not None and one["step_sync"] is None  # single: no sync
    assert two["bottleneck"] == summary_of(tmp_path, two["run_ids"][0]).bottleneck != ""
    split = dict((c[0], int(c[1:])) for c in cells[10].split())
    assert set(split) <= set("dfbsox") and {"f", "b", "s"} <= set(split)
    assert sum(split.values()) == pytest.approx(100, abs=len(split))  # rounded shares
    assert "Step split: the share of a step in data wait (d)" in shown.output
    assert f"'two ranks': {two['bottleneck']}" in shown.output


@pytest.mark.slow
def test_a_row_that_fails_or_cannot_run_is_in_the_table_and_the_rest_still_run(
    tmp_path: Path, no_gpu: None
) -> None:
    suite = write_suite(
        tmp_path,
        """
baseline = "single"

[[rows]]
label = "crashes"
preset = "cpu-demo"
set = { "devices.spec" = "cpu:2", "training.batch_size" = 32, faults = ["crash:1:2"] }

[[rows]]
label = "DataParallel"
preset = "cpu-demo"
set = { "strategy.name" = "dataparallel", "devices.spec" = "cpu" }

[[rows]]
label = "single"
preset = "cpu-demo"
set = { "strategy.name" = "single", "devices.spec" = "cpu:1", "training.batch_size" = 64 }
""",
    )
    out = tmp_path / "table.md"
    result = bench(tmp_path, "--suite", str(suite), "--out", str(out))
    assert result.exit_code == 1, result.output + result.stderr
    assert out.read_text() == result.stdout
    crashed = markdown_row(result.stdout, "crashes")
    assert crashed[-1].startswith("failed: rank 1:"), crashed
    assert "injected" in crashed[-1].lower() or "crash" in crashed[-1].lower()
    skipped = markdown_row(result.stdout, "DataParallel")
    assert skipped[-1].startswith("skipped: strategy dataparallel needs CUDA GPUs")
    # The failure did not stop the bench: the row after it ran and is the baseline.
    assert markdown_row(result.stdout, "single")[8] == "1.00x"
    assert markdown_row(result.stdout, "single")[-1] == "baseline"
    assert "[3/3] single (cpu-demo): completed" in result.stderr
    # Two runs were made (the skipped row none), and none of their processes is left.
    runs = sorted((tmp_path / "runs").iterdir())
    assert len(runs) == 2
    for path in runs:
        info = RunDir(path).read_run_info()
        refs = [ref for ref in [info.launcher, *info.ranks] if ref is not None]
        assert refs and not any(still_running(ref.pid, ref.start_time) for ref in refs)


# ---- nothing starts -------------------------------------------------------------------------------


def test_a_suite_this_machine_cannot_run_lists_every_row_as_skipped(
    tmp_path: Path, no_gpu: None
) -> None:
    result = bench(tmp_path, "--suite", "seed-table")
    assert result.exit_code == 0, result.output + result.stderr
    for label in ("single", "DataParallel x4", "DDP x2", "DDP x4", "DDP x4 + AMP"):
        assert markdown_row(result.stdout, label)[-1].startswith("skipped: devices.spec")
    assert markdown_row(result.stdout, "DDP x4")[2:5] == ["4 GPUs", "fp32", "1024 †"]
    assert "no row ran on this machine" in result.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ([], "give --suite NAME"),
        (["cpu-demo", "--suite", "cpu-scaling"], "either --suite NAME or preset names"),
        (["--suite", "nope"], "no suite named 'nope'"),
        (["no-such-preset"], "no preset named 'no-such-preset'"),
        (["--suite", "cpu-scaling", "--set", "training.epoks=2"], "unknown key training.epoks"),
        (["--suite", "cpu-scaling", "--set", "oops"], "is not SECTION.KEY=VALUE"),
        (["cpu-demo", "--out", "/nonexistent/dir/t.md"], "the directory /nonexistent/dir"),
        (["cpu-demo", "--repeat", "0"], "--repeat"),
        (["cpu-demo", "--format", "xml"], "--format"),
    ],
)
def test_bad_input_is_one_sentence_exit_2_and_nothing_starts(
    tmp_path: Path, no_gpu: None, args: list[str], fragment: str
) -> None:
    result = bench(tmp_path, *args)
    assert result.exit_code == 2, result.output + result.stderr
    assert fragment in result.stderr
    assert not (tmp_path / "runs").exists()
    assert not (tmp_path / "results.sqlite3").exists()


def test_a_broken_suite_file_names_the_file_and_key(tmp_path: Path, no_gpu: None) -> None:
    suite = tmp_path / "broken.toml"
    suite.write_text('[[rows]]\npreset = "cpu-demo"\nset = { "training.epochs" = "many" }\n')
    result = bench(tmp_path, "--suite", str(suite))
    assert result.exit_code == 2
    message = result.stderr.strip()
    assert message.startswith(f"ddptui: {suite}: ") and "training.epochs is 'many'" in message
    assert len(message.splitlines()) == 1


def test_a_newer_results_database_stops_the_bench_before_any_run(
    tmp_path: Path, no_gpu: None
) -> None:
    db = tmp_path / "results.sqlite3"
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA user_version = 9")
    before = db.read_bytes()
    result = bench(tmp_path, "cpu-demo")
    assert result.exit_code == 2
    assert "written by a newer ddptui (schema 9" in result.stderr
    assert db.read_bytes() == before
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_ctrl_c_stops_the_running_row_lists_the_rest_as_skipped_and_leaves_no_process(
    tmp_path: Path, no_gpu: None
) -> None:
    suite = write_suite(
        tmp_path,
        """
[[rows]]
label = "long"
preset = "cpu-demo"
set = { "devices.spec" = "cpu:2", "training.epochs" = 50 }

[[rows]]
label = "never"
preset = "cpu-demo"
""",
    )
    runs = tmp_path / "runs"
    # markdown, whole: the child inherits a COLUMNS that readline sets in this process's C
    # environment (not os.environ), which would fit the table to 80 columns
    command = [
        sys.executable,
        "-m",
        "ddptui",
        "bench",
        "--suite",
        str(suite),
        "--format",
        "markdown",
    ]
    command += ["--runs-dir", str(runs), "--db", str(tmp_path / "results.sqlite3")]
    bench_process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Interrupt once both ranks are training.
        assert wait_for(
            lambda: any(
                (p / "events" / "rank-1.jsonl").exists()
                and "epoch_started" in (p / "events" / "rank-1.jsonl").read_text()
                for p in (runs.iterdir() if runs.exists() else [])
            ),
            timeout=120,
        )
        bench_process.send_signal(signal.SIGINT)
        stdout, stderr = bench_process.communicate(timeout=60)
    finally:
        if bench_process.poll() is None:
            bench_process.kill()
            bench_process.communicate()
    assert bench_process.returncode == 1, stderr
    assert markdown_row(stdout, "long")[-1].startswith("failed: killed"), stdout
    assert markdown_row(stdout, "never")[-1] == "skipped: " + INTERRUPTED
    assert "not recorded in the results history: the bench was interrupted" in stderr
    (run,) = runs.iterdir()
    info = RunDir(run).read_run_info()
    refs = [ref for ref in [info.launcher, *info.ranks] if ref is not None]
    assert len(refs) == 3 and not any(still_running(r.pid, r.start_time) for r in refs)

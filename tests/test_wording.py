"""Words that used to mislead, each pinned to its exact text: what `kill` says was SIGKILLed,
`gpus` without NVML, `stacks --pid`, `ps` roles and torchrun labels, `run --help`'s faults,
`results compare`, `run train.sh`, a batch larger than a rank's share, a loss that diverged."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner

from ddptui.cli import main
from ddptui.commands.gpus import render_gpus
from ddptui.kill_report import kill_report
from ddptui.stack_report import diagnosis_lines
from ddptui.terminal_progress import result_line
from engine.core.backends.local.kill import KillResult, Target, _killed_by_launcher
from engine.core.common.run_environment import RUN_DIR_ENV, RUN_MARKER_ENV
from engine.core.common.statuses import (
    HolderKind,
    KillOutcome,
    ProcessRole,
    RankActivity,
    RunStatus,
)
from engine.core.config.faults import FAULT_KINDS
from engine.core.config.schema import (
    ConfigError,
    DataConfig,
    DevicesConfig,
    RunConfig,
    StrategyConfig,
    TrainingConfig,
)
from engine.core.host.gpus import GpuInventory
from engine.core.jobs import process_table
from engine.core.jobs.gpu_view import GpuProcessRow, GpuView, build_gpu_view
from engine.core.jobs.process_table import scan_processes
from engine.core.plan.run_plan import plan_run
from engine.core.procs.process_scan import ProcessInfo
from engine.core.procs.stopping import StopResult
from engine.core.runs.events import EpochEnded, RankStarted, StepProgress, StopSignalled
from engine.core.runs.summarize import build_summary, figure_warnings
from engine.core.runs.summary import EpochFigures
from engine.core.stacks.snapshot import RankDiagnosis, StackSnapshot
from tests.fixtures.made_runs import ProcessPen, make_run, ref_of
from tests.test_result_history import A100, LAPTOP, table_of
from tests.ui.standins import eight_gpu_table

NO_NVML = GpuInventory(
    error="NVML: NVML Shared Library Not Found (the NVIDIA driver is not installed here)"
)


# ---- ddptui kill: who needed SIGKILL ---------------------------------------------------------------


def test_kill_names_what_ended_on_sigterm_and_what_needed_sigkill() -> None:
    result = KillResult(
        run_id="r",
        outcome=KillOutcome.STOPPED,
        status_before=RunStatus.RUNNING,
        targets=(
            Target(100, 1.0, "launcher", "ana"),
            Target(101, 1.0, "rank 0", "ana"),
            Target(102, 1.0, "rank 1", "ana"),
            Target(103, 1.0, "marked", "ana"),
        ),
        stop=StopResult(terminated=(100, 101, 103), killed=(102,), seconds=5.6),
        by_launcher=True,
        grace_seconds=5.0,
    )
    assert kill_report(result, 10.0) == [
        "run r: stopping launcher (pid 100), rank 0 (pid 101), rank 1 (pid 102), marked (pid 103)",
        "  its launcher stopped its ranks and wrote the summary",
        "  ended on SIGTERM: launcher (pid 100), rank 0 (pid 101), pid 103",
        "  needed SIGKILL, 5 s after SIGTERM: rank 1 (pid 102)",
        "  5.6 s in all",
        "  none left",
    ]


def test_what_the_launcher_sigkilled_is_read_from_its_events(runs_dir: Path) -> None:
    now = time.time()
    run_dir = make_run(
        runs_dir,
        "r",
        events={
            "launcher": [
                StopSignalled(signal="SIGTERM", ranks=(0, 1), pids=(101, 102), time=now + 1),
                StopSignalled(signal="SIGKILL", ranks=(1,), pids=(102,), time=now + 6),
            ]
        },
    )
    assert _killed_by_launcher(run_dir, now) == {102}
    assert _killed_by_launcher(run_dir, now + 10) == set()  # an earlier stop is not this one


# ---- ddptui gpus without NVML ------------------------------------------------------------------


def test_gpus_without_nvml_says_why_whole_and_names_the_jobs_it_cannot_place() -> None:
    view = build_gpu_view(NO_NVML, eight_gpu_table(), now=0.0)
    lines = render_gpus(view, 80)
    assert lines[:2] == [
        "GPUs not available: NVML: NVML Shared Library Not Found (the NVIDIA driver is",
        "  not installed here).",
    ]
    assert "No ddptui rank runs on the CPU" not in "\n".join(lines)  # its CPU ranks are listed
    notes = " ".join(line.strip() for line in lines[lines.index("Not visible from here:") + 1 :])
    assert notes == (
        "- 2 training jobs running here are not listed, since without NVML the GPU a process "
        "uses cannot be told (torchrun job 'bo-pretrain' at 10.0.0.7:29500, torchrun job "
        "'sweep-3' at 127.0.0.1:29510); `ddptui ps` lists every job."
    )


def test_gpus_without_nvml_and_nothing_of_ours_says_so_not_that_nothing_runs() -> None:
    view = GpuView(gpus=(), rows=(), error="NVML: stand-in")
    assert render_gpus(view, 80) == [
        "GPUs not available: NVML: stand-in.",
        "",
        "No ddptui rank runs on the CPU, and no process has a GPU device open.",
    ]


def test_a_cpu_rank_holds_no_gpu_memory_it_is_not_unlisted() -> None:
    cpu_rank = GpuProcessRow(
        gpu_index=None, pid=7, kind=HolderKind.DDPTUI, what="ddptui run r rank 0", listed=False
    )
    hidden = GpuProcessRow(
        gpu_index=3, pid=8, kind=HolderKind.UNKNOWN, what="not part of any job", listed=False
    )
    assert cpu_rank.memory_text == "-" and hidden.memory_text == "unlisted"
    lines = render_gpus(GpuView(gpus=(), rows=(cpu_rank, hidden), error="NVML: stand-in"), None)
    rows = [line.split() for line in lines if line.split()[:1] in (["cpu"], ["3"])]
    assert [r[:4] for r in rows] == [["3", "8", "?", "unlisted"], ["cpu", "7", "?", "-"]]


def test_a_process_that_could_not_be_training_is_never_noted() -> None:
    """A container's init (pid 1, its environment unreadable on every call) is not a note."""

    def unreadable(pid: int, exe: str) -> ProcessInfo:
        return ProcessInfo(
            pid=pid, ppid=0, name=Path(exe).name, cmdline=(exe, "--serve"), username="root",
            uid=os.getuid(), create_time=1.0, status="sleeping", environ=None, exe=exe,
        )  # fmt: skip

    assert process_table._visibility_notes({1: unreadable(1, "/process_api")}) == []
    assert process_table._visibility_notes({9: unreadable(9, "/usr/bin/python3.11")}) == [
        "1 process (pid 9) whose environment cannot be read (a protected process, or one in "
        "another user namespace): recognised by command line only."
    ]


# ---- ddptui stacks --pid -----------------------------------------------------------------------


def test_stacks_of_a_pid_say_pid_not_rank_minus_one() -> None:
    snapshot = StackSnapshot(
        time=0.0,
        reason="pid 4242 (running)",
        ranks=(
            RankDiagnosis(
                rank=-1, pid=4242, activity=RankActivity.STEPPING, method="py-spy", stack="x"
            ),
        ),
    )
    assert diagnosis_lines(snapshot, full=True) == [
        "stacks (pid 4242 (running)):",
        "  pid 4242 busy [py-spy]",
        "",
        "pid 4242 (stepping, by py-spy):",
        "  x",
    ]


# ---- ddptui ps: a run outside --runs-dir, a torchrun job with no name ---------------------------


def test_a_run_outside_the_runs_dir_has_its_launcher_and_ranks(
    tmp_path: Path, pen: ProcessPen
) -> None:
    elsewhere = tmp_path / "elsewhere"
    run_id = "20260101-000000-made-away"
    marker = {RUN_MARKER_ENV: run_id}
    # The launcher carries only the marker, as one started before ddptui also gave it the run
    # directory; its ranks carry both.
    launcher = pen.python(env=marker)
    run_dir_env = {**marker, RUN_DIR_ENV: str(elsewhere / run_id)}
    ranks = [pen.python(env=run_dir_env), pen.python(env=run_dir_env)]
    make_run(elsewhere, run_id, launcher=ref_of(launcher), ranks=[ref_of(r) for r in ranks])
    assert pen.wait_until(lambda: _carries(ranks[-1].pid, RUN_DIR_ENV))
    table = scan_processes(gpus=NO_NVML, cpu_interval=0.0)
    (job,) = [j for j in table.jobs if j.run_id == run_id]
    roles = {p.pid: (p.role, p.rank) for p in job.processes}
    assert roles == {
        launcher.pid: (ProcessRole.LAUNCHER, None),
        ranks[0].pid: (ProcessRole.RANK, 0),
        ranks[1].pid: (ProcessRole.RANK, 1),
    }


def test_a_torchrun_job_without_an_id_is_named_by_where_it_meets(pen: ProcessPen) -> None:
    port = str(20000 + os.getpid() % 10000)
    env = {"TORCHELASTIC_RUN_ID": "none", "RANK": "0", "WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}  # fmt: skip
    worker = pen.python(env=env)
    assert pen.wait_until(lambda: _carries(worker.pid, "TORCHELASTIC_RUN_ID"))
    table = scan_processes(gpus=NO_NVML, cpu_interval=0.0)
    found = table.job_of(worker.pid)
    assert found is not None and found[0].label == f"torchrun job at 127.0.0.1:{port}"


# ---- ddptui run: its faults, a shell script, a batch larger than a rank's share ------------------


def test_run_help_lists_every_fault() -> None:
    result = CliRunner().invoke(main, ["run", "--help"], env={"COLUMNS": "200"})
    said = " ".join(result.stdout.split())
    for kind in FAULT_KINDS:
        assert f" {kind} (" in said, kind
    assert "hang-collective (block forever before the step's backward, its peers in the " in said


def test_a_shell_script_is_not_called_bad_toml(tmp_path: Path, runs_dir: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text("python train.py\n")
    result = CliRunner().invoke(main, ["run", str(script), "--runs-dir", str(runs_dir)])
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        f"ddptui: {script}: a shell script, not a preset (.toml) nor a Python script (.py, or "
        "-m package.module); give ddptui the preset, or the Python script it should run"
    )
    assert list(runs_dir.iterdir()) == []


def test_a_batch_larger_than_a_ranks_share_is_refused_in_the_plan(runs_dir: Path) -> None:
    config = RunConfig(
        strategy=StrategyConfig(name="ddp"),
        devices=DevicesConfig(spec="cpu:2"),
        data=DataConfig(train_size=100),
        training=TrainingConfig(batch_size=64),
    )
    with pytest.raises(ConfigError) as raised:
        plan_run(config, gpu_count=0)
    assert str(raised.value) == (
        "training.batch_size 64 is more than the 50 training images each of the 2 ranks gets "
        "per epoch (100 in all), so an epoch would have no full batch; use a batch of at most 50 "
        "or more data"
    )
    assert raised.value.key == "training.batch_size"
    args = ["run", "cpu-demo", "--set", "data.train_size=100", "--batch-size", "64",
            "--devices", "cpu:2", "--runs-dir", str(runs_dir)]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert result.stderr.strip() == f"ddptui: {raised.value}"
    assert list(runs_dir.iterdir()) == []  # nothing started


# ---- a loss that diverged --------------------------------------------------------------------


def _epoch(loss: float) -> EpochFigures:
    return EpochFigures(
        epoch=0, seconds=4.0, data_wait_seconds=0.1, images=5888, steps=46, warmup_steps=5,
        steady_images_per_s=1500.0, steady_epoch_seconds=3.9, train_loss=loss,
        test_accuracy=0.1,
    )  # fmt: skip


def test_a_loss_that_ends_far_above_where_it_began_is_a_warning() -> None:
    assert figure_warnings([_epoch(5.5e19)], (2.31, 1)) == (
        "the training loss ended far above where it began (2.31 at step 1, 5.5e+19 over epoch "
        "1): the model diverged (a learning rate too high?) and its figures mean little",
    )
    assert figure_warnings([_epoch(0.4)], (2.31, 1)) == ()  # it learned
    assert figure_warnings([_epoch(2.6)], (2.31, 1)) == ()  # a little worse is no divergence


def test_the_divergence_warning_is_in_the_summary_and_the_result_line(runs_dir: Path) -> None:
    now = time.time()
    run_dir = make_run(
        runs_dir,
        "20260101-000000-made-lr12",
        state=RunStatus.COMPLETED,
        events={
            "rank-0": [
                RankStarted(rank=0, world_size=2, pid=1, host="h", device="cpu", time=now),
                StepProgress(
                    rank=0, epoch=0, step=1, steps=46, global_step=1, loss=2.31,
                    images_per_s=100.0, step_seconds=0.1, lr=1e12, time=now + 1,
                ),
                EpochEnded(
                    rank=0, epoch=0, steps=46, images=2944, seconds=4.0, data_wait_seconds=0.1,
                    warmup_steps=5, steady_images_per_s=750.0, train_loss=5.5e19,
                    global_images=5888, global_seconds=4.0, global_data_wait_seconds=0.1,
                    global_steady_images_per_s=1500.0, global_train_loss=5.5e19, time=now + 5,
                ),
            ]
        },
    )  # fmt: skip
    summary = build_summary(run_dir, RunStatus.COMPLETED)
    warning = (
        "the training loss ended far above where it began (2.31 at step 1, 5.5e+19 over epoch "
        "1): the model diverged (a learning rate too high?) and its figures mean little"
    )
    assert summary.warnings == (warning,)
    assert f"\n  warning: {warning}\n" in result_line(summary, run_dir)


# ---- ddptui results compare ------------------------------------------------------------------


def test_results_compare_has_no_empty_column(tmp_path: Path) -> None:
    from engine.core.bench.result_history import ResultHistory

    db = tmp_path / "results.sqlite3"
    with ResultHistory(db) as history:
        for machine, times in ((A100, (13.2, 6.1)), (A100, (11.0, 5.5)), (LAPTOP, (11.0, 5.5))):
            history.record(title="t", command="c", machine=machine, table=table_of(*times)[0])
    same = CliRunner().invoke(main, ["results", "compare", "1", "2", "--db", str(db)])
    rows = [
        [c.strip() for c in line.strip("|").split("|")]
        for line in same.stdout.splitlines()
        if line.startswith("| ")
    ]
    machine = rows[: rows.index(["machine", "A", "B", "A vs B"]) + 1 + len(A100.describe()) + 1]
    assert machine[0] == ["machine", "A", "B", "A vs B"]
    assert {r[3] for r in machine[2:]} == {"same"}  # every cell says something
    other = CliRunner().invoke(main, ["results", "compare", "1", "3", "--db", str(db)])
    host = next(line for line in other.stdout.splitlines() if line.startswith("| host "))
    assert [c.strip() for c in host.strip("|").split("|")] == [
        "host",
        "gpu-box",
        "laptop",
        "differs",
    ]


def _carries(pid: int, key: str) -> bool:
    try:
        return key in psutil.Process(pid).environ()
    except psutil.Error:
        return False

"""Every table the CLI prints fits the terminal: with ``COLUMNS=80`` no line of ``ddptui runs``,
``presets``, ``ps``, ``gpus``, ``results show``, ``bench``'s table, ``stacks`` and ``queue`` is
longer than 80 characters, what a column gives up is cut with an ellipsis in the order the
command chose, and ``--wide`` prints every cell whole. Plus the table module itself
(``ddptui.cli_table``)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddptui.cli import main
from ddptui.cli_table import Column, cut_middle, render_table, wrap_line
from engine.core.bench.result_history import ResultHistory
from engine.core.common.statuses import RankActivity, RunStatus
from engine.core.host.gpus import GpuInventory, sample_gpus
from engine.core.jobs.gpu_view import GpuView
from engine.core.runs.events import RankStalled
from engine.core.runs.summarize import build_summary
from engine.core.stacks.snapshot import (
    Frame,
    RankDiagnosis,
    StackSnapshot,
    ThreadStack,
    save_snapshot,
)
from tests.fixtures.made_runs import ProcessPen, make_run, ref_of
from tests.fixtures.standin_nvml import EIGHT_GPUS, standin_nvml
from tests.test_result_history import A100, table_of
from tests.test_runs_commands import started, step
from tests.ui.standins import eight_gpu_table, eight_gpu_view

WIDTH = 80


def cli80(*args: str) -> str:
    result = CliRunner().invoke(main, list(args), env={"COLUMNS": str(WIDTH)})
    assert result.exit_code == 0, result.output
    return result.stdout


def assert_fits(text: str, width: int = WIDTH) -> list[str]:
    lines = text.splitlines()
    long = [line for line in lines if len(line) > width]
    assert not long, "\n".join(long)
    return lines


# ---- the table module -----------------------------------------------------------------------------


def test_columns_give_up_width_in_the_chosen_order_and_cut_with_an_ellipsis() -> None:
    columns = (
        Column("ID"),
        Column("NAME", shrink=1, min_width=6),
        Column("KIND", shrink=0, min_width=0),
        Column("N", right=True),
    )
    rows = [("20261202-105133-cpu-demo-3f9a", "a-very-long-name", "optional", 7)]
    assert render_table(columns, rows, None) == [
        "ID                             NAME              KIND      N",
        "20261202-105133-cpu-demo-3f9a  a-very-long-name  optional  7",
    ]
    # KIND goes first, whole, and its gap with it: then the rest fits 50 columns.
    assert render_table(columns, rows, 50) == [
        "ID                             NAME              N",
        "20261202-105133-cpu-demo-3f9a  a-very-long-name  7",
    ]
    # In 46, NAME gives the four columns still missing.
    assert render_table(columns, rows, 46) == [
        "ID                             NAME          N",
        "20261202-105133-cpu-demo-3f9a  a-very-long…  7",
    ]
    # Narrower than every floor: the widest column gives, and an id keeps both ends.
    id_column = (Column("ID", fit=cut_middle), *columns[1:])
    narrow = render_table(id_column, rows, 30)
    assert narrow[1] == "20261202-…demo-3f9a  a-ver…  7"
    assert all(len(line) <= 30 for line in narrow)


def test_a_wrapped_column_breaks_at_words_and_rows_keep_their_cells() -> None:
    columns = (Column("NAME"), Column("WHY", shrink=0, min_width=10, wrap=True))
    lines = render_table(columns, [("seed-ddp", "devices.spec 'all' asks for GPUs")], 24)
    assert lines == [
        "NAME      WHY",
        "seed-ddp  devices.spec",
        "          'all' asks for",
        "          GPUs",
    ]
    assert wrap_line("one two three four", 9, indent="- ", hang="  ") == [
        "- one two",
        "  three",
        "  four",
    ]


def test_a_wide_character_takes_two_columns() -> None:
    lines = render_table((Column("A"), Column("B")), [("日本", "x")], None)
    assert lines == ["A     B", "日本  x"]


# ---- each command at 80 columns -------------------------------------------------------------------


def test_runs_fits_80_columns_and_wide_shows_every_cell(runs_dir: Path, pen: ProcessPen) -> None:
    live = pen.python()
    now = time.time()
    make_run(
        runs_dir,
        "20260101-000000-long-preset-name-aaaa",
        launcher=ref_of(live),
        events={
            "rank-0": [started(0, now - 20), step(0, now - 20)],
            "rank-1": [started(1, now - 20), step(1, now - 1)],
            "launcher": [RankStalled(rank=0, silent_seconds=15, time=now - 2)],
        },
    )
    make_run(runs_dir, "20260101-000001-made-bbbb", state=RunStatus.COMPLETED)
    lines = assert_fits(cli80("runs", "--runs-dir", str(runs_dir)))
    # The preset, in the id already, gave way first; the id stays whole.
    assert lines[0].split() == ["RUN", "ID", "STATE", "AGE", "DEVICES", "RANKS", "NOTE"]
    assert lines[1].startswith("20260101-000000-long-preset-name-aaaa  running")
    assert lines[1].endswith("stalled 0")
    wide = CliRunner().invoke(
        main, ["runs", "--runs-dir", str(runs_dir), "--wide"], env={"COLUMNS": "80"}
    )
    assert wide.stdout.splitlines()[0].split()[:3] == ["RUN", "ID", "PRESET"]
    assert wide.stdout.splitlines()[1].split()[:3] == [
        "20260101-000000-long-preset-name-aaaa",
        "made",  # the preset its config names
        "running",
    ]


def test_presets_fit_80_columns_and_reasons_break_between_words(no_gpu: None) -> None:
    lines = assert_fits(cli80("presets"))
    assert lines[0].startswith("This machine: ")
    # The reason, wrapped under its preset, reads whole when its lines are joined again.
    start = next(i for i, line in enumerate(lines) if line.split()[1:2] == ["seed-ddp"])
    follow = []
    for line in lines[start + 1 :]:
        if line[:4].strip():  # the next preset's mark
            break
        follow.append(line.strip())
    said = " ".join(follow)
    assert "cannot run here: devices.spec 'all' asks for GPUs, but this machine has none" in said


def test_ps_fits_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    from ddptui.commands import processes

    table = eight_gpu_view(_eight_gpus()).table
    monkeypatch.setattr(processes, "scan_processes", lambda *a, **k: table)
    lines = assert_fits(cli80("ps"))
    assert lines[0].startswith("ddptui run 20261202-104500-fast-ddp-9a9a  [running]")
    header = next(line for line in lines if line.split()[:1] == ["PID"])
    assert header.split()[-1] == "COMMAND"
    # The command keeps its script's name while its middle gives way.
    rank = next(line for line in lines if line.split()[:1] == ["7200"])
    assert "pretrain.py" in rank
    assert eight_gpu_table().jobs  # the stand-in has jobs to show


def test_gpus_fits_80_columns_with_and_without_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    from ddptui.commands import gpus as gpus_command

    view = eight_gpu_view(_eight_gpus())
    monkeypatch.setattr(gpus_command.GpuScanner, "scan", lambda self, **k: view)
    lines = assert_fits(cli80("gpus"))
    assert lines[1].split() == ["GPU", "NAME", "UTIL", "MEMORY", "TEMP", "POWER", "PROCESSES"]
    assert lines[2].split()[:4] == ["0", "H100", "80GB", "HBM3"] and "31.5/80.0 GiB" in lines[2]
    assert "host CPU 33% of 64 · mem 200.0/512.0G · swap 0.0/8.0G · load 21.50" in lines
    wide = CliRunner().invoke(main, ["gpus", "--wide"], env={"COLUMNS": "80"}).stdout
    assert max(len(line) for line in wide.splitlines()) > WIDTH  # both bars, whole
    blind = GpuView(
        gpus=(),
        rows=(),
        error="NVML: NVML Shared Library Not Found, and the driver of this machine is not loaded",
        table=eight_gpu_table(),
    )
    monkeypatch.setattr(gpus_command.GpuScanner, "scan", lambda self, **k: blind)
    assert_fits(cli80("gpus"))


def test_results_show_fits_80_columns(tmp_path: Path) -> None:
    db = tmp_path / "results.sqlite3"
    with ResultHistory(db) as history:
        table, runs = table_of(13.2, 6.1)
        history.record(
            title="seed-table", command="ddptui bench", machine=A100, table=table, runs=runs
        )
    lines = assert_fits(cli80("results", "show", "1", "--db", str(db)))
    header = next(line for line in lines if line.startswith("row "))
    assert header.split()[:3] == ["row", "devices", "epoch"]  # the spare columns gave way
    ddp = next(line for line in lines if line.startswith("DDP x4 "))
    assert "2.16x" in ddp
    # To a file or a pipe (no $COLUMNS), the markdown of before, whole.
    piped = CliRunner().invoke(main, ["results", "show", "1", "--db", str(db)])
    assert "| DDP x4 " in piped.stdout


def test_the_bench_table_fits_80_columns(capsys: pytest.CaptureFixture[str]) -> None:
    from ddptui.commands.bench import _print_table
    from ddptui.speedup_text import chosen_format

    table, _ = table_of(13.2, 6.1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COLUMNS", "80")
        _print_table(table, chosen_format(None, False), 80, None)
    lines = assert_fits(capsys.readouterr().out)
    assert lines[2].split() == ["row", "devices", "epoch", "s", "images/s", "speedup",
                                "efficiency", "test", "acc", "note"]  # fmt: skip
    skipped = next(i for i, line in enumerate(lines) if line.startswith("DDP x8 "))
    note = [line[lines[2].index("note") :] for line in lines[skipped : skipped + 2]]
    assert " ".join(note) == "skipped: needs 8 GPUs"  # the note wraps, between words


def test_the_step_split_leaves_a_narrow_table_whole_and_is_there_on_a_wide_one() -> None:
    from dataclasses import replace

    from ddptui.speedup_text import speedup_lines

    table, _ = table_of(13.2, 6.1)
    split = {"step_data": 0.004, "step_forward": 0.048, "step_backward": 0.034, "step_sync": 0.013}
    rows = tuple(replace(r, **split) if r.label == "DDP x4" else r for r in table.rows)
    table = replace(table, rows=rows)
    narrow = assert_fits("\n".join(speedup_lines(table, "table", 80)))
    assert "step split" not in narrow[2] and not any("d4 " in line for line in narrow)
    wide = speedup_lines(table, "table", 200)
    header = next(line for line in wide if line.startswith("row "))
    ddp = next(line for line in wide if line.startswith("DDP x4 "))
    column = header.index("step split")
    assert ddp[column:].startswith("d4 f48 b34 s13")


def test_stacks_fit_80_columns_main_thread_first_native_frames_folded(runs_dir: Path) -> None:
    run_dir = make_run(runs_dir, "20260101-000000-made-stck", state=RunStatus.FAILED)
    run_dir.write_summary(build_summary(run_dir, RunStatus.FAILED, None, "rank 0 hung"))
    long = (
        "/opt/conda/envs/train/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
    )
    native = [
        Frame(f"ncclKernel_AllReduce_{i}", "/usr/lib/libnccl.so.2", native=True) for i in range(12)
    ]
    main_thread = ThreadStack(
        "MainThread",
        (*native, Frame("all_reduce", long, 2501), Frame("train_step", "/home/u/train.py", 42)),
        main=True,
    )
    watchdog = ThreadStack("Thread 0x7f00 (idle)", (Frame("run", "/usr/lib/threading.py", 9),))
    save_snapshot(
        run_dir.path,
        StackSnapshot(
            time=time.time(),
            reason="stall",
            ranks=(
                RankDiagnosis(
                    rank=0, pid=4242, activity=RankActivity.WAITING, detail="in all_reduce",
                    method="py-spy", stack="(text)", threads=(watchdog, main_thread),
                ),
            ),
            culprit_rank=0,
            culprit_reason="every rank waits; it went silent first",
        ),
    )  # fmt: skip
    lines = assert_fits(cli80("stacks", "stck", "--runs-dir", str(runs_dir)))
    threads = [line.strip() for line in lines if line.strip().endswith(":") and "Thread" in line]
    assert threads == ["MainThread (main):", "Thread 0x7f00 (idle):"]
    assert "      … 12 native frames (--native shows them)" in lines
    frame = next(line for line in lines if "all_reduce (" in line)
    assert frame.startswith("      all_reduce (/opt") and frame.endswith(
        "distributed_c10d.py:2501)"
    )
    unfolded = cli80("stacks", "stck", "--runs-dir", str(runs_dir), "--native")
    assert unfolded.count("ncclKernel_AllReduce_") == 12


def _eight_gpus() -> GpuInventory:
    with standin_nvml(machine=EIGHT_GPUS):
        return sample_gpus()


@pytest.fixture(autouse=True)
def _no_columns(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """$COLUMNS only where a test sets it."""
    monkeypatch.delenv("COLUMNS", raising=False)
    yield


def test_queue_fits_80_columns_with_each_waits_reason_under_it_and_prints_json(
    tmp_path: Path, pen: ProcessPen, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ddptui queue` on a machine of two CPU slots and two GPUs, GPU 1 held by alice's process:
    a run holds the slots, one waits for GPU 1, one for the slots; each reason under its row,
    wrapped at 80 columns, whole with --wide; --json gives every claim's verdict."""
    from engine.core.queue import device_state
    from engine.core.queue.claims import Claim, DeviceWant, open_store
    from engine.core.queue.device_state import GpuHolder, GpuState, MachineState

    store = open_store(tmp_path / "claims")
    holder = GpuHolder(4411, "alice", "python /home/alice/projects/train.py --epochs 90", 38 << 30)
    machine = MachineState(2, (GpuState(0), GpuState(1, (holder,), 39 << 30)))
    monkeypatch.setattr(device_state.MachineWatcher, "state", lambda self, gpus: machine)
    now = time.time()
    wants = [DeviceWant("cpu", 2), DeviceWant("gpu", 1, (1,)), DeviceWant("cpu", 2)]
    for ticket, want in enumerate(wants, start=1):
        claim = Claim(
            ticket, f"20261207-09{ticket}000-a-long-preset-name-{ticket}a2b",
            str(tmp_path / f"run-{ticket}"), want, ref_of(pen.python()), now - 600 * ticket,
            label="/home/alice/projects/with/a/long/path/train.py",
        )  # fmt: skip
        store.write(claim.holding(()) if ticket == 1 else claim, new=True)
    lines = assert_fits(cli80("queue", "--queue-store", str(store.path)))
    assert lines[0].split()[:5] == ["#", "RUN", "ID", "USER", "WANTS"]
    rows = [line for line in lines[1:] if not line.startswith("    ")]
    assert [row.split()[0] for row in rows] == ["run", "1", "2"]
    assert [row.split()[3] for row in rows] == ["cpu:2", "GPU", "cpu:2"]
    reasons = " | ".join(line.strip() for line in lines[1:] if line.startswith("    "))
    assert reasons.startswith("runs on cpu:2 | GPU 1 held by pid 4411 (alice, python")
    assert "…), 38.0G | needs 2 CPU slots, 0 of 2 free: 2 claimed by run" in reasons
    wide = CliRunner().invoke(main, ["queue", "--queue-store", str(store.path), "--wide"])
    assert "/home/alice/projects/with/a/long/path/train.py" in wide.stdout
    assert max(len(line) for line in wide.stdout.splitlines()) > WIDTH
    listed = json.loads(cli80("queue", "--queue-store", str(store.path), "--json"))
    assert [(c["place"], c["state"], c["may_start"]) for c in listed] == [
        (0, "holding", False),
        (1, "waiting", False),
        (2, "waiting", False),
    ]
    assert listed[1]["reason"].startswith("GPU 1 held by pid 4411 (alice, python")
    assert listed[1]["want"] == {"kind": "gpu", "count": 1, "indices": [1]}

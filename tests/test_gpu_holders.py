"""Who holds a GPU: the scan of open device files (a file made here stands in for /dev/nvidia<N>,
held open by real processes), hidden holders in the process table, and the GPU view that names
each process on each card (ddptui rank, foreign job, orphaned, DataLoader worker, unknown)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner

from engine.core.common.statuses import HolderKind
from engine.core.host.gpus import GpuInventory, GpuProcess, GpuSample
from engine.core.jobs.gpu_view import GpuScanner
from engine.core.jobs.process_table import ProcessScanner
from engine.core.procs.device_holders import minor_of, scan_device_holders
from tests.fixtures.made_runs import ProcessPen

ELASTIC = {
    "TORCHELASTIC_RUN_ID": "job-g",
    "RANK": "0",
    "LOCAL_RANK": "0",
    "WORLD_SIZE": "2",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29977",
}
NO_NVML = GpuInventory(error="NVML: stand-in says no driver")


def holding(path: Path, then: str = "") -> str:
    """Code for a process that keeps ``path`` open (as CUDA keeps /dev/nvidia<N>) and sleeps."""
    return (
        f"import time\nf = open({str(path)!r}, 'rb')\n{then}\nopen({str(path)!r} + '.ready', 'w')\n"
        "while True: time.sleep(0.1)"
    )


@pytest.fixture
def devices(tmp_path: Path) -> Path:
    """A folder with stand-ins for /dev/nvidia0..7 and /dev/nvidiactl."""
    folder = tmp_path / "dev"
    folder.mkdir()
    for name in [*(f"nvidia{i}" for i in range(8)), "nvidiactl"]:
        (folder / name).write_bytes(b"")
    return folder


def ready(path: Path, pen: ProcessPen) -> None:
    marker = Path(str(path) + ".ready")
    assert pen.wait_until(marker.exists)
    marker.unlink()


def inventory(*gpus: tuple[int, list[tuple[int, int]]]) -> GpuInventory:
    return GpuInventory(
        gpus=tuple(
            GpuSample(
                index=index,
                name="stand-in",
                memory_used_bytes=sum(m for _, m in procs) or (3 << 30),
                memory_total_bytes=80 << 30,
                utilization_percent=50,
                processes=tuple(GpuProcess(pid, m) for pid, m in procs),
            )
            for index, procs in gpus
        ),
        driver_version="550.0",
    )


def test_device_minor_numbers() -> None:
    assert minor_of("/dev/nvidia3") == 3
    assert minor_of("/dev/nvidiactl") is None
    assert minor_of("/dev/nvidia-uvm") is None


def test_a_process_with_the_device_open_is_found_and_others_are_not(
    pen: ProcessPen, devices: Path
) -> None:
    holder = pen.python(holding(devices / "nvidia2"))
    bystander = pen.python()
    ready(devices / "nvidia2", pen)
    scan = scan_device_holders(str(devices / "nvidia*"))
    found = scan.by_pid()
    assert holder.pid in found and bystander.pid not in found
    h = found[holder.pid]
    assert h.minors == (2,) and h.any_card and not h.zombie
    assert h.start_time == psutil.Process(holder.pid).create_time()
    assert scan.holds(holder.pid) is True and scan.holds(bystander.pid) is False


def test_a_zombie_leader_whose_thread_holds_the_device_is_found(
    pen: ProcessPen, devices: Path
) -> None:
    """The main thread has exited (the process shows as a zombie); another thread still has the
    device open, so the card's memory is still pinned."""
    code = holding(
        devices / "nvidia5",
        then=(
            "import threading, ctypes\n"
            "threading.Thread(target=lambda: [time.sleep(0.1) for _ in iter(int, 1)]).start()"
        ),
    )
    code = code.replace(
        "while True: time.sleep(0.1)", "time.sleep(0.2)\nctypes.CDLL(None).pthread_exit(None)"
    )
    proc = pen.python(code)
    ready(devices / "nvidia5", pen)
    assert pen.wait_until(lambda: psutil.Process(proc.pid).status() == psutil.STATUS_ZOMBIE)
    found = scan_device_holders(str(devices / "nvidia*")).by_pid()
    assert found[proc.pid].zombie and found[proc.pid].minors == (5,)


def test_hidden_holders_are_in_the_process_table_and_its_json(
    pen: ProcessPen, devices: Path
) -> None:
    worker = pen.orphan(holding(devices / "nvidia1"), env=ELASTIC)
    ready(devices / "nvidia1", pen)
    listed = pen.python(holding(devices / "nvidia0"))
    ready(devices / "nvidia0", pen)
    gpus = inventory((0, [(listed.pid, 1 << 30)]), (1, []))
    table = ProcessScanner(device_glob=str(devices / "nvidia*")).scan(gpus=gpus)
    hidden = {h.pid for h in table.hidden_holders}
    assert worker.pid in hidden and listed.pid not in hidden
    found = table.job_of(worker.pid)
    assert found is not None
    job, process = found
    assert job.state == "orphaned"
    assert [(g.gpu_index, g.used_bytes, g.listed) for g in process.gpu] == [(1, None, False)]
    data = json.loads(json.dumps(table.to_json()))
    (entry,) = [h for h in data["hidden_gpu_holders"] if h["pid"] == worker.pid]
    assert entry["minors"] == [1] and entry["job"] == job.key


def test_ps_lists_hidden_holders(
    pen: ProcessPen, devices: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ddptui.cli import main
    from engine.core.jobs import process_table

    holder = pen.python(holding(devices / "nvidia6"))
    ready(devices / "nvidia6", pen)
    monkeypatch.setattr(process_table, "DEFAULT_DEVICE_GLOB", str(devices / "nvidia*"))
    monkeypatch.setattr(process_table, "sample_gpus", lambda: inventory((6, [])))
    result = CliRunner().invoke(main, ["ps"])
    assert result.exit_code == 0, result.output
    assert "GPU devices held open that NVML does not list" in result.stdout
    line = next(line for line in result.stdout.splitlines() if f" {holder.pid} " in line)
    assert "GPU 6" in line and "not part of any training job" in line


def test_the_gpu_view_names_every_process(pen: ProcessPen, devices: Path) -> None:
    rank = pen.python(holding(devices / "nvidia0"), env=ELASTIC)
    ready(devices / "nvidia0", pen)
    orphan_env = {**ELASTIC, "TORCHELASTIC_RUN_ID": "dead", "MASTER_PORT": "29978"}
    orphan = pen.orphan(holding(devices / "nvidia3"), env=orphan_env)
    ready(devices / "nvidia3", pen)
    stranger = pen.python(holding(devices / "nvidia4"))
    ready(devices / "nvidia4", pen)
    gpus = inventory(
        (0, [(rank.pid, 2 << 30)]),
        (3, [(orphan.pid, 5 << 30)]),
        (4, [(4_000_000, 1 << 30)]),  # a pid of another namespace
        (6, []),
    )
    view = GpuScanner(device_glob=str(devices / "nvidia*")).scan(gpus)
    rows = {(r.gpu_index, r.pid): r for r in view.rows}
    ours = rows[(0, rank.pid)]
    assert ours.kind == HolderKind.FOREIGN and "torchrun job 'job-g'" in ours.what
    assert ours.gpu_memory_bytes == 2 << 30 and ours.listed and ours.own
    assert rows[(3, orphan.pid)].kind == HolderKind.ORPHANED
    assert rows[(4, 4_000_000)].kind == HolderKind.UNKNOWN
    assert not rows[(4, 4_000_000)].visible
    hidden = rows[(4, stranger.pid)]
    assert (hidden.kind, hidden.listed, hidden.gpu_memory_bytes) == (
        HolderKind.UNKNOWN,
        False,
        None,
    )
    assert hidden.command.startswith("python") or "python" in hidden.command
    assert view.job_refs(ours.job_key or "") == (ours.ref,)
    data = json.loads(json.dumps(view.to_json()))
    assert [g["index"] for g in data["gpus"]] == [0, 3, 4, 6]
    assert {p["kind"] for p in data["processes"]} >= {"foreign", "orphaned", "unknown"}


def test_a_dataloader_worker_is_named_as_one(pen: ProcessPen, devices: Path) -> None:
    child = holding(devices / "nvidia2")
    code = (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', {child!r}])\n"
        "while True: time.sleep(0.1)"
    )
    rank = pen.python(code, env=ELASTIC)
    ready(devices / "nvidia2", pen)
    (worker,) = psutil.Process(rank.pid).children()
    pen.started.append(worker)
    view = GpuScanner(device_glob=str(devices / "nvidia*")).scan(inventory((2, [])))
    (row,) = view.rows_of(2)
    assert row.pid == worker.pid and row.kind == HolderKind.WORKER
    assert row.what.startswith("DataLoader worker of rank 0 of torchrun job 'job-g'")


def test_without_nvml_holders_and_cpu_ranks_are_shown(pen: ProcessPen, devices: Path) -> None:
    holder = pen.python(holding(devices / "nvidia0"))
    ready(devices / "nvidia0", pen)
    view = GpuScanner(device_glob=str(devices / "nvidia*")).scan(NO_NVML)
    assert view.error == NO_NVML.error and view.gpus == ()
    (row,) = [r for r in view.rows if r.pid == holder.pid]
    assert row.gpu_index == 0 and not row.listed


def test_gpus_json_with_and_without_nvml(
    pen: ProcessPen, devices: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ddptui.cli import main
    from engine.core.jobs import gpu_view, process_table

    holder = pen.python(holding(devices / "nvidia1"))
    ready(devices / "nvidia1", pen)
    monkeypatch.setattr(process_table, "DEFAULT_DEVICE_GLOB", str(devices / "nvidia*"))
    monkeypatch.setattr(gpu_view, "DEFAULT_DEVICE_GLOB", str(devices / "nvidia*"))
    monkeypatch.setattr(gpu_view, "sample_gpus", lambda: NO_NVML)
    result = CliRunner().invoke(main, ["gpus", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["error"] == NO_NVML.error and data["gpus"] == []
    assert any(p["pid"] == holder.pid and p["gpu"] == 1 for p in data["processes"])
    text = CliRunner().invoke(main, ["gpus"])
    assert text.exit_code == 0
    assert text.stdout.splitlines()[0] == f"GPUs not available: {NO_NVML.error}."
    monkeypatch.setattr(gpu_view, "sample_gpus", lambda: inventory((0, []), (1, [])))
    data = json.loads(CliRunner().invoke(main, ["gpus", "--json"]).stdout)
    assert data["error"] is None and [g["index"] for g in data["gpus"]] == [0, 1]
    (row,) = [p for p in data["processes"] if p["pid"] == holder.pid]
    assert (row["gpu"], row["listed_by_nvml"], row["kind"]) == (1, False, "unknown")
    assert data["gpus"][1]["processes"] == [holder.pid]


def test_another_users_device_holder_is_seen_as_root(
    pen: ProcessPen, request: pytest.FixtureRequest
) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to start a process as another user")
    import shutil
    import subprocess
    import sys
    import tempfile

    shared = Path(tempfile.mkdtemp(prefix="ddptui-dev-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(shared, ignore_errors=True))
    shared.chmod(0o755)
    (shared / "nvidia7").write_bytes(b"")
    (shared / "nvidia7").chmod(0o644)
    proc = subprocess.Popen(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
         f"import time\nf = open({str(shared / 'nvidia7')!r}, 'rb')\ntime.sleep(60)"],
    )  # fmt: skip
    pen.popens.append(proc)
    pen.started.append(psutil.Process(proc.pid))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = scan_device_holders(str(shared / "nvidia*")).by_pid()
        if proc.pid in found:
            break
        time.sleep(0.05)
    assert found[proc.pid].user == "nobody" and found[proc.pid].minors == (7,)


def test_the_screen_flag_is_in_the_help() -> None:
    from ddptui.cli import main

    result = CliRunner().invoke(main, ["--help"])
    assert "--screen [launch|runs|processes|gpus|results]" in result.stdout
    result = CliRunner().invoke(main, ["--screen", "nope"])
    assert result.exit_code == 2


def test_gpus_watch_redraws(monkeypatch: pytest.MonkeyPatch) -> None:
    from ddptui.cli import main
    from engine.core.jobs import gpu_view

    monkeypatch.setattr(gpu_view, "sample_gpus", lambda: inventory((0, []), (1, [])))
    result = CliRunner().invoke(main, ["gpus", "--watch", "--interval", "0.2", "--count", "2"])
    assert result.exit_code == 0, result.output
    assert result.stdout.count("ddptui gpus · ") == 2
    gpu_lines = [line.split()[:2] for line in result.stdout.splitlines()]
    assert gpu_lines.count(["1", "stand-in"]) == 2

"""``ddptui gpus``: every GPU and every process on it, named for what it is (the GPUs screen as a
one-shot table, ``--watch`` to refresh, ``--json`` for scripts)."""

from __future__ import annotations

import json
import shutil
import sys
import time

import click

from ddptui.cli_common import aligned_columns, echo, unused_runs_dir_option
from ddptui.text_figures import bar, short_command
from engine.core.common.formatting import format_bytes, format_duration, gib
from engine.core.jobs.gpu_view import GpuProcessRow, GpuScanner, GpuView

KIND_WORDS = {
    "ddptui": "ddptui",
    "foreign": "foreign",
    "orphaned": "ORPHANED",
    "dataloader-worker": "worker",
    "unknown": "unknown",
}


def _gpu_lines(view: GpuView) -> list[str]:
    lines = []
    for gpu in view.gpus:
        if gpu.error is not None:
            lines.append(f"GPU {gpu.index}  {gpu.name or '?'}: not available ({gpu.error})")
            continue
        util = gpu.utilization_percent
        used, total = gpu.memory_used_bytes or 0, gpu.memory_total_bytes or 0
        parts = [
            f"GPU {gpu.index}  {gpu.name.removeprefix('NVIDIA ')[:20]:<20}",
            f"util {bar(util or 0, 100, 10)} {util if util is not None else '?':>3}%",
            f"mem {bar(used, total, 10)} {gib(used):>5}/{gib(total)} GiB",
        ]
        if gpu.temperature_c is not None:
            parts.append(f"{gpu.temperature_c}°C")
        if gpu.power_watts is not None:
            parts.append(f"{gpu.power_watts:.0f} W")
        held = len(view.rows_of(gpu.index))
        parts.append(f"{held} process{'es' if held != 1 else ''}" if held else "free")
        lines.append("  ".join(parts))
    return lines


def _memory_cell(row: GpuProcessRow) -> str:
    if not row.listed:
        return "unlisted"
    return format_bytes(row.gpu_memory_bytes)


def render_gpus(view: GpuView, width: int = 120) -> str:
    """The GPUs, then one line per process on each (pid, user, GPU memory, CPU, host memory, age,
    what it is, its command), then what could not be seen."""
    lines: list[str] = []
    if view.error is not None:
        lines.append(f"GPUs not available: {view.error}")
    elif not view.gpus:
        lines.append("GPUs: NVML lists none on this machine.")
    else:
        driver = f", driver {view.driver_version}" if view.driver_version else ""
        lines.append(f"{len(view.gpus)} GPU{'s' if len(view.gpus) != 1 else ''}{driver}")
        lines.extend(_gpu_lines(view))
    lines.append("")
    if not view.rows:
        lines.append(
            "No process holds a GPU." if view.error is None else "No training process is running."
        )
    else:
        header = ("GPU", "PID", "USER", "GPU MEM", "CPU%", "MEM", "AGE", "KIND")
        rows = [header]
        for r in sorted(view.rows, key=_order):
            rows.append(
                (
                    "cpu" if r.gpu_index is None else str(r.gpu_index),
                    str(r.pid),
                    r.user,
                    _memory_cell(r),
                    f"{r.cpu_percent:.0f}" if r.cpu_percent is not None else "-",
                    format_bytes(r.rss_bytes),
                    format_duration(r.age_seconds),
                    KIND_WORDS.get(str(r.kind), str(r.kind)),
                )
            )
        table_lines = aligned_columns(rows, right=(0, 1, 3, 4, 5, 6))
        for cells, shown in zip(table_lines, [None, *sorted(view.rows, key=_order)], strict=True):
            if shown is None:
                lines.append(f"{cells}  WHAT / COMMAND")
                continue
            room = max(20, width - len(cells) - 2)
            lines.append(f"{cells}  {short_command(shown.what, room)}")
            if shown.command:
                lines.append(f"{'':<{len(cells)}}  {short_command(shown.command, room)}")
    if view.notes:
        lines.append("")
        lines.append("Not visible from here:")
        lines.extend(f"  - {note}" for note in view.notes)
    return "\n".join(lines).rstrip()


def _order(row: GpuProcessRow) -> tuple[int, int]:
    return (row.gpu_index if row.gpu_index is not None else 1 << 30, -(row.gpu_memory_bytes or 0))


@click.command("gpus")
@unused_runs_dir_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output for scripts.")
@click.option("--watch", is_flag=True, help="Redraw every --interval seconds until Ctrl-C.")
@click.option(
    "--interval",
    type=click.FloatRange(min=0.2),
    default=2.0,
    show_default=True,
    help="Seconds between redraws with --watch.",
)
@click.option("--count", type=click.IntRange(min=1), default=None, hidden=True)
def gpus_command(as_json: bool, watch: bool, interval: float, count: int | None) -> None:
    """Every GPU (utilisation, memory, temperature, power) and every process on it.

    \b
    Each process is named for what it is: a rank of a ddptui run, a foreign job's rank
    (torchrun, torch.multiprocessing.spawn), a process of an orphaned job (its launcher is
    gone), a DataLoader worker, or unknown. Processes that hold a /dev/nvidia* device open but
    that NVML does not list (another PID namespace, a zombie's threads, a dead job's workers)
    are found by their open files and shown as "unlisted". Without NVML the first line says why
    and the ranks of ddptui runs on the CPU are listed. `ddptui ps` groups the same processes
    into jobs; `ddptui clean` stops orphaned ones.
    """
    scanner = GpuScanner()
    shown = 0
    try:
        while True:
            view = scanner.scan(cpu_interval=0.2 if shown == 0 else 0.0)
            shown += 1
            if as_json:
                click.echo(json.dumps(view.to_json(), indent=2))
            else:
                width = shutil.get_terminal_size().columns if sys.stdout.isatty() else 160
                if watch and sys.stdout.isatty():
                    click.clear()
                stamp = time.strftime("%H:%M:%S", time.localtime(view.scanned_at))
                if watch:
                    echo(f"ddptui gpus · {stamp} · every {interval:g} s (Ctrl-C stops)")
                echo(render_gpus(view, width))
            if not watch or (count is not None and shown >= count):
                return
            time.sleep(interval)
    except KeyboardInterrupt:
        return

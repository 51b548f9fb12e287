"""``ddptui gpus``: every GPU and every process on it, named for what it is (the GPUs screen as a
one-shot table, ``--watch`` to refresh, ``--json`` for scripts)."""

from __future__ import annotations

import json
import sys
import time

import click

from ddptui.cli_common import echo, unused_runs_dir_option
from ddptui.cli_table import (
    Column,
    cell_text,
    output_width,
    render_table,
    wide_option,
    with_notes,
    wrap_line,
)
from ddptui.text_figures import bar, host_line, short_command
from engine.core.common.formatting import format_duration, gib, short_bytes
from engine.core.jobs.gpu_view import GpuProcessRow, GpuScanner, GpuView

KIND_WORDS = {
    "ddptui": "ddptui",
    "foreign": "foreign",
    "orphaned": "ORPHANED",
    "dataloader-worker": "worker",
    "unknown": "unknown",
}


GPU_COLUMNS = (
    Column("GPU", right=True),
    Column("NAME", shrink=2, min_width=8),
    Column("", whole=True, shrink=0),  # utilisation bar
    Column("UTIL", right=True),
    Column("", whole=True, shrink=1),  # memory bar
    Column("MEMORY", right=True),
    Column("TEMP", right=True),
    Column("POWER", right=True),
    Column("PROCESSES", shrink=3, min_width=5),
)
PROCESS_COLUMNS = (
    Column("GPU", right=True),
    Column("PID", right=True),
    Column("USER", shrink=0, min_width=6),
    Column("GPU MEM", right=True),
    Column("CPU%", right=True),
    Column("MEM", right=True),
    Column("AGE", right=True),
    Column("KIND"),
)
DETAIL_INDENT = " " * 5  # what a process is and its command, under its row


def _gpu_rows(view: GpuView) -> tuple[list[tuple[object, ...]], list[str]]:
    """(a table row per readable GPU, a sentence per GPU that cannot be read)."""
    rows: list[tuple[object, ...]] = []
    unreadable = []
    for gpu in view.gpus:
        if gpu.error is not None:
            unreadable.append(f"GPU {gpu.index} {gpu.name or '?'}: not available ({gpu.error})")
            continue
        util = gpu.utilization_percent
        used, total = gpu.memory_used_bytes or 0, gpu.memory_total_bytes or 0
        held = len(view.rows_of(gpu.index))
        rows.append(
            (
                gpu.index,
                gpu.name.removeprefix("NVIDIA "),
                bar(util or 0, 100, 10),
                f"{util if util is not None else '?'}%",
                bar(used, total, 10),
                f"{gib(used)}/{gib(total)} GiB",
                f"{gpu.temperature_c}°C" if gpu.temperature_c is not None else "-",
                f"{gpu.power_watts:.0f} W" if gpu.power_watts is not None else "-",
                f"{held} process{'es' if held != 1 else ''}" if held else "free",
            )
        )
    return rows, unreadable


def render_gpus(view: GpuView, width: int | None) -> list[str]:
    """The GPUs, then a line per process on each (GPU, pid, user, GPU memory, CPU, host memory,
    age, kind) with what it is and its command under it, then what could not be seen; no line
    wider than ``width`` (None: every cell whole)."""
    lines: list[str] = []
    if view.error is not None:
        lines += wrap_line(f"GPUs not available: {view.error}.", width, hang="  ")
    elif not view.gpus:
        lines.append("GPUs: NVML lists none on this machine.")
    else:
        driver = f", driver {view.driver_version}" if view.driver_version else ""
        lines.append(f"{len(view.gpus)} GPU{'s' if len(view.gpus) != 1 else ''}{driver}")
        rows, unreadable = _gpu_rows(view)
        if rows:
            lines += render_table(GPU_COLUMNS, rows, width)
        for sentence in unreadable:
            lines += wrap_line(sentence, width, hang="  ")
    if view.host is not None:
        lines += wrap_line(host_line(view.host, width), width, hang="  ")
    lines.append("")
    if not view.rows:
        lines.append(
            "No process holds a GPU."
            if view.error is None
            else "No ddptui rank runs on the CPU, and no process has a GPU device open."
        )
    else:
        shown = sorted(view.rows, key=_order)
        table = render_table(
            PROCESS_COLUMNS,
            [
                (
                    "cpu" if r.gpu_index is None else r.gpu_index,
                    r.pid,
                    r.user,
                    r.memory_text,
                    f"{r.cpu_percent:.0f}" if r.cpu_percent is not None else "-",
                    short_bytes(r.rss_bytes),
                    format_duration(r.age_seconds),
                    KIND_WORDS.get(str(r.kind), str(r.kind)),
                )
                for r in shown
            ],
            width,
        )
        lines.append(table[0])
        room = None if width is None else max(20, width - len(DETAIL_INDENT))
        for line, r in zip(table[1:], shown, strict=True):
            lines.append(line)
            lines += wrap_line(r.what, width, indent=DETAIL_INDENT, hang=DETAIL_INDENT + "  ")
            if r.command:
                command = r.command if room is None else short_command(r.command, room)
                lines.append(DETAIL_INDENT + cell_text(command))
    if view.notes:
        lines.append("")
    return with_notes(lines, view.notes, width)


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
@wide_option
def gpus_command(
    as_json: bool, watch: bool, interval: float, count: int | None, wide: bool
) -> None:
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
                width = output_width(wide)
                if watch and sys.stdout.isatty():
                    click.clear()
                stamp = time.strftime("%H:%M:%S", time.localtime(view.scanned_at))
                if watch:
                    echo(f"ddptui gpus · {stamp} · every {interval:g} s (Ctrl-C stops)")
                echo("\n".join(render_gpus(view, width)))
            if not watch or (count is not None and shown >= count):
                return
            time.sleep(interval)
    except KeyboardInterrupt:
        return

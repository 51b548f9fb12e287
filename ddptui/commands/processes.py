"""``ddptui ps`` and ``ddptui clean``: find training processes and clean up orphaned ones
(``ddptui kill`` stops one run: ``ddptui.commands.kill``).

Exit codes (both): 0 done (or nothing to do), 1 the operation failed (a process survived
SIGKILL, or clean was declined), 2 bad input (unknown run id, unreadable run.json, a process that
is not yours to stop): nothing was signalled.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from ddptui import exit_codes
from ddptui.cli_common import confirmed, echo, fail, grace_option, unused_runs_dir_option
from ddptui.cli_table import Column, output_width, render_table, wide_option, with_notes, wrap_line
from ddptui.text_figures import short_command
from engine.core.common import strict_json
from engine.core.common.formatting import format_bytes, format_duration
from engine.core.jobs.clean import (
    CleanedJob,
    CleanPlan,
    UnknownPids,
    clean_orphans,
    plan_clean,
)
from engine.core.jobs.process_table import (
    ProcessTable,
    TrainingJob,
    TrainingProcess,
    scan_processes,
)
from engine.core.procs.leftovers import (
    DEFAULT_SHM_DIR,
    LeftoverPlan,
    LeftoverRemoval,
    plan_leftovers,
    remove_leftovers,
)

# ---- formatting ------------------------------------------------------------------------------


def _gpu_cell(p: TrainingProcess, gpu_error: str | None) -> str:
    if not p.gpu:
        return "n/a" if gpu_error else "-"
    return " ".join(
        f"{g.gpu_index}:{format_bytes(g.used_bytes) if g.listed else 'unlisted'}" for g in p.gpu
    )


def _rank_cell(p: TrainingProcess) -> str:
    if p.rank is None:
        return "-"
    return f"{p.rank}/{p.world_size}" if p.world_size else str(p.rank)


def _job_header(job: TrainingJob) -> str:
    return f"{job.label}  [{job.state}] {job.reason}"


PROCESS_COLUMNS = (
    Column("PID", right=True),
    Column("USER", shrink=1, min_width=6),
    Column("ROLE"),
    Column("RANK", right=True),
    Column("AGE", right=True),
    Column("CPU%", right=True),
    Column("RSS", right=True, shrink=3, min_width=0),
    Column("GPU MEM", shrink=2, min_width=7),
    Column("STATE"),
    # The command keeps 24 columns while others give; past that it is the widest, and gives.
    Column("COMMAND", shrink=0, min_width=24, fit=short_command),
)
HOLDER_COLUMNS = (
    Column("PID", right=True),
    Column("USER", shrink=1, min_width=4),
    Column("GPUS"),
    Column("WHAT", shrink=0, min_width=20, wrap=True),
)


def render_ps(table: ProcessTable, width: int | None) -> list[str]:
    """``ddptui ps`` as lines no wider than ``width`` (None: every cell whole): each job's
    heading and its processes, the processes holding a GPU that NVML does not list, and what
    could not be seen."""
    lines: list[str] = []
    if not table.jobs:
        lines.append("No distributed-training processes found on this machine.")
    for job in table.jobs:
        lines += wrap_line(_job_header(job), width, hang="  ")
        if job.run_dir:
            lines += wrap_line(f"run directory: {job.run_dir}", width, indent="  ", hang="    ")
        rows = [
            (
                p.pid,
                p.user,
                p.role,
                _rank_cell(p),
                format_duration(p.age_seconds),
                f"{p.cpu_percent:.0f}" if p.cpu_percent is not None else "-",
                format_bytes(p.rss_bytes),
                _gpu_cell(p, table.gpu_error),
                p.state,
                p.command,
            )
            for p in job.processes
        ]
        lines += render_table(PROCESS_COLUMNS, rows, width, indent=2)
        for p in job.processes:
            if p.note:
                lines += wrap_line(f"pid {p.pid}: {p.note}", width, indent="  ", hang="    ")
        lines.append("")
    if table.hidden_holders:
        lines += _hidden_lines(table, width)
        lines.append("")
    return with_notes(lines, table.notes, width)


def _hidden_lines(table: ProcessTable, width: int | None) -> list[str]:
    """Processes with a GPU device open that NVML does not list, with what each is."""
    title = (
        "GPU devices held open that NVML does not list"
        if table.gpu_error is None
        else "GPU devices held open (NVML not available to compare)"
    )
    lines = wrap_line(f"{title} (found by their open /dev/nvidia* files):", width, hang="  ")
    rows = []
    for h in table.hidden_holders:
        found = table.job_of(h.pid)
        what = (
            f"{found[1].role} of {found[0].label} [{found[0].state}]"
            if found
            else "not part of any training job found"
        )
        if h.zombie:
            what += "; a zombie whose threads still hold it"
        rows.append((h.pid, h.user, ", ".join(f"GPU {m}" for m in h.minors), what))
    return lines + render_table(HOLDER_COLUMNS, rows, width, indent=2)


# ---- ddptui ps -------------------------------------------------------------------------------


@click.command("ps")
@unused_runs_dir_option
@wide_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output for scripts.")
def ps_command(wide: bool, as_json: bool) -> None:
    """List the distributed-training processes on this machine, grouped into jobs.

    \b
    Ours are found by their run marker (DDPTUI_RUN_ID and DDPTUI_RUN_DIR, so wherever their
    run directory lies); foreign ones (torchrun,
    torch.distributed.launch, torch.multiprocessing.spawn) by their environment (RANK /
    LOCAL_RANK with WORLD_SIZE, MASTER_ADDR + MASTER_PORT, TORCHELASTIC_RUN_ID) or as a Python
    interpreter with torch loaded whose command line is a launcher's; never by name alone.
    Each process shows pid, user, role, rank, age, CPU, host memory, GPU memory per GPU (where
    NVML is there) and a state: running, orphaned (its launcher or agent is gone), stalled (a
    ddptui rank silent too long; foreign jobs report no progress, so they are never stalled),
    stopped (SIGSTOP or Ctrl-Z: `kill -CONT PID` resumes it) or zombie. What cannot be seen (another user's process, a GPU pid from another namespace)
    is listed at the end. `ddptui clean` stops the orphaned jobs.
    """
    table = scan_processes()
    if as_json:
        click.echo(strict_json.dumps(table.to_json(), indent=2))
        return
    for line in render_ps(table, output_width(wide)):
        echo(line)


# ---- ddptui clean ----------------------------------------------------------------------------


def _plan_lines(plan: CleanPlan) -> list[str]:
    lines = []
    for job in plan.jobs:
        pids = ", ".join(str(p.pid) for p in job.live_processes)
        lines.append(f"stop {job.label}: {job.reason}")
        lines.append(f"  pids {pids}")
    for job, why in plan.left_alone:
        lines.append(f"leave {job.label} alone: {why}")
    lines.extend(why for _, why in plan.not_orphaned)
    return lines


def _leftover_lines(plan: LeftoverPlan) -> list[str]:
    lines = []
    if plan.remove:
        lines.append(
            f"files left by dead jobs ({format_bytes(plan.size_bytes)}, yours; each is checked "
            "again just before it is removed):"
        )
        for item in plan.remove:
            lines.append(f"  remove {item.path}  {format_bytes(item.size_bytes)}: {item.why}")
    else:
        lines.append(
            "No files left by dead jobs (torch segments in /dev/shm, torchelastic_* dirs)."
        )
    for item in plan.left_alone:
        lines.append(f"  leave {item.path} alone: {item.why}")
    return lines


@click.command("clean")
@click.argument("pids", metavar="[PID]...", nargs=-1, type=click.IntRange(min=1))
@click.option("--yes", "-y", is_flag=True, help="Do not ask; for scripts.")
@click.option("--dry-run", is_flag=True, help="Only show what would be stopped and removed.")
@click.option("--all-users", is_flag=True, help="As root: also stop orphaned jobs of other users.")
@grace_option
@unused_runs_dir_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable plan and result.")
@click.option("--shm-dir", type=click.Path(path_type=Path), default=DEFAULT_SHM_DIR, hidden=True)
@click.option("--tmp-dir", type=click.Path(path_type=Path), default=None, hidden=True)
def clean_command(
    pids: tuple[int, ...],
    yes: bool,
    dry_run: bool,
    all_users: bool,
    grace: float,
    as_json: bool,
    shm_dir: Path,
    tmp_dir: Path | None,
) -> None:
    """Stop orphaned training jobs (those whose launcher or agent is gone), then remove the files
    dead jobs left behind, after showing each and asking. With PIDs (as `ddptui ps` lists them),
    only the orphaned jobs those processes belong to; the others are left as they are.

    \b
    Running jobs, live ddptui runs, this process and its parent shell are never touched, nor
    other users' processes unless run as root with --all-users.
    Left-over files: torch's shared-memory segments in /dev/shm (torch_<pid>_...: host memory
    until removed) whose maker is gone and that no process has open or mapped, and the
    /tmp/torchelastic_* directories of torchrun agents that no live process refers to. Only
    your own are removed; the rest are listed with the reason they stay.
    Exit codes: 0 done (a question declined after something was done included) or nothing to
    do, 1 every question declined or a process survived, 2 bad input.
    """
    if all_users and os.getuid() != 0:
        fail("--all-users needs root: only root may stop other users' processes")

    def say(line: str) -> None:
        if not as_json:
            echo(line)

    started = time.monotonic()
    try:
        plan = plan_clean(
            scan_processes(cpu_interval=0.0), all_users=all_users, pids=frozenset(pids)
        )
    except UnknownPids as err:
        fail(str(err))
    if not plan.jobs:
        say("No orphaned jobs to stop.")
    for line in _plan_lines(plan):
        say(line)
    cleaned: tuple[CleanedJob, ...] | None = None
    declined = False
    if plan.jobs and not dry_run:
        question = f"Stop {plan.process_count} processes of {len(plan.jobs)} orphaned job(s)?"
        if yes or confirmed(question, err=as_json):
            cleaned = clean_orphans(plan, grace, all_users=all_users)
            for line in _cleaned_lines(cleaned):
                say(line)
        else:
            declined = True
            click.echo("Nothing stopped.", err=as_json)
    # after the jobs: what the jobs just stopped left behind is offered too
    leftovers = plan_leftovers(shm_dir, tmp_dir)
    for line in _leftover_lines(leftovers):
        say(line)
    removal: LeftoverRemoval | None = None
    if leftovers.remove and not dry_run:
        question = (
            f"Remove {len(leftovers.remove)} left-over file(s), "
            f"{format_bytes(leftovers.size_bytes)}?"
        )
        if yes or confirmed(question, err=as_json):
            removal = remove_leftovers(leftovers.remove)
            for line in _removal_lines(removal):
                say(line)
        else:
            declined = True
            click.echo("Nothing removed.", err=as_json)
    ok = all(c.stop.ok for c in cleaned or ()) and (removal is None or removal.ok)
    did = cleaned is not None or removal is not None
    if as_json:
        click.echo(strict_json.dumps(_clean_json(plan, cleaned, leftovers, removal), indent=2))
    elif did:
        say(f"done in {time.monotonic() - started:.1f} s")
    # A question declined fails the command only when nothing was done: stopping the orphans and
    # leaving their files is a clean that worked.
    sys.exit(exit_codes.OK if ok and (did or not declined) else exit_codes.FAILED)


def _cleaned_lines(cleaned: tuple[CleanedJob, ...]) -> list[str]:
    lines = []
    for c in cleaned:
        state = (
            "none left" if c.stop.ok else f"still alive: {', '.join(map(str, c.stop.survivors))}"
        )
        lines.append(
            f"{c.job.label}: {len(c.stop.terminated)} ended on SIGTERM, "
            f"{len(c.stop.killed)} needed SIGKILL; {state}"
        )
        lines.extend(f"  {line}" for line in c.skipped)
    return lines


def _removal_lines(removal: LeftoverRemoval) -> list[str]:
    lines = [f"removed {len(removal.removed)}"]
    lines.extend(f"  kept {item.path}: in use again" for item in removal.kept)
    lines.extend(f"  could not remove {item.path}: {why}" for item, why in removal.failed)
    return lines


def _clean_json(
    plan: CleanPlan, cleaned: Any, leftovers: LeftoverPlan, removal: LeftoverRemoval | None
) -> dict[str, Any]:
    return {
        "leftovers": {
            "remove": [item.to_json() for item in leftovers.remove],
            "left_alone": [item.to_json() for item in leftovers.left_alone],
            "removed": None if removal is None else [str(i.path) for i in removal.removed],
            "failed": None
            if removal is None
            else [{"path": str(i.path), "reason": why} for i, why in removal.failed],
        },
        "stop": [j.key for j in plan.jobs],
        "left_alone": [{"job": j.key, "reason": why} for j, why in plan.left_alone],
        "not_orphaned": [{"pid": pid, "reason": why} for pid, why in plan.not_orphaned],
        "jobs": [asdict(j) for j in plan.jobs],
        "result": None
        if cleaned is None
        else [
            {"job": c.job.key, "ok": c.stop.ok, **asdict(c.stop), "skipped": list(c.skipped)}
            for c in cleaned
        ],
        "dry_run": cleaned is None and removal is None,
    }

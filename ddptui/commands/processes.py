"""``ddptui ps``, ``ddptui kill`` and ``ddptui clean``: find, stop and clean up training processes.

Exit codes (all three): 0 done (or nothing to do), 1 the operation failed (a process survived
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
from ddptui.cli_common import echo, fail, read_runs_dir_option, unused_runs_dir_option
from ddptui.cli_table import Column, output_width, render_table, wide_option, wrap_line
from ddptui.text_figures import short_command
from engine.core.common import strict_json
from engine.core.common.formatting import format_bytes, format_duration
from engine.core.common.statuses import KillOutcome
from engine.core.jobs.clean import CleanedJob, CleanPlan, clean_orphans, plan_clean
from engine.core.jobs.process_table import (
    ProcessTable,
    TrainingJob,
    TrainingProcess,
    scan_processes,
)
from engine.core.ops.backends import backend_of
from engine.core.ops.kill import KillResult
from engine.core.procs.leftovers import (
    DEFAULT_SHM_DIR,
    LeftoverPlan,
    LeftoverRemoval,
    plan_leftovers,
    remove_leftovers,
)
from engine.core.procs.stopping import KillRefused
from engine.core.runs.rundir import RunDirError, find_run, run_dir_owner

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
    if table.notes:
        lines.append("Not visible from here:")
        for note in table.notes:
            lines += wrap_line(note, width, indent="  - ", hang="    ")
    while lines and not lines[-1]:
        lines.pop()
    return lines


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


# ---- ddptui kill -----------------------------------------------------------------------------


def _kill_report(result: KillResult, grace: float) -> list[str]:
    lines = []
    if result.outcome == KillOutcome.ALREADY_FINISHED:
        lines.append(
            f"run {result.run_id} already finished ({result.status_before}); nothing to stop."
        )
    elif result.outcome == KillOutcome.NOTHING_RUNNING:
        recorded = (
            "recorded it as killed"
            if result.summary_written
            else f"its summary was not written: {result.unwritten}"
            if result.unwritten
            else "its summary was already there"
        )
        lines.append(
            f"run {result.run_id}: no process of it is left (state was {result.status_before}); "
            f"{recorded}."
        )
    elif result.job_id and not result.targets:
        lines.append(
            f"run {result.run_id}: Slurm job {result.job_id} cancelled while it was "
            f"{result.status_before}, before any node launcher had started"
        )
    else:
        roles = ", ".join(f"{t.role} (pid {t.pid})" for t in result.targets)
        job = f" (Slurm job {result.job_id}, cancelled)" if result.job_id else ""
        lines.append(f"run {result.run_id}{job}: stopping {roles}")
        if result.status_before.final:
            lines.append(
                f"  it had already finished ({result.status_before}); these were leftovers"
            )
        stop = result.stop
        if stop is not None:
            extra = len(stop.stopped) - len(result.targets)
            if extra > 0:
                lines.append(f"  and {extra} of their child processes")
            if result.by_launcher and result.job_id:
                lines.append("  each node launcher stopped its ranks and checked its node")
            elif result.by_launcher:
                lines.append("  its launcher stopped its ranks and wrote the summary")
            lines.extend(_how_stopped(result, grace))
            if stop.survivors:
                lines.append(f"  still alive after SIGKILL: {', '.join(map(str, stop.survivors))}")
            else:
                lines.append("  none left")
            lines.extend(f"  not stopped: {why}" for _, why in stop.refused)
            lines.extend(f"  {why}" for _, why in stop.left_alone)
    lines.extend(f"  {s}" for s in result.skipped)
    if result.verification:
        lines.append(f"  {result.verification}")
    lines.extend(f"  a rank's daemon: {d}" for d in result.daemons)
    if result.gpu_check:
        lines.append(f"  {result.gpu_check}")
    if result.summary_written:
        lines.append("  summary.json: killed")
    elif result.unwritten and result.outcome == KillOutcome.STOPPED:
        lines.append(f"  summary.json not written: {result.unwritten}")
    return lines


def _how_stopped(result: KillResult, grace: float) -> list[str]:
    """Which process ended on SIGTERM and which needed SIGKILL, each named (its role in the run,
    else its pid), as the launcher's events or the killer's own stop say it."""
    assert result.stop is not None
    roles = {t.pid: t.role for t in result.targets}

    def named(pids: tuple[int, ...]) -> str:
        return ", ".join(
            f"{roles[pid]} (pid {pid})" if roles.get(pid) not in (None, "marked") else f"pid {pid}"
            for pid in pids
        )

    stop = result.stop
    lines = []
    if stop.terminated:
        lines.append(f"  ended on SIGTERM: {named(stop.terminated)}")
    if stop.killed:
        given = result.grace_seconds or grace
        lines.append(f"  needed SIGKILL, {given:g} s after SIGTERM: {named(stop.killed)}")
    lines.append(f"  {stop.seconds:.1f} s in all")
    return lines


@click.command("kill")
@click.argument("run_id")
@click.option(
    "--grace",
    type=click.FloatRange(min=0),
    default=10.0,
    show_default=True,
    help="Seconds between SIGTERM and SIGKILL.",
)
@click.option(
    "--all-users",
    is_flag=True,
    help="As root: also stop another user's run, or processes of the run that belong to other "
    "users (asks first when the run directory is another user's).",
)
@click.option("--yes", "-y", is_flag=True, help="Do not ask; for scripts.")
@read_runs_dir_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result.")
def kill_command(
    run_id: str, grace: float, all_users: bool, yes: bool, runs_dir: Path, as_json: bool
) -> None:
    """Stop exactly the processes of run RUN_ID (its id or any unique part of one, such as its
    random suffix, or a preset's name for that preset's newest run).

    \b
    Only what is provably the run's: processes whose own environment carries the run's marker
    (DDPTUI_RUN_ID and this run directory as DDPTUI_RUN_DIR: a run of the same id elsewhere is
    another run), owned by the run directory's owner, the launcher and ranks run.json names also
    by pid and start time (so a reused pid or a process run.json merely names is never hit), and
    their children carrying the marker too: SIGTERM,
    SIGKILL after --grace seconds, then a check that none is left (and, with NVML, that their
    GPU memory was released). summary.json records the run as killed. A finished run is left
    alone. Another user's run directory is refused; as root, --all-users stops it after asking.

    Exit codes: 0 stopped (or nothing to stop), 1 a process survived or the question was
    declined, 2 bad input (unknown run, unreadable run.json, another user's run or process):
    nothing was signalled.
    """
    if all_users and os.getuid() != 0:
        fail("--all-users needs root: only root may stop other users' processes")
    try:
        run_dir = find_run(runs_dir, run_id)
        owner = run_dir_owner(run_dir)
        if owner is not None and all_users and not yes:
            _confirm_or_stop(
                f"Run {run_dir.run_id} belongs to user {owner}. Stop its processes as root?",
                err=as_json,
            )
        result = backend_of(run_dir).stop(run_dir, grace, allow_other_users=all_users)
    except (RunDirError, KillRefused) as err:
        fail(str(err))
    if as_json:
        click.echo(strict_json.dumps(_kill_json(result), indent=2))
    else:
        echo("\n".join(_kill_report(result, grace)))
    sys.exit(exit_codes.OK if result.ok else exit_codes.FAILED)


def _confirm_or_stop(question: str, *, err: bool) -> None:
    """Ask; anything but yes (Ctrl-D, no terminal) stops with nothing signalled, exit 1."""
    try:
        agreed = click.confirm(question, default=False, err=err)
    except click.Abort:
        agreed = False
    if not agreed:
        echo("Nothing stopped.", err=err)
        sys.exit(exit_codes.FAILED)


def _kill_json(result: KillResult) -> dict[str, Any]:
    data = asdict(result)
    data["ok"] = result.ok
    return data


# ---- ddptui clean ----------------------------------------------------------------------------


def _plan_lines(plan: CleanPlan) -> list[str]:
    lines = []
    for job in plan.jobs:
        pids = ", ".join(str(p.pid) for p in job.live_processes)
        lines.append(f"stop {job.label}: {job.reason}")
        lines.append(f"  pids {pids}")
    for job, why in plan.left_alone:
        lines.append(f"leave {job.label} alone: {why}")
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
@click.option("--yes", "-y", is_flag=True, help="Do not ask; for scripts.")
@click.option("--dry-run", is_flag=True, help="Only show what would be stopped and removed.")
@click.option("--all-users", is_flag=True, help="As root: also stop orphaned jobs of other users.")
@click.option(
    "--grace",
    type=click.FloatRange(min=0),
    default=5.0,
    show_default=True,
    help="Seconds between SIGTERM and SIGKILL.",
)
@unused_runs_dir_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable plan and result.")
@click.option("--shm-dir", type=click.Path(path_type=Path), default=DEFAULT_SHM_DIR, hidden=True)
@click.option("--tmp-dir", type=click.Path(path_type=Path), default=None, hidden=True)
def clean_command(
    yes: bool,
    dry_run: bool,
    all_users: bool,
    grace: float,
    as_json: bool,
    shm_dir: Path,
    tmp_dir: Path | None,
) -> None:
    """Stop orphaned training jobs (those whose launcher or agent is gone), then remove the files
    dead jobs left behind, after showing each and asking.

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
    plan = plan_clean(scan_processes(cpu_interval=0.0), all_users=all_users)
    if not plan.jobs:
        say("No orphaned jobs to stop.")
    for line in _plan_lines(plan):
        say(line)
    cleaned: tuple[CleanedJob, ...] | None = None
    declined = False
    if plan.jobs and not dry_run:
        question = f"Stop {plan.process_count} processes of {len(plan.jobs)} orphaned job(s)?"
        if yes or click.confirm(question, default=False, err=as_json):
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
        if yes or click.confirm(question, default=False, err=as_json):
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
        "jobs": [asdict(j) for j in plan.jobs],
        "result": None
        if cleaned is None
        else [
            {"job": c.job.key, "ok": c.stop.ok, **asdict(c.stop), "skipped": list(c.skipped)}
            for c in cleaned
        ],
        "dry_run": cleaned is None and removal is None,
    }

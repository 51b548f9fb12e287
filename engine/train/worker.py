"""The entry of one rank process, under the ddptui launcher or under torchrun.

- ``spawn_entry(local_rank, run_dir, global_ranks, world_size)``: the target the launcher passes
  to ``torch.multiprocessing.spawn``.
- ``python -m engine.train.worker RUN_DIR [--preset NAME_OR_PATH] [--set section.key=value ...]``: the
  same rank under ``torchrun`` (RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT from the
  environment). With no launcher there, global rank 0 writes summary.json at the end, and a rank
  that fails writes a failed one if none exists yet.

Either way a rank sends its stdout and stderr (file descriptors 1 and 2, so C++ output too) to
``logs/rank-<r>.log``, writes its events to ``events/rank-<r>.jsonl``, reports an exception as a
``RankFailed`` event before exiting non-zero, and leaves the process group on the way out.

A rank never outlives the process that started it: ``engine.train.rank_bootstrap`` arms Linux's
parent-death signal before torch is imported (at the top of this module under torchrun, at the
top of ``engine.train.launch`` for spawned ranks, again in ``spawn_entry``, and in every DataLoader
worker), and a watchdog thread ends the rank and its workers where that signal does not exist.
"""

from __future__ import annotations

if __name__ == "__main__":
    # Under torchrun: tie this rank to torchrun's agent before torch is imported (seconds).
    from engine.train.rank_bootstrap import bind_to_parent

    bind_to_parent()

import argparse
import contextlib
import os
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import NoReturn

import psutil
import torch
import torch.distributed as dist

from engine.core.common.disk_space import WriteFailed, disk_full
from engine.core.common.run_environment import (
    ATTEMPT_ENV,
    LAUNCHER_PID_ENV,
    RESUME_FROM_ENV,
    THREADS_ENV,
)
from engine.core.common.run_files import (
    PRIVATE_DIR_MODE,
    make_dirs,
    open_private,
    write_atomic,
)
from engine.core.common.statuses import RunStatus
from engine.core.config.presets import load_preset
from engine.core.config.schema import ConfigError
from engine.core.config.toml_io import apply_overrides, load_config, parse_setting, to_toml
from engine.core.host import gpus
from engine.core.plan.run_plan import RunPlan, plan_run
from engine.core.procs.process_identity import ProcessRef, identify, ref_alive
from engine.core.runs.events import (
    EventWriter,
    RankFailed,
    RankFinished,
    RankStarted,
    one_line_error,
)
from engine.core.runs.rundir import RunDir, this_host
from engine.core.runs.settle import settle_run
from engine.core.runs.summarize import build_summary
from engine.train.flight_recorder import dump_flight_recorder, enable_flight_recorder
from engine.train.rank_bootstrap import bootstrap_rank, exit_at_once, prepare_stack_dumps
from engine.train.rank_device import gpu_index, pick_device
from engine.train.rank_setup import StepCounter
from engine.train.rendezvous import rendezvous_store
from engine.train.training import train_rank

WATCHDOG_INTERVAL_SECONDS = 0.5
WATCHDOG_EXIT_CODE = 1
# Long enough for rank 0 to download CIFAR-10 while the others wait at the barrier; collectives
# get ddp.timeout_seconds once setup is over (engine.train.training.set_collective_timeout).
SETUP_TIMEOUT_SECONDS = 600.0


# ---- process set-up --------------------------------------------------------------------------


def redirect_output(log_path: Path) -> None:
    """Point file descriptors 1 and 2 at ``log_path`` (appending) and make Python's stdout and
    stderr line-buffered writers on them, so every line reaches the log as it is written."""
    make_dirs(log_path.parent, PRIVATE_DIR_MODE)
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    # Readable by its owner only, whatever the umask; never written through a planted link.
    fd = open_private(log_path, "append")
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115


def threads_per_rank() -> int:
    return max(1, int(os.environ.get(THREADS_ENV, "1")))


def planning_gpu_count() -> int:
    """The GPU count to plan with, so that a rank's plan is the launcher's plan.

    The launcher plans with NVML's count of the machine's GPUs (devices.spec names NVML indices,
    e.g. "0,2"), then sets CUDA_VISIBLE_DEVICES to the chosen ones; re-planning with the number of
    visible GPUs would refuse "0,2". An empty CUDA_VISIBLE_DEVICES (a CPU run) means none. Without
    NVML, CUDA's count stands in (torchrun on a machine whose NVML does not answer).
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and not visible.strip():
        return 0
    count = gpus.gpu_count()
    return count if count > 0 else torch.cuda.device_count()


def plan_for_world(plan: RunPlan, world_size: int) -> RunPlan:
    """The plan for a run of ``world_size`` ranks in all (several nodes under one process group):
    plan_run counts one node's devices, so the global batch and linear lr scaling follow here."""
    if plan.config.strategy.name != "ddp":
        if world_size != 1:
            raise ConfigError(
                f"strategy {plan.config.strategy.name} runs one process, but {world_size} were "
                "started; use ddp for several processes"
            )
        return plan
    if world_size == plan.world_size:
        return plan
    optimizer = plan.config.optimizer
    global_batch = plan.config.training.batch_size * world_size
    lr = optimizer.lr
    if optimizer.lr_scaling == "linear":
        lr = lr * global_batch / optimizer.reference_batch
    return replace(plan, world_size=world_size, global_batch=global_batch, base_lr=lr)


# ---- launcher-death watchdog -----------------------------------------------------------------


def _process_identity(pid_text: str | None) -> ProcessRef | None:
    """The identity of the process ``pid_text`` names now, so that a reused pid is not taken for
    it later; a pid with no process is already gone (a start time no process has)."""
    if not pid_text or not pid_text.strip().isdigit():
        return None
    return identify(int(pid_text)) or ProcessRef(int(pid_text), -1.0)


def kill_own_children(timeout: float = 2.0) -> None:
    """SIGKILL every descendant of this process (DataLoader workers) and reap them."""
    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        return
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(children, timeout=timeout)


def launcher_gone(parent_pid: int, launcher: ProcessRef | None) -> str | None:
    """Why this rank is orphaned, or None while the process that started it is alive."""
    if os.getppid() != parent_pid:
        return f"parent process {parent_pid} is gone"
    if launcher is not None and not ref_alive(launcher):
        return f"launcher {launcher.pid} ({LAUNCHER_PID_ENV}) is gone"
    return None


def start_launcher_watchdog(interval: float = WATCHDOG_INTERVAL_SECONDS) -> threading.Thread:
    """A daemon thread that ends this process when the process that started it (the launcher's
    ``mp.spawn`` parent or torchrun's agent), or the launcher named by DDPTUI_LAUNCHER_PID, is gone:
    it kills this rank's own children, then ``os._exit(1)``. A rank blocked in a collective or a
    hang would otherwise live on after a SIGKILLed launcher."""
    parent_pid = os.getppid()
    launcher = _process_identity(os.environ.get(LAUNCHER_PID_ENV))

    def watch() -> None:
        while True:
            time.sleep(interval)
            reason = launcher_gone(parent_pid, launcher)
            if reason is not None:
                print(f"watchdog: {reason}; ending this rank", file=sys.stderr, flush=True)
                kill_own_children()
                os._exit(WATCHDOG_EXIT_CODE)

    thread = threading.Thread(target=watch, name="launcher-watchdog", daemon=True)
    thread.start()
    return thread


def end_process(code: int) -> NoReturn:
    """Exit now: end this process's children (DataLoader workers), then flush Python's and C's
    output and ``os._exit`` (``rank_bootstrap.exit_at_once``). Interpreter shutdown of a process
    that imported torch takes seconds (measured 2-4 s on a busy 2-core machine) and does nothing
    a finished rank needs."""
    kill_own_children()
    exit_at_once(code)


# ---- one rank --------------------------------------------------------------------------------


def disk_full_failure(err: BaseException, log_path: Path) -> WriteFailed | None:
    """``err`` as a WriteFailed (one sentence: the path and the free space) when it is a full
    disk: an event or checkpoint write says which file; a print says none, and goes to the log."""
    if isinstance(err, WriteFailed):
        return err
    if not disk_full(err):
        return None
    assert isinstance(err, OSError)
    return WriteFailed(Path(err.filename) if err.filename else log_path, err)


def report_failure(
    events: EventWriter, rank: int, err: BaseException, global_step: int | None = None
) -> None:
    """A RankFailed event (with the step it was taking, where known) and the traceback in the
    log, each as far as the disk allows: a rank whose disk is full still fails with its sentence,
    through torch.multiprocessing's error file that the launcher reads."""
    error = str(err) if isinstance(err, WriteFailed) else one_line_error(err)
    failed = RankFailed(
        rank=rank, error=error, traceback=traceback.format_exc(), global_step=global_step
    )
    with contextlib.suppress(OSError):
        events.write(failed)
    with contextlib.suppress(OSError):
        traceback.print_exc()


def run_rank(run_dir: RunDir, *, rank: int, local_rank: int, world_size: int) -> None:
    """Everything one rank does after its output is redirected: plan, join the process group,
    train, report. Raises what training raised, after reporting it as a RankFailed event."""
    torch.set_num_threads(threads_per_rank())
    start_launcher_watchdog()
    events = EventWriter(run_dir.rank_events_path(rank))
    joined = False
    counter = StepCounter()
    try:
        config = load_config(run_dir.config_path)
        plan = plan_for_world(plan_run(config, planning_gpu_count()), world_size)
        device = pick_device(plan, local_rank)
        events.write(
            RankStarted(
                rank=rank,
                world_size=world_size,
                pid=os.getpid(),
                host=this_host(),
                device=str(device),
                gpu_index=gpu_index(device),
            )
        )
        if config.strategy.name == "ddp":
            if device.type == "cuda":
                torch.cuda.set_device(device)
            enable_flight_recorder(run_dir)
            setup_timeout = timedelta(
                seconds=max(SETUP_TIMEOUT_SECONDS, config.ddp.timeout_seconds)
            )
            store = rendezvous_store(rank, world_size, setup_timeout)
            dist.init_process_group(
                plan.backend,
                init_method=None if store is not None else "env://",
                store=store,
                rank=rank,
                world_size=world_size,
                timeout=setup_timeout,
            )
            joined = True
        resume_from = os.environ.get(RESUME_FROM_ENV)
        train_rank(
            run_dir,
            plan,
            rank=rank,
            local_rank=local_rank,
            world_size=world_size,
            events=events,
            resume_from=Path(resume_from) if resume_from else None,
            attempt=int(os.environ.get(ATTEMPT_ENV, "1") or 1),
            counter=counter,
        )
        events.write(RankFinished(rank=rank))
    except BaseException as err:
        if joined:  # which collectives this rank saw, for the analysis of a hang or timeout
            dump_flight_recorder(run_dir, rank)
        full = disk_full_failure(err, run_dir.rank_log_path(rank))
        report_failure(events, rank, full or err, counter.global_step)
        if full is not None and full is not err:
            raise full from err
        raise
    finally:
        if joined:
            dist.destroy_process_group()
        events.close()
        with contextlib.suppress(OSError):  # the log may be on a full disk
            sys.stdout.flush()
            sys.stderr.flush()


def spawn_entry(
    local_rank: int, run_dir: str, global_ranks: Sequence[int], world_size: int
) -> None:
    """Target of ``torch.multiprocessing.spawn`` (which passes ``local_rank`` first): this process
    is global rank ``global_ranks[local_rank]``, as the launcher numbered it."""
    bootstrap_rank()  # already done in __mp_main__ under our launcher; not under other spawners
    rank = global_ranks[local_rank]
    rd = RunDir(Path(run_dir))
    redirect_output(rd.rank_log_path(rank))
    run_rank(rd, rank=rank, local_rank=local_rank, world_size=world_size)
    end_process(0)  # failures raise instead, so mp.spawn reports the traceback to the launcher


# ---- torchrun --------------------------------------------------------------------------------


def write_config_if_missing(run_dir: RunDir, preset: str | None, overrides: Sequence[str]) -> None:
    """Resolve ``preset`` + ``overrides`` into RUN_DIR/config.toml unless it is there. Every rank
    may get here at once: each writes the same text to its own temp file and renames it."""
    run_dir.make_missing_dirs()
    if run_dir.config_path.exists():
        return
    if preset is None:
        raise ConfigError(f"{run_dir.config_path}: no config.toml here; pass --preset NAME_OR_PATH")
    pairs = {}
    for item in overrides:
        try:
            key, value = parse_setting(item)
        except ConfigError as err:  # the sentence `ddptui run --set` gives
            raise ConfigError(f"--set {err}") from None
        pairs[key] = value
    config = apply_overrides(load_preset(preset), pairs)
    write_atomic(run_dir.config_path, to_toml(config))


def _environment_int(name: str) -> int:
    value = os.environ.get(name)
    if value is None or not value.isdigit():
        raise ConfigError(
            f"{name} is {value!r} in the environment; run this module under torchrun, which sets "
            "RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT"
        )
    return int(value)


def _write_summary(run_dir: RunDir, status: RunStatus) -> None:
    """Under torchrun there is no ddptui launcher: the rank that ends the run settles it."""
    problem = settle_run(run_dir, build_summary(run_dir, status))
    if problem:
        print(f"ddptui: {problem}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m engine.train.worker",
        description="One ddptui training rank under torchrun (rank and world from the environment).",
    )
    parser.add_argument("run_dir", type=Path, help="the run directory (made if missing)")
    parser.add_argument("--preset", help="preset name or .toml path, when RUN_DIR has no config")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one preset value (repeatable)",
    )
    args = parser.parse_args(argv)
    run_dir = RunDir(args.run_dir)
    try:
        rank = _environment_int("RANK")
        local_rank = _environment_int("LOCAL_RANK")
        world_size = _environment_int("WORLD_SIZE")
        write_config_if_missing(run_dir, args.preset, args.overrides)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    prepare_stack_dumps(str(run_dir.path.resolve()))  # torchrun passes no run directory down
    print(f"rank {rank}: output goes to {run_dir.rank_log_path(rank)}", file=sys.stderr)
    redirect_output(run_dir.rank_log_path(rank))
    try:
        run_rank(run_dir, rank=rank, local_rank=local_rank, world_size=world_size)
    except BaseException:
        try:  # the first rank to fail settles the run (a summary already there stands)
            _write_summary(run_dir, RunStatus.FAILED)
        except Exception:
            traceback.print_exc()
        return 1
    if rank == 0:
        _write_summary(run_dir, RunStatus.COMPLETED)
    return 0


if __name__ == "__main__":
    end_process(main())

"""The launcher: ``python -m engine.train.launch RUN_DIR`` starts the ranks of one run and supervises them.

It sets the environment every rank inherits (run marker, rendezvous, GPU set, thread split) before
anything touches CUDA, checks the machine can hold the run, starts the ranks (the engine's with
``torch.multiprocessing.spawn``, a user's script as one ``engine.train.script_rank`` process per
device), records their pids and start times in run.json, and hands them to
``engine.train.supervisor``, which watches them to the end (failures, stalls, stragglers, SIGTERM).

A failed attempt starts again from the newest checkpoint as ``supervision.max_restarts`` allows
(``engine.train.restarts``; each attempt's start and end: ``engine.train.attempt``). Whatever
happens, it writes summary.json and the final state in run.json before it exits. Two launchers with ``--nnodes 2 --node-rank 0|1 --master-addr --master-port`` form one run.
"""

from __future__ import annotations

if __name__ == "__mp_main__":
    # A rank spawned by this launcher re-imports this module as __mp_main__ before anything
    # else (torch included): tie it to the launcher first, so that it dies with it, and make its
    # stack askable.
    from engine.train.rank_bootstrap import bootstrap_rank

    bootstrap_rank()

import argparse
import os
import pickle
import subprocess
import sys
import traceback
from dataclasses import replace
from pathlib import Path

import psutil

from engine.core.common.disk_space import WriteFailed
from engine.core.common.run_environment import (
    LAUNCHER_PID_ENV,
    THREADS_ENV,
)
from engine.core.common.run_files import open_private
from engine.core.common.statuses import RunStatus
from engine.core.config.schema import ConfigError, RunConfig
from engine.core.config.toml_io import load_config
from engine.core.host import gpus
from engine.core.host.capacity import available_memory_bytes, usable_cores
from engine.core.host.outside_load import OutsideLoad
from engine.core.plan.resource_guard import check_resources
from engine.core.plan.run_plan import RunPlan, plan_run
from engine.core.procs.process_identity import ProcessRef
from engine.core.procs.run_leftovers import end_leftovers
from engine.core.procs.run_proof import RunMarker
from engine.core.procs.stopping import stop_processes
from engine.core.runs.recorded_environment import RecordedEnvironment
from engine.core.runs.rundir import (
    RunDir,
    RunDirError,
)
from engine.core.runs.summarize import build_summary
from engine.core.runs.summary import Failure
from engine.train.attempt import (
    AttemptBegin,
    AttemptEnd,
    final_info,
    record_start,
    write_final_state,
)
from engine.train.attempt import LauncherEvents as LauncherEvents  # where node_launch finds it
from engine.train.environment_record import record_environment, record_outside_load
from engine.train.launch_rendezvous import (
    LaunchError,
    prepare_rendezvous_file,
    rendezvous_environment,
    rendezvous_port,
)
from engine.train.memory_fault import own_memory_cgroup, remove_fault_cgroup
from engine.train.restarts import run_attempts
from engine.train.supervisor import supervise

EXIT_BAD_INPUT = 2


def threads_asked() -> int | None:
    """The CPU threads a rank was asked to use by OMP_NUM_THREADS in this process's environment
    (a whole number over 0), None when it is unset or is not one."""
    text = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


def rank_environment(
    run_dir: RunDir,
    plan: RunPlan,
    master_addr: str,
    master_port: int,
    nproc: int,
    cores: int | None = None,
) -> dict[str, str]:
    """The environment every rank inherits, set before any child touches CUDA. ``cores``: the
    cores the ranks share (this process's usable cores unless a scheduler gave fewer); each rank
    gets its share of them as its CPU threads, unless the run was started with OMP_NUM_THREADS
    set, which every rank then keeps (as torchrun does), so a user's choice is what ran and what
    environment.json records."""
    threads = threads_asked() or max(1, (cores or usable_cores()) // max(1, nproc))
    env = {
        **RunMarker.of_dir(run_dir.path).environment(),
        LAUNCHER_PID_ENV: str(os.getpid()),
        THREADS_ENV: str(threads),
        "OMP_NUM_THREADS": str(threads),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }
    if plan.devices.kind == "cuda":
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in plan.devices.gpu_indices)
    else:
        env["CUDA_VISIBLE_DEVICES"] = ""  # CPU runs never touch a GPU
    return env


def spawn_error(error_file: str | None) -> str:
    """The error a spawned rank raised, from the file torch.multiprocessing's wrapper pickles
    its traceback into: the way a rank reports when the disk refused its RankFailed event."""
    if not error_file:
        return ""
    try:
        with open(error_file, "rb") as f:
            text = pickle.load(f)
    except (OSError, EOFError, pickle.UnpicklingError):
        return ""
    last = next((line for line in reversed(str(text).splitlines()) if line.strip()), "")
    kind, _, message = last.partition(": ")
    # WriteFailed's message is a whole sentence (the path, the free space); others keep their type
    return message.strip() if kind.endswith("WriteFailed") else last.strip()


def plan_this_node(run_dir: RunDir) -> tuple[RunConfig, RunPlan]:
    """The run's config and this node's plan, refused when the machine cannot hold it (its
    warnings printed)."""
    config = load_config(run_dir.config_path)
    plan = plan_run(config, gpus.gpu_count())
    # ddptui run checked this already; `python -m engine.train.launch` on another node did not. The
    # estimate counts this launcher, which already holds its memory.
    own = psutil.Process().memory_info().rss
    resources = check_resources(plan, available_bytes=available_memory_bytes() + own)
    for warning in resources.warnings:
        print(f"ddptui: warning: {warning}", file=sys.stderr, flush=True)
    return config, plan


def launch(
    run_dir: RunDir,
    *,
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: str = "127.0.0.1",
    master_port: int | None = None,
) -> RunStatus:
    """Run one node's share of a run to the end, each restart included
    (``engine.train.restarts``); returns the final status."""
    config, plan = plan_this_node(run_dir)
    nproc = plan.world_size
    world_size = nproc * nnodes
    if nnodes > 1 and config.strategy.name != "ddp":
        raise LaunchError(
            f"strategy {config.strategy.name} runs on one machine; use ddp with --nnodes"
        )
    if nnodes > 1 and config.supervision.max_restarts > 0:
        # across machines, only a scheduler's backend (its batch job) starts every node again
        raise LaunchError(
            "supervision.max_restarts restarts a run on one machine or a scheduler's job, not "
            "launchers started by hand with --nnodes"
        )
    master_port = rendezvous_port(nnodes, node_rank, master_addr, master_port)
    os.environ.update(rank_environment(run_dir, plan, master_addr, master_port, nproc))
    os.environ.update(rendezvous_environment(run_dir, nnodes, master_addr, master_port))
    where = {"world_size": world_size, "node_rank": node_rank, "nnodes": nnodes}

    def attempt(begun: AttemptBegin, stop_requests: list[str]) -> AttemptEnd:
        return run_attempt(run_dir, config, plan, begun, stop_requests, **where)

    def finish(end: AttemptEnd) -> None:
        write_final_state(run_dir, end.info, end.summary, end.events)

    ranks = node_ranks(node_rank, nproc)
    return run_attempts(run_dir, config, ranks, attempt, finish)


def run_attempt(
    run_dir: RunDir,
    config: RunConfig,
    plan: RunPlan,
    begun: AttemptBegin,
    stop_requests: list[str],
    *,
    world_size: int,
    node_rank: int,
    nnodes: int,
) -> AttemptEnd:
    """One attempt of this node's share: record its start, start and supervise its ranks, and
    build its end (the processes that outlived them stopped or left, as the preset says)."""
    base, events = record_start(
        run_dir, config, plan, world_size=world_size, node_rank=node_rank, nnodes=nnodes,
        attempt=begun,
    )  # fmt: skip
    status, failure, reason = RunStatus.FAILED, None, ""
    outside_load = OutsideLoad()
    environment: RecordedEnvironment | None = None
    processes: dict[int, psutil.Process] = {}
    error_files: list[str | None] = []
    ranks = node_ranks(node_rank, plan.world_size)
    try:
        if nnodes == 1:
            prepare_rendezvous_file(run_dir)
        if config.script.given:
            processes.update(start_script_ranks(run_dir, node_rank, ranks, world_size))
        else:
            spawned, error_files = spawn_engine_ranks(run_dir, ranks, world_size)
            processes.update(spawned)
        run_dir.write_run_info(
            replace(
                base,
                ranks=tuple(ProcessRef(p.pid, p.create_time()) for p in processes.values()),
                global_ranks=tuple(processes),
            )
        )
        # after the spawn: the engine's ranks are started through torch, whose versions it has
        environment = record_environment(run_dir, plan)
        status, failure, reason = supervise(
            run_dir,
            config,
            processes,
            events,
            base.oom_baseline,
            # a script rank has no spawn error file: its log's tail is its evidence
            error_of=lambda rank: spawn_error(
                dict(zip(ranks, error_files, strict=False)).get(rank)
            ),
            stop_requests=stop_requests,
            stop_stalled=config.supervision.max_restarts > 0,
        )
    except BaseException as err:  # the summary is written whatever happened
        reason = f"the launcher failed: {type(err).__name__}: {err}"
        failure = Failure(rank=None, error=reason, traceback=traceback.format_exc())
        status = RunStatus.KILLED if isinstance(err, KeyboardInterrupt) else RunStatus.FAILED
        live = [p for p in processes.values() if p.is_running()]
        stop_processes(live, grace=3.0)
    finally:
        remove_rank_leftovers(run_dir, processes, error_files)
        record_outside_load(run_dir, environment, outside_load)
    summary = build_summary(run_dir, status, failure, reason)
    leftovers = end_leftovers(
        RunMarker.of_dir(run_dir.path), leave=config.supervision.leftovers == "leave"
    )
    final = final_info(base, status, processes)
    return AttemptEnd(status, final, replace(summary, leftovers=leftovers), events)


def remove_rank_leftovers(
    run_dir: RunDir, processes: dict[int, psutil.Process], error_files: list[str | None]
) -> None:
    """What the ranks needed and no reader does: the rendezvous file store, the spawn error
    files, and the cgroup an ``oom`` fault made (once its rank is gone)."""
    run_dir.rendezvous_path.unlink(missing_ok=True)
    for name in error_files:
        if name:
            Path(name).unlink(missing_ok=True)
    cgroup = own_memory_cgroup()
    for p in processes.values():
        remove_fault_cgroup(p.pid, cgroup)


def node_ranks(node_rank: int, nproc: int) -> tuple[int, ...]:
    """The global rank of each local rank this launcher starts: node ``node_rank`` of a run with
    ``nproc`` ranks a node holds the next ``nproc``. The one place a rank gets its number; run.json
    records it (``RunInfo.ranked``), so no reader works it out again."""
    return tuple(node_rank * nproc + local_rank for local_rank in range(nproc))


def spawn_engine_ranks(
    run_dir: RunDir, ranks: tuple[int, ...], world_size: int
) -> tuple[dict[int, psutil.Process], list[str | None]]:
    """The engine's workload: ``torch.multiprocessing.spawn`` of ``spawn_entry``, one per device,
    local rank i as global rank ``ranks[i]``. Returns the ranks by global rank and the files each
    pickles its error into, in the same order."""
    import torch.multiprocessing as mp  # only now: the environment above is in place

    from engine.train.worker import spawn_entry

    context = mp.start_processes(
        spawn_entry,
        args=(str(run_dir.path), ranks, world_size),
        nprocs=len(ranks),
        join=False,
        start_method="spawn",
    )
    processes = {}
    for rank, proc in zip(ranks, context.processes, strict=True):
        assert proc.pid is not None
        processes[rank] = psutil.Process(proc.pid)
    return processes, list(context.error_files)


def start_script_ranks(
    run_dir: RunDir, node_rank: int, ranks: tuple[int, ...], world_size: int
) -> dict[int, psutil.Process]:
    """The user's script: one ``engine.train.script_rank`` process per device (local rank i as
    global rank ``ranks[i]``), with the torchrun contract in its environment and its log as its
    output. The script makes its own process group; its env:// meets at the launcher's store all
    the same (``engine.train.rendezvous``, routed by ``engine.train.script_rank``)."""
    processes = {}
    nproc = len(ranks)
    for local_rank, rank in enumerate(ranks):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(nproc),
            "GROUP_RANK": str(node_rank),
            "PYTHONUNBUFFERED": "1",
        }
        fd = open_private(run_dir.rank_log_path(rank), "append")
        with os.fdopen(fd, "ab") as log:
            child = subprocess.Popen(
                [sys.executable, "-m", "engine.train.script_rank", str(run_dir.path), str(rank)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        processes[rank] = psutil.Process(child.pid)
    return processes


def carry_run_marker(run_dir: RunDir, argv: list[str], module: str = "engine.train.launch") -> None:
    """Re-execute this launcher (same pid, same start time) with the run marker (its id and its
    directory) in its environment when it was started without it (by hand, on another node): `ddptui kill` and
    `clean` stop only processes that carry the marker from their start, which is what
    /proc/PID/environ shows; setting os.environ later would not."""
    marker = RunMarker.of_dir(run_dir.path)
    if marker.mismatch(os.environ, os.getpid()) is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    env = {**os.environ, **marker.environment()}
    os.execve(sys.executable, [sys.executable, "-m", module, *argv], env)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m engine.train.launch",
        description="Start and supervise the ranks of one ddptui run (its directory holds config.toml).",
    )
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--nnodes", type=int, default=1, help="machines in the run (default 1)")
    parser.add_argument(
        "--node-rank", type=int, default=0, help="this machine's index, 0 .. nnodes-1"
    )
    parser.add_argument("--master-addr", default="127.0.0.1", help="address of node 0")
    parser.add_argument("--master-port", type=int, default=None, help="free port on node 0")
    args = parser.parse_args(argv)
    run_dir = RunDir(args.run_dir)
    if argv is None:
        carry_run_marker(run_dir, sys.argv[1:])
    if not (0 <= args.node_rank < args.nnodes):
        print(f"--node-rank {args.node_rank} is outside 0..{args.nnodes - 1}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        status = launch(
            run_dir,
            nnodes=args.nnodes,
            node_rank=args.node_rank,
            master_addr=args.master_addr,
            master_port=args.master_port,
        )
    except WriteFailed as err:  # even the space reserve could not hold the summary
        print(f"ddptui: {err}", file=sys.stderr)
        return 1
    except (ConfigError, LaunchError, RunDirError) as err:
        print(f"ddptui: {err}", file=sys.stderr)
        if run_dir.config_path.exists() and not run_dir.summary_path.exists():
            # Nothing started, but whoever watches this directory learns why.
            try:
                summary = build_summary(
                    run_dir, RunStatus.FAILED, Failure(rank=None, error=str(err)), str(err)
                )
                run_dir.write_summary(summary)
            except (ConfigError, RunDirError, OSError):
                pass
        return EXIT_BAD_INPUT
    return 0 if status == RunStatus.COMPLETED else 1


if __name__ == "__main__":
    sys.exit(main())

"""One node's launcher of a run on Slurm: ``python -m engine.train.node_launch RUN_DIR``, started by
``srun --ntasks-per-node=1`` on every node of the job (the batch script ``engine.core.ops
.slurm_submit`` writes), and ``python -m engine.train.node_launch --finish RUN_DIR`` at the end of
that script.

Each node launcher does on its node what ``engine.train.launch`` does on one machine, with the same
pieces: the run marker from its first instruction, the environment every rank inherits, the rank
start (orphan-proof ranks, stack-dump handler, per-rank events and logs), the supervision (stalls
judged on its ranks, stacks of the whole run when one stalls), and its own part of the record:

- its node rank is Slurm's (``SLURM_NODEID``); it numbers its ranks ``node rank * ranks per node +
  local rank`` and records those numbers, with its own process and its ranks', in
  ``nodes/<node>.json`` (``engine.core.backends.slurm.records``): readers go by that record;
- node 0 serves the c10d store: its rank 0 binds it on node 0's own address only, and node 0's
  launcher publishes that address and a free port (``slurm/rendezvous.json``) for the others;
- it answers the stack-dump signal Slurm delivers (``scancel --signal=USR2``) by passing it to its
  own ranks, and is never ended by it;
- it samples its node's GPUs (NVML) into ``gpus/<node>.json`` while its ranks run;
- on SIGTERM (``scancel``, a time limit, a node failure elsewhere) it stops its ranks within
  Slurm's grace and, at its end whatever happened, proves its node clean: every process of its
  attempt carrying the run's marker on this node is gone, a double-forked daemon of a rank found
  and stopped and named; that proof is in its record, which ``ddptui kill`` waits for;
- it runs the attempt run.json names (a restart after a failure or a lost node:
  ``engine.core.backends.slurm.restarts``; ``ddptui resume``): its ranks get the attempt's
  environment (``engine.train.attempt``: its number, the checkpoint they go on from), and a
  launcher of an earlier attempt that outlived its job (a node cut off, then back) never writes
  into the later attempt's records nor stops its processes.

The run's summary is written once, from every node's record and Slurm's own word on the job
(``engine.core.backends.slurm.state``): by the batch script's last step when every node said how
its share ended (``engine.core.backends.slurm.job_steps finish``; ``--finish`` here does the same
for a batch script written before it), else by the first reader that finds the job over
(``ddptui run``'s follower, ``kill``, ``show``).
"""

from __future__ import annotations

if __name__ == "__mp_main__":
    # An engine rank spawned by this launcher re-imports this module first: tie it to its
    # launcher before anything else, as engine.train.launch does.
    from engine.train.rank_bootstrap import bootstrap_rank

    bootstrap_rank()

import argparse
import contextlib
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import psutil

from engine.core.backends.slurm.node_proof import prove_node_clean
from engine.core.backends.slurm.records import (
    NODE_STOP_GRACE_SECONDS,
    NodeRecord,
    node_events_path,
    node_log_path,
    store_address_path,
    write_node_record,
)
from engine.core.backends.slurm.restarts import attempt_start
from engine.core.common.disk_space import WriteFailed
from engine.core.common.run_environment import NODE_ENV, STACK_DUMP_SIGNAL
from engine.core.common.run_files import open_private, write_json_atomic
from engine.core.common.statuses import RunStatus
from engine.core.config.schema import ConfigError, RunConfig
from engine.core.host.capacity import usable_cores
from engine.core.host.gpus import sample_gpus
from engine.core.host.outside_load import OutsideLoad
from engine.core.procs.process_identity import ref_of
from engine.core.procs.stopping import stop_processes
from engine.core.runs.events import NodeFinished, RunStarted
from engine.core.runs.node_files import NodeGpus, check_node_name, read_json_file, write_node_gpus
from engine.core.runs.recorded_environment import RecordedEnvironment
from engine.core.runs.resume_point import resume_point
from engine.core.runs.rundir import RunDir, RunDirError, this_host
from engine.core.stacks.snapshot import StackSnapshot
from engine.train.attempt import AttemptBegin, begin_attempt
from engine.train.environment_record import record_environment, record_outside_load
from engine.train.launch import (
    EXIT_BAD_INPUT,
    LauncherEvents,
    carry_run_marker,
    node_ranks,
    plan_this_node,
    rank_environment,
    remove_rank_leftovers,
    spawn_engine_ranks,
    spawn_error,
    start_script_ranks,
)
from engine.train.launch_rendezvous import (
    LaunchError,
    find_free_port,
    prepare_rendezvous_file,
    rendezvous_environment,
)
from engine.train.supervisor import supervise

RENDEZVOUS_WAIT_SECONDS = 120.0  # for node 0 to publish where its rank 0 serves the store
GPU_SAMPLE_SECONDS = 2.0


@dataclass(frozen=True)
class SlurmNode:
    """This node, as Slurm's environment of the step names it."""

    name: str
    index: int  # SLURM_NODEID: 0 .. count-1
    count: int
    job_id: str
    step_id: str
    restarts: int = 0

    @classmethod
    def from_environ(cls) -> SlurmNode:
        env = os.environ
        missing = [
            v
            for v in ("SLURM_JOB_ID", "SLURM_NODEID", "SLURM_NNODES", "SLURMD_NODENAME")
            if not env.get(v)
        ]
        if missing:
            raise LaunchError(
                f"{', '.join(missing)} not set: the node launcher runs as a task of a Slurm step "
                "(srun), which sets them"
            )
        return cls(
            name=check_node_name(env["SLURMD_NODENAME"]),
            index=int(env["SLURM_NODEID"]),
            count=int(env.get("SLURM_STEP_NUM_NODES") or env["SLURM_NNODES"]),
            job_id=env["SLURM_JOB_ID"],
            step_id=env.get("SLURM_STEP_ID", ""),
            restarts=int(env.get("SLURM_RESTART_COUNT") or 0),
        )


def slurm_cores() -> int:
    """The cores Slurm gave this node's task (``--cpus-per-task``), where it bounds them below
    what this process may run on: threads are split over those, not over the whole machine."""
    given = os.environ.get("SLURM_CPUS_PER_TASK", "")
    cores = usable_cores()
    return min(cores, int(given)) if given.isdigit() and int(given) > 0 else cores


# ---- where the ranks meet ---------------------------------------------------------------------


def own_address(node: SlurmNode) -> str:
    """The address this node is reached at: its Slurm name resolved, else its host name's."""
    for name in (node.name, socket.gethostname()):
        with contextlib.suppress(OSError):
            return str(socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0])
    raise LaunchError(f"node {node.name}: neither its name nor {socket.gethostname()} resolves")


def meet(run_dir: RunDir, node: SlurmNode) -> tuple[str, int]:
    """(address, port) of the store: node 0 picks a free port on its own address and publishes
    both; the others wait for that, from this very job step (a requeued job's file is stale)."""
    path = store_address_path(run_dir.path)
    tag = {"job_id": node.job_id, "step_id": node.step_id, "restarts": node.restarts}
    if node.index == 0:
        address = own_address(node)
        port = find_free_port(address)
        write_json_atomic(path, {**tag, "address": address, "port": port, "node": node.name})
        return address, port
    deadline = time.monotonic() + RENDEZVOUS_WAIT_SECONDS
    while time.monotonic() < deadline:
        with contextlib.suppress(ValueError):
            data = read_json_file(run_dir.path, path)
            if data is not None and all(data.get(k) == v for k, v in tag.items()):
                return str(data["address"]), int(data["port"])
        time.sleep(0.1)
    raise LaunchError(
        f"node {node.name}: node 0 did not say where the ranks meet within "
        f"{RENDEZVOUS_WAIT_SECONDS:g} s ({path})"
    )


# ---- what runs beside the ranks ---------------------------------------------------------------


class GpuSampler(threading.Thread):
    """This node's GPUs, sampled into ``gpus/<node>.json`` every ``GPU_SAMPLE_SECONDS``."""

    def __init__(self, run_dir: RunDir, node: str) -> None:
        super().__init__(name="gpu-sampler", daemon=True)
        self.run_dir = run_dir
        self.node = node
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            sample = NodeGpus(node=self.node, time=time.time(), inventory=sample_gpus())
            with contextlib.suppress(OSError):
                write_node_gpus(self.run_dir.path, sample)
            self.done.wait(GPU_SAMPLE_SECONDS)


def pass_stack_signal_to(processes: dict[int, psutil.Process]) -> None:
    """Answer the stack-dump signal (``scancel --signal=USR2`` reaches the step's tasks, which are
    the node launchers) by passing it on to this node's ranks; this launcher lives on."""

    def forward(_signum: int, _frame: object) -> None:
        for proc in list(processes.values()):
            with contextlib.suppress(psutil.Error):
                proc.send_signal(STACK_DUMP_SIGNAL)

    signal.signal(STACK_DUMP_SIGNAL, forward)


# ---- one node's share of the run --------------------------------------------------------------


def _stacks_of_the_run(run_dir: RunDir) -> Callable[[str], StackSnapshot | None]:
    """A stall's snapshot of every rank of the run, on every node (one taker at a time)."""
    from engine.core.backends.slurm.stacks import snapshot_slurm_run

    return lambda reason: snapshot_slurm_run(run_dir, reason=reason, wait_for_other=0.0)


def this_attempt(run_dir: RunDir, config: RunConfig) -> AttemptBegin:
    """The attempt run.json names, as it began (a later one goes on from the newest
    checkpoint)."""
    info = run_dir.read_run_info()
    if info.attempt <= 1:
        return AttemptBegin(1)
    return AttemptBegin(info.attempt, attempt_start(info), resume_point(run_dir, config))


def record_node_start(
    run_dir: RunDir, node: SlurmNode, devices: str, world_size: int, attempt: AttemptBegin
) -> tuple[NodeRecord, LauncherEvents]:
    """This node launcher's record (no ranks yet) and its RunStarted event, in its own events."""
    me = psutil.Process()
    record = NodeRecord(
        node=node.name,
        node_rank=node.index,
        host=this_host(),
        job_id=node.job_id,
        step_id=node.step_id,
        launcher=ref_of(me),
        state=RunStatus.RUNNING,
        attempt=attempt.number,
    )
    run_dir.make_missing_dirs()
    write_node_record(run_dir.path, record)
    events = LauncherEvents(node_events_path(run_dir.path, node.name))
    resumed = attempt.resume_from
    events.write(
        RunStarted(
            run_id=run_dir.run_id,
            world_size=world_size,
            launcher_pid=me.pid,
            devices=devices,
            stops_recorded=True,
            attempt=attempt.number,
            started_by="" if attempt.number == 1 else attempt.start.value,
            resumed_from_step=resumed.global_step if resumed else None,
            resumed_from_epoch=resumed.epoch if resumed else None,
        )
    )
    return record, events


def write_final_record(run_dir: RunDir, record: NodeRecord) -> None:
    """This launcher's record at its end, where its attempt's records are: the run directory's
    top, or, once a later attempt began (this launcher outlived its job), below attempts/."""
    try:
        current = run_dir.read_run_info().attempt
    except RunDirError:
        current = record.attempt
    where = (
        run_dir.path if current == record.attempt else run_dir.layout.attempt(record.attempt).path
    )
    if where.is_dir():
        write_node_record(where, record)


def launch_node(run_dir: RunDir, node: SlurmNode) -> RunStatus:
    """Run this node's share of the run to its end and record it; returns how its share ended."""
    config, plan = plan_this_node(run_dir)
    nproc = plan.world_size
    world_size = nproc * node.count
    if node.count > 1 and config.strategy.name != "ddp":
        raise LaunchError(
            f"strategy {config.strategy.name} runs on one machine; use ddp across nodes"
        )
    if node.count > 1:
        address, port = meet(run_dir, node)
    else:  # one node: its ranks meet at a file store in the run directory, as on one machine
        address, port = "127.0.0.1", find_free_port()
        prepare_rendezvous_file(run_dir)
    os.environ.update(rank_environment(run_dir, plan, address, port, nproc, slurm_cores()))
    os.environ.update(rendezvous_environment(run_dir, node.count, address, port))
    os.environ[NODE_ENV] = node.name
    ranks = node_ranks(node.index, nproc)
    attempt = this_attempt(run_dir, config)
    begin_attempt(run_dir, attempt, ranks, script=config.script.given)
    devices = plan.devices.describe()
    record, events = record_node_start(run_dir, node, devices, world_size, attempt)
    processes: dict[int, psutil.Process] = {}
    pass_stack_signal_to(processes)
    sampler = GpuSampler(run_dir, node.name)
    sampler.start()
    error_files: list[str | None] = []
    status, reason = RunStatus.FAILED, ""
    outside_load = OutsideLoad()
    environment: RecordedEnvironment | None = None
    try:
        if config.script.given:
            processes.update(start_script_ranks(run_dir, node.index, ranks, world_size))
        else:
            spawned, error_files = spawn_engine_ranks(run_dir, ranks, world_size)
            processes.update(spawned)
        record = replace(
            record, ranks=tuple(ref_of(p) for p in processes.values()), global_ranks=ranks
        )
        write_node_record(run_dir.path, record)
        if node.index == 0:  # one record a run: node 0's ranks hold rank 0
            environment = record_environment(run_dir, plan)
        status, _failure, reason = supervise(
            run_dir,
            config,
            processes,
            events,
            error_of=lambda rank: spawn_error(
                dict(zip(ranks, error_files, strict=False)).get(rank)
            ),
            take_stacks=_stacks_of_the_run(run_dir),
            signal_stop_grace=NODE_STOP_GRACE_SECONDS,
            stop_stalled=config.supervision.max_restarts > 0,  # a stall ends it, to restart
        )
    except BaseException as err:  # the record is written whatever happened
        reason = f"the node launcher failed: {type(err).__name__}: {err}"
        status = RunStatus.KILLED if isinstance(err, KeyboardInterrupt) else RunStatus.FAILED
        traceback.print_exc()
        stop_processes([p for p in processes.values() if p.is_running()], grace=1.0)
    finally:
        sampler.done.set()
        remove_rank_leftovers(run_dir, processes, error_files)
        record_outside_load(run_dir, environment, outside_load)
        proof = prove_node_clean(run_dir, node.name, processes, attempt.number)
        final = replace(record, state=status, reason=reason, finished=time.time(), proof=proof)
        with contextlib.suppress(WriteFailed, OSError):
            write_final_record(run_dir, final)
        events.write(NodeFinished(node=node.name, status=status, reason=reason))
        events.close()
    return status


def redirect_own_output(run_dir: RunDir, node: str) -> None:
    """This launcher's own output to ``logs/launcher-<node>.log`` (its ranks have their own)."""
    fd = open_private(node_log_path(run_dir.path, node), "append")
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def run_node(run_dir: RunDir) -> int:
    try:
        node = SlurmNode.from_environ()
    except (LaunchError, ValueError) as err:
        print(f"ddptui: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if not run_dir.config_path.is_file():
        print(
            f"ddptui: node {node.name} ({socket.gethostname()}) cannot see the run directory "
            f"{run_dir.path} (no config.toml there): put --runs-dir on storage every node mounts",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_BAD_INPUT
    redirect_own_output(run_dir, node.name)
    try:
        status = launch_node(run_dir, node)
    except (ConfigError, LaunchError, RunDirError, WriteFailed) as err:
        print(f"ddptui: node {node.name}: {err}", file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT
    return 0 if status == RunStatus.COMPLETED else 1


def finish_run(run_dir: RunDir) -> int:
    """The last step of a batch script written before ``job_steps``: settle the run once every
    node launcher said how its share ended, as ``job_steps finish`` does (a restart it decides
    on would not be started by such a script: its runs have no restarts)."""
    from engine.core.backends.slurm.job_steps import main as job_step

    job_step(["finish", str(run_dir.path)])
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m engine.train.node_launch",
        description="One node's launcher of a ddptui run on Slurm (a task of its srun step).",
    )
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--finish", action="store_true", help="settle the run at the job's end")
    args = parser.parse_args(argv)
    run_dir = RunDir(args.run_dir)
    if args.finish:
        return finish_run(run_dir)
    if argv is None:  # re-executed with the run's marker (id and directory) unless it has it
        carry_run_marker(run_dir, sys.argv[1:], module="engine.train.node_launch")
    return run_node(run_dir)


if __name__ == "__main__":
    sys.exit(main())

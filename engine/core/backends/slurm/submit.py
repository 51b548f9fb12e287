"""Starting a run on Slurm: check what can be checked before anything is submitted, make the run
directory, write the batch script into it and submit it (``sbatch --parsable``), or, inside an
allocation (``salloc``, ``SLURM_JOB_ID`` set), start the step with ``srun`` in it.

The batch script starts one node launcher per node (``srun --ntasks-per-node=1 python -m
engine.train.node_launch RUN_DIR``), each the same rank start as on one machine, then settles the
run once every node reported, or starts the next attempt in the same allocation after a failure
(``engine.core.backends.slurm.job_steps``); a run with restarts (``supervision.max_restarts``) is
submitted ``--requeue``, so that Slurm requeues its job after a node failure, and its script's
first step begins the next attempt (``engine.core.backends.slurm.restarts``). ``resubmit_run``
submits an ended run again as its next attempt (``ddptui resume``). Bad input (no sbatch, an
unknown partition, more nodes than the partition has, GPU indices Slurm cannot honour, a run
directory only this machine can see, restarts asked of a step of your own allocation) is a
ConfigError, one sentence, before anything is made or submitted.

Plain Python: Slurm's commands on PATH, with ``SLURM_CONF`` as the user has it.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from engine.core.backends.local.start import LauncherHandle, create_run_dir
from engine.core.backends.slurm.cluster import (
    SlurmCluster,
    SlurmUnavailable,
    expand_hostlist,
    read_cluster,
    run_slurm,
    slurm_command,
)
from engine.core.backends.slurm.config import SlurmConfig
from engine.core.backends.slurm.jobs import QUEUE, read_job
from engine.core.backends.slurm.records import (
    SlurmPlacement,
    batch_script_path,
    job_output_path,
)
from engine.core.backends.slurm.state import LISTING_GRACE_SECONDS
from engine.core.backends.slurm.stop import request_cancel
from engine.core.backends.slurm.watch import SLURM_DIR
from engine.core.common.config_error import ConfigError
from engine.core.common.disk_space import write_failure
from engine.core.common.run_environment import RUN_DIR_ENV, RUN_MARKER_ENV
from engine.core.common.run_files import SpaceReserve, open_private, write_atomic
from engine.core.common.statuses import StopRequester
from engine.core.config.devices import parse_device_spec
from engine.core.config.schema import RunConfig
from engine.core.plan.run_plan import RunPlan, plan_run
from engine.core.procs.process_identity import ProcessRef, identify
from engine.core.runs.rundir import (
    RunDir,
    RunDirError,
    RunInfo,
    this_host,
)

# File systems that live in one machine's memory: other nodes never see them.
LOCAL_ONLY_FILESYSTEMS = frozenset({"tmpfs", "ramfs", "devtmpfs"})


@dataclass(frozen=True)
class SlurmRequest:
    """A checked request: the run's plan on each node and what Slurm will be asked."""

    plan: RunPlan  # one node's share (devices of each node)
    nodes: int
    world_size: int  # 0 when each node decides its devices (all, auto)
    devices: str  # what run.json records: "cpu:1 on 2 nodes"
    in_allocation: str = ""  # the job id of the allocation this runs inside, if any


def node_plan(config: RunConfig) -> tuple[RunPlan, bool]:
    """One node's plan from ``devices.spec`` meaning the devices of each node, and whether its
    device count is known before a node looks (cpu:K, a GPU count) or not (all, auto)."""
    spec = parse_device_spec(config.devices.spec)
    if spec.kind == "gpus":
        raise ConfigError(
            f"--devices {config.devices.spec}: on Slurm each node's GPUs are Slurm's to choose; "
            "give a count per node (--devices 4) or all",
            key="devices.spec",
            reason="GPU indices on Slurm",
        )
    if spec.kind == "count":
        return plan_run(config, spec.count), True
    return plan_run(config, 0), spec.kind == "cpu"


def _filesystem_type(path: Path) -> str:
    """The type of the file system holding ``path`` (the longest mount point above it)."""
    resolved, best, kind = str(Path(os.path.abspath(path))), "", ""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return ""
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = resolved == point or resolved.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


def check_shared_storage(runs_dir: Path, cluster: SlurmCluster, nodes: tuple[str, ...]) -> None:
    """ConfigError when the run directory would be on storage only this machine sees (tmpfs)
    while some of ``nodes`` are other machines. More cannot be told from here: a node that
    cannot see the run directory fails the run with a sentence naming itself and the path."""
    here = this_host().split(".")[0]
    others = [n for n in nodes if (node := cluster.node(n)) and node.hostname.split(".")[0] != here]
    kind = _filesystem_type(runs_dir)
    if others and kind in LOCAL_ONLY_FILESYSTEMS:
        raise ConfigError(
            f"--runs-dir {runs_dir} is on {kind}, in this machine's memory, and Slurm's nodes "
            f"({', '.join(others[:3])}) cannot see it; give a --runs-dir on storage every node "
            "mounts",
            key="runs_dir",
            reason="run directory on local storage",
        )


def _allocation() -> str:
    return os.environ.get("SLURM_JOB_ID", "").strip()


def check_request(config: RunConfig, runs_dir: Path) -> SlurmRequest:
    """Everything that can be checked before submitting; ConfigError (one sentence) otherwise."""
    slurm = SlurmConfig.of(config)
    plan, known = node_plan(config)
    try:
        allocation = _allocation()
        slurm_command("srun" if allocation else "sbatch")
        slurm_command("srun")
        cluster = read_cluster()
    except SlurmUnavailable as err:
        raise ConfigError(f"--slurm: {err}", key="slurm", reason="Slurm is not reachable") from None
    if allocation and config.supervision.max_restarts > 0:
        raise ConfigError(
            f"--max-restarts {config.supervision.max_restarts}: inside your allocation (job "
            f"{allocation}, SLURM_JOB_ID) the run is a step of it, which ddptui does not start "
            "again; submit it from outside the allocation (a batch job of its own restarts)",
            key="supervision.max_restarts",
            reason="restarts of a step of your allocation",
        )
    if allocation:
        have = int(os.environ.get("SLURM_JOB_NUM_NODES", os.environ.get("SLURM_NNODES", "0")) or 0)
        if have and slurm.nodes > have:
            raise ConfigError(
                f"--nodes {slurm.nodes}: the allocation of job {allocation} (SLURM_JOB_ID) has "
                f"{have} node(s); ask salloc for more, or run ddptui outside the allocation",
                key="slurm.nodes",
                reason="more nodes than the allocation",
            )
        members = expand_hostlist(os.environ.get("SLURM_JOB_NODELIST", ""))
    else:
        partition = cluster.partition(slurm.partition)
        if partition is None:
            names = ", ".join(p.name for p in cluster.partitions) or "none"
            which = f"--partition {slurm.partition}" if slurm.partition else "the default partition"
            raise ConfigError(
                f"{which}: Slurm has no such partition (partitions: {names})",
                key="slurm.partition",
                reason="unknown partition",
            )
        if slurm.nodes > len(partition.nodes):
            raise ConfigError(
                f"--nodes {slurm.nodes}: partition {partition.name} has {len(partition.nodes)} "
                f"node(s) ({', '.join(partition.nodes[:8])})",
                key="slurm.nodes",
                reason="more nodes than the partition has",
            )
        members = partition.nodes
    check_shared_storage(runs_dir, cluster, members)
    per_node = plan.devices.describe() if known else config.devices.spec
    return SlurmRequest(
        plan=plan,
        nodes=slurm.nodes,
        world_size=plan.world_size * slurm.nodes if known else 0,
        devices=f"{per_node} on {slurm.nodes} node{'s' if slurm.nodes > 1 else ''}",
        in_allocation=allocation,
    )


# ---- the batch script ----------------------------------------------------------------------------


def _resources(config: RunConfig, request: SlurmRequest) -> list[str]:
    """What each node's one task needs: its CPU ranks' cores, or its GPUs."""
    spec = parse_device_spec(config.devices.spec)
    if spec.kind == "cpu":
        return [f"--cpus-per-task={request.plan.world_size}"]
    if spec.kind == "count":
        return [f"--gpus-per-node={spec.count}"]
    if spec.kind == "all":
        return ["--exclusive"]
    return []


def _export(run_dir: RunDir) -> str:
    """srun's environment: all of it, plus the run marker in full (id and directory: what proves a
    process the run's on any node). A directory whose path has a comma cannot go in srun's list;
    the node launcher then re-executes itself with it (``carry_run_marker``)."""
    path = str(run_dir.path.resolve())
    where = f"{RUN_DIR_ENV}={path}," if "," not in path else ""
    return f"--export=ALL,{RUN_MARKER_ENV}={run_dir.run_id},{where}PYTHONUNBUFFERED=1"


def srun_command(run_dir: RunDir, config: RunConfig, request: SlurmRequest) -> list[str]:
    """The step: one node launcher per node, carrying the run marker from its first instruction."""
    return [
        "srun",
        f"--nodes={request.nodes}",
        f"--ntasks={request.nodes}",
        "--ntasks-per-node=1",
        *(r for r in _resources(config, request) if r != "--exclusive"),
        "--kill-on-bad-exit=0",
        _export(run_dir),
        sys.executable,
        "-m",
        "engine.train.node_launch",
        str(run_dir.path.resolve()),
    ]


def _job_step(step: str, run_dir: RunDir) -> str:
    """The batch script's line for one of its own steps (``job_steps``)."""
    argv = (sys.executable, "-m", "engine.core.backends.slurm.job_steps", step, str(run_dir.path))
    return " ".join(shlex.quote(a) for a in argv)


def batch_script(run_dir: RunDir, config: RunConfig, request: SlurmRequest) -> str:
    """The batch script ``sbatch`` runs on the first node of the job (and again, from its
    start, when Slurm requeues the job)."""
    slurm = SlurmConfig.of(config)
    options = [
        f"--job-name=ddptui-{config.name}",
        f"--nodes={request.nodes}",
        "--ntasks-per-node=1",
        *_resources(config, request),
        f"--output={job_output_path(run_dir.path.resolve())}",
        "--open-mode=append",  # a requeued job's output goes on after the earlier run's
        f"--chdir={os.getcwd()}",
        # restarts left: Slurm requeues the job when a node of it fails (restarts.py)
        *(["--requeue"] if config.supervision.max_restarts > 0 else []),
    ]
    for key in ("partition", "time", "account", "qos"):
        value = getattr(slurm, key)
        if value:
            options.append(f"--{key}={value}")
    options += [f"--{k}={v}" if v else f"--{k}" for k, v in slurm.sbatch.items()]
    step = " ".join(shlex.quote(a) for a in srun_command(run_dir, config, request))
    return "\n".join(
        [
            "#!/bin/bash",
            *(f"#SBATCH {o}" for o in options),
            f"# ddptui run {run_dir.run_id}: a requeued job goes on as the run's next attempt",
            "# (or ends it); then one node launcher per node, and the run's end once every",
            "# node launcher said how its share ended, or its next attempt after a failure.",
            f"{_job_step('begin', run_dir)} || exit 1",
            "while :; do",
            f"    {step}",
            "    code=$?",
            f"    {_job_step('finish', run_dir)} || exit $code",
            "done",
            "",
        ]
    )


# ---- the job, followed ---------------------------------------------------------------------------


class SlurmJobHandle:
    """A submitted job as ``StartedRun.process``: ``poll`` / ``wait`` give 0 once it completed, 1
    once it ended otherwise, None while it waits or runs; ``send_signal`` (Ctrl-C in ``ddptui
    run``) ends it as ``ddptui kill`` would."""

    def __init__(self, run_dir: RunDir, job_id: str) -> None:
        self.run_dir = run_dir
        self.job_id = job_id
        self.pid = 0  # no process of this machine
        self.submitted = time.monotonic()

    def poll(self) -> int | None:
        found = read_job(self.job_id)
        if found.job is None:  # not listed yet, or Slurm cannot be asked now: not over
            listed_by_now = time.monotonic() - self.submitted > LISTING_GRACE_SECONDS
            return 1 if listed_by_now and not found.problem else None
        if not found.job.state.ended:
            return None
        return 0 if found.job.state.value == "COMPLETED" else 1

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"job {self.job_id}", timeout or 0.0)
            time.sleep(0.5)
        return code

    def send_signal(self, sig: int) -> None:
        if sig in (signal.SIGTERM, signal.SIGINT):
            placement = SlurmPlacement.of(self.run_dir.read_run_info())
            if placement is not None:
                request_cancel(self.run_dir, placement, by=StopRequester.CTRL_C)


def _info(run_dir: RunDir, config: RunConfig, request: SlurmRequest) -> RunInfo:
    slurm = SlurmConfig.of(config)
    begun = RunInfo.begun(
        run_dir.run_id, config.name, world_size=request.world_size, devices=request.devices
    )
    return replace(
        begun,
        nnodes=request.nodes,
        placement=SlurmPlacement(
            job_id=request.in_allocation,
            nodes=request.nodes,
            partition=slurm.partition,
            time_limit=slurm.time,
            in_allocation=bool(request.in_allocation),
            submitted=time.time(),
        ).placement(),
    )


def _submit(
    run_dir: RunDir, config: RunConfig, request: SlurmRequest
) -> tuple[str, LauncherHandle]:
    """sbatch the script (the job id, its handle), or start the step in this allocation (the
    allocation's job id, the srun process)."""
    if request.in_allocation:
        fd = open_private(job_output_path(run_dir.path), "append")
        with os.fdopen(fd, "ab") as log:
            process = subprocess.Popen(
                srun_command(run_dir, config, request),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return request.in_allocation, process
    script = batch_script_path(run_dir.path)
    write_atomic(script, batch_script(run_dir, config, request))
    try:
        done = run_slurm("sbatch", "--parsable", str(script), timeout=60.0)
    except SlurmUnavailable as err:
        raise ConfigError(
            f"Slurm refused the job: {str(err).split(': ', 1)[-1]}",
            key="slurm",
            reason="sbatch refused the job",
        ) from None
    job_id = done.stdout.strip().split(";")[0]
    QUEUE.forget()
    return job_id, SlurmJobHandle(run_dir, job_id)


def _submit_recorded(
    run_dir: RunDir, config: RunConfig, request: SlurmRequest, info: RunInfo
) -> LauncherHandle:
    """Submit the run whose run.json is ``info`` and record its job there (and, inside an
    allocation, the srun that started its step)."""
    job_id, follow = _submit(run_dir, config, request)
    placement = SlurmPlacement.of(info)
    assert placement is not None
    launcher: ProcessRef | None = None
    if isinstance(follow, subprocess.Popen):
        launcher = identify(follow.pid)
    placed = replace(placement, job_id=job_id).placement()
    run_dir.write_run_info(replace(info, launcher=launcher, placement=placed))
    return follow


def submit_run(
    config: RunConfig, runs_dir: Path, *, run_id: str | None = None
) -> tuple[RunDir, RunPlan, LauncherHandle]:
    """Check, make the run directory (config.toml, run.json with the job, the space reserve) and
    submit. Returns the run directory, one node's plan and what follows the job (a
    ``SlurmJobHandle``, or the srun process inside an allocation). ConfigError or RunDirError,
    with nothing made or submitted, when the request cannot be met."""
    request = check_request(config, Path(runs_dir))
    run_dir, info = create_run_dir(
        config, runs_dir, run_id, lambda new: _info(new, config, request), folders=(SLURM_DIR,)
    )
    try:
        follow = _submit_recorded(run_dir, config, request, info)
    except BaseException as err:
        shutil.rmtree(run_dir.path, ignore_errors=True)
        if isinstance(err, OSError):
            raise RunDirError(write_failure(run_dir.path, err)) from None
        raise
    return run_dir, request.plan, follow


def resubmit_run(
    run_dir: RunDir, config: RunConfig, request: SlurmRequest, *, attempt: int, created: float
) -> LauncherHandle:
    """Submit the ended run in ``run_dir`` again as its attempt ``attempt`` (``ddptui resume``;
    the attempt before it moved below attempts/ already): run.json for it, with the new job, and
    the space reserve. ConfigError when Slurm refuses the job, OSError when the run directory
    cannot be written."""
    begun = _info(run_dir, config, request)
    placement = SlurmPlacement.of(begun)
    assert placement is not None
    placed = replace(placement, attempt_start="resume").placement()
    now = time.time()
    info = replace(begun, created=created, attempt=attempt, attempt_started=now, placement=placed)
    run_dir.write_run_info(info)
    SpaceReserve(run_dir.path).make()
    return _submit_recorded(run_dir, config, request, info)

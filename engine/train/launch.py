"""The launcher: ``python -m engine.train.launch RUN_DIR`` starts the ranks of one run and supervises them.

It sets the environment every rank inherits (run marker, free port, GPU set, thread split) before
anything touches CUDA, starts the ranks with ``torch.multiprocessing.spawn``, records their pids and
start times in run.json, and then watches them:

- the first rank to fail is the root cause; the others get ``supervision.failure_grace_seconds``
  to exit, then SIGKILL (a rank stuck in a collective never exits by itself);
- a rank silent for ``supervision.stall_seconds`` is reported stalled, a rank whose step time is
  ``supervision.straggler_factor`` times the others' median is reported straggling, and with
  ``supervision.kill_stalled_after`` a stalled run is stopped;
- SIGTERM or SIGINT to the launcher stops the ranks (SIGTERM, grace, SIGKILL) and ends the run as
  killed.

Whatever happens, it writes summary.json and the final state in run.json before it exits.
Two launchers with ``--nnodes 2 --node-rank 0|1 --master-addr --master-port`` form one run.
"""

from __future__ import annotations

if __name__ == "__mp_main__":
    # A rank spawned by this launcher re-imports this module as __mp_main__ before anything
    # else (torch included): tie it to the launcher first, so that it dies with it.
    from engine.train.rank_bootstrap import bind_to_parent

    bind_to_parent()

import argparse
import contextlib
import os
import signal
import socket
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path

import psutil

from engine.core import gpus
from engine.core.config import ConfigError, RunConfig, load_config
from engine.core.events import (
    EventTail,
    EventWriter,
    RankExited,
    RankFailed,
    RankFinished,
    RankStalled,
    RankStraggling,
    RunFinished,
    RunStarted,
    StepProgress,
)
from engine.core.oom_evidence import oom_kill_count, sigkill_cause
from engine.core.plan import RunPlan, plan_run
from engine.core.process_kill import stop_processes
from engine.core.resource_guard import available_memory_bytes, check_resources
from engine.core.rundir import (
    COMPLETED,
    FAILED,
    KILLED,
    RUN_MARKER_ENV,
    RUNNING,
    ProcessRef,
    RunDir,
    RunDirError,
    RunInfo,
    this_host,
)
from engine.core.summary import Failure, build_summary, exit_status
from engine.train.memory_fault import own_memory_cgroup, remove_fault_cgroup
from engine.train.rank_bootstrap import LAUNCHER_PID_ENV

POLL_SECONDS = 0.1
STARTUP_ALLOWANCE_SECONDS = 60.0
EXIT_BAD_INPUT = 2


class LaunchError(Exception):
    """Bad input found before any rank started: one sentence for the user."""


def find_free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def check_port_free(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as err:
            raise LaunchError(
                f"--master-port {port} on {host} is in use or not bindable ({err.strerror}); "
                "pick another port or leave it out to get a free one"
            ) from None


def rank_environment(
    run_dir: RunDir, plan: RunPlan, master_addr: str, master_port: int, nproc: int
) -> dict[str, str]:
    """The environment every rank inherits, set before any child touches CUDA."""
    cores = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    )
    threads = max(1, cores // max(1, nproc))
    env = {
        RUN_MARKER_ENV: run_dir.run_id,
        "DDPTUI_RUN_DIR": str(run_dir.path.resolve()),
        LAUNCHER_PID_ENV: str(os.getpid()),
        "DDPTUI_THREADS_PER_RANK": str(threads),
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


@dataclass
class RankWatch:
    """What the launcher knows of one local rank."""

    rank: int
    pid: int | None = None
    process: psutil.Process | None = None
    tail: EventTail | None = None
    last_event: float = field(default_factory=time.time)
    reported: bool = False  # has this rank written any event yet
    step_seconds: float | None = None
    finished: bool = False
    failed_event: RankFailed | None = None
    exitcode: int | None = None
    exited: bool = False
    stalled: bool = False
    straggling: bool = False


def _descendants(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return proc.children(recursive=True)
    except psutil.Error:
        return []


class Supervisor:
    """Watches the local ranks of one run until every one has exited."""

    def __init__(
        self,
        run_dir: RunDir,
        config: RunConfig,
        ranks: list[int],
        events: EventWriter,
        oom_kills_at_start: int | None = None,
    ):
        self.run_dir = run_dir
        self.oom_kills_at_start = oom_kills_at_start
        self.config = config
        self.events = events
        self.watches = {
            r: RankWatch(rank=r, tail=EventTail(run_dir.rank_events_path(r))) for r in ranks
        }
        self.stop_reason = ""  # why the launcher stopped the ranks, when it did
        self.stop_status = ""
        self.stop_deadline: float | None = None
        self.stopped_by_us: set[int] = set()
        self.first_exit_order: list[int] = []
        self.stall_kill_rank: int | None = None
        self.stop_signal_sent: signal.Signals | None = None

    # -- reading the ranks ------------------------------------------------------------------
    def read_events(self, now: float) -> None:
        for w in self.watches.values():
            assert w.tail is not None
            new = w.tail.read_new()
            if new:
                w.last_event = now
                w.reported = True
                w.stalled = False
            for e in new:
                if isinstance(e, StepProgress):
                    w.step_seconds = e.step_seconds
                elif isinstance(e, RankFailed):
                    w.failed_event = e
                elif isinstance(e, RankFinished):
                    w.finished = True

    def check_health(self, now: float) -> None:
        sup = self.config.supervision
        live = [w for w in self.watches.values() if not w.exited and not w.finished]
        for w in live:
            silent = now - w.last_event
            # Before its first event a rank is importing torch and loading data: allow for that.
            allowance = 0.0 if w.reported else STARTUP_ALLOWANCE_SECONDS
            if silent >= sup.stall_seconds + allowance and not w.stalled:
                w.stalled = True
                self.events.write(RankStalled(rank=w.rank, silent_seconds=round(silent, 1)))
            if (
                w.stalled
                and sup.kill_stalled_after > 0
                and silent >= sup.stall_seconds + sup.kill_stalled_after
                and self.stop_deadline is None
            ):
                self.stall_kill_rank = w.rank
                self.begin_stop(
                    FAILED,
                    f"rank {w.rank} reported nothing for {silent:.0f} s; stopped by supervision.kill_stalled_after",
                )
        timed = [w for w in live if w.step_seconds is not None]
        for w in timed:
            others = [o.step_seconds for o in timed if o is not w and o.step_seconds is not None]
            if not others:
                continue
            median = statistics.median(others)
            behind = (
                median > 0
                and w.step_seconds is not None
                and w.step_seconds > sup.straggler_factor * median
            )
            if behind and not w.straggling:
                self.events.write(
                    RankStraggling(
                        rank=w.rank,
                        step_seconds=round(w.step_seconds or 0.0, 4),
                        others_median_step_seconds=round(median, 4),
                    )
                )
            w.straggling = behind

    def reap(self, processes: dict[int, psutil.Process]) -> None:
        for rank, proc in processes.items():
            w = self.watches[rank]
            if w.exited:
                continue
            try:
                code = proc.wait(timeout=0)
            except psutil.TimeoutExpired:
                continue
            except psutil.NoSuchProcess:
                code = None
            w.exited = True
            w.exitcode = code
            w.pid = proc.pid
            self.first_exit_order.append(rank)
            exitcode, signal_name = exit_status(code)
            self.events.write(
                RankExited(rank=rank, pid=proc.pid, exitcode=exitcode, signal=signal_name)
            )

    # -- stopping ---------------------------------------------------------------------------
    def begin_stop(self, status: str, reason: str) -> None:
        """Ask every live rank to stop; after the grace period the rest are killed."""
        if self.stop_deadline is not None:
            return
        self.stop_status, self.stop_reason = status, reason
        self.stop_deadline = time.monotonic() + self.config.supervision.failure_grace_seconds
        for w in self.watches.values():
            if not w.exited:
                self.stopped_by_us.add(w.rank)

    def enforce_stop(self, processes: dict[int, psutil.Process]) -> None:
        """SIGTERM once when the stop begins, SIGKILL once the grace period is over."""
        if self.stop_deadline is None:
            return
        overdue = time.monotonic() >= self.stop_deadline
        if self.stop_signal_sent == (signal.SIGKILL if overdue else signal.SIGTERM):
            return
        sig = signal.SIGKILL if overdue else signal.SIGTERM
        live = [p for r, p in processes.items() if not self.watches[r].exited]
        for target in [*live, *(c for p in live for c in _descendants(p))]:
            with contextlib.suppress(psutil.Error):
                target.send_signal(sig)
        self.stop_signal_sent = sig

    def root_cause(self) -> Failure | None:
        """The first failure: a rank that died without a report (hard exit, signal) comes first,
        since the errors of its peers follow from its disappearance; else the earliest report."""
        bad = [
            w
            for w in self.watches.values()
            if w.exited and w.exitcode != 0 and w.rank not in self.stopped_by_us
        ]
        silent = [w for w in bad if w.failed_event is None]
        if silent:
            w = min(silent, key=lambda w: self.first_exit_order.index(w.rank))
            exitcode, signal_name = exit_status(w.exitcode)
            how = f"code {exitcode}" if exitcode is not None else signal_name or "an unknown status"
            error = f"rank {w.rank} exited with {how} without reporting an error"
            if signal_name == "SIGKILL" and w.pid is not None:
                cause = sigkill_cause(w.pid, self.oom_kills_at_start)
                error += f"; {cause}" if cause else ""
            return Failure(
                rank=w.rank,
                exitcode=exitcode,
                signal=signal_name,
                error=error,
                traceback=_log_tail(self.run_dir.rank_log_path(w.rank)),
            )
        reported = [w for w in self.watches.values() if w.failed_event is not None]
        if reported:
            w = min(reported, key=lambda w: w.failed_event.time if w.failed_event else 0.0)
            assert w.failed_event is not None
            exitcode, signal_name = exit_status(w.exitcode)
            return Failure(
                rank=w.rank,
                exitcode=exitcode,
                signal=signal_name,
                error=w.failed_event.error,
                traceback=w.failed_event.traceback,
            )
        return None


def _log_tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def supervise(
    run_dir: RunDir,
    config: RunConfig,
    processes: dict[int, psutil.Process],
    events: EventWriter,
    oom_kills_at_start: int | None = None,
) -> tuple[str, Failure | None, str]:
    """Watch the ranks until all have exited; returns (status, root cause, reason)."""
    sup = Supervisor(run_dir, config, sorted(processes), events, oom_kills_at_start)
    requested: list[str] = []

    def on_signal(signum: int, _frame: object) -> None:
        requested.append(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while True:
        now = time.time()
        sup.read_events(now)
        sup.reap(processes)
        if requested and sup.stop_deadline is None:
            sup.begin_stop(KILLED, f"the launcher received {requested[0]}")
        failed = [
            w
            for w in sup.watches.values()
            if (w.exited and w.exitcode != 0) or w.failed_event is not None
        ]
        if failed and sup.stop_deadline is None:
            first = failed[0].rank
            sup.begin_stop(FAILED, f"rank {first} failed; the other ranks were stopped")
            # the failing rank itself is not "stopped by us"
            for w in failed:
                sup.stopped_by_us.discard(w.rank)
        if sup.stop_deadline is None:
            sup.check_health(now)
        sup.enforce_stop(processes)
        if all(w.exited for w in sup.watches.values()):
            break
        time.sleep(POLL_SECONDS)
    sup.read_events(time.time())
    if sup.stop_status == KILLED:
        return KILLED, None, sup.stop_reason
    if sup.stall_kill_rank is not None:
        rank = sup.stall_kill_rank
        return (
            FAILED,
            Failure(
                rank=rank, error=sup.stop_reason, traceback=_log_tail(run_dir.rank_log_path(rank))
            ),
            sup.stop_reason,
        )
    cause = sup.root_cause()
    if cause is not None:
        return FAILED, cause, f"rank {cause.rank} failed: {cause.error}"
    if all(w.exitcode == 0 for w in sup.watches.values()):
        return COMPLETED, None, ""
    return FAILED, None, "a rank ended without finishing"


def launch(
    run_dir: RunDir,
    *,
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: str = "127.0.0.1",
    master_port: int | None = None,
) -> str:
    """Run one node's share of a run to the end; returns the final status."""
    config = load_config(run_dir.config_path)
    plan = plan_run(config, gpus.gpu_count())
    # ddptui run checked this already; `python -m engine.train.launch` on another node did not. The
    # estimate counts this launcher, which already holds its memory.
    own = psutil.Process().memory_info().rss
    resources = check_resources(plan, available_bytes=available_memory_bytes() + own)
    for warning in resources.warnings:
        print(f"ddptui: warning: {warning}", file=sys.stderr, flush=True)
    nproc = plan.world_size
    world_size = nproc * nnodes
    if nnodes > 1 and config.strategy.name != "ddp":
        raise LaunchError(
            f"strategy {config.strategy.name} runs on one machine; use ddp with --nnodes"
        )
    if master_port is None:
        if nnodes > 1:
            raise LaunchError("--nnodes above 1 needs --master-port (the same on every node)")
        master_port = find_free_port(master_addr)
    elif node_rank == 0:
        check_port_free(master_addr, master_port)
    os.environ.update(rank_environment(run_dir, plan, master_addr, master_port, nproc))

    info = run_dir.read_run_info() if run_dir.run_json_path.exists() else None
    me = psutil.Process()
    base = RunInfo(
        run_id=run_dir.run_id,
        preset=config.name,
        host=this_host(),
        created=info.created if info else time.time(),
        state=RUNNING,
        world_size=world_size,
        devices=plan.devices.describe(),
        launcher=ProcessRef(me.pid, me.create_time()),
        pgid=os.getpgid(0),
        node_rank=node_rank,
        nnodes=nnodes,
        oom_kills_at_start=oom_kill_count(),
    )
    run_dir.events_dir.mkdir(parents=True, exist_ok=True)
    run_dir.logs_dir.mkdir(parents=True, exist_ok=True)
    run_dir.write_run_info(base)
    events = EventWriter(run_dir.launcher_events_path)
    events.write(
        RunStarted(
            run_id=run_dir.run_id,
            world_size=world_size,
            launcher_pid=me.pid,
            devices=plan.devices.describe(),
        )
    )
    status, failure, reason = FAILED, None, ""
    processes: dict[int, psutil.Process] = {}
    try:
        import torch.multiprocessing as mp  # only now: the environment above is in place

        from engine.train.worker import spawn_entry

        context = mp.start_processes(
            spawn_entry,
            args=(str(run_dir.path), node_rank, nproc, world_size),
            nprocs=nproc,
            join=False,
            start_method="spawn",
        )
        for local_rank, proc in enumerate(context.processes):
            assert proc.pid is not None
            processes[node_rank * nproc + local_rank] = psutil.Process(proc.pid)
        run_dir.write_run_info(
            replace(
                base, ranks=tuple(ProcessRef(p.pid, p.create_time()) for p in processes.values())
            )
        )
        status, failure, reason = supervise(
            run_dir, config, processes, events, base.oom_kills_at_start
        )
    except BaseException as err:  # the summary is written whatever happened
        reason = f"the launcher failed: {type(err).__name__}: {err}"
        failure = Failure(rank=None, error=reason, traceback=traceback.format_exc())
        status = KILLED if isinstance(err, KeyboardInterrupt) else FAILED
        live = [p for p in processes.values() if p.is_running()]
        stop_processes(live, grace=3.0)
    finally:
        cgroup = own_memory_cgroup()
        for p in processes.values():  # the cgroup an `oom` fault made, once its rank is gone
            remove_fault_cgroup(p.pid, cgroup)
        events.write(RunFinished(status=status, reason=reason))
        events.close()
        run_dir.write_run_info(
            replace(
                base,
                state=status,
                ranks=tuple(ProcessRef(p.pid, _create_time(p)) for p in processes.values()),
            )
        )
        run_dir.write_summary(build_summary(run_dir, status, failure, reason).to_json())
    return status


def _create_time(p: psutil.Process) -> float:
    try:
        return p.create_time()
    except psutil.Error:
        return 0.0


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
    except (ConfigError, LaunchError, RunDirError) as err:
        print(f"ddptui: {err}", file=sys.stderr)
        if run_dir.config_path.exists() and not run_dir.summary_path.exists():
            # Nothing started, but whoever watches this directory learns why.
            try:
                summary = build_summary(
                    run_dir, FAILED, Failure(rank=None, error=str(err)), str(err)
                )
                run_dir.write_summary(summary.to_json())
            except (ConfigError, RunDirError, OSError):
                pass
        return EXIT_BAD_INPUT
    return 0 if status == COMPLETED else 1


if __name__ == "__main__":
    sys.exit(main())

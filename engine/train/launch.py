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
    # else (torch included): tie it to the launcher first, so that it dies with it, and make its
    # stack askable.
    from engine.train.rank_bootstrap import bootstrap_rank

    bootstrap_rank()

import argparse
import contextlib
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import psutil

from engine.core import gpus
from engine.core.config import ConfigError, RunConfig, load_config
from engine.core.diagnosis import RankTarget, StackSnapshot, latest_snapshot, take_snapshot
from engine.core.disk_space import SpaceReserve, WriteFailed
from engine.core.events import (
    Event,
    EventTail,
    EventWriter,
    RankExited,
    RankFailed,
    RankFinished,
    RankStalled,
    RankStraggling,
    RunFinished,
    RunStarted,
    StacksTaken,
)
from engine.core.oom_evidence import OomBaseline, oom_baseline, sigkill_cause
from engine.core.plan import RunPlan, plan_run
from engine.core.process_identity import ProcessRef
from engine.core.process_kill import stop_processes
from engine.core.rank_states import RankStateTracker, Thresholds
from engine.core.resource_guard import available_memory_bytes, check_resources
from engine.core.run_environment import (
    LAUNCHER_PID_ENV,
    RENDEZVOUS_ENV,
    RUN_DIR_ENV,
    RUN_MARKER_ENV,
    THREADS_ENV,
)
from engine.core.run_files import PRIVATE_FILE_MODE
from engine.core.rundir import (
    RunDir,
    RunDirError,
    RunInfo,
    this_host,
)
from engine.core.statuses import RankStatus, RunStatus
from engine.core.summarize import build_summary
from engine.core.summary import Failure, RunSummary, exit_status
from engine.train.memory_fault import own_memory_cgroup, remove_fault_cgroup

# Exits are reaped every POLL_SECONDS, so a dead rank stops its peers at once; the event files
# are read, and the stall and straggler rules applied, every READ_SECONDS, which keeps the
# launcher's own CPU (taken from the ranks on a busy machine) near torchrun's agent's.
POLL_SECONDS = 0.1
READ_SECONDS = 0.5
# A stop right after a snapshot (the stall's, or the one ``ddptui kill`` takes before it signals
# the launcher) does not take another: the ranks are already on their way down.
RECENT_SNAPSHOT_SECONDS = 15.0
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
        RUN_DIR_ENV: str(run_dir.path.resolve()),
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


def loopback_interface() -> str:
    """The name of the interface holding 127.0.0.1 ("lo" on Linux, "lo0" on macOS)."""
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == "127.0.0.1" for a in addresses):
            return name
    return "lo"


def rendezvous_environment(
    run_dir: RunDir, nnodes: int, master_addr: str, master_port: int
) -> dict[str, str]:
    """Where the ranks meet and which interface they talk over.

    One node: through a file store in the run directory, and gloo and NCCL pinned to loopback, so
    no process of the run holds a listening socket beyond 127.0.0.1 (torch's TCPStore would
    listen on every interface). Several nodes: through a TCP store that rank 0 serves on
    ``master_addr`` only; gloo and NCCL use the interface their own settings pick.
    """
    if nnodes > 1:
        return {RENDEZVOUS_ENV: f"tcp://{master_addr}:{master_port}"}
    loopback = loopback_interface()
    return {
        RENDEZVOUS_ENV: f"file://{run_dir.rendezvous_path.resolve()}",
        "GLOO_SOCKET_IFNAME": loopback,
        "NCCL_SOCKET_IFNAME": loopback,
    }


def prepare_rendezvous_file(run_dir: RunDir) -> None:
    """An empty file store, private whatever the umask (c10d would make it 0644 minus it)."""
    run_dir.rendezvous_path.unlink(missing_ok=True)
    os.close(
        os.open(run_dir.rendezvous_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE)
    )


class LauncherEvents(EventWriter):
    """The launcher's events, best effort: a full disk must not end the supervision of ranks
    that still run (summary.json, written from the space reserve, says how the run ended)."""

    refused = ""  # the first write the disk refused, as one sentence

    def write(self, event: Event) -> None:
        try:
            super().write(event)
        except WriteFailed as err:
            self.refused = self.refused or str(err)


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


@dataclass
class RankWatch:
    """What the launcher knows of one local rank's process; its state is the tracker's."""

    rank: int
    pid: int | None = None
    tail: EventTail | None = None
    finished: bool = False
    failed_event: RankFailed | None = None
    exitcode: int | None = None
    exited: bool = False
    stalled: bool = False  # reported stalled, and silent since
    straggling: bool = False  # reported straggling, and still so


def _descendants(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return proc.children(recursive=True)
    except psutil.Error:
        return []


class Supervisor:
    """Watches the local ranks of one run until every one has exited. Whether a rank is stalled or
    straggling is the run observer's rule (``RankStateTracker``), fed the same events readers
    see; the launcher reports what it finds as events and acts on it."""

    def __init__(
        self,
        run_dir: RunDir,
        config: RunConfig,
        ranks: list[int],
        events: EventWriter,
        oom_baseline: OomBaseline | None = None,
        error_of: Callable[[int], str] = lambda rank: "",
    ):
        self.run_dir = run_dir
        self.error_of = error_of  # what a rank that could not report raised, by rank
        self.oom_baseline = oom_baseline
        self.config = config
        self.events = events
        self.watches = {
            r: RankWatch(rank=r, tail=EventTail(run_dir.rank_events_path(r), run_dir.path))
            for r in ranks
        }
        self.tracker = RankStateTracker(
            world_size=len(ranks), thresholds=Thresholds.of(config), run_started=time.time()
        )
        self.stop_reason = ""  # why the launcher stopped the ranks, when it did
        self.stop_status: RunStatus | None = None
        self.stop_deadline: float | None = None
        self.stopped_by_us: set[int] = set()
        self.first_exit_order: list[int] = []
        self.stall_kill_rank: int | None = None
        self.stop_signal_sent: signal.Signals | None = None
        self.processes: dict[int, psutil.Process] = {}
        self.distributed = config.strategy.name == "ddp"
        self.started = time.time()
        self.stall_episode = False  # a snapshot was taken since a rank went stalled
        self._snapshot_thread: threading.Thread | None = None
        self._snapshot_done: list[StackSnapshot] = []

    # -- stacks ------------------------------------------------------------------------------
    def _targets(self) -> list[RankTarget]:
        reported = {s.rank: s.last_event_time for s in self.tracker.states()}
        targets = []
        for rank, proc in sorted(self.processes.items()):
            try:
                ref = ProcessRef(proc.pid, proc.create_time())
            except psutil.Error:  # gone and reaped: a ref no process has
                ref = ProcessRef(proc.pid, -1.0)
            failed = self.watches[rank].failed_event
            error = failed.error if failed is not None else ""
            targets.append(RankTarget(rank, ref, reported.get(rank), error))
        return targets

    def _take(self, reason: str) -> None:
        self._snapshot_done.append(
            take_snapshot(
                self.run_dir.path, self._targets(), reason=reason, distributed=self.distributed
            )
        )

    def snapshot_in_background(self, reason: str) -> None:
        """Every rank's stack, taken while supervision goes on (py-spy may take a second)."""
        if self._snapshot_thread is not None and self._snapshot_thread.is_alive():
            return
        self._snapshot_thread = threading.Thread(
            target=self._take, args=(reason,), name="stack-snapshot", daemon=True
        )
        self._snapshot_thread.start()

    def snapshot_now(self, reason: str) -> None:
        """Every rank's stack before the launcher stops them, unless one was just taken (by the
        stall snapshot, or by ``ddptui kill`` before it signalled this launcher)."""
        if self._snapshot_thread is not None:
            self._snapshot_thread.join()
        latest = latest_snapshot(self.run_dir.path)
        if latest is not None and time.time() - latest.time < RECENT_SNAPSHOT_SECONDS:
            return
        if any(not w.exited for w in self.watches.values()):
            self._take(reason)

    def report_snapshots(self) -> None:
        """Say in the launcher's events what the snapshots taken meanwhile found."""
        while self._snapshot_done:
            snapshot = self._snapshot_done.pop(0)
            self.events.write(
                StacksTaken(
                    path=snapshot.path,
                    reason=snapshot.reason,
                    culprit_rank=snapshot.culprit_rank,
                    summary=snapshot.summary_line(),
                )
            )

    def culprit_note(self, root_rank: int | None) -> str:
        """The latest snapshot of this run, when it names a culprit other than the root cause."""
        latest = latest_snapshot(self.run_dir.path)
        if latest is None or latest.time < self.started or latest.culprit is None:
            return ""
        if latest.culprit_rank == root_rank:
            return ""
        return f"{latest.culprit.describe()} ({latest.culprit_reason})"

    # -- reading the ranks ------------------------------------------------------------------
    def read_events(self) -> None:
        for w in self.watches.values():
            assert w.tail is not None
            for e in w.tail.read_new():
                self.tracker.feed(e)
                if isinstance(e, RankFailed):
                    w.failed_event = e
                elif isinstance(e, RankFinished):
                    w.finished = True

    def check_health(self, now: float) -> None:
        sup = self.config.supervision
        states = {
            s.rank: s for s in self.tracker.states(now=now, launcher_alive=True, judge_silence=True)
        }
        for w in self.watches.values():
            state = states.get(w.rank)
            if w.exited or w.finished or state is None:
                continue
            stalled = state.state == RankStatus.STALLED
            silent = state.silent_seconds or 0.0
            if stalled and not w.stalled:
                self.events.write(RankStalled(rank=w.rank, silent_seconds=round(silent, 1)))
                if not self.stall_episode:
                    self.stall_episode = True
                    self.snapshot_in_background("stall")
            w.stalled = stalled
            if (
                stalled
                and sup.kill_stalled_after > 0
                and silent >= (state.stall_after or 0.0) + sup.kill_stalled_after
                and self.stop_deadline is None
            ):
                self.stall_kill_rank = w.rank
                self.begin_stop(
                    RunStatus.FAILED,
                    f"rank {w.rank} reported nothing for {silent:.0f} s; stopped by "
                    "supervision.kill_stalled_after",
                )
            behind = state.state == RankStatus.STRAGGLER
            if behind and not w.straggling:
                self.events.write(
                    RankStraggling(
                        rank=w.rank,
                        step_seconds=round(state.step_seconds or 0.0, 4),
                        others_median_step_seconds=round(state.peers_step_seconds or 0.0, 4),
                    )
                )
            w.straggling = behind
        if not any(w.stalled for w in self.watches.values()):
            self.stall_episode = False  # the next stall gets its own snapshot

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
            exited = RankExited(rank=rank, pid=proc.pid, exitcode=exitcode, signal=signal_name)
            self.events.write(exited)
            self.tracker.feed(exited)

    # -- stopping ---------------------------------------------------------------------------
    def begin_stop(self, status: RunStatus, reason: str) -> None:
        """Take every rank's stack, then ask every live rank to stop; after the grace period the
        rest are killed."""
        if self.stop_deadline is not None:
            return
        self.snapshot_now("before stop")
        self.report_snapshots()
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
            error = self.error_of(w.rank) or (
                f"rank {w.rank} exited with {how} without reporting an error"
            )
            if signal_name == "SIGKILL" and w.pid is not None:
                cause = sigkill_cause(w.pid, self.oom_baseline)
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


def _with_note(reason: str, note: str) -> str:
    return f"{reason}; stacks before the stop: {note}" if note else reason


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
    oom_baseline: OomBaseline | None = None,
    error_of: Callable[[int], str] = lambda rank: "",
) -> tuple[RunStatus, Failure | None, str]:
    """Watch the ranks until all have exited; returns (status, root cause, reason)."""
    sup = Supervisor(run_dir, config, sorted(processes), events, oom_baseline, error_of)
    sup.processes = processes
    requested: list[str] = []

    def on_signal(signum: int, _frame: object) -> None:
        requested.append(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    last_read = 0.0
    while True:
        now = time.time()
        fresh = now - last_read >= READ_SECONDS or bool(requested)
        if fresh:
            sup.read_events()
            last_read = now
        sup.reap(processes)
        if requested and sup.stop_deadline is None:
            sup.begin_stop(RunStatus.KILLED, f"the launcher received {requested[0]}")
        failed = [
            w
            for w in sup.watches.values()
            if (w.exited and w.exitcode != 0) or w.failed_event is not None
        ]
        if failed and sup.stop_deadline is None:
            first = failed[0].rank
            sup.begin_stop(RunStatus.FAILED, f"rank {first} failed; the other ranks were stopped")
            # the failing rank itself is not "stopped by us"
            for w in failed:
                sup.stopped_by_us.discard(w.rank)
        if fresh and sup.stop_deadline is None:
            sup.check_health(now)
        sup.report_snapshots()
        sup.enforce_stop(processes)
        if all(w.exited for w in sup.watches.values()):
            break
        time.sleep(POLL_SECONDS)
    sup.read_events()
    sup.report_snapshots()
    if sup.stop_status == RunStatus.KILLED:
        return RunStatus.KILLED, None, _with_note(sup.stop_reason, sup.culprit_note(None))
    if sup.stall_kill_rank is not None:
        rank = sup.stall_kill_rank
        return (
            RunStatus.FAILED,
            Failure(
                rank=rank, error=sup.stop_reason, traceback=_log_tail(run_dir.rank_log_path(rank))
            ),
            _with_note(sup.stop_reason, sup.culprit_note(rank)),
        )
    cause = sup.root_cause()
    if cause is not None:
        reason = f"rank {cause.rank} failed: {cause.error}"
        return RunStatus.FAILED, cause, _with_note(reason, sup.culprit_note(cause.rank))
    if all(w.exitcode == 0 for w in sup.watches.values()):
        return RunStatus.COMPLETED, None, ""
    return RunStatus.FAILED, None, "a rank ended without finishing"


def launch(
    run_dir: RunDir,
    *,
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: str = "127.0.0.1",
    master_port: int | None = None,
) -> RunStatus:
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
    os.environ.update(rendezvous_environment(run_dir, nnodes, master_addr, master_port))

    info = run_dir.read_run_info() if run_dir.run_json_path.exists() else None
    me = psutil.Process()
    base = RunInfo(
        run_id=run_dir.run_id,
        preset=config.name,
        host=this_host(),
        created=info.created if info else time.time(),
        state=RunStatus.RUNNING,
        world_size=world_size,
        devices=plan.devices.describe(),
        launcher=ProcessRef(me.pid, me.create_time()),
        pgid=os.getpgid(0),
        node_rank=node_rank,
        nnodes=nnodes,
        oom_baseline=oom_baseline(),
    )
    run_dir.make_missing_dirs()
    reserve = SpaceReserve(run_dir.path)
    if not reserve.path.exists():  # started by hand (another node): set it aside now
        with contextlib.suppress(WriteFailed):
            reserve.make()
    run_dir.write_run_info(base)
    events = LauncherEvents(run_dir.launcher_events_path)
    events.write(
        RunStarted(
            run_id=run_dir.run_id,
            world_size=world_size,
            launcher_pid=me.pid,
            devices=plan.devices.describe(),
        )
    )
    status, failure, reason = RunStatus.FAILED, None, ""
    processes: dict[int, psutil.Process] = {}
    error_files: list[str | None] = []
    try:
        if nnodes == 1:
            prepare_rendezvous_file(run_dir)
        if config.script.given:
            processes.update(start_script_ranks(run_dir, node_rank, nproc, world_size))
        else:
            spawned, error_files = spawn_engine_ranks(run_dir, node_rank, nproc, world_size)
            processes.update(spawned)
        run_dir.write_run_info(
            replace(
                base, ranks=tuple(ProcessRef(p.pid, p.create_time()) for p in processes.values())
            )
        )
        status, failure, reason = supervise(
            run_dir,
            config,
            processes,
            events,
            base.oom_baseline,
            # a script rank has no spawn error file: its log's tail is its evidence
            error_of=lambda rank: spawn_error(
                dict(enumerate(error_files)).get(rank - node_rank * nproc)
            ),
        )
    except BaseException as err:  # the summary is written whatever happened
        reason = f"the launcher failed: {type(err).__name__}: {err}"
        failure = Failure(rank=None, error=reason, traceback=traceback.format_exc())
        status = RunStatus.KILLED if isinstance(err, KeyboardInterrupt) else RunStatus.FAILED
        live = [p for p in processes.values() if p.is_running()]
        stop_processes(live, grace=3.0)
    finally:
        run_dir.rendezvous_path.unlink(missing_ok=True)
        for name in error_files:
            if name:
                Path(name).unlink(missing_ok=True)
        cgroup = own_memory_cgroup()
        for p in processes.values():  # the cgroup an `oom` fault made, once its rank is gone
            remove_fault_cgroup(p.pid, cgroup)
        final = replace(
            base,
            state=status,
            ranks=tuple(ProcessRef(p.pid, _create_time(p)) for p in processes.values()),
        )
        write_final_state(run_dir, final, build_summary(run_dir, status, failure, reason), events)
    return status


def spawn_engine_ranks(
    run_dir: RunDir, node_rank: int, nproc: int, world_size: int
) -> tuple[dict[int, psutil.Process], list[str | None]]:
    """The engine's workload: ``torch.multiprocessing.spawn`` of ``spawn_entry``, one per device.
    Returns the ranks and the files each pickles its error into."""
    import torch.multiprocessing as mp  # only now: the environment above is in place

    from engine.train.worker import spawn_entry

    context = mp.start_processes(
        spawn_entry,
        args=(str(run_dir.path), node_rank, nproc, world_size),
        nprocs=nproc,
        join=False,
        start_method="spawn",
    )
    processes = {}
    for local_rank, proc in enumerate(context.processes):
        assert proc.pid is not None
        processes[node_rank * nproc + local_rank] = psutil.Process(proc.pid)
    return processes, list(context.error_files)


def start_script_ranks(
    run_dir: RunDir, node_rank: int, nproc: int, world_size: int
) -> dict[int, psutil.Process]:
    """The user's script: one ``engine.train.script_rank`` process per device, with the torchrun
    contract in its environment and its log as its output. (The script makes its own process
    group, so its store listens where torch's TCPStore does, not through our file store.)"""
    processes = {}
    for local_rank in range(nproc):
        rank = node_rank * nproc + local_rank
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(nproc),
            "GROUP_RANK": str(node_rank),
            "PYTHONUNBUFFERED": "1",
        }
        fd = os.open(
            run_dir.rank_log_path(rank),
            os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW,
            PRIVATE_FILE_MODE,
        )
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


def write_final_state(
    run_dir: RunDir, info: RunInfo, summary: RunSummary, events: LauncherEvents
) -> None:
    """summary.json first (what every reader goes by), then run.json's final state, then the
    RunFinished event, from the room the space reserve gives back. Raises WriteFailed when even
    then the summary does not fit; the follower (or the next reader) then says so."""
    SpaceReserve(run_dir.path).release()
    if events.refused:
        note = f"the launcher could not record all its events: {events.refused}"
        summary = replace(summary, warnings=(*summary.warnings, note))
    run_dir.write_summary(summary)
    with contextlib.suppress(WriteFailed):
        run_dir.write_run_info(info)
    events.write(RunFinished(status=summary.status, reason=summary.reason))
    events.close()


def _create_time(p: psutil.Process) -> float:
    try:
        return p.create_time()
    except psutil.Error:
        return 0.0


def carry_run_marker(run_dir: RunDir, argv: list[str]) -> None:
    """Re-execute this launcher (same pid, same start time) with the run marker in its
    environment when it was started without it (by hand, on another node): `ddptui kill` and
    `clean` stop only processes that carry the marker from their start, which is what
    /proc/PID/environ shows; setting os.environ later would not."""
    if os.environ.get(RUN_MARKER_ENV) == run_dir.run_id:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    env = {**os.environ, RUN_MARKER_ENV: run_dir.run_id}
    os.execve(sys.executable, [sys.executable, "-m", "engine.train.launch", *argv], env)


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

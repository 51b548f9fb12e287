"""The engine calls the UI makes that change or survey the machine, one method each.

Start a run (through its backend, ``engine.core.backends``, or into the machine's queue,
``engine.core.queue``), resume one (``engine.core.ops.resume``), stop one and clean orphans
(process control), scan processes (``engine.core.jobs.process_table``), read the queue's line,
build a speedup table (``engine.core.bench.speedup_table``). The screens call these
from thread workers only, and only through an ``EngineActions``, so each stays one swappable call
(tests pass a subclass). Engine modules are imported when first called, which keeps them (and
anything they import) off the app's start-up path: every import inside a method below is there
for start-up time, not to dodge an import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.core.config.schema import RunConfig
from engine.core.procs.stopping import STOP_GRACE_SECONDS
from engine.core.runs.rundir import RunDir

if TYPE_CHECKING:
    from collections.abc import Sequence

    from engine.core.backends.local.start import StartedRun
    from engine.core.bench.speedup_table import SpeedupTable
    from engine.core.host.gpus import GpuInventory
    from engine.core.jobs.gpu_view import GpuView
    from engine.core.jobs.process_table import ProcessTable
    from engine.core.plan.run_plan import RunPlan
    from engine.core.procs.process_identity import ProcessProbe, ProcessRef
    from engine.core.queue.enqueue import QueuedRun
    from engine.core.queue.line import Verdict
    from engine.core.stacks.snapshot import StackSnapshot


def may_stop_other_users() -> bool:
    """Whether this user may stop other users' processes at all (root), as
    ``engine.core.procs.stopping`` decides it."""
    from engine.core.procs.stopping import may_stop_other_users as root_only

    return root_only()


@dataclass(frozen=True)
class Outcome:
    """What a kill or clean did, in words for the user; ``ok`` is False when something is left."""

    ok: bool
    report: str


class EngineActions:
    def __init__(
        self, runs_dir: Path, device_glob: str | None = None, claims_dir: Path | None = None
    ) -> None:
        self.runs_dir = runs_dir
        self.device_glob = device_glob  # None: /dev/nvidia*; tests hold files of their own open
        self.claims_dir = claims_dir  # the queue's claim store; None: $DDPTUI_CLAIMS_DIR or /tmp's
        self._scanner: Any = None
        self._gpu_scanner: Any = None
        self._machine_watcher: Any = None

    def start_run(
        self, config: RunConfig, gpu_count: int, *, where: str = "", queue: bool = False
    ) -> StartedRun | QueuedRun:
        """Start the launcher in its own session, or (``where``: a backend's name) hand the run
        to that backend (a scheduler's submit), or (``queue``) put it in this machine's queue, to
        start when its devices are free, as ``ddptui run --queue`` does; raises ConfigError with
        the reason."""
        if queue:
            from engine.core.queue.enqueue import queue_run

            return queue_run(config, self.runs_dir, store_path=self.claims_dir, gpu_count=gpu_count)
        from engine.core.backends.registry import LOCAL, backend_called

        backend = backend_called(where) if where else LOCAL
        return backend.start(config, self.runs_dir, gpu_count=gpu_count)

    def check_queue(self, config: RunConfig, plan: RunPlan) -> None:
        """What queueing ``config`` checks beyond its plan, making nothing: the devices it would
        wait for and the claim store; ConfigError (ClaimStoreError) with the reason."""
        from engine.core.queue.enqueue import check_queueing

        check_queueing(config, plan, self.claims_dir)

    def read_queue(self) -> list[Verdict]:
        """This machine's line, every user's (``ddptui queue``'s): each live claim's verdict,
        those holding their devices first. No store yet: an empty line."""
        from engine.core.queue.device_state import MachineWatcher
        from engine.core.queue.standing import line_at

        if self._machine_watcher is None:
            self._machine_watcher = MachineWatcher(self.device_glob)
        return line_at(self.claims_dir, self._machine_watcher)

    def check_placement(self, where: str, config: RunConfig) -> RunPlan:
        """``config`` checked as the backend named ``where`` starts it, nothing started (as
        ``ddptui run`` with its flag checks it): each node's plan; ConfigError with the reason."""
        from engine.core.backends.registry import backend_called

        return backend_called(where).check(config, self.runs_dir)

    def kill_run(self, run_dir: RunDir, grace: float = STOP_GRACE_SECONDS) -> Outcome:
        """The job-scoped kill through the run's backend (``engine.core.procs.stopping`` here,
        a scheduler's cancel with every node's proof elsewhere): every process of this run,
        nothing else."""
        from ddptui.kill_report import kill_sentence
        from engine.core.backends.registry import backend_for
        from engine.core.common.statuses import StopRequester
        from engine.core.runs.run_handle import observe_handle

        handle = observe_handle(run_dir)  # one look, which the run's backend takes too
        backend = backend_for(handle.info)
        result = backend.stop(run_dir, grace, by=StopRequester.UI, handle=handle)
        return Outcome(ok=result.ok, report=kill_sentence(result))

    def resume_run(self, run_dir: RunDir) -> tuple[StartedRun, str]:
        """Start the next attempt of a failed, killed or lost run from its newest checkpoint
        (``engine.core.ops.resume``), and say so; ResumeRefused (one sentence, nothing started)
        when it cannot go on."""
        from engine.core.ops.resume import resume_run

        started, planned = resume_run(run_dir)
        return started, f"run {run_dir.run_id}: started {planned.describe()}"

    def take_stacks(self, run_dir: RunDir) -> StackSnapshot | None:
        """Every rank's stack now (stored in the run directory); None when no rank is alive."""
        from engine.core.backends.registry import backend_for
        from engine.core.runs.run_handle import observe_handle

        handle = observe_handle(run_dir)  # one look, which the run's backend takes too
        return backend_for(handle.info).snapshot(run_dir, reason="on demand", handle=handle)

    def scan_processes(self) -> ProcessTable:
        from engine.core.jobs.process_table import ProcessScanner

        if self._scanner is None:
            self._scanner = ProcessScanner(self.device_glob)
        table: ProcessTable = self._scanner.scan(cpu_interval=0.0)
        return table

    def scan_gpus(self, inventory: GpuInventory) -> GpuView:
        """Every GPU's processes, named (``engine.core.jobs.gpu_view``), against the given NVML sample."""
        from engine.core.jobs.gpu_view import GpuScanner

        if self._gpu_scanner is None:
            self._gpu_scanner = GpuScanner(self.device_glob)
        view: GpuView = self._gpu_scanner.scan(inventory)
        return view

    def stop_processes(
        self, refs: Sequence[ProcessRef], grace: float = STOP_GRACE_SECONDS, all_users: bool = False
    ) -> Outcome:
        """Stop these processes (pid and start time) and their children: SIGTERM, SIGKILL."""
        from engine.core.procs.stopping import stop_refs

        result, skipped = stop_refs(refs, grace, all_users=all_users)
        return Outcome(ok=result.ok and not result.refused, report=describe_stop(result, skipped))

    def signal_processes(
        self, refs: Sequence[ProcessRef], signal_name: str, all_users: bool = False
    ) -> Outcome:
        """Send one signal (SIGINT, SIGKILL, ...) to these processes (pid and start time), no
        follow-up: the GPUs screen's choice of signal."""
        import signal

        from engine.core.procs.stopping import signal_refs

        result = signal_refs(refs, signal.Signals[signal_name], all_users=all_users)
        return Outcome(ok=not result.refused, report=describe_signal(result))

    def clean(self, grace: float = STOP_GRACE_SECONDS, all_users: bool = False) -> Outcome:
        """Stop this user's orphaned jobs (every user's with ``all_users``, as root), from a fresh
        scan (what ``ddptui clean`` does)."""
        from engine.core.jobs.clean import clean_orphans, plan_clean
        from engine.core.jobs.process_table import scan_processes

        plan = plan_clean(scan_processes(cpu_interval=0.0), all_users=all_users)
        cleaned = clean_orphans(plan, grace, all_users=all_users)
        stopped = sum(len(c.stop.stopped) for c in cleaned)
        left = [pid for c in cleaned for pid in c.stop.survivors]
        parts = [f"cleaned {len(cleaned)} orphaned job{'s' if len(cleaned) != 1 else ''}"]
        parts.append(f"{stopped} process{'es' if stopped != 1 else ''} stopped")
        if left:
            parts.append(f"still there: pids {', '.join(map(str, left))}")
        for job, why in plan.left_alone:
            parts.append(f"left {job.label} alone: {why}")
        return Outcome(ok=not left, report="; ".join(parts))

    def remove_runs(self, run_dirs: Sequence[RunDir]) -> Outcome:
        """Remove these runs' directories, refusing any that is going (``ddptui rm``'s rule)."""
        from engine.core.ops.run_removal import plan_removal, remove_runs

        plan = plan_removal(run_dirs)
        result = remove_runs(plan) if plan.remove else None
        removed = result.removed if result is not None else ()
        parts = [f"removed {', '.join(removed)}" if removed else "nothing removed"]
        parts += [f"kept {run_id}: {why}" for run_id, why in plan.refused]
        parts += (
            [f"could not remove {run_id}: {why}" for run_id, why in result.failed] if result else []
        )
        return Outcome(ok=bool(removed) and len(removed) == len(run_dirs), report="; ".join(parts))

    def session_table(
        self, run_dirs: list[RunDir], baseline: str | None, probe: ProcessProbe | None = None
    ) -> SpeedupTable:
        """The speedup table of the given runs (one row each, labelled by run id), each run as
        the run observer sees it through ``probe`` (a running one is a row that says so)."""
        from engine.core.bench.table_compute import build_speedup_table
        from engine.core.bench.table_rows import session_rows

        return build_speedup_table(
            session_rows(run_dirs, probe),
            title="Runs launched in this session",
            baseline=baseline,
        )

    def list_benches(self) -> list[Any]:
        from engine.core.bench.result_history import ResultHistory, default_db_path

        if not default_db_path().exists():
            return []
        with ResultHistory(create=False) as history:
            return history.list()

    def bench_table(self, bench_id: int, baseline: str | None) -> SpeedupTable:
        """A stored bench's table, rebuilt from its runs when another baseline is chosen."""
        from engine.core.bench.result_history import ResultHistory
        from engine.core.bench.table_rows import rebaseline

        with ResultHistory(create=False) as history:
            record = history.get(bench_id)
        if baseline is None or baseline == record.table.baseline:
            return record.table
        return rebaseline(record, baseline)


def describe_signal(result: Any) -> str:
    """A ``SignalResult`` in one sentence: who got the signal, who was gone or refused."""
    sent = len(result.sent)
    parts = [
        f"sent {result.signal} to {sent} process{'es' if sent != 1 else ''}"
        + (f" (pid {', '.join(map(str, result.sent))})" if result.sent else "")
    ]
    if result.gone:
        parts.append(f"{len(result.gone)} had already ended")
    parts.extend(why for _, why in result.refused)
    parts.extend(result.skipped)
    return "; ".join(parts)


def describe_stop(result: Any, skipped: tuple[str, ...] = ()) -> str:
    """A ``StopResult`` in one sentence: what was stopped, how, and what is left or refused."""
    stopped = len(result.stopped)
    parts = [
        f"stopped {stopped} process{'es' if stopped != 1 else ''} "
        f"({len(result.terminated)} on SIGTERM, {len(result.killed)} needed SIGKILL)"
    ]
    if result.already_gone:
        parts.append(f"{len(result.already_gone)} had already ended")
    if result.survivors:
        parts.append(f"STILL RUNNING: pids {', '.join(map(str, result.survivors))}")
    elif stopped:
        parts.append("none left")
    parts.extend(why for _, why in result.refused)
    parts.extend(skipped)
    return "; ".join(parts)

"""Stand-ins at the machine boundaries the UI reads: the process probe (psutil), the engine
actions, the process scans and the clock, so snapshots show the same figures on every machine. The
pynvml stand-in is tests.fixtures.standin_nvml's."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ddptui.actions import EngineActions, Outcome
from ddptui.app import DdptuiApp
from engine.core.common.statuses import JobKind, JobState, ProcessRole, ProcessState
from engine.core.config.schema import RunConfig
from engine.core.host.gpus import GpuInventory
from engine.core.host.host_usage import HostUsage
from engine.core.jobs.gpu_join import join_gpus
from engine.core.jobs.gpu_view import GpuView, build_gpu_view
from engine.core.jobs.process_table import (
    ProcessTable,
    TrainingJob,
    TrainingProcess,
)
from engine.core.procs.device_holders import DeviceHolder, HolderScan
from engine.core.procs.process_identity import ProcessProbe, ProcessRef, ProcessUsage
from engine.core.queue.line import Verdict
from engine.core.runs.rundir import RunDir
from tests.fixtures import make_recorded_run as recorded
from tests.fixtures.standin_nvml import EIGHT_GPUS

RECORDED = Path("tests/fixtures/recorded-run")  # relative: snapshots show it as is
LIVE_RUN = recorded.LIVE_RUN
# The launcher and ranks the recorded live run names: alive whenever a stand-in probe is told so.
LIVE_PIDS = [424242, 424250, 424251, 424252, 424253]
GPU_RUN = recorded.GPU_RUN
FAILED_RUN = recorded.FAILED_RUN
NOW = recorded.NOW
NO_CLAIM_STORE = Path("/nonexistent/ddptui-claims")


class StandInProbe(ProcessProbe):
    """Says the given processes are alive and gives every pid fixed CPU / memory figures."""

    def __init__(
        self, alive: Iterable[int] = (), cpu: float = 97.0, rss: int = 310 * 2**20
    ) -> None:
        super().__init__()
        self.alive_pids = set(alive)
        self.cpu = cpu
        self.rss = rss
        self.user_names: dict[int, str] = {}  # users() knows these; every other pid is elsewhere

    def state(self, ref: ProcessRef) -> ProcessState:
        return ProcessState.RUNNING if ref.pid in self.alive_pids else ProcessState.GONE

    def pid_alive(self, pid: int) -> bool:
        return pid in self.alive_pids

    def usage(self, pids: Iterable[int]) -> dict[int, ProcessUsage]:
        return {pid: ProcessUsage(self.cpu, self.rss) for pid in pids if pid in self.alive_pids}

    def users(self, pids: Iterable[int]) -> dict[int, str]:
        return {pid: self.user_names[pid] for pid in pids if pid in self.user_names}


def orphan_table() -> ProcessTable:
    """What the process scan of the snapshot machine finds: our live run, and an orphaned torchrun
    job whose agent is gone."""
    live = tuple(
        TrainingProcess(
            pid=pid,
            ppid=recorded.LIVE_LAUNCHER.pid,
            start_time=recorded.LIVE_START,
            user="ana",
            role=ProcessRole.RANK,
            rank=rank,
            local_rank=rank,
            world_size=4,
            state=JobState.RUNNING,
            age_seconds=95.0,
            cpu_percent=97.0,
            rss_bytes=310 * 2**20,
            gpu=(),
            command="python -c from multiprocessing.spawn import spawn_main",
            own=True,
        )
        for rank, pid in enumerate(recorded.LIVE_RANK_PIDS)
    )
    launcher = TrainingProcess(
        pid=recorded.LIVE_LAUNCHER.pid,
        ppid=1000,
        start_time=recorded.LIVE_LAUNCHER.start_time,
        user="ana",
        role=ProcessRole.LAUNCHER,
        rank=None,
        local_rank=None,
        world_size=4,
        state=JobState.RUNNING,
        age_seconds=96.0,
        cpu_percent=1.0,
        rss_bytes=90 * 2**20,
        gpu=(),
        command=f"python -m engine.train.launch runs/{LIVE_RUN}",
        own=True,
    )
    orphans = tuple(
        TrainingProcess(
            pid=5100 + rank,
            ppid=1,
            start_time=NOW - 7200,
            user="ana",
            role=ProcessRole.RANK,
            rank=rank,
            local_rank=rank,
            world_size=2,
            state=JobState.ORPHANED,
            age_seconds=7200.0,
            cpu_percent=0.0,
            rss_bytes=2100 * 2**20,
            gpu=(),
            command="python train.py --epochs 90",
            own=True,
        )
        for rank in range(2)
    )
    return ProcessTable(
        jobs=(
            TrainingJob(
                key=f"ddptui:{LIVE_RUN}",
                kind=JobKind.DDPTUI,
                label=f"ddptui run {LIVE_RUN}",
                state=JobState.RUNNING,
                reason="its launcher is alive",
                users=("ana",),
                processes=(launcher, *live),
                launcher_pid=launcher.pid,
                launcher_alive=True,
                run_id=LIVE_RUN,
                run_dir=str(RECORDED / LIVE_RUN),
            ),
            TrainingJob(
                key="torchelastic:none@127.0.0.1:29500",
                kind=JobKind.ELASTIC,
                label="torchrun job 'none' at 127.0.0.1:29500",
                state=JobState.ORPHANED,
                reason="its torchrun agent is gone",
                users=("ana",),
                processes=orphans,
            ),
            TrainingJob(
                key="env:10.0.0.9:29600",
                kind=JobKind.ENV,
                label="job at 10.0.0.9:29600",
                state=JobState.ORPHANED,
                reason="pid 5300 has no visible parent: its launcher is gone",
                users=("bo",),
                processes=(
                    replace(
                        orphans[0],
                        pid=5300,
                        user="bo",
                        own=False,
                        world_size=1,
                        command="/opt/conda/bin/python -u /home/bo/experiments/finetune_llm.py --lr 3e-5",
                    ),
                ),
            ),
        ),
        notes=("1 process of another user could not be inspected.",),
        gpu_error=None,
        scanned_at=NOW,
        hidden_holders=(
            DeviceHolder(
                pid=8800,
                start_time=NOW - 3600,
                user="ana",
                uid=ANA,
                name="python",
                zombie=False,
                minors=(1,),
                paths=("/dev/nvidia1",),
            ),
        ),
    )


ANA, BO = 1000, 1001  # the users of the eight-GPU machine; the viewer is ana
SPAWNED = "python -c from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=8, pipe_handle=12) --multiprocessing-fork"
EIGHT_GPU_RUN = "20261202-104500-fast-ddp-9a9a"


def _process(pid: int, role: ProcessRole, rank: int | None, **values: Any) -> TrainingProcess:
    defaults: dict[str, Any] = {
        "ppid": 1,
        "start_time": NOW - 3600,
        "user": "ana",
        "local_rank": rank,
        "world_size": None,
        "state": JobState.RUNNING,
        "age_seconds": 3600.0,
        "cpu_percent": 101.0,
        "rss_bytes": 6 * 2**30,
        "gpu": (),
        "command": SPAWNED,
        "own": True,
    }
    defaults.update(values)
    return TrainingProcess(pid=pid, role=role, rank=rank, **defaults)


def eight_gpu_table() -> ProcessTable:
    """The process scan of the eight-GPU machine (EIGHT_GPUS), with its device-file scan."""
    ours = TrainingJob(
        key=f"ddptui:{EIGHT_GPU_RUN}",
        kind=JobKind.DDPTUI,
        label=f"ddptui run {EIGHT_GPU_RUN}",
        state=JobState.RUNNING,
        reason="its launcher (pid 6090) is running",
        users=("ana",),
        processes=(
            _process(6090, ProcessRole.LAUNCHER, None, cpu_percent=1.0, rss_bytes=600 * 2**20,
                     command=f"python -m engine.train.launch runs/{EIGHT_GPU_RUN}"),
            _process(6100, ProcessRole.RANK, 0, world_size=2),
            _process(6101, ProcessRole.RANK, 1, world_size=2),
        ),
        run_id=EIGHT_GPU_RUN,
    )  # fmt: skip
    bo_command = "/opt/conda/envs/llm/bin/python -u /home/bo/llm/pretrain.py --config configs/7b.yaml --nodes 1 --resume latest"
    theirs = TrainingJob(
        key="elastic:bo-pretrain@10.0.0.7:29500",
        kind=JobKind.ELASTIC,
        label="torchrun job 'bo-pretrain' at 10.0.0.7:29500",
        state=JobState.RUNNING,
        reason="its launcher (torchrun, pid 7190) is running",
        users=("bo",),
        processes=(
            _process(7190, ProcessRole.AGENT, None, user="bo", own=False, cpu_percent=0.0,
                     rss_bytes=300 * 2**20, age_seconds=86400.0,
                     command="/opt/conda/envs/llm/bin/torchrun --nproc-per-node 3 pretrain.py"),
            *(
                _process(7200 + r, ProcessRole.RANK, r, user="bo", own=False, world_size=3,
                         age_seconds=86400.0, cpu_percent=99.0, rss_bytes=14 * 2**30,
                         command=bo_command)
                for r in range(3)
            ),
        ),
    )  # fmt: skip
    orphan_command = "/usr/bin/python3 /home/ana/sweeps/train_sweep.py --trial 3 --lr 0.003"
    dead = TrainingJob(
        key="elastic:sweep-3@127.0.0.1:29510",
        kind=JobKind.ELASTIC,
        label="torchrun job 'sweep-3' at 127.0.0.1:29510",
        state=JobState.ORPHANED,
        reason="its torchrun agent is gone",
        users=("ana",),
        processes=(
            _process(5100, ProcessRole.RANK, 0, state=JobState.ORPHANED, world_size=1,
                     cpu_percent=0.0, age_seconds=7200.0, command=orphan_command),
            _process(5110, ProcessRole.WORKER, 0, state=JobState.ORPHANED, ppid=5100,
                     cpu_percent=0.0, rss_bytes=2 * 2**30, age_seconds=7190.0,
                     command=orphan_command),
        ),
    )  # fmt: skip

    def holder(pid: int, minor: int, user: str = "ana", name: str = "python") -> DeviceHolder:
        return DeviceHolder(
            pid=pid,
            start_time=NOW - 3600,
            user=user,
            uid=BO if user == "bo" else ANA,
            name=name,
            zombie=False,
            minors=(minor,),
            paths=(f"/dev/nvidia{minor}", "/dev/nvidiactl", "/dev/nvidia-uvm"),
        )

    holders = HolderScan(
        holders=(
            holder(6100, 0),
            holder(6101, 1),
            *(holder(7200 + r, 2 + r, "bo") for r in range(3)),
            holder(5100, 5),
            holder(5110, 5),
            holder(8800, 6),
        )
    )
    return ProcessTable(
        jobs=(ours, theirs, dead),
        notes=(),
        gpu_error=None,
        scanned_at=NOW,
        holders=holders,
    )


LEAK_COMMAND = "python /home/ana/scratch/leak_check.py --hold-gpu 6"


# The eight-GPU machine's host: 64 cores a third busy, 200 of 512 GiB in use, no swap used.
EIGHT_GPU_HOST = HostUsage(
    cpu_percent=33.0,
    cores=64,
    memory_used_bytes=200 * 2**30,
    memory_total_bytes=512 * 2**30,
    swap_used_bytes=0,
    swap_total_bytes=8 * 2**30,
    load_average=21.5,
)


def eight_gpu_view(inventory: GpuInventory) -> GpuView:
    """What the GPUs screen shows of the eight-GPU machine, through the real join."""
    table = eight_gpu_table()
    visible = {h.pid: h.zombie for h in table.holders.holders}
    visible |= {p.pid: p.state == JobState.ZOMBIE for j in table.jobs for p in j.processes}
    join = join_gpus(inventory, table.holders, visible)
    table = replace(table, hidden_holders=join.hidden, gpu_holdings=join.holdings)
    return build_gpu_view(
        inventory,
        table,
        probe=StandInProbe(alive=[8800], cpu=0.0, rss=1200 * 2**20),
        commands={8800: LEAK_COMMAND},
        uid=ANA,
        now=NOW,
        host=EIGHT_GPU_HOST,
    )


def stand_in_actions(app: Any) -> StandInActions:
    """The stand-in actions an app of ``make_app`` was given, typed."""
    actions = app.actions
    assert isinstance(actions, StandInActions)
    return actions


def started_stand_in(run_dir: RunDir) -> Any:
    """A launcher this UI started, as ``StartedRun`` stands for it: still running."""

    class Started:
        run_id = run_dir.run_id

        def __init__(self) -> None:
            self.run_dir = run_dir

        def poll(self) -> int | None:
            return None

    return Started()


class StandInActions(EngineActions):
    """Engine actions that record what the UI asked for instead of touching the machine."""

    def __init__(self, runs_dir: Path) -> None:
        # No claim store: the form's queue check is ``ddptui run --queue``'s, on no store yet.
        super().__init__(runs_dir, claims_dir=NO_CLAIM_STORE)
        self.started: list[RunConfig] = []
        self.killed: list[str] = []
        self.cleaned = 0
        self.cleaned_all_users: list[bool] = []
        self.start_as: RunDir | None = None
        self.stopped: list[tuple[tuple[int, ...], bool]] = []
        self.where: list[str] = []  # where each start asked to run ("" here, "slurm")
        # Slurm as this stand-in answers: its partitions, or None for "no Slurm here".
        self.partitions: list[tuple[str, bool, int, str]] | None = None
        self.signalled: list[tuple[str, tuple[int, ...], bool]] = []
        self.queued: list[bool] = []  # whether each start asked for the machine's queue
        self.line: list[Verdict] = []  # the queue's line as this stand-in reads it
        self.resumed: list[str] = []
        self.refuse_resume = ""  # the sentence a resume is refused with ("": it starts)

    def start_run(
        self, config: RunConfig, gpu_count: int, *, where: str = "", queue: bool = False
    ) -> Any:
        self.started.append(config)
        self.where.append(where)
        self.queued.append(queue)
        if self.start_as is None:
            raise RuntimeError("this stand-in starts nothing")
        return started_stand_in(self.start_as)

    def resume_run(self, run_dir: RunDir) -> tuple[Any, str]:
        self.resumed.append(run_dir.run_id)
        if self.refuse_resume:
            raise ValueError(self.refuse_resume)
        said = f"run {run_dir.run_id}: started attempt 2 (it failed), from step 10"
        return started_stand_in(run_dir), said

    def slurm_partitions(self) -> list[tuple[str, bool, int, str]]:
        if self.partitions is None:
            raise RuntimeError("Slurm's sinfo is not on PATH")
        return self.partitions

    def check_placement(self, where: str, config: RunConfig) -> Any:
        """As ``ddptui run --slurm`` checks, against the stand-in's partitions: each node's plan."""
        from engine.core.backends.slurm.config import SlurmConfig
        from engine.core.backends.slurm.submit import node_plan
        from engine.core.config.schema import ConfigError

        assert where == "slurm"
        if self.partitions is None:
            raise ConfigError("--slurm: Slurm's srun is not on PATH")
        names = {name: nodes for name, _, nodes, _ in self.partitions}
        default = next(name for name, chosen, _, _ in self.partitions if chosen)
        slurm = SlurmConfig.of(config)
        partition = slurm.partition or default
        if partition not in names:
            raise ConfigError(f"--partition {partition}: Slurm has no such partition")
        if slurm.nodes > names[partition]:
            raise ConfigError(
                f"--nodes {slurm.nodes}: partition {partition} has {names[partition]} node(s)"
            )
        return node_plan(config)[0]

    def read_queue(self) -> list[Verdict]:
        return list(self.line)

    def kill_run(self, run_dir: RunDir, grace: float = 5.0) -> Outcome:
        self.killed.append(run_dir.run_id)
        return Outcome(True, f"stopped run {run_dir.run_id}: 5 processes; none left")

    def scan_processes(self) -> ProcessTable:
        return orphan_table()

    def clean(self, grace: float = 5.0, all_users: bool = False) -> Outcome:
        self.cleaned += 1
        self.cleaned_all_users.append(all_users)
        return Outcome(True, "cleaned 1 orphaned job; 2 processes stopped")

    def scan_gpus(self, inventory: GpuInventory) -> GpuView:
        return eight_gpu_view(inventory)

    def stop_processes(self, refs: Any, grace: float = 5.0, all_users: bool = False) -> Outcome:
        self.stopped.append((tuple(r.pid for r in refs), all_users))
        n = len(refs)
        return Outcome(True, f"stopped {n} process{'es' if n != 1 else ''}; none left")

    def signal_processes(self, refs: Any, signal_name: str, all_users: bool = False) -> Outcome:
        self.signalled.append((signal_name, tuple(r.pid for r in refs), all_users))
        return Outcome(True, f"sent {signal_name} to {len(refs)} process(es)")

    def list_benches(self) -> list[Any]:
        return []


def seed_gpu_history(app: DdptuiApp) -> None:
    """A fixed 40-sample history, so the sparklines are the same in every snapshot."""
    for i in range(40):
        util = 50 + 45 * math.sin(i / 4)
        app.gpu_history.add(0, util, 0.2 + 0.1 * (i % 5))
        app.gpu_history.add(1, None, None)
        for gpu, card in enumerate(EIGHT_GPUS[2:], start=2):  # the eight-GPU machine's others
            busy = card.util * (0.8 + 0.2 * math.sin(i / 3 + gpu))
            app.gpu_history.add(gpu, busy, card.used_gib / 80 * (0.9 + 0.1 * math.cos(i / 5)))


def _tables_measured(app: Any) -> bool:
    """A DataTable measures its new rows' columns when the app is next idle; until then it draws
    them at the headers' widths, so a screenshot taken in between is not what a user sees."""
    from textual.widgets import DataTable

    return not any(t._require_update_dimensions for t in app.screen.query(DataTable))


async def settle(pilot: Any, until: Callable[[], bool] | None = None, timeout: float = 5.0) -> None:
    """Let workers post and handlers run (until ``until`` holds, when given, and no worker a
    handler started is still going), and tables measure what they were given."""
    from textual.worker import WorkerCancelled, WorkerState

    deadline = time.monotonic() + timeout
    while True:
        await pilot.pause(0.05)
        try:
            await pilot.app.workers.wait_for_complete()
        except WorkerCancelled:  # replaced by a newer one (exclusive workers): wait for that
            if time.monotonic() > deadline:
                return
            continue
        await pilot.pause()
        going = any(
            w.state in (WorkerState.PENDING, WorkerState.RUNNING) and not w.is_cancelled
            for w in pilot.app.workers
        )
        done = (until is None or until()) and not going
        if (done and _tables_measured(pilot.app)) or time.monotonic() > deadline:
            return


def text_of(widget: Any) -> str:
    """The plain text a widget shows (its Rich renderable printed wide)."""
    import io

    from rich.console import Console
    from textual.widgets import Static

    console = Console(width=300, file=io.StringIO(), record=True, color_system=None)
    console.print(widget.content if isinstance(widget, Static) else widget.render())
    return console.export_text()


def screen_text(app: Any) -> str:
    """The whole screen as a user sees it, as plain text lines (what a snapshot draws)."""
    import io

    from rich.console import Console

    console = Console(
        width=app.size.width,
        height=app.size.height,
        file=io.StringIO(),
        record=True,
        color_system=None,
        legacy_windows=False,
    )
    console.print(app.screen._compositor.render_update(full=True))
    return console.export_text()


EIGHT_RANK_RUN = "20261202-103200-fast-ddp-8r8g"
EIGHT_RANK_LAUNCHER = ProcessRef(pid=525200, start_time=NOW - 300)
EIGHT_RANK_PIDS = tuple(525210 + r for r in range(8))


def make_eight_rank_run(runs_dir: Path) -> RunDir:
    """A run of 8 ranks on GPUs 0-7, going at NOW: rank 3 stalled, rank 6 a straggler."""
    from engine.core.common.statuses import RunStatus
    from engine.core.config.presets import load_preset
    from engine.core.config.toml_io import apply_overrides, to_toml
    from engine.core.runs.events import (
        EpochStarted,
        EventWriter,
        RankStalled,
        RankStarted,
        RankStraggling,
        RunStarted,
        StepProgress,
    )
    from engine.core.runs.rundir import RunInfo

    run = RunDir(runs_dir / EIGHT_RANK_RUN)
    run.create()
    config = apply_overrides(
        load_preset("fast-ddp"), {"devices.spec": "all", "data.dataset": "synthetic"}
    )
    run.config_path.write_text(to_toml(config), encoding="utf-8")
    devices = "gpu:" + ",".join(str(i) for i in range(8))
    run.write_run_info(
        RunInfo(
            run_id=EIGHT_RANK_RUN,
            preset="fast-ddp",
            host="trainbox",
            created=NOW - 300,
            state=RunStatus.RUNNING,
            world_size=8,
            devices=devices,
            launcher=EIGHT_RANK_LAUNCHER,
            ranks=tuple(ProcessRef(pid, NOW - 299) for pid in EIGHT_RANK_PIDS),
        )
    )
    start = NOW - 290
    with EventWriter(run.launcher_events_path) as launcher:
        launcher.write(
            RunStarted(
                run_id=EIGHT_RANK_RUN,
                world_size=8,
                launcher_pid=EIGHT_RANK_LAUNCHER.pid,
                devices=devices,
                time=start,
            )
        )
        launcher.write(RankStalled(rank=3, silent_seconds=75.0, time=NOW - 1))
        launcher.write(
            RankStraggling(rank=6, step_seconds=0.9, others_median_step_seconds=0.3, time=NOW - 2)
        )
    for rank, pid in enumerate(EIGHT_RANK_PIDS):
        with EventWriter(run.rank_events_path(rank)) as w:
            w.write(RankStarted(rank=rank, world_size=8, pid=pid, host="trainbox",
                                device=f"cuda:{rank}", gpu_index=rank, time=start))  # fmt: skip
            w.write(EpochStarted(rank=rank, epoch=0, steps=195, time=start + 5))
            upto = 60 if rank == 3 else 140
            for step in range(10, upto + 1, 10):
                w.write(StepProgress(rank=rank, epoch=0, step=step, steps=195,
                                     global_step=step, loss=round(2.3 * 0.99**step, 4),
                                     images_per_s=850.0 if rank != 6 else 280.0,
                                     step_seconds=0.3 if rank != 6 else 0.9, lr=0.1,
                                     time=start + 5 + step * 0.3 * (0.5 if rank != 3 else 1.0)))  # fmt: skip
        run.rank_log_path(rank).write_text(
            "".join(f"[rank {rank}] epoch 1 step {s}/195\n" for s in range(10, 141, 10)),
            encoding="utf-8",
        )
    return run

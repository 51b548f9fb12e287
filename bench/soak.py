"""Soak: many short real runs with random faults; does every one end with nothing left running and
a summary.json? (issue 8)

Each run is cpu-demo on ``cpu:2`` for a handful of steps, started the way ``ddptui run`` starts it
(``engine.core.backends.local.start.start_run``: the launcher in its own session, ranks spawned by it), with one
fault drawn at random:

- ``none``, ``crash``, ``exit``: a clean run, a rank raising, a rank's ``os._exit(3)``;
- ``hang``: a rank blocks forever; ``supervision.kill_stalled_after`` makes the launcher end it;
- ``hang-collective``: a rank blocks before its backward, the other in the all-reduce; the
  collective timeout (``ddp.timeout_seconds``) fails the run;
- ``oom``: a rank allocates until the kernel's OOM killer ends it (only where the fault can cap
  itself in a memory cgroup: unconfined it would fill the machine);
- ``kill-launcher``: a rank SIGKILLs its launcher mid-epoch;
- ``sigkill-launcher``: this script SIGKILLs the launcher at a random moment, start-up included
  (ranks still importing torch);
- ``sigkill-rank``: this script SIGKILLs a rank mid-run;
- ``sigstop-rank``: this script SIGSTOPs a rank mid-run: it stalls the run, and
  ``supervision.kill_stalled_after`` makes the launcher end it as failed (SIGKILL reaches a
  stopped process);
- ``diverge``: a learning rate of 1e30 makes the loss NaN within a few steps: failed, "training
  diverged at epoch E step S on rank R";
- ``full-disk``: the run's directory is on its own 3 MiB tmpfs, which this script fills once the
  ranks train (root only: it mounts): failed, one sentence naming the path and the free space,
  and still a summary;
- ``hang-eval``, ``hang-setup``: a rank blocks as evaluation starts, or in its setup before its
  model is built (slow phases, whose fixed rule is 10 minutes); ``hang-script``: a rank of the
  tutorial's own DDP script blocks after a few fast steps it never reported. The launcher's probe
  must flag each within 30 s of the rank's last event, naming it the culprit
  (``supervision.kill_stalled_after`` then ends the run).

Beside the runs, a healthy script run goes on in a runs directory of its own for the whole soak,
and after every run the soak plans a ``ddptui clean`` of the whole machine (the ``clean --yes``
judgement: ``plan_clean`` over a full process scan) and stops what it plans of its own runs; with
``--clean-cli`` it runs the real ``ddptui clean --yes`` instead (every orphan of the machine: a
machine of your own only). Goal: that healthy run is never planned, and none of its processes
is stopped.

A run that ends without a launcher summary is settled half the time the way the ``ddptui run``
follower does it (it knows the launcher's exit status) and half the time the way ``ddptui runs``
does (``observe_run``, then ``settle_observed``), so both writers of ``lost`` summaries are
exercised.

After each run (and a grace of ``--grace`` seconds) it counts the processes still carrying the
run's marker (goal 0), whether summary.json exists (goal 0 missing), its status against the one
the fault should give, files a run should not leave (``.*.tmp``, the rendezvous file, the space
reserve; goal 0), any memory cgroup an ``oom`` fault left, and the stalls the launcher flagged in
runs where nothing stops a rank (false stalls, goal 0: the stall rule follows each run's pace).
Exit code 1 when a goal is missed.

    .venv/bin/python bench/soak.py                      # 30 runs, about 6 minutes on 2 cores
    .venv/bin/python bench/soak.py --runs 60 --seed 7 --max-minutes 12
    .venv/bin/python bench/soak.py --faults sigkill-launcher,kill-launcher --runs 10 --keep

Run on demand, never as a test.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import psutil  # noqa: E402

from engine.core.backends.local.kill import kill_run  # noqa: E402
from engine.core.backends.local.start import StartedRun, start_run  # noqa: E402
from engine.core.common.run_environment import RUN_MARKER_ENV  # noqa: E402
from engine.core.config.presets import load_preset  # noqa: E402
from engine.core.config.schema import RunConfig, ScriptConfig  # noqa: E402
from engine.core.config.toml_io import apply_overrides  # noqa: E402
from engine.core.jobs.clean import CleanPlan, clean_orphans, plan_clean  # noqa: E402
from engine.core.jobs.process_table import scan_processes  # noqa: E402
from engine.core.ops.follower import follow_run  # noqa: E402
from engine.core.runs.events import RankStalled, read_events  # noqa: E402
from engine.core.runs.observer import LAUNCHER_START_GRACE_SECONDS, observe_run  # noqa: E402
from engine.core.runs.rundir import RunDir  # noqa: E402
from engine.core.runs.settle import settle_observed  # noqa: E402
from engine.train.memory_fault import FAULT_CGROUP_PREFIX, own_memory_cgroup  # noqa: E402

FAULTS = (
    "none",
    "crash",
    "exit",
    "hang",
    "hang-collective",
    "oom",
    "kill-launcher",
    "sigkill-launcher",
    "sigkill-rank",
    "sigstop-rank",
    "diverge",
    "full-disk",
    "hang-eval",
    "hang-setup",
    "hang-script",
)
# Hangs in slow phases, which the launcher's probe must flag within PROBE_GOAL_SECONDS.
PROBED = ("hang-eval", "hang-setup", "hang-script")
PROBE_GOAL_SECONDS = 30.0
# Faults that stop a rank from reporting: a stall flagged in any other run is a false one.
STALLING = ("hang", "hang-collective", "sigstop-rank", *PROBED)
TUTORIAL = REPO / "tests" / "fixtures" / "tutorial_ddp.py"
HEALTHY_SCRIPT = "import time\nwhile True:\n    time.sleep(0.5)\n"
# The status each fault should end its run with.
EXPECTED = {
    "none": ("completed",),
    "crash": ("failed",),
    "exit": ("failed",),
    "hang": ("failed",),
    "hang-collective": ("failed",),
    "oom": ("failed",),
    "kill-launcher": ("lost",),
    # killed before it wrote run.json's ranks, or before any rank started: still lost
    "sigkill-launcher": ("lost",),
    "sigkill-rank": ("failed",),
    "sigstop-rank": ("failed",),  # stalled, then ended by supervision.kill_stalled_after
    "diverge": ("failed",),
    "full-disk": ("failed",),
    "hang-eval": ("failed",),
    "hang-setup": ("failed",),
    "hang-script": ("failed",),
}
FULL_DISK_BYTES = 3 * 1024 * 1024
STEPS = 12
RUN_TIMEOUT_SECONDS = 120.0


@dataclass
class Outcome:
    fault: str
    run_id: str
    status: str  # summary.json's status, or "missing"
    expected: bool
    left: int  # processes still carrying the run's marker after the grace
    debris: int  # files a finished run must not leave: .*.tmp, .rendezvous, .space-reserve
    cgroups_left: int
    seconds: float
    settled_by: str  # launcher | follower | reader
    stalls: int  # stalls the launcher flagged
    flagged_after: float | None = None  # probed hangs: seconds from the rank's last event
    flagged_culprit: bool = False  # probed hangs: the flagged rank is the one that hangs
    healthy_planned: int = 0  # times the clean plan named the healthy run


def marked(run_id: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get(RUN_MARKER_ENV) == run_id and proc.status() != "zombie":
                found.append(proc)
        except psutil.Error:
            continue
    return found


def fault_cgroups() -> set[str]:
    group = own_memory_cgroup()
    if group is None or not group.is_dir():
        return set()
    return {p.name for p in group.glob(f"{FAULT_CGROUP_PREFIX}*")}


def oom_fault_can_be_confined() -> bool:
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(REPO)!r})
        from engine.train.memory_fault import confine
        print(confine(1 << 30) or "")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    ).stdout.strip()
    if out:
        with contextlib.suppress(OSError):
            Path(out).rmdir()
    return bool(out)


def overrides_for(fault: str, rng: random.Random) -> dict[str, object]:
    values: dict[str, object] = {
        "devices.spec": "cpu:2",
        "training.epochs": 1,
        "training.max_steps": STEPS,
        "training.evaluate": False,
        "training.checkpoint": False,
        "training.report_interval": 0,
    }
    rank, step = rng.randrange(2), rng.randrange(1, STEPS - 2)
    if fault in ("crash", "exit", "hang", "hang-collective", "oom", "kill-launcher"):
        values["faults"] = [f"{fault}:{rank}:{step}"]
    if fault == "hang-collective":
        values["training.max_steps"] = 10_000
        values["ddp.timeout_seconds"] = 5
    if fault in ("hang", "sigstop-rank"):
        values["training.max_steps"] = 10_000
        values["supervision.stall_seconds"] = 2
        values["supervision.kill_stalled_after"] = 2
    if fault in ("sigkill-launcher", "sigkill-rank", "full-disk"):
        values["training.max_steps"] = 10_000  # this script ends it
        values["training.epochs"] = 50
    if fault == "diverge":
        values["optimizer.lr"] = 1e30
    if fault in PROBED:
        values["training.max_steps"] = 10_000 if fault == "hang-setup" else STEPS
        values["supervision.kill_stalled_after"] = 2
        values["ddp.timeout_seconds"] = 120  # the probe must act first
    if fault == "hang-eval":
        values.update({"training.evaluate": True, "data.test_size": 1000})
        values["faults"] = [f"hang-eval:{rank}:0"]
    if fault == "hang-setup":
        values["faults"] = [f"hang-setup:{rank}:0"]
    return values


def config_for(fault: str, rng: random.Random) -> tuple[RunConfig, int | None]:
    """The run of ``fault`` and the rank that hangs (probed hangs only)."""
    overrides = overrides_for(fault, rng)
    if fault == "hang-script":
        rank = rng.randrange(2)
        script = ScriptConfig(
            path=str(TUTORIAL),
            args=("--epochs", "3", "--steps", "20", "--hang-rank", str(rank), "--at-step", "3"),
        )
        overrides = {
            k: v for k, v in overrides.items() if k.startswith(("supervision", "ddp", "devices"))
        }
        return apply_overrides(RunConfig.for_script(script), overrides), rank
    config = apply_overrides(load_preset("cpu-demo"), overrides)
    hanging = next((f for f in config.faults if f.split(":")[0] in PROBED), None)
    return config, int(hanging.split(":")[1]) if hanging else None


def flag_latency(run_dir: RunDir, rank: int | None) -> tuple[float | None, bool]:
    """Seconds from the hanging rank's last event to the first stall flagged, and whether the
    flagged rank is the hanging one."""
    stalls = [e for e in read_events(run_dir.launcher_events_path) if isinstance(e, RankStalled)]
    if rank is None or not stalls:
        return None, False
    said = [e.time for e in read_events(run_dir.rank_events_path(rank)) if e.time <= stalls[0].time]
    since = max(said) if said else stalls[0].time
    return stalls[0].time - since, stalls[0].rank == rank


def ranks_named(run_dir: RunDir) -> list[int]:
    try:
        return [r.pid for r in run_dir.read_run_info().ranks]
    except Exception:
        return []


def fill(directory: Path) -> None:
    """Write until the disk refuses."""
    with contextlib.suppress(OSError), open(directory / "filler", "ab") as f:
        while True:
            f.write(b"\0" * 65536)
            f.flush()


def mount_small_disk(where: Path) -> bool:
    where.mkdir(parents=True, exist_ok=True)
    size = f"size={FULL_DISK_BYTES}"
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", size, "tmpfs", str(where)], capture_output=True, check=False
    )
    return done.returncode == 0


def full_disk_possible(runs_dir: Path) -> bool:
    probe = runs_dir / "probe-disk"
    if os.geteuid() != 0 or not mount_small_disk(probe):
        return False
    subprocess.run(["umount", "-l", str(probe)], check=False)
    probe.rmdir()
    return True


def debris(run_dir: RunDir) -> list[str]:
    names = (".rendezvous", ".space-reserve")
    return [str(p) for p in run_dir.path.rglob(".*") if p.name in names or p.name.endswith(".tmp")]


def inject_from_outside(started: StartedRun, fault: str, rng: random.Random) -> None:
    """SIGKILL the launcher (at a random moment from start-up on); once the ranks train,
    SIGKILL or SIGSTOP a rank, or fill the disk under the run."""
    deadline = time.monotonic() + 60
    if fault == "sigkill-launcher":
        time.sleep(rng.uniform(0.5, 8.0))
        with contextlib.suppress(ProcessLookupError):
            os.kill(started.process.pid, signal.SIGKILL)
        return
    while time.monotonic() < deadline and started.poll() is None:
        pids = ranks_named(started.run_dir)
        if pids and any(started.run_dir.rank_event_paths()):
            time.sleep(rng.uniform(0.2, 2.0))
            if fault == "full-disk":
                fill(started.run_dir.path.parent.parent)
                return
            sig = signal.SIGSTOP if fault == "sigstop-rank" else signal.SIGKILL
            with contextlib.suppress(ProcessLookupError):
                os.kill(rng.choice(pids), sig)
            return
        time.sleep(0.1)


def soak_one(fault: str, runs_dir: Path, rng: random.Random, grace: float) -> Outcome:
    config, hanging = config_for(fault, rng)
    began = time.monotonic()
    disk: Path | None = None
    if fault == "full-disk":  # a disk of its own, filled once the ranks train
        disk = Path(tempfile.mkdtemp(prefix="disk-", dir=runs_dir))
        if not mount_small_disk(disk):
            raise SystemExit(f"soak: cannot mount a tmpfs at {disk}")
        runs_dir = disk / "runs"
    started = start_run(config, runs_dir)
    if fault in ("sigkill-launcher", "sigkill-rank", "sigstop-rank", "full-disk"):
        inject_from_outside(started, fault, rng)
    try:
        started.wait(timeout=RUN_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        started.process.kill()
        started.wait()
    settled_by = "launcher"
    if not started.run_dir.summary_path.exists():
        if rng.random() < 0.5:
            settled_by = "follower"
            follow_run(started, on_state=lambda _state: None)  # the launcher has exited
        else:
            # `ddptui runs` as it reads the run after the launcher's start-up grace: a launcher
            # killed before it recorded itself is only then known to be gone
            settled_by = "reader"
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                later = time.time() + LAUNCHER_START_GRACE_SECONDS
                state = settle_observed(observe_run(started.run_dir, now=later))
                if state.summary is not None:
                    break
                time.sleep(0.2)
    time.sleep(grace)
    left = marked(started.run_id)
    for proc in left:  # counted; now ended so the next run starts clean
        with contextlib.suppress(psutil.Error):
            proc.kill()
    summary = started.run_dir.read_summary()
    status = str(summary.status) if summary else "missing"
    flagged_after, flagged_culprit = flag_latency(started.run_dir, hanging)
    leftover_files = debris(started.run_dir)
    if disk is not None:
        subprocess.run(["umount", "-l", str(disk)], check=False)
    return Outcome(
        fault=fault,
        run_id=started.run_id,
        status=status,
        expected=status in EXPECTED[fault],
        left=len(left),
        debris=len(leftover_files),
        cgroups_left=len(fault_cgroups()),
        seconds=time.monotonic() - began,
        settled_by=settled_by,
        stalls=sum(
            isinstance(e, RankStalled) for e in read_events(started.run_dir.launcher_events_path)
        ),
        flagged_after=flagged_after,
        flagged_culprit=flagged_culprit,
    )


class HealthyRun:
    """A script run that stays healthy for the whole soak, in a runs directory of its own (not
    the one the soak's runs use, nor the working directory's): no clean may plan or stop it."""

    def __init__(self) -> None:
        self.home = Path(tempfile.mkdtemp(prefix="ddptui-soak-healthy-"))
        script = self.home / "healthy.py"
        script.write_text(HEALTHY_SCRIPT)
        config = apply_overrides(
            RunConfig.for_script(ScriptConfig(path=str(script))), {"devices.spec": "cpu:2"}
        )
        self.started = start_run(config, self.home / "runs")
        deadline = time.monotonic() + 60
        while len(ranks_named(self.started.run_dir)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        info = self.started.run_dir.read_run_info()
        refs = [r for r in [info.launcher, *info.ranks] if r is not None]
        self.processes = [psutil.Process(r.pid) for r in refs]
        self.planned = 0  # times a clean plan named it

    @property
    def run_id(self) -> str:
        return self.started.run_id

    def stopped(self) -> int:
        """Its processes that are no longer running (goal 0)."""
        count = 0
        for proc in self.processes:
            try:
                count += not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
            except psutil.Error:
                count += 1
        return count

    def clean_round(self, soak_ids: set[str], clean_cli: bool) -> None:
        """Judge the whole machine as `ddptui clean --yes` does; stop what it plans of the soak's
        own runs (with ``clean_cli``: run `ddptui clean --yes` itself)."""
        if clean_cli:
            done = subprocess.run(
                [sys.executable, "-m", "ddptui", "clean", "--yes"],
                cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip
            self.planned += self.run_id in done.stdout
            return
        plan = plan_clean(scan_processes(cpu_interval=0.0))
        self.planned += any(j.run_id == self.run_id for j in plan.jobs)
        own = tuple(j for j in plan.jobs if j.run_id in soak_ids)
        clean_orphans(CleanPlan(jobs=own, left_alone=()), grace=2.0)

    def close(self) -> None:
        kill_run(self.started.run_dir, grace=2.0, check_gpu=False)
        self.started.wait(timeout=30)
        import shutil

        shutil.rmtree(self.home, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-minutes", type=float, default=10.0, help="stop starting new runs")
    parser.add_argument("--grace", type=float, default=2.0, help="seconds before counting")
    parser.add_argument("--faults", default=",".join(FAULTS), help="comma-separated subset")
    parser.add_argument("--keep", action="store_true", help="keep the run directories")
    parser.add_argument(
        "--clean-cli",
        action="store_true",
        help="run the real `ddptui clean --yes` after each run (stops every orphan of the "
        "machine: on a machine of your own only)",
    )
    args = parser.parse_args()
    faults = [f for f in args.faults.split(",") if f]
    unknown = [f for f in faults if f not in FAULTS]
    if unknown:
        print(f"soak: unknown fault {unknown[0]!r}; choose from {', '.join(FAULTS)}")
        return 2
    if "oom" in faults and not oom_fault_can_be_confined():
        print("soak: no writable memory cgroup here, so the oom fault is left out")
        faults.remove("oom")
    rng = random.Random(args.seed)
    runs_dir = Path(tempfile.mkdtemp(prefix="ddptui-soak-"))
    if "full-disk" in faults and not full_disk_possible(runs_dir):
        print("soak: cannot mount a tmpfs here (root only), so the full-disk fault is left out")
        faults.remove("full-disk")
    cgroups_before = fault_cgroups()
    outcomes: list[Outcome] = []
    stop_at = time.monotonic() + args.max_minutes * 60
    # every fault once, then at random
    plan = faults + [rng.choice(faults) for _ in range(max(0, args.runs - len(faults)))]
    healthy = HealthyRun()
    try:
        for i, fault in enumerate(plan[: args.runs]):
            if time.monotonic() >= stop_at:
                print(f"soak: --max-minutes {args.max_minutes} reached after {i} runs")
                break
            o = soak_one(fault, runs_dir, rng, args.grace)
            outcomes.append(o)
            healthy.clean_round({x.run_id for x in outcomes}, args.clean_cli)
            print(
                f"{i + 1:3d}  {o.fault:17s} {o.status:10s} left {o.left} debris {o.debris}  "
                f"settled by {o.settled_by:8s} {o.seconds:5.1f} s{_flagged(o)}{_missed(o)}",
                flush=True,
            )
        healthy_stopped = healthy.stopped()
    finally:
        healthy.close()
    left = sum(o.left for o in outcomes)
    false_stalls = sum(o.stalls for o in outcomes if o.fault not in STALLING)
    missing = sum(o.status == "missing" for o in outcomes)
    leftover = sum(o.debris for o in outcomes)
    unexpected = [o for o in outcomes if not o.expected]
    cgroups = len(fault_cgroups() - cgroups_before)
    probed = [o for o in outcomes if o.fault in PROBED]
    late = [o for o in probed if not _probe_met(o)]
    print()
    print(f"runs               {len(outcomes)}")
    print(f"faults             {dict(Counter(o.fault for o in outcomes))}")
    print(f"statuses           {dict(Counter(o.status for o in outcomes))}")
    print(f"settled by         {dict(Counter(o.settled_by for o in outcomes))}")
    print(f"processes left     {left}   (goal 0)")
    print(f"summaries missing  {missing}   (goal 0)")
    print(f"files left behind  {leftover}   (goal 0: .*.tmp, .rendezvous, .space-reserve)")
    print(f"unexpected status  {len(unexpected)}   {[(o.fault, o.status) for o in unexpected]}")
    print(f"cgroups left       {cgroups}   (goal 0)")
    print(f"false stalls       {false_stalls}   (goal 0)")
    latencies = sorted(o.flagged_after for o in probed if o.flagged_after is not None)
    shown = ", ".join(f"{x:.0f}" for x in latencies) or "-"
    print(f"hangs flagged      {len(probed) - len(late)}/{len(probed)} within {PROBE_GOAL_SECONDS:g} s "
          f"with the culprit (seconds after its last event: {shown})")  # fmt: skip
    print(f"healthy planned    {healthy.planned}   (goal 0: the script run of another runs dir)")
    print(f"healthy stopped    {healthy_stopped}   (goal 0)")
    print(f"run directories    {runs_dir}" + ("" if args.keep else " (removed)"))
    if not args.keep:
        import shutil

        shutil.rmtree(runs_dir, ignore_errors=True)
    missed = left or missing or unexpected or cgroups or leftover or false_stalls or late
    return 1 if missed or healthy.planned or healthy_stopped else 0


def _probe_met(o: Outcome) -> bool:
    return (
        o.flagged_after is not None and o.flagged_after <= PROBE_GOAL_SECONDS and o.flagged_culprit
    )


def _flagged(o: Outcome) -> str:
    if o.fault not in PROBED:
        return ""
    if o.flagged_after is None:
        return "  never flagged"
    return f"  flagged after {o.flagged_after:.0f} s" + ("" if o.flagged_culprit else " (not it)")


def _missed(o: Outcome) -> str:
    good = o.expected and o.left == 0 and o.debris == 0 and o.status != "missing"
    good = good and (o.stalls == 0 or o.fault in STALLING)
    good = good and (o.fault not in PROBED or _probe_met(o))
    return "" if good else "   <-- goal missed"


if __name__ == "__main__":
    sys.exit(main())

"""Reading stacks into a diagnosis (engine.core.stacks.capture, engine.core.stacks.diagnosis) and the stall rule
that follows a run's own pace (engine.core.runs.rank_states), on hand-made stacks and events. The same
on real stuck runs is in tests/test_stuck_runs.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engine.core.common.statuses import ProcessState, RankActivity, RankStatus
from engine.core.procs.process_identity import ProcessRef, identify
from engine.core.runs.events import EpochStarted, PhaseStarted, RankStarted, StepProgress
from engine.core.runs.rank_states import RankStateTracker, Thresholds
from engine.core.stacks.capture import (
    ProcessStack,
    capture_stack,
    parse_faulthandler,
    parse_py_spy_json,
)
from engine.core.stacks.diagnosis import RankTarget, choose_culprit, diagnose
from engine.core.stacks.snapshot import (
    Frame,
    RankDiagnosis,
    StackSnapshot,
    ThreadStack,
    latest_snapshot,
    save_snapshot,
)
from tests.fixtures.repo import REPO_ROOT
from tests.fixtures.waiting import wait_for

ENGINE = str(REPO_ROOT / "engine" / "train")
TORCH = str(Path(sys.prefix) / "lib" / "python3.11" / "site-packages" / "torch")
STDLIB = os.path.dirname(os.__file__)

FAULTHANDLER_TEXT = f"""\
Thread 0x00007f51d2bff640 (most recent call first):
  File "{STDLIB}/threading.py", line 324 in wait
  File "{ENGINE}/worker.py", line 211 in watch
  File "{STDLIB}/threading.py", line 982 in run

Current thread 0x00007f51d7b8c740 (most recent call first):
  File "{STDLIB}/threading.py", line 320 in wait
  File "{ENGINE}/faults.py", line 35 in hang
  File "{ENGINE}/faults.py", line 74 in at_step
  File "{ENGINE}/training.py", line 371 in train_rank
  File "{STDLIB}/multiprocessing/spawn.py", line 135 in _main
  File "<string>", line 1 in <module>
"""


def frames(*spec: tuple[str, str, int]) -> tuple[Frame, ...]:
    return tuple(Frame(function, filename, line) for function, filename, line in spec)


def stack_of(*spec: tuple[str, str, int], state: str = "running") -> ProcessStack:
    main = ThreadStack("MainThread", frames(*spec), main=True)
    return ProcessStack(pid=4242, method="py-spy", process_state=state, threads=(main,))


HUNG = stack_of(
    ("wait", f"{STDLIB}/threading.py", 320),
    ("hang", f"{ENGINE}/faults.py", 35),
    ("train_rank", f"{ENGINE}/training.py", 371),
)
IN_BACKWARD = stack_of(
    ("_engine_run_backward", f"{TORCH}/autograd/graph.py", 829),
    ("backward", f"{TORCH}/autograd/__init__.py", 364),
    ("Tensor.backward", f"{TORCH}/_tensor.py", 630),
    ("train_rank", f"{ENGINE}/training.py", 386),
)
IN_ALL_REDUCE = stack_of(
    ("all_reduce", f"{TORCH}/distributed/distributed_c10d.py", 2950),
    ("reduce_epoch", f"{ENGINE}/training.py", 180),
)
IN_DATA = stack_of(
    ("_MultiProcessingDataLoaderIter._next_data", f"{TORCH}/utils/data/dataloader.py", 1400),
    ("train_rank", f"{ENGINE}/training.py", 377),
)


def target(rank: int, last: float, error: str = "") -> RankTarget:
    return RankTarget(rank, ProcessRef(4242, 1.0), last, error)


# ---- parsing ---------------------------------------------------------------------------------


def test_a_faulthandler_dump_reads_as_threads_with_the_main_one_known() -> None:
    threads = parse_faulthandler(FAULTHANDLER_TEXT)
    assert [len(t.frames) for t in threads] == [3, 6]
    main = next(t for t in threads if t.main)
    assert main.frames[1] == Frame("hang", f"{ENGINE}/faults.py", 35)
    assert main.frames[1].where == "faults.py:35"


def test_py_spy_json_reads_as_threads_with_native_frames_marked() -> None:
    data = [
        {
            "os_thread_id": 4242,
            "thread_name": "MainThread",
            "active": False,
            "frames": [
                {"name": "pthread_cond_wait", "filename": "/lib/libc.so.6", "line": 0},
                {"name": "hang", "filename": f"{ENGINE}/faults.py", "line": 35},
            ],
        },
        {"os_thread_id": 4243, "thread_name": None, "frames": []},
    ]
    main, other = parse_py_spy_json(data, 4242)
    assert main.main and not other.main
    assert main.name == "MainThread (idle)"
    assert main.frames[0].native and not main.frames[1].native
    assert main.frames[1].where == "faults.py:35"


# ---- what each rank was doing, and the culprit ---------------------------------------------


def test_a_hung_rank_is_stepping_in_its_own_code_and_its_peer_waits_in_backward() -> None:
    ranks = diagnose(
        {1: (target(1, 100.0), HUNG), 0: (target(0, 101.0), IN_BACKWARD)}, distributed=True
    )
    by_rank = {r.rank: r for r in ranks}
    assert by_rank[1].activity == RankActivity.STEPPING
    assert by_rank[1].describe() == "rank 1 stuck at faults.py:35 in hang"
    assert by_rank[0].activity == RankActivity.WAITING
    assert by_rank[0].describe() == "rank 0 waiting in backward (all-reduce)"
    assert choose_culprit(ranks) == (1, "the only rank not waiting on its peers")


def test_collectives_data_waits_stopped_and_gone_ranks() -> None:
    ranks = diagnose(
        {
            0: (target(0, 5.0), IN_ALL_REDUCE),
            1: (target(1, 5.0), IN_DATA),
            2: (target(2, 5.0), stack_of(state="stopped")),
            3: (target(3, 5.0), ProcessStack(pid=9, process_state="gone")),
        },
        distributed=True,
    )
    assert [(r.activity, r.detail) for r in ranks] == [
        (RankActivity.WAITING, "in all_reduce"),
        (RankActivity.STEPPING, "waiting for its data"),
        (RankActivity.STOPPED, "SIGSTOP"),
        (RankActivity.GONE, "gone"),
    ]
    assert "kill -CONT 4242" in ranks[2].describe()


def test_a_single_process_run_never_waits_on_peers_in_backward() -> None:
    (rank,) = diagnose({0: (target(0, 1.0), IN_BACKWARD)}, distributed=False)
    assert rank.activity == RankActivity.STEPPING


def test_the_culprit_when_several_or_none_stand_out() -> None:
    def diag(rank: int, activity: RankActivity, last: float) -> RankDiagnosis:
        return RankDiagnosis(rank=rank, pid=rank, activity=activity, last_event_time=last)

    waiting, stepping = RankActivity.WAITING, RankActivity.STEPPING
    two = (diag(0, stepping, 9.0), diag(1, stepping, 3.0), diag(2, waiting, 1.0))
    assert choose_culprit(two) == (  # no evidence which of the two the third waits for (#21)
        None,
        "ranks 0, 1 are not waiting on their peers: no single one is behind",
    )
    gone = (diag(0, waiting, 9.0), diag(1, RankActivity.GONE, 3.0))
    assert choose_culprit(gone) == (1, "it is gone while its peers wait for it")
    all_wait = (diag(0, waiting, 9.0), diag(1, waiting, 4.0))
    assert choose_culprit(all_wait)[0] is None  # a healthy run between steps (#21)
    failed = diagnose(
        {
            0: (target(0, 400.0, "RuntimeError: timed out"), IN_BACKWARD),
            1: (target(1, 100.0), HUNG),
        },
        distributed=True,
    )
    assert failed[0].activity == RankActivity.FAILED
    assert choose_culprit(failed)[0] == 1  # the rank that timed out is the victim


def test_snapshots_are_stored_privately_and_the_latest_is_read_back(tmp_path: Path) -> None:
    ranks = diagnose(
        {1: (target(1, 100.0), HUNG), 0: (target(0, 101.0), IN_BACKWARD)}, distributed=True
    )
    older = save_snapshot(tmp_path, StackSnapshot(time=1000.0, reason="stall", ranks=ranks))
    newer = save_snapshot(
        tmp_path, StackSnapshot(time=2000.0, reason="before kill", ranks=ranks, culprit_rank=1)
    )
    assert older.path and newer.path and older.path != newer.path
    assert Path(newer.path).stat().st_mode & 0o077 == 0
    loaded = latest_snapshot(tmp_path)
    assert loaded is not None and loaded.reason == "before kill"
    assert loaded.summary_line() == (
        "rank 1 stuck at faults.py:35 in hang; rank 0 waiting in backward (all-reduce)"
    )
    assert loaded.ranks == newer.ranks


# ---- a real process's stack, without its cooperation ---------------------------------------

SLEEPER = textwrap.dedent(
    """
    import sys, threading
    sys.path.insert(0, {repo!r})
    from engine.train.rank_bootstrap import prepare_stack_dumps
    def stuck_here(dump):
        print(dump, flush=True)  # from in here: a stack taken once this is read names this frame
        threading.Event().wait()
    stuck_here(prepare_stack_dumps({run_dir!r}))
    """
)


def start_sleeper(run_dir: Path, user: str | None = None) -> subprocess.Popen[str]:
    code = SLEEPER.format(repo=str(REPO_ROOT), run_dir=str(run_dir))
    prefix = []
    if user is not None:
        import pwd

        entry = pwd.getpwnam(user)
        prefix = ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--clear-groups"]
    return subprocess.Popen(
        [*prefix, sys.executable, "-c", code], stdout=subprocess.PIPE, text=True
    )


def test_the_faulthandler_dump_answers_a_signal_with_every_thread(tmp_path: Path) -> None:
    proc = start_sleeper(tmp_path)
    try:
        dump = Path(proc.stdout.readline().strip())  # type: ignore[union-attr]
        assert dump.parent == tmp_path / "stacks" and dump.name == f"pid-{proc.pid}.txt"
        assert dump.stat().st_mode & 0o077 == 0
        ref = identify(proc.pid)
        assert ref is not None
        stack = capture_stack(ref, dump, use_py_spy=False)
        assert stack.method == "faulthandler"
        main = stack.main_thread
        assert main is not None and any(f.function == "stuck_here" for f in main.frames)
        assert proc.poll() is None, "a stack dump must not end the process"
    finally:
        proc.kill()
        proc.wait()


def test_py_spy_takes_the_stack_of_this_users_process(tmp_path: Path) -> None:
    proc = start_sleeper(tmp_path)
    try:
        proc.stdout.readline()  # type: ignore[union-attr]
        ref = identify(proc.pid)
        assert ref is not None
        stack = capture_stack(ref, None)
        assert stack.method == "py-spy", stack.problem
        main = stack.main_thread
        assert main is not None and any(f.function == "stuck_here" for f in main.frames)
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="making a process of another user needs root")
def test_a_normal_user_gets_the_stack_of_their_own_rank(tmp_path: Path) -> None:
    """As a user without privileges: the rank allowed same-user ptrace (PR_SET_PTRACER), and when
    py-spy still may not attach the faulthandler dump answers."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chown(run_dir, 65534, 65534)  # nobody
    proc = start_sleeper(run_dir, user="nobody")
    try:
        assert proc.stdout.readline().strip()  # type: ignore[union-attr]
        probe = textwrap.dedent(
            f"""
            import sys
            sys.path.insert(0, {str(REPO_ROOT)!r})
            from pathlib import Path
            from engine.core.procs.process_identity import identify
            from engine.core.stacks.capture import capture_stack
            ref = identify({proc.pid})
            stack = capture_stack(ref, Path({str(run_dir)!r}) / "stacks" / "pid-{proc.pid}.txt")
            main = stack.main_thread
            print(stack.method, any(f.function == "stuck_here" for f in main.frames) if main else stack.problem)
            """
        )
        import pwd

        entry = pwd.getpwnam("nobody")
        done = subprocess.run(
            ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--clear-groups",
             sys.executable, "-c", probe],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        method, found = done.stdout.split()
        assert method in ("py-spy", "faulthandler"), done.stderr
        assert found == "True", done.stdout + done.stderr
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


# ---- the stall rule --------------------------------------------------------------------------

T0 = 1_000_000.0


def step(rank: int, t: float, step_no: int, step_seconds: float) -> StepProgress:
    return StepProgress(
        rank=rank, epoch=0, step=step_no, steps=100, global_step=step_no, loss=1.0,
        images_per_s=100.0, step_seconds=step_seconds, lr=0.1, time=t,
    )  # fmt: skip


def judged(tracker: RankStateTracker, now: float) -> tuple[RankStatus, float | None]:
    (state,) = tracker.states(now=now, judge_silence=True)
    return state.state, state.stall_after


def test_the_stall_threshold_follows_the_pace_with_a_floor() -> None:
    fast = RankStateTracker(world_size=1)
    fast.feed_all([RankStarted(rank=0, world_size=1, pid=1, host="h", device="cpu", time=T0)])
    fast.feed_all([step(0, T0 + 1 + 0.25 * i, i, 0.05) for i in range(6)])
    assert judged(fast, T0 + 12) == (RankStatus.RUNNING, 10.0)  # the floor
    assert judged(fast, T0 + 13)[0] == RankStatus.STALLED
    slow = RankStateTracker(world_size=1)
    slow.feed_all([step(0, T0 + 30 * i, i, 30.0) for i in range(3)])
    assert judged(slow, T0 + 60 + 200) == (RankStatus.RUNNING, 300.0)  # 10 x its 30 s steps
    assert judged(slow, T0 + 60 + 301)[0] == RankStatus.STALLED


def test_known_slow_phases_are_not_stalls_until_their_own_allowance() -> None:
    tracker = RankStateTracker(world_size=1, thresholds=Thresholds(slow_phase_seconds=100))
    tracker.feed_all([step(0, T0 + 0.25 * i, i, 0.05) for i in range(4)])
    tracker.feed(PhaseStarted(rank=0, phase="evaluation", time=T0 + 1))
    assert judged(tracker, T0 + 60) == (RankStatus.RUNNING, 100.0)
    assert judged(tracker, T0 + 102)[0] == RankStatus.STALLED
    tracker.feed(EpochStarted(rank=0, epoch=1, steps=100, time=T0 + 103))  # warm-up: slow too
    assert judged(tracker, T0 + 150)[0] == RankStatus.RUNNING


def test_a_fixed_stall_seconds_overrides_the_pace() -> None:
    tracker = RankStateTracker(world_size=1, thresholds=Thresholds(stall_seconds=3))
    tracker.feed_all([step(0, T0 + 30 * i, i, 30.0) for i in range(3)])
    assert judged(tracker, T0 + 64)[0] == RankStatus.STALLED


def test_show_says_the_stall_rule_the_run_follows(tmp_path: Path) -> None:
    """The default follows the pace; `ddptui show` once said "stalled after 0 s silent"."""
    from click.testing import CliRunner

    from ddptui.cli import main
    from tests.fixtures.made_runs import make_run

    assert Thresholds().describe() == (
        "stalled when silent 10x its recent step gap (at least 10 s), straggler at 2x the median step"
    )
    make_run(tmp_path, "paced", stall_seconds=0.0)
    make_run(tmp_path, "fixed", stall_seconds=3.0)
    for run_id, rule in (
        ("paced", "stalled when silent 10x its recent step gap (at least 10 s),"),
        ("fixed", "stalled when silent 3 s,"),
    ):
        shown = CliRunner().invoke(main, ["show", run_id, "--runs-dir", str(tmp_path)])
        assert shown.exit_code == 0, shown.output
        assert f"supervise  {rule}" in shown.output


def test_a_stopped_rank_process_is_shown_stopped_with_the_way_out() -> None:
    tracker = RankStateTracker(world_size=1)
    tracker.feed_all(
        [
            RankStarted(rank=0, world_size=1, pid=77, host="h", device="cpu", time=T0),
            step(0, T0, 1, 0.1),
        ]
    )
    (state,) = tracker.states(now=T0 + 100, stopped_pids=frozenset({77}))
    assert state.state == RankStatus.STOPPED
    assert "kill -CONT 77" in state.reason


@pytest.mark.skipif(sys.platform != "linux", reason="ptrace through libc, as py-spy does")
def test_a_process_held_by_a_tracer_is_not_stopped_by_a_signal() -> None:
    """py-spy holds a rank in a tracing stop while ddptui takes its stack: `ddptui runs` at that
    moment must not call the rank stopped (it showed '-' instead of 'stalled 0')."""
    import ctypes

    import psutil

    from engine.core.procs.process_identity import ProcessProbe, lookup

    libc = ctypes.CDLL(None, use_errno=True)
    ptrace_attach, ptrace_detach = 16, 17
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        if libc.ptrace(ptrace_attach, proc.pid, None, None) != 0:
            pytest.skip(f"this kernel refuses ptrace here (errno {ctypes.get_errno()})")
        try:
            assert wait_for(
                lambda: psutil.Process(proc.pid).status() == psutil.STATUS_TRACING_STOP, timeout=5
            )
            ref = identify(proc.pid)
            assert ref is not None
            assert ProcessProbe().stopped([ref]) == frozenset()
            assert lookup(ref)[0] == ProcessState.RUNNING
        finally:
            libc.ptrace(ptrace_detach, proc.pid, None, None)
    finally:
        proc.kill()
        proc.wait()


def test_a_process_stopped_by_sigstop_is_seen_stopped(tmp_path: Path) -> None:
    from engine.core.procs.process_identity import ProcessProbe

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ref = identify(proc.pid)
        assert ref is not None
        proc.send_signal(signal.SIGSTOP)
        probe = ProcessProbe()
        assert wait_for(lambda: probe.stopped([ref]) == {proc.pid}, timeout=5)
        proc.send_signal(signal.SIGCONT)
        assert wait_for(lambda: not probe.stopped([ref]), timeout=5)
    finally:
        proc.kill()
        proc.wait()

"""The GPUs screen: every GPU and every process on it, named; sorting and keyboard moves; stopping a
process or its whole job after a confirmation, your own only unless root allows all users (also
confirmed); the app opening on it with --screen; without NVML one line says why.

The first tests read the eight-GPU stand-in machine (tests/ui/standins.py: a ddptui run, a foreign
job of user bo, an orphaned job, a hidden holder). The last ones stop real processes: they hold a
file made here open (standing in for /dev/nvidia<N>), and a stand-in NVML lists their real pids."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from ddptui.actions import EngineActions
from ddptui.app import DdptuiApp
from ddptui.screens.gpus import GpuBars, GpusScreen
from ddptui.widgets import confirm
from ddptui.widgets.confirm import ConfirmDialog
from ddptui.widgets.gpu_process_list import GpuProcessList
from engine.core.common.statuses import HolderKind
from engine.core.procs.process_identity import ProcessRef, find_process
from tests.fixtures.made_runs import ProcessPen
from tests.fixtures.standin_nvml import EIGHT_GPUS, StandInGpu, standin_nvml
from tests.ui.standins import (
    NOW,
    StandInActions,
    settle,
    text_of,
)

pytestmark = pytest.mark.asyncio
SMALL = (80, 24)


@pytest.fixture
def root(monkeypatch: pytest.MonkeyPatch) -> None:
    """As root: the all-users toggle is offered."""
    monkeypatch.setattr(confirm, "may_stop_other_users", lambda: True)


@pytest.fixture
def not_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(confirm, "may_stop_other_users", lambda: False)


@pytest.fixture
def eight() -> Iterator[None]:
    with standin_nvml(machine=EIGHT_GPUS):
        yield


async def open_gpus(pilot: Any, app: DdptuiApp) -> GpusScreen:
    await settle(pilot, lambda: app.gpu_inventory is not None)
    await pilot.press("g")
    await settle(pilot, lambda: isinstance(app.screen, GpusScreen) and app.screen.view is not None)
    screen = app.screen
    assert isinstance(screen, GpusScreen)
    return screen


def select(screen: GpusScreen, pid: int) -> None:
    procs = screen.query_one(GpuProcessList)
    procs.cursor = [r.pid for r in procs.ordered()].index(pid)


async def test_every_gpu_and_every_holder_named(
    make_app: Callable[..., DdptuiApp], eight: None, root: None
) -> None:
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        screen = await open_gpus(pilot, app)
        bars = text_of(screen.query_one(GpuBars))
        assert bars.count("GPU") == 8 and "7 free"[2:] in bars.splitlines()[7]
        kinds = {(r.gpu_index, r.pid): r.kind for r in screen.query_one(GpuProcessList).rows}
        assert kinds == {
            (0, 6100): HolderKind.DDPTUI,
            (1, 6101): HolderKind.DDPTUI,
            (2, 7200): HolderKind.FOREIGN,
            (3, 7201): HolderKind.FOREIGN,
            (4, 7202): HolderKind.FOREIGN,
            (5, 5100): HolderKind.ORPHANED,
            (5, 5110): HolderKind.WORKER,
            (6, 8800): HolderKind.UNKNOWN,
        }
        listing = text_of(screen.query_one(GpuProcessList))
        assert "unlisted" in listing and "bo" in listing
        assert "leak_check.py" in listing  # the script name survives the elision at 80 columns


async def test_sorting_and_moving_as_in_nvitop(
    make_app: Callable[..., DdptuiApp], eight: None, root: None
) -> None:
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        screen = await open_gpus(pilot, app)
        procs = screen.query_one(GpuProcessList)
        assert [r.gpu_index for r in procs.ordered()] == [0, 1, 2, 3, 4, 5, 5, 6]
        await pilot.press("full_stop")  # next sort column: pid
        await settle(pilot)
        assert procs.sort == "pid"
        assert [r.pid for r in procs.ordered()][:2] == [5100, 5110]
        await pilot.press("slash")
        await settle(pilot)
        assert procs.ordered()[0].pid == 8800
        await pilot.press("full_stop", "full_stop")  # user, then GPU memory
        await settle(pilot)
        assert procs.sort == "gpu mem" and "GPU MEM▼" in text_of(procs)
        await pilot.press("comma", "comma", "comma", "slash")
        await settle(pilot)
        assert (procs.sort, procs.reverse) == ("gpu", False)
        await pilot.press("end")
        await settle(pilot)
        assert procs.selected is not None and procs.selected.pid == 8800
        await pilot.press("home", "down", "down")
        await settle(pilot)
        assert procs.selected is not None and procs.selected.pid == 7200
        assert "torchrun job 'bo-pretrain'" in text_of(screen.query_one("#gpus-detail"))


async def test_another_users_process_is_refused_until_root_allows_all_users(
    make_app: Callable[..., DdptuiApp], eight: None, root: None
) -> None:
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        screen = await open_gpus(pilot, app)
        actions = app.actions
        assert isinstance(actions, StandInActions)
        select(screen, 7201)
        await pilot.press("t")
        await settle(pilot)
        assert not isinstance(app.screen, ConfirmDialog)
        assert any("belongs to bo" in str(n.message) for n in app._notifications)
        await pilot.press("a")
        await settle(pilot)
        assert isinstance(app.screen, ConfirmDialog)  # turning it on is confirmed
        await pilot.press("escape")
        await settle(pilot)
        assert not screen.all_users
        await pilot.press("a")
        await settle(pilot)
        await pilot.press("y")
        await settle(pilot)
        assert screen.all_users
        assert "stops: ALL USERS" in text_of(screen.query_one("#gpus-head"))
        await pilot.press("t")
        await settle(pilot)
        assert isinstance(app.screen, ConfirmDialog)
        await pilot.press("y")
        await settle(pilot, lambda: bool(actions.stopped))
        assert actions.stopped == [((7201,), True)]


async def test_not_root_has_no_all_users_toggle(
    make_app: Callable[..., DdptuiApp], eight: None, not_root: None
) -> None:
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        screen = await open_gpus(pilot, app)
        await pilot.press("a")
        await settle(pilot)
        assert not isinstance(app.screen, ConfirmDialog) and not screen.all_users


async def test_stop_a_whole_job_after_a_confirmation(
    make_app: Callable[..., DdptuiApp], eight: None, root: None
) -> None:
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        screen = await open_gpus(pilot, app)
        actions = app.actions
        assert isinstance(actions, StandInActions)
        select(screen, 5110)  # the DataLoader worker: T stops its whole (orphaned) job
        await pilot.press("T")
        await settle(pilot)
        assert isinstance(app.screen, ConfirmDialog)
        assert "2 processes of torchrun job 'sweep-3'" in app.screen.body_text
        await pilot.press("escape")
        await settle(pilot)
        assert actions.stopped == []
        await pilot.press("T")
        await settle(pilot)
        await pilot.press("y")
        await settle(pilot, lambda: bool(actions.stopped))
        assert actions.stopped == [((5100, 5110), False)]


async def test_the_host_line_says_cpu_memory_and_swap(
    make_app: Callable[..., DdptuiApp], eight: None
) -> None:
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        screen = await open_gpus(pilot, app)
        assert text_of(screen.query_one("#gpus-host")).strip() == (
            "host CPU 33% of 64 · mem 200.0/512.0G · swap 0.0/8.0G · load 21.50"
        )


async def test_f_filters_the_processes_and_the_footer_shows_it(
    make_app: Callable[..., DdptuiApp], eight: None
) -> None:
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        screen = await open_gpus(pilot, app)
        procs = screen.query_one(GpuProcessList)
        shown = {k for k, b in app.active_bindings.items() if b.binding.show and b.enabled}
        assert "f" in shown  # the footer offers it (/ is the sort order's)
        await pilot.press("f", "s", "w", "e", "e", "p")  # the orphaned sweep job
        await settle(pilot)
        assert [r.pid for r in procs.ordered()] == [5100, 5110]
        assert "filter 'sweep' (f: change)" in text_of(screen.query_one("#gpus-head"))
        await pilot.press("enter")  # back to the list, the filter kept
        await settle(pilot)
        assert procs.has_focus and [r.pid for r in procs.ordered()] == [5100, 5110]
        await pilot.press("f", "backspace", "backspace", "backspace", "backspace", "backspace")
        await pilot.press("b", "o")  # by user
        await settle(pilot)
        assert [r.pid for r in procs.ordered()] == [7200, 7201, 7202]
        await pilot.press("escape")  # cleared
        await settle(pilot)
        assert len(procs.ordered()) == 8 and procs.has_focus
        assert "filter" not in text_of(screen.query_one("#gpus-head"))


async def test_stopping_offers_a_choice_of_signal(
    make_app: Callable[..., DdptuiApp], eight: None, root: None
) -> None:
    app = make_app()
    async with app.run_test(size=SMALL) as pilot:
        screen = await open_gpus(pilot, app)
        actions = app.actions
        assert isinstance(actions, StandInActions)
        select(screen, 6100)
        await pilot.press("t")
        await settle(pilot)
        assert isinstance(app.screen, ConfirmDialog)
        assert [c[:2] for c in app.screen.choices] == [
            ("y", "Stop"), ("i", "SIGINT"), ("k", "SIGKILL"),
        ]  # fmt: skip
        await pilot.press("i")
        await settle(pilot, lambda: bool(actions.signalled))
        assert actions.signalled == [("SIGINT", (6100,), False)] and actions.stopped == []
        select(screen, 6101)
        await pilot.press("T", "k")  # its whole job, SIGKILL now
        await settle(pilot, lambda: len(actions.signalled) == 2)
        assert actions.signalled[1] == ("SIGKILL", (6090, 6100, 6101), False)


async def test_signalling_real_processes_by_pid_and_start_time(pen: ProcessPen) -> None:
    import signal as signals

    from engine.core.procs.stopping import signal_refs

    sleeper = pen.python()
    ref = ProcessRef(sleeper.pid, psutil.Process(sleeper.pid).create_time())
    reused = ProcessRef(sleeper.pid, ref.start_time - 100)  # its pid, another start: not it
    left = signal_refs([reused], signals.SIGINT)
    assert (left.sent, left.gone) == ((), (sleeper.pid,)) and left.skipped == (
        f"pid {sleeper.pid} now belongs to another process: left alone",
    )
    assert sleeper.poll() is None
    done = signal_refs([ref], signals.SIGINT)
    assert done.sent == (sleeper.pid,) and done.signal == "SIGINT"
    assert sleeper.wait(timeout=10) != 0  # KeyboardInterrupt ended it
    assert gone(sleeper.pid, ref.start_time)


async def test_a_process_that_cannot_be_told_is_refused_not_called_ended(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import signal as signals

    from engine.core.common.statuses import ProcessState
    from engine.core.procs import stopping

    monkeypatch.setattr(stopping, "lookup", lambda ref: (ProcessState.UNREADABLE, None))
    result = stopping.signal_refs([ProcessRef(4242, 1.0)], signals.SIGINT)
    assert (result.sent, result.gone) == ((), ())
    assert result.refused == ((4242, "this user cannot tell which process it is"),)


async def test_the_app_opens_on_the_gpus_screen(
    make_app: Callable[..., DdptuiApp], eight: None
) -> None:
    app = make_app(screen="gpus")
    async with app.run_test(size=SMALL) as pilot:
        await settle(
            pilot, lambda: isinstance(app.screen, GpusScreen) and app.screen.view is not None
        )
        assert isinstance(app.screen, GpusScreen)


async def test_without_nvml_a_sentence_says_why_whole_at_80_columns(
    make_app: Callable[..., DdptuiApp],
) -> None:
    why = "Driver Not Loaded: the NVIDIA kernel module is not loaded on this machine"
    with standin_nvml(fail_init=why):
        app = make_app()
        async with app.run_test(size=SMALL) as pilot:
            screen = await open_gpus(pilot, app)
            bars = screen.query_one(GpuBars)
            lines = [line.rstrip() for line in text_of(bars).strip().splitlines()]
            assert bars.size.height == len(lines) == 2  # wrapped, not cut at 80 columns
            assert all(len(line) <= 80 for line in lines)
            assert " ".join(lines) == (
                f"GPUs not available: NVML: {why}. Showing the ranks of ddptui runs on the CPU."
            )


# ---- real processes --------------------------------------------------------------------------


def holding(path: Path) -> str:
    return (
        f"import time\nf = open({str(path)!r}, 'rb')\nopen({str(path)!r} + '.ready', 'w')\n"
        "while True: time.sleep(0.1)"
    )


def ready(path: Path, pen: ProcessPen) -> None:
    marker = Path(str(path) + ".ready")
    assert pen.wait_until(marker.exists)
    marker.unlink()


def gone(pid: int, start: float) -> bool:
    """That very process has ended (the identity rule of the engine: pid and start time)."""
    return find_process(ProcessRef(pid, start)) is None


ORPHAN_ENV = {  # a job id of this test process's own: another suite's stand-ins are not in its job
    "TORCHELASTIC_RUN_ID": f"real-orphan-{os.getpid()}",
    "WORLD_SIZE": "2",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29941",
}


async def test_stopping_real_processes_and_a_real_job(
    pen: ProcessPen, tmp_path: Path, pinned: None, root: None
) -> None:
    devices = tmp_path / "dev"
    devices.mkdir()
    for i in range(3):
        (devices / f"nvidia{i}").write_bytes(b"")
    single = pen.python(holding(devices / "nvidia0"))
    ready(devices / "nvidia0", pen)
    ranks = [
        pen.orphan(holding(devices / f"nvidia{r + 1}"), env={**ORPHAN_ENV, "RANK": str(r)})
        for r in range(2)
    ]
    for r in range(2):
        ready(devices / f"nvidia{r + 1}", pen)
    starts = {p.pid: psutil.Process(p.pid).create_time() for p in [single, *ranks]}
    machine = (
        StandInGpu(2.0, 10, 40, 100, ((single.pid, 1.5),)),
        StandInGpu(2.0, 10, 40, 100, ((ranks[0].pid, 1.5),)),
        StandInGpu(2.0, 10, 40, 100),  # rank 1 holds GPU 2 unlisted: found by its open file
    )
    with standin_nvml(machine=machine):
        runs = tmp_path / "runs"
        app = DdptuiApp(
            runs,
            actions=EngineActions(runs, device_glob=str(devices / "nvidia*")),
            clock=lambda: NOW,
            gpu_poll_seconds=3600,
            list_poll_seconds=3600,
        )
        async with app.run_test(size=(120, 30)) as pilot:
            screen = await open_gpus(pilot, app)
            procs = screen.query_one(GpuProcessList)
            rows = {r.pid: r for r in procs.rows}
            assert rows[single.pid].kind == HolderKind.UNKNOWN
            assert rows[ranks[0].pid].kind == HolderKind.ORPHANED
            assert not rows[ranks[1].pid].listed and rows[ranks[1].pid].gpu_index == 2
            select(screen, single.pid)
            await pilot.press("t")
            await settle(pilot)
            assert isinstance(app.screen, ConfirmDialog)
            await pilot.press("y")
            await settle(pilot, lambda: bool(screen.report) and not screen.stopping, timeout=20)
            assert "none left" in screen.report, screen.report
            assert gone(single.pid, starts[single.pid])
            assert not any(gone(p.pid, starts[p.pid]) for p in ranks)
            await settle(pilot, lambda: single.pid not in {r.pid for r in procs.rows})
            select(screen, ranks[1].pid)
            screen.report = ""
            await pilot.press("T")
            await settle(pilot)
            assert isinstance(app.screen, ConfirmDialog)
            await pilot.press("y")
            await settle(pilot, lambda: bool(screen.report) and not screen.stopping, timeout=20)
            assert "stopped 2 processes" in screen.report, screen.report
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and not all(
                gone(p.pid, starts[p.pid]) for p in ranks
            ):
                await pilot.pause(0.1)
            assert all(gone(p.pid, starts[p.pid]) for p in ranks)

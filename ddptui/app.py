"""The Textual app: launch runs, watch every rank and GPU, kill, compare, clean up.

``ddptui`` with no command calls ``run_app()``. The app never imports torch and never starts
ranks itself: runs start through ``engine.core.backends.local.start`` (a launcher in its own session), so closing
the app, a dropped SSH link or a crash leaves them running, and opening a running run re-attaches to
its run directory.

Screens (installed once, switched with the keys in the footer): Launch (l), Runs (r),
Processes (p), GPUs (g), Results (c), and one Run screen per opened run; ``w`` goes to a run
that is going (the one last watched while it goes on, else the newest going on disk), else back
to the run last watched.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from textual import work
from textual.app import App
from textual.binding import Binding, BindingType
from textual.reactive import reactive
from textual.worker import Worker, WorkerState

from ddptui.gpu_history import GpuHistory
from ddptui.messages import GpusSampled, LatestRunFound, RunsGoingAtQuit
from ddptui.runs_location import default_runs_dir
from engine.core.common.visible_text import visible
from engine.core.host.gpus import GpuInventory, sample_gpus
from engine.core.runs.rundir import RunDir

if TYPE_CHECKING:  # imported where first used: the first frame needs none of them
    from textual.screen import Screen

    from ddptui.actions import EngineActions
    from ddptui.watch import Clock, ProcessProbe
    from engine.core.plan.resource_guard import ResourceCheck
    from engine.core.plan.run_plan import RunPlan

    ResourceChecker = Callable[[RunPlan, GpuInventory | None], ResourceCheck]

MAIN_SCREENS = ("launch", "runs", "processes", "gpus", "results")
REAP_SECONDS = 5.0


def check_plan_resources(plan: RunPlan, inventory: GpuInventory | None) -> ResourceCheck:
    """The resource guard on this machine's cores and memory, with the GPUs as last sampled (none
    sampled yet: the GPU rules wait, rather than sample NVML on the UI thread)."""
    from engine.core.plan.resource_guard import check_resources

    sampled = inventory if inventory is not None else GpuInventory(error="not sampled yet")
    return check_resources(plan, inventory=sampled)


class DdptuiApp(App[None]):
    """The whole UI. Everything that touches the machine is injectable for tests: the clock, the
    process probe (psutil), the engine actions, the NVML sampler, the resource guard's reading of
    cores and memory, and the polling intervals."""

    CSS_PATH = Path(__file__).parent / "app.tcss"
    TITLE = "ddptui"
    # The palette's footer hint costs columns an 80-column terminal needs; every action has a key.
    ENABLE_COMMAND_PALETTE = False
    # First after each screen's own keys, so an 80-column footer always shows how to quit and how
    # to see the keys it has no room for.
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("question_mark", "keys", "Keys"),
        Binding("q", "quit", "Quit"),
        Binding("l", "show('launch')", "Launch"),
        Binding("r", "show('runs')", "Runs"),
        Binding("p", "show('processes')", "Procs"),
        Binding("g", "show('gpus')", "GPUs"),
        Binding("c", "show('results')", "Results"),
        Binding("w", "watch_last", "Watch"),
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True),
    ]

    # Screens watch this; repaint=False because repainting the app redraws the whole screen.
    gpu_inventory: reactive[GpuInventory | None] = reactive(
        None, always_update=True, init=False, repaint=False
    )

    def __init__(
        self,
        runs_dir: Path | None = None,
        *,
        clock: Clock = time.time,
        probe: ProcessProbe | None = None,
        actions: EngineActions | None = None,
        gpu_sampler: Callable[[], GpuInventory] = sample_gpus,
        resource_checker: ResourceChecker = check_plan_resources,
        run_poll_seconds: float = 0.5,
        gpu_poll_seconds: float = 1.0,
        list_poll_seconds: float = 2.0,
        screen: str = "launch",
    ) -> None:
        super().__init__()
        if screen not in MAIN_SCREENS:
            raise ValueError(f"screen {screen!r} is not one of {', '.join(MAIN_SCREENS)}")
        self.first_screen = screen
        self.runs_dir = Path(runs_dir) if runs_dir is not None else default_runs_dir()
        self.clock = clock
        self._probe = probe
        self._actions = actions
        self.gpu_sampler = gpu_sampler
        self.resource_checker = resource_checker
        self.run_poll_seconds = run_poll_seconds
        self.gpu_poll_seconds = gpu_poll_seconds
        self.list_poll_seconds = list_poll_seconds
        self.gpu_history = GpuHistory()
        self.gpu_samples = 0
        self.coalesced_gpu_samples = 0
        # Runs launched from this app, oldest first (the results screen's default table).
        self.session_runs: list[RunDir] = []
        # Launchers this app started: polling them reaps them when they exit.
        self.started: dict[str, object] = {}
        self.run_screen_names: list[str] = []
        self.theme = "textual-dark"

    @property
    def probe(self) -> ProcessProbe:
        if self._probe is None:
            from ddptui.watch import ProcessProbe

            self._probe = ProcessProbe()
        return self._probe

    @probe.setter
    def probe(self, probe: ProcessProbe) -> None:
        self._probe = probe

    @property
    def actions(self) -> EngineActions:
        if self._actions is None:
            from ddptui.actions import EngineActions

            self._actions = EngineActions(self.runs_dir)
        return self._actions

    @actions.setter
    def actions(self, actions: EngineActions) -> None:
        self._actions = actions

    # -- start-up ----------------------------------------------------------------------------

    def on_mount(self) -> None:
        self.install_named_screen(self.first_screen)
        self.push_screen(self.first_screen)
        self.sample_gpus()
        self.set_interval(self.gpu_poll_seconds, self.sample_gpus)
        self.set_interval(REAP_SECONDS, self.reap_launchers)

    def reap_launchers(self) -> None:
        """Collect the exit status of launchers this app started, so none lingers as a zombie
        while its run screen is not being watched (a non-blocking waitpid each)."""
        for started in self.started.values():
            poll = getattr(started, "poll", None)
            if callable(poll):
                poll()

    # -- NVML ----------------------------------------------------------------------------------

    @work(thread=True, exclusive=True, exit_on_error=False, group="nvml")
    def sample_gpus(self) -> None:
        self.post_message(GpusSampled(self.gpu_sampler()))

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        # Workers run with exit_on_error=False: a failure is shown, and the next tick tries again.
        if event.state == WorkerState.ERROR:
            self.notify(
                f"{event.worker.name}: {type(event.worker.error).__name__}: {event.worker.error}",
                title="Background read failed",
                severity="error",
            )

    def on_gpus_sampled(self, message: GpusSampled) -> None:
        self.gpu_samples += 1
        self.coalesced_gpu_samples += message.coalesced
        inventory = message.inventory
        for gpu in inventory.gpus:
            fraction = None
            if gpu.memory_used_bytes is not None and gpu.memory_total_bytes:
                fraction = gpu.memory_used_bytes / gpu.memory_total_bytes
            self.gpu_history.add(
                gpu.index,
                float(gpu.utilization_percent) if gpu.utilization_percent is not None else None,
                fraction,
            )
        self.gpu_inventory = inventory

    # -- navigation ------------------------------------------------------------------------------

    def install_named_screen(self, name: str) -> None:
        """Install one of the four main screens the first time it is shown (importing them all
        would slow the start; a screen not installed yet is not the one on show)."""
        if self.is_screen_installed(name):
            return
        screen: Screen[None]
        if name == "launch":
            from ddptui.screens.launch import LaunchScreen

            screen = LaunchScreen()
        elif name == "runs":
            from ddptui.screens.runs import RunsScreen

            screen = RunsScreen()
        elif name == "processes":
            from ddptui.screens.processes import ProcessesScreen

            screen = ProcessesScreen()
        elif name == "gpus":
            from ddptui.screens.gpus import GpusScreen

            screen = GpusScreen()
        elif name == "results":
            from ddptui.screens.results import ResultsScreen

            screen = ResultsScreen()
        else:
            return
        self.install_screen(screen, name)

    def action_keys(self) -> None:
        """Every key of this screen in a dialog: those the footer shows, those it has no room
        for at 80 columns, and those it never shows."""
        from ddptui.widgets.keys_dialog import KeysDialog, keys_of  # lazily: first use only

        if isinstance(self.screen, KeysDialog):
            return
        name = self.screen.sub_title or type(self.screen).__name__.removesuffix("Screen")
        self.push_screen(KeysDialog(name, keys_of(self.screen), self.size.width - 8))

    def action_show(self, name: str) -> None:
        self.install_named_screen(name)
        self.switch_screen(name)
        self.refresh_bindings()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # The footer has no room to offer the screen you are on.
        if action == "show" and parameters and self.is_screen_installed(str(parameters[0])):
            return self.get_screen(str(parameters[0])) is not self.screen
        if action == "watch_last":  # not on a run screen: [ and ] move between runs there
            return getattr(self.screen, "run_dir", None) is None
        return True

    def action_watch_last(self) -> None:
        """A run that is going: the one last watched while it goes on, else the newest going on
        disk; with none going, back to the run last watched (found in a thread: it reads run
        directories)."""
        self.find_latest_run(self.last_watched())

    def last_watched(self) -> RunDir | None:
        if not self.run_screen_names:
            return None
        run_dir = getattr(self.get_screen(self.run_screen_names[-1]), "run_dir", None)
        return run_dir if isinstance(run_dir, RunDir) else None

    @work(thread=True, exclusive=True, exit_on_error=False, group="latest-run")
    def find_latest_run(self, last: RunDir | None) -> None:
        from ddptui.watch import latest_active_run, run_is_active

        now = self.clock()
        if last is not None and run_is_active(last, self.probe, now):
            self.post_message(LatestRunFound(last))
            return
        self.post_message(LatestRunFound(latest_active_run(self.runs_dir, self.probe, now)))

    def on_latest_run_found(self, message: LatestRunFound) -> None:
        if message.run_dir is not None:
            self.open_run(message.run_dir)
            return
        last = self.last_watched()
        if last is not None:
            self.open_run(last)
            self.notify(f"No run is going in {self.runs_dir}: back to the run last watched.")
            return
        self.notify(f"No run is going in {self.runs_dir}; r lists them all.")

    def open_run(self, run_dir: RunDir, started: object = None) -> None:
        """Show the run screen of ``run_dir``, attaching to it (or re-attaching) as needed."""
        from ddptui.screens.run import RunScreen

        name = f"run:{run_dir.run_id}"
        if started is not None:
            self.started[run_dir.run_id] = started
        if not self.is_screen_installed(name):
            self.install_screen(RunScreen(run_dir, started=started), name)
        elif started is not None:  # its next attempt (a resume): follow that launcher now
            screen = self.get_screen(name)
            if isinstance(screen, RunScreen):
                screen.attach(started)
        if name in self.run_screen_names:
            self.run_screen_names.remove(name)
        self.run_screen_names.append(name)
        self.switch_screen(name)
        self.refresh_bindings()

    def cycle_run(self, current: str, step: int) -> bool:
        """To the next (or previous) open run; False when there is no other to go to."""
        names = self.run_screen_names
        if len(names) < 2 or current not in names:
            return False
        self.switch_screen(names[(names.index(current) + step) % len(names)])
        return True

    def run_launched(self, run_dir: RunDir, started: object) -> None:
        self.session_runs.append(run_dir)
        self.open_run(run_dir, started)

    # -- quitting ---------------------------------------------------------------------------------

    def watched_runs(self) -> list[RunDir]:
        """Runs opened or launched here (what quitting asks about, if they still go)."""
        seen: dict[str, RunDir] = {r.run_id: r for r in self.session_runs}
        for name in self.run_screen_names:
            screen = self.get_screen(name)
            run_dir = getattr(screen, "run_dir", None)
            if isinstance(run_dir, RunDir):
                seen.setdefault(run_dir.run_id, run_dir)
        return list(seen.values())

    async def action_quit(self) -> None:
        self.reap_launchers()
        self.check_runs_going(self.watched_runs())

    @work(thread=True, exclusive=True, exit_on_error=False, group="quit-check")
    def check_runs_going(self, runs: list[RunDir]) -> None:
        """Which of ``runs`` still go, checked now off the event loop: observing a run reads
        its directory and, for a run a scheduler placed, asks that scheduler."""
        from ddptui.watch import run_is_active

        now = self.clock()
        self.post_message(RunsGoingAtQuit([r for r in runs if run_is_active(r, self.probe, now)]))

    def on_runs_going_at_quit(self, message: RunsGoingAtQuit) -> None:
        active = message.runs
        if not active:
            self.exit()
            return
        from ddptui.widgets.confirm import ConfirmDialog

        names = ", ".join(visible(r.run_id, one_line=True) for r in active[:3]) + (
            "…" if len(active) > 3 else ""
        )
        dialog = ConfirmDialog(
            f"{len(active)} run{'s are' if len(active) > 1 else ' is'} still going",
            f"{names}\n\nLeave them running (they go on without the UI; `ddptui` re-attaches "
            "from the Runs screen), or stop them first?",
            [("l", "Leave running", "leave"), ("s", "Stop them", "stop")],
        )

        def chosen(answer: str | None) -> None:
            if answer == "leave":
                self.exit()
            elif answer == "stop":
                self.stop_and_exit(active)

        self.push_screen(dialog, chosen)

    @work(thread=True, exclusive=True, exit_on_error=False, group="quit")
    def stop_and_exit(self, runs: list[RunDir]) -> None:
        reports = []
        for run_dir in runs:
            try:
                reports.append(f"{run_dir.run_id}: {self.actions.kill_run(run_dir).report}")
            except Exception as err:  # shown, then the user decides again
                reports.append(f"{run_dir.run_id}: could not stop it ({err})")
                self.call_from_thread(self.notify, visible("\n".join(reports)), severity="error")
                return
        self.call_from_thread(self.exit, None, 0, visible("\n".join(reports)))


def run_app(runs_dir: Path | None = None, screen: str = "launch") -> None:
    """Open the UI on ``runs_dir`` (default: $DDPTUI_RUNS_DIR, else ./runs), showing ``screen``."""
    DdptuiApp(runs_dir, screen=screen).run()

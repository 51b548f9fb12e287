"""One run: a row per rank, the GPUs (or the rank processes' CPU), the log tail with the root cause of
a failure, elapsed time and ETA, and a Kill button and key that stop the run through the job-scoped
kill after a confirmation; once the run has ended, a summary with its curves per epoch in place of
the GPUs, no kill, and ``R`` to resume a failed, killed or lost run from its newest checkpoint. On a small terminal the rank table folds to a line per state (``f``
toggles); ``d`` shows the reader's details (events read, lines skipped, stale updates).

Why it is slow: the bottleneck in one line under the ranks, and the step view (``t``): a stacked
bar per rank of where its step goes and the curves per step (loss, step time, images/s). On a
terminal of ``STEP_VIEW_FROM_ROWS`` rows it is shown beside the rest; on a smaller one ``t``
shows it in place of the GPUs and the log.

Reading happens in a thread worker every ``run_poll_seconds`` (``ddptui.watch.RunReader``, over the
run observer), which posts ``RunProgressed``; the widgets change only in its handler.
"""

from __future__ import annotations

from typing import Any, ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.widgets import Button, Footer, Header, Static
from textual.worker import Worker, WorkerState

from ddptui.actions import STOP_GRACE_SECONDS
from ddptui.messages import KillFinished, RunProgressed, WorkerProblem
from ddptui.screens.resuming import ResumingScreen, resumable
from ddptui.watch import RunReader, RunView
from ddptui.widgets.confirm import confirm_kill
from ddptui.widgets.gpu_panel import GpuPanel
from ddptui.widgets.log_tail import LogTail
from ddptui.widgets.node_gpus import NodeGpusPanel
from ddptui.widgets.rank_table import RankTable
from ddptui.widgets.run_summary import CHARTS_FROM, STATUS_STYLES, RunSummaryPanel
from ddptui.widgets.step_curves import StepCurvesPanel
from ddptui.widgets.step_split import StepSplitPanel
from engine.core.common import formatting
from engine.core.common.statuses import RankStatus, RunStatus
from engine.core.common.visible_text import visible
from engine.core.host.gpus import GpuInventory
from engine.core.runs.run_state import RunState
from engine.core.runs.rundir import RunDir
from engine.core.runs.step_breakdown import BottleneckKind

LOG_KEEP = 6  # log lines a small terminal keeps by folding the rank table
STEP_VIEW_FROM_ROWS = 40  # terminals this tall show the step view beside the GPUs and the log


def stoppable(status: RunStatus) -> bool:
    """Something of the run may still be running: its launcher, or orphaned ranks."""
    return status.active or status == RunStatus.ORPHANED


class RunScreen(ResumingScreen):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("k", "kill", "Kill"),
        Binding("R", "resume", "Resume"),
        Binding("escape", "back", "Back"),
        Binding("left_square_bracket", "cycle(-1)", "Prev run", show=False),
        Binding("right_square_bracket", "cycle(1)", "Next run", show=False),
        Binding("j", "log_rank(1)", "Log"),
        Binding("s", "stacks", "Stacks"),
        Binding("f", "fold", "Fold", show=False),
        Binding("d", "details", "Details", show=False),
        Binding("t", "step_view", "Timing"),
    ]

    def __init__(self, run_dir: RunDir, started: Any = None) -> None:
        super().__init__()
        self.run_dir = run_dir
        self.started = started
        self.view: RunView | None = None
        self.log_rank: int | None = None  # None: follow the failing rank, else rank 0
        self.coalesced = 0
        self.kill_report = ""
        self.killing = False
        self.problem = ""
        self.details = False
        self.fold_choice: bool | None = None  # None: fold when the terminal is too short
        self.step_view_choice: bool | None = None  # None: shown when the terminal is tall
        self._busy_polls = 0
        self._reader: RunReader | None = None
        self._polling_slowly = False  # the run has ended: one slow read keeps the log honest

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="run-head"):
            yield Static(visible(self.run_dir.run_id, one_line=True), id="run-title", markup=False)
            yield Button("Kill (k)", id="kill", variant="error", compact=True)
        yield RankTable(id="ranks")
        diagnosis = Static("", id="diagnosis", markup=False)
        diagnosis.display = False  # shown while a rank is stuck and its stacks are known
        yield diagnosis
        yield Static("", id="bottleneck", markup=False)
        yield GpuPanel(self.ddptui.gpu_history, id="gpus")
        node_gpus = NodeGpusPanel(id="node-gpus")
        node_gpus.display = False  # a run across nodes: its nodes' GPUs, not this machine's
        yield node_gpus
        yield RunSummaryPanel(id="summary")
        yield StepSplitPanel(id="split")
        yield StepCurvesPanel(id="curves")
        yield LogTail(id="log")
        yield Static("", id="run-details")
        yield Static("", id="run-foot")
        yield Footer()

    def _attach_reader(self) -> None:
        """Read the run afresh, polling the launcher this UI started (``started``), if any."""
        app = self.ddptui
        poll = getattr(self.started, "poll", None)
        self._reader = RunReader(
            self.run_dir,
            clock=app.clock,
            probe=app.probe,
            launcher_poll=poll if callable(poll) else None,
        )

    def attach(self, started: Any) -> None:
        """Follow the launcher of the run's next attempt (a resume) at the run's own pace."""
        self.started = started
        self._attach_reader()
        self._polling_slowly = False
        self.poll_every(self.poll_seconds())
        self.poll()

    def on_mount(self) -> None:
        app = self.ddptui
        self._attach_reader()
        self.sub_title = visible(self.run_dir.run_id, one_line=True)
        self.watch(app, "gpu_inventory", self._gpus_changed, init=False)
        self.query_one(GpuPanel).inventory = app.gpu_inventory
        self.query_one(RunSummaryPanel).display = False
        self.query_one("#run-details").display = False
        self.query_one("#bottleneck").display = False

    def poll_seconds(self) -> float:
        return self.ddptui.run_poll_seconds

    def on_screen_resume(self) -> None:
        self.query_one(RankTable).focus()

    def _gpus_changed(self, inventory: GpuInventory | None) -> None:
        if self.is_current:
            panel = self.query_one(GpuPanel)
            panel.inventory = inventory
            panel.fit()
            self._fold_to_fit()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "kill":  # gone from the footer once nothing of the run can be running
            return self.view is None or stoppable(self.view.run.status)
        if action == "resume":  # shown once it can go on (RESUMABLE)
            return self.view is not None and resumable(self.view.run.status)
        return True

    # -- fitting a small terminal --------------------------------------------------------------

    def _fold_to_fit(self) -> None:
        """Fold the rank table when its rows would leave the log tail fewer than LOG_KEEP lines
        (unless ``f`` chose)."""
        table = self.query_one(RankTable)
        panel = self.query_one(GpuPanel)
        others = 1 + 1 + 1 + 2  # header, title line, footer, two margins
        if self.query_one("#run-foot").display:
            others += 1
        summary = self.query_one(RunSummaryPanel)
        if summary.display:
            others += summary.outer_size.height or 3
        others += self._step_view_lines()
        keep = LOG_KEEP if self.query_one(LogTail).display else 0
        room = (self.size.height or 24) - others - keep
        panel.compact = False
        gpu_lines = panel.line_count() + 1 if panel.display else 0
        nodes = self.query_one(NodeGpusPanel)
        if nodes.display:  # a line per node, and its title
            gpu_lines += 2 + len(self.view.node_gpus if self.view else {})
        if self.fold_choice is not None:
            table.folded = self.fold_choice
        else:
            table.folded = table.line_count(folded=False) + gpu_lines > room
        if table.line_count() + gpu_lines > room and panel.display:
            panel.compact = True  # two GPUs to a line
        panel.fit()

    def on_resize(self) -> None:
        self._show_step_view()
        self._fold_to_fit()

    # -- why it is slow ------------------------------------------------------------------------

    def _step_view_shown(self) -> bool:
        if self.step_view_choice is not None:
            return self.step_view_choice
        return (self.size.height or 24) >= STEP_VIEW_FROM_ROWS

    def _step_view_lines(self) -> int:
        """Lines the bottleneck and the step view take (the curves' least, on a small screen)."""
        lines = 1 if self.query_one("#bottleneck").display else 0
        if self._step_view_shown():
            split = self.query_one(StepSplitPanel)
            lines += (len(split.split) + 2 if split.split else 0) + 8
        return lines

    def _show_step_view(self) -> None:
        """The step view in or out; on a small terminal it takes the place of the GPUs and the
        log, which come back with it out."""
        shown = self._step_view_shown()
        small = (self.size.height or 24) < STEP_VIEW_FROM_ROWS
        self.query_one(StepSplitPanel).display = shown
        curves = self.query_one(StepCurvesPanel)
        curves.display = shown
        curves.styles.height = "1fr" if small else 12
        ended = self.view is not None and self.view.run.final
        across = self.view is not None and self.view.run.across_nodes  # each node's GPUs
        room = not ended and not (shown and small)
        self.query_one(GpuPanel).display = room and not across
        self.query_one(NodeGpusPanel).display = room and across
        self.query_one(LogTail).display = not (shown and small)
        if shown and self.view is not None:
            curves.show(self.view.run.curves)

    def _show_bottleneck(self) -> None:
        run = self.view.run if self.view else None
        widget = self.query_one("#bottleneck", Static)
        found = run.bottleneck if run is not None else None
        self.query_one(StepSplitPanel).show(run.step_breakdown if run else (), found)
        if found is None:
            widget.display = False
            return
        named = found.kind != BottleneckKind.BALANCED
        line = Text("slow: " if named else "step: ", style="bold magenta" if named else "bold")
        line.append(found.sentence, style="magenta" if named else "")
        if not self._step_view_shown():
            line.append(" · t: timing", style="dim")
        widget.display = True
        widget.update(line)

    def action_step_view(self) -> None:
        self.step_view_choice = not self._step_view_shown()
        self._show_bottleneck()
        self._show_step_view()
        self._fold_to_fit()

    def action_fold(self) -> None:
        table = self.query_one(RankTable)
        self.fold_choice = not table.folded
        self._fold_to_fit()

    def action_details(self) -> None:
        self.details = not self.details
        self.query_one("#run-details").display = self.details
        self._show_details()

    # -- reading -------------------------------------------------------------------------------

    def read(self) -> None:
        assert self._reader is not None
        try:
            view = self._reader.poll(self.log_rank)
        except Exception as err:  # shown on the screen; the next poll tries again
            self.post_message(WorkerProblem("run directory", f"{type(err).__name__}: {err}"))
            return
        if view is not None:
            self.post_message(RunProgressed(view, self._reader.busy_polls))

    def on_run_progressed(self, message: RunProgressed) -> None:
        self.coalesced += message.coalesced
        view = message.view
        run = view.run
        self.view = view
        self.problem = ""
        table = self.query_one(RankTable)
        table.now = run.now
        table.epochs = 0 if run.script else run.epochs
        table.steps_only = bool(run.script) and not any(r.images_per_s for r in run.ranks)
        table.ranks = run.ranks
        table.culprit = self._culprit(run)
        if table.selected is None and run.ranks:
            table.selected = view.log_rank
        panel = self.query_one(GpuPanel)
        panel.indices = run.gpu_indices
        panel.ranks = run.ranks
        panel.fit()
        ended = run.final
        nodes = self.query_one(NodeGpusPanel)
        if not ended and run.across_nodes:
            nodes.show(view.node_gpus, run.now)
        summary = self.query_one(RunSummaryPanel)
        summary.display = ended
        if ended:
            summary.show(run, charts=self._room_for_charts())
        title = f"logs/rank-{view.log_rank}.log" if view.log_rank is not None else "log"
        self.query_one(LogTail).show(
            f"── {title} (j: next rank) ──",
            view.log_lines,
            run.failure,
            run.notices,
            said_above=ended,  # the summary names the root cause: the log pins its traceback
        )
        kill = self.query_one("#kill", Button)
        if kill.display != stoppable(run.status):
            kill.display = stoppable(run.status)
            self.refresh_bindings()  # the footer drops k once the run has ended (R comes)
        self._show_diagnosis()
        self._show_bottleneck()
        self._show_step_view()
        self._fold_to_fit()
        self._show_head()
        self._busy_polls = message.busy_polls
        self._show_foot(message.busy_polls)
        self._show_details()
        if run.final and not self._polling_slowly:
            # Nothing more will be written; one slow poll keeps the log tail honest.
            self._polling_slowly = True
            self.poll_every(5.0)

    def on_worker_problem(self, message: WorkerProblem) -> None:
        self.problem = f"{message.source}: {message.error}"
        self._show_foot(0)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state == WorkerState.ERROR:
            self.problem = f"{event.worker.name}: {event.worker.error}"
            self._show_foot(0)

    def _show_head(self) -> None:
        if self.view is None:
            return
        run = self.view.run
        head = Text()
        head.append(run.preset or "?", style="bold")
        head.append(" · ")
        head.append(str(run.status), style=STATUS_STYLES.get(run.status, "bold"))
        if run.devices:
            head.append(f" · {run.devices}")
        if run.attempt > 1:
            head.append(f" · attempt {run.attempt}")
        head.append(f" · {formatting.format_duration(run.elapsed)}")
        if run.stalled_ranks:  # a frozen ETA would be a lie
            head.append(" · ETA stalled", style="bold yellow")
        elif run.eta is not None:
            head.append(f" · ETA ~{formatting.format_duration(run.eta)}")
        if run.accuracy is not None:
            head.append(f" · acc {run.accuracy:.1%}")
        if run.reason and not run.final:  # an ended run's summary says why, once
            head.append(f" · {run.reason}", style="dim")
        if run.script and not run.metrics_reported:
            head.append(" · steps only (ddptui.report adds loss, accuracy, img/s)", style="dim")
        self.query_one("#run-title", Static).update(head, layout=False)

    @staticmethod
    def _stuck(run: RunState) -> bool:
        """A rank with a process is stalled or stopped: what the stacks are shown for."""
        return any(r.state in (RankStatus.STALLED, RankStatus.STOPPED) and r.pid for r in run.ranks)

    @classmethod
    def _culprit(cls, run: RunState) -> int | None:
        """The rank the others wait for, while ranks are stuck and a snapshot names one."""
        stuck = cls._stuck(run)
        return run.diagnosis.culprit_rank if stuck and run.diagnosis is not None else None

    def _show_diagnosis(self) -> None:
        """Where the stuck ranks are, from the latest stack snapshot, while a rank is stalled or
        stopped (and after a failed run): "rank 0 stuck at faults.py:35 in hang; rank 1 …"."""
        run = self.view.run if self.view else None
        widget = self.query_one("#diagnosis", Static)
        stuck = run is not None and self._stuck(run)
        snapshot = run.diagnosis if run is not None else None
        if snapshot is None or not (stuck or (run is not None and run.status.final)):
            widget.display = False
            return
        text = Text("stacks: ", style="bold yellow")
        text.append(snapshot.summary_line())
        if snapshot.culprit is not None:
            text.append(f" · culprit {snapshot.culprit.who} ◀", style="bold")
        text.append(" · s: full stacks", style="dim")
        widget.display = True
        widget.update(text)

    def action_stacks(self) -> None:
        from ddptui.screens.stacks import StacksScreen

        snapshot = self.view.run.diagnosis if self.view else None
        self.app.push_screen(StacksScreen(self.run_dir, snapshot))

    def _show_foot(self, busy_polls: int) -> None:
        foot = Text()
        if self.problem:
            foot.append(self.problem, style="bold red")
        elif self.kill_report:
            foot.append(self.kill_report, style="bold")
        elif self.view is not None and (self.view.run.problem or self.view.run.unsaved):
            run = self.view.run
            # The screen already names the run: say "run.json: …", not the whole path.
            said = "; ".join(s for s in (run.problem, run.unsaved) if s)
            foot.append(said.replace(f"{self.run_dir.path}/", ""), style="red")
        elif self.view is not None and self.view.run.skipped_lines:
            skipped = self.view.run.skipped_lines
            foot.append(f"{skipped} unreadable event lines (d: details)", style="bold yellow")
        foot.truncate(max(20, self.size.width), overflow="ellipsis")
        view = self.query_one("#run-foot", Static)
        if view.display != bool(foot.plain):
            view.display = bool(foot.plain)  # a line only when there is something to say
        view.update(foot, layout=False)

    def _room_for_charts(self) -> bool:
        columns, rows = CHARTS_FROM
        return (self.size.width or 80) >= columns and (self.size.height or 24) >= rows

    def _show_details(self) -> None:
        """What the reader did, for whoever wonders whether the screen is keeping up (d)."""
        if not self.details:
            return
        run_state = self.view.run if self.view else None
        line = Text(no_wrap=True, overflow="ellipsis", style="dim")
        line.append(f"{run_state.events_read if run_state else 0} events read")
        skipped = run_state.skipped_lines if run_state else 0
        line.append(f" · {skipped} unreadable lines", style="bold yellow" if skipped else "")
        line.append(f" · stale updates skipped: {self.coalesced}")
        line.append(f" · reads skipped while one was slow: {self._busy_polls}")
        line.append(f" · {visible(str(self.run_dir.path), one_line=True)}")
        self.query_one("#run-details", Static).update(line, layout=False)

    # -- actions -------------------------------------------------------------------------------

    def on_rank_table_rank_selected(self, message: RankTable.RankSelected) -> None:
        self.log_rank = message.rank
        self.poll()

    def action_log_rank(self, step: int) -> None:
        self.query_one(RankTable).action_move(step)

    def action_back(self) -> None:
        self.ddptui.action_show("runs")

    def action_cycle(self, step: int) -> None:
        if not self.ddptui.cycle_run(f"run:{self.run_dir.run_id}", step):
            self.notify(
                "This is the only run open: [ and ] move between open runs (open another from "
                "the Runs screen, r)."
            )

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "kill":
            event.stop()
            self.action_kill()

    def action_resume(self) -> None:
        if self.view is not None:
            self.resume(self.run_dir, self.view.run.status)

    def action_kill(self) -> None:
        run = self.view.run if self.view else None
        if self.killing:
            self.notify("The kill is already in progress.")
            return
        if run is not None and not stoppable(run.status):
            self.notify(f"This run is {run.status}: nothing to stop.", severity="warning")
            return

        def chosen(answer: str | None) -> None:
            if answer == "kill":
                self.killing = True
                self.kill_report = "stopping the run…"
                self._show_foot(0)
                self.kill_run()

        self.app.push_screen(
            confirm_kill(visible(self.run_dir.run_id, one_line=True), STOP_GRACE_SECONDS), chosen
        )

    @work(thread=True, exclusive=True, exit_on_error=False, group="kill")
    def kill_run(self) -> None:
        try:
            outcome = self.ddptui.actions.kill_run(self.run_dir, STOP_GRACE_SECONDS)
        except Exception as err:
            self.post_message(KillFinished(self.run_dir.run_id, False, f"kill failed: {err}"))
            return
        self.post_message(KillFinished(self.run_dir.run_id, outcome.ok, outcome.report))

    def on_kill_finished(self, message: KillFinished) -> None:
        self.killing = False
        self.kill_report = message.report
        self.notify(
            message.report,
            title="Run stopped" if message.ok else "Kill incomplete",
            severity="information" if message.ok else "error",
        )
        self._show_foot(0)
        self.poll()

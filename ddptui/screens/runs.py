"""Past and running runs from the runs directory, newest first; Enter opens one (re-attaching to a
run that is still going), ``R`` resumes a failed, killed or lost one from its newest checkpoint
(and opens it), ``delete`` removes an ended one after a confirmation, ``k`` stops a going one (a
queued one leaves the queue) after a confirmation, ``f`` shows only the runs in one state, ``m``
marks a run (A, then B) and ``d`` compares them as ``ddptui diff`` does (one marked: against the
highlighted run; none: the highlighted run against the newest completed run of its preset before
it).

Above the runs, this machine's queue (``ddptui.widgets.queue_line``), every user's: who waits
for what, since when and why, read with the runs in the same thread worker at each poll; a
queued run's row says its place in line.

The list comes from one ``RunCatalog`` (through ``ddptui.watch.RunLister``) in a thread worker: an
ended run is read once, then only its summary's identity is checked; a going run is observed at
each poll. The rows are redrawn only when a listing changed; a going run's time goes on counting
at every poll all the same.
"""

from __future__ import annotations

import time
from typing import ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import DataTable, Footer, Header, Static

from ddptui.actions import STOP_GRACE_SECONDS
from ddptui.messages import KillFinished, QueueRead, RunsCompared, RunsListed, RunsRemoved
from ddptui.screens.resuming import ResumingScreen
from ddptui.watch import RunLister, RunListing, read_queue_view
from ddptui.widgets.confirm import ConfirmDialog, confirm_kill
from ddptui.widgets.fitted_table import FittedTable
from ddptui.widgets.queue_line import QueueLine
from ddptui.widgets.run_diff_dialog import read_diff, show_comparison
from ddptui.widgets.run_summary import STATUS_STYLES
from engine.core.common import formatting
from engine.core.common.statuses import RunStatus
from engine.core.common.visible_text import visible
from engine.core.runs.rundir import RunDir

# What ``f`` steps through: every run, then the runs in one state (going: something of it runs).
GOING = "going"
FILTERS: tuple[str, ...] = (
    "",
    GOING,
    RunStatus.COMPLETED,
    RunStatus.FAILED,
    RunStatus.KILLED,
    RunStatus.LOST,
)


def shown_by(run: RunListing, state: str) -> bool:
    if not state:
        return True
    if state == GOING:
        return run.status.live
    return run.status == state


class RunsTable(FittedTable):
    """The runs, one a row; Enter opens the highlighted one (and the footer says so)."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("enter", "select_cursor", "Open")]


class RunsScreen(ResumingScreen):
    PROBLEM_AT = "#runs-head"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("k", "kill", "Kill"),
        Binding("delete", "remove", "Delete"),
        Binding("R", "resume", "Resume"),
        Binding("f", "filter", "Filter"),
        Binding("space", "mark", "Mark", show=False),
        Binding("m", "mark", "Mark", show=False),
        Binding("d", "compare", "Compare"),
        Binding("f5", "refresh", "Refresh", show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.runs: list[RunListing] = []  # every run, newest first
        self.state = ""  # the state shown ("": every run)
        self.removing = False
        self.killing = False
        self.places: dict[str, int] = {}  # each queued run's place in the machine's line
        self.marked: list[str] = []  # the runs marked for comparing, A first (at most 2)
        self._shown: list[RunListing] = []
        self._head: Text | None = None  # the head line as last drawn
        self._lister: RunLister | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("", id="runs-head")
        yield QueueLine(id="runs-queue")
        yield RunsTable(id="runs-table", cursor_type="row")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = "Runs"
        table = self.query_one(DataTable)
        table.add_column("run", key="run")
        table.add_column("status", key="status")
        table.add_column("devices", key="devices")
        table.add_column("started", key="started")
        table.add_column("time", key="time")
        table.add_column("acc", key="acc")

    def on_screen_resume(self) -> None:
        self.query_one(DataTable).focus()

    def read(self) -> None:
        app = self.ddptui
        if self._lister is None:
            self._lister = RunLister(app.runs_dir, clock=app.clock, probe=app.probe)
        self.post_read("runs directory", self._lister.list, RunsListed)
        self.post_read("queue", lambda: read_queue_view(app.actions.read_queue), QueueRead)

    def on_runs_listed(self, message: RunsListed) -> None:
        self.runs = message.runs
        self._show()

    def on_queue_read(self, message: QueueRead) -> None:
        queue = message.queue
        self.query_one(QueueLine).show(queue, self.ddptui.clock())
        places = {v.claim.run_id: v.place for v in queue.verdicts if v.place}
        if places != self.places:
            self.places = places
            self._shown = []  # the queued runs' places changed: redraw the rows
            self._show()

    def _show(self) -> None:
        """The head line, then the rows: redrawn when what they show changed, else only the
        time of the runs still going."""
        app = self.ddptui
        shown = [r for r in self.runs if shown_by(r, self.state)]
        going = sum(1 for r in self.runs if shown_by(r, GOING))  # as the 'going' filter counts
        head = Text.assemble(
            (f"{len(self.runs)} runs in {app.runs_dir}", "bold"), f" · {going} going"
        )
        if self.marked:
            marks = ", ".join(f"{'AB'[i]} {run_id}" for i, run_id in enumerate(self.marked))
            head.append(f" · marked {marks} (d compares)", style="cyan")
        elif self.state:
            head.append(f" · showing {self.state} ({len(shown)}; f: next state)", style="yellow")
        else:
            head.append(" · Enter opens (re-attaches to a running one)")
        if head != self._head:  # an unchanged line is not redrawn (a re-layout each poll)
            self._head = head
            self.query_one("#runs-head", Static).update(head)
        table = self.query_one(DataTable)
        if shown == self._shown:
            for run in shown:
                if run.status.active and run.run_id in table.rows:
                    table.update_cell(run.run_id, "time", self._elapsed(run))
            return
        self._shown = shown
        self._fill(table, shown)

    def _elapsed(self, run: RunListing) -> str:
        if run.elapsed is not None:
            return formatting.format_duration(run.elapsed)
        if run.status.active and run.created:  # its clock runs while it is silent too
            return formatting.format_duration(self.ddptui.clock() - run.created)
        return "-"

    def _fill(self, table: DataTable[object], shown: list[RunListing]) -> None:
        open_ids = {name.removeprefix("run:") for name in self.ddptui.run_screen_names}
        keep = None
        if table.row_count:
            keep = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        table.clear()
        for run in shown:
            marker = "▸ " if run.run_id in open_ids else "  "
            if run.run_id in self.marked:
                marker = "AB"[self.marked.index(run.run_id)] + " "
            started = (
                time.strftime("%m-%d %H:%M", time.localtime(run.created)) if run.created else "-"
            )
            said = f"{run.status} ({run.waiting_for})" if run.waiting_for else str(run.status)
            if run.status == RunStatus.QUEUED and run.run_id in self.places:
                said = f"queued #{self.places[run.run_id]}"
            if run.attempt > 1:  # restarted or resumed: which attempt it is at
                said += f" · attempt {run.attempt}"
            status = Text(said, style=STATUS_STYLES.get(run.status, ""))
            devices = run.devices or "-"
            if run.placement is not None and run.placement.label:  # where its backend put it
                devices += f" · {run.placement.label}"
            table.add_row(
                marker + run.run_id,
                status,
                devices,
                started,
                self._elapsed(run),
                f"{run.accuracy:.1%}" if run.accuracy is not None else "-",
                key=run.run_id,
            )
        if keep is not None and keep in table.rows:
            table.move_cursor(row=table.get_row_index(keep))

    # -- actions ---------------------------------------------------------------------------------

    def _highlighted(self) -> RunListing | None:
        table = self.query_one(DataTable)
        if not table.row_count:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        return next((r for r in self.runs if r.run_id == key), None)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        run = next((r for r in self.runs if r.run_id == event.row_key.value), None)
        if run is not None:
            self.ddptui.open_run(RunDir(run.path))

    def action_open(self) -> None:
        run = self._highlighted()
        if run is not None:
            self.ddptui.open_run(RunDir(run.path))

    def action_resume(self) -> None:
        """Go on with the highlighted run (failed, killed or lost) as its next attempt."""
        run = self._highlighted()
        if run is None:
            self.notify("No run selected.")
            return
        self.resume(RunDir(run.path), run.status)

    def action_filter(self) -> None:
        self.state = FILTERS[(FILTERS.index(self.state) + 1) % len(FILTERS)]
        self._show()

    def action_mark(self) -> None:
        """Mark the highlighted run for comparing (again: unmark it); a third mark replaces A."""
        run = self._highlighted()
        if run is None:
            return
        if run.run_id in self.marked:
            self.marked.remove(run.run_id)
        else:
            self.marked = [*self.marked[-1:], run.run_id]
        self._shown = []  # the rows' marks changed: redraw them
        self._head = None
        self._show()

    def action_compare(self) -> None:
        run = self._highlighted()
        by_id = {r.run_id: r for r in self.runs}
        marked = [RunDir(by_id[i].path) for i in self.marked if i in by_id]
        if len(marked) == 2:
            self.compare_runs(marked[0], marked[1])
        elif run is None:
            self.notify("No run selected.")
        elif marked and marked[0].run_id != run.run_id:
            self.compare_runs(marked[0], RunDir(run.path))
        else:  # against the newest completed run of its preset, as `ddptui diff RUN`
            self.compare_runs(None, RunDir(run.path))

    @work(thread=True, exclusive=True, exit_on_error=False, group="compare")
    def compare_runs(self, a: RunDir | None, b: RunDir) -> None:
        self.post_message(read_diff(a, b))

    def on_runs_compared(self, message: RunsCompared) -> None:
        show_comparison(self, message)

    def action_kill(self) -> None:
        """Stop the highlighted run after a confirmation: every process of it, as the Run
        screen's k; a queued run leaves the queue."""
        run = self._highlighted()
        if run is None:
            self.notify("No run selected.")
            return
        if self.killing:
            self.notify("A kill is already in progress.")
            return
        if not run.status.live:
            self.notify(f"{run.run_id} is {run.status}: nothing to stop.", severity="warning")
            return
        queued = run.status == RunStatus.QUEUED

        def chosen(answer: str | None) -> None:
            if answer == "kill":
                self.killing = True
                self.kill_run(RunDir(run.path))

        shown_id = visible(run.run_id, one_line=True)
        self.app.push_screen(confirm_kill(shown_id, STOP_GRACE_SECONDS, queued=queued), chosen)

    @work(thread=True, exclusive=True, exit_on_error=False, group="kill")
    def kill_run(self, run_dir: RunDir) -> None:
        try:
            outcome = self.ddptui.actions.kill_run(run_dir, STOP_GRACE_SECONDS)
        except Exception as err:  # one sentence (another user's run, say): shown, nothing lost
            self.post_message(KillFinished(run_dir.run_id, False, f"kill failed: {err}"))
            return
        self.post_message(KillFinished(run_dir.run_id, outcome.ok, outcome.report))

    def on_kill_finished(self, message: KillFinished) -> None:
        self.killing = False
        self.notify(
            message.report,
            title="Run stopped" if message.ok else "Kill incomplete",
            severity="information" if message.ok else "error",
        )
        self.poll()

    def action_remove(self) -> None:
        run = self._highlighted()
        if run is None:
            self.notify("No run selected.")
            return
        if self.removing:
            self.notify("A removal is already in progress.")
            return
        if run.status.live:
            self.notify(
                f"{run.run_id} is {run.status}: stop it first (k).",
                severity="warning",
            )
            return
        dialog = ConfirmDialog(
            f"Remove run {run.run_id}?",
            f"Its directory {visible(str(run.path), one_line=True)} goes, with its logs, events, stacks and checkpoint. "
            "Benches recorded from it keep their figures.",
            [("y", "Remove", "remove")],
        )

        def chosen(answer: str | None) -> None:
            if answer == "remove":
                self.removing = True
                self.remove_run(RunDir(run.path))

        self.app.push_screen(dialog, chosen)

    @work(thread=True, exclusive=True, exit_on_error=False, group="remove")
    def remove_run(self, run_dir: RunDir) -> None:
        try:
            outcome = self.ddptui.actions.remove_runs([run_dir])
        except Exception as err:
            self.post_message(RunsRemoved(False, f"could not remove {run_dir.run_id}: {err}"))
            return
        self.post_message(RunsRemoved(outcome.ok, outcome.report))

    def on_runs_removed(self, message: RunsRemoved) -> None:
        self.removing = False
        self.notify(message.report, severity="information" if message.ok else "error")
        self.poll()

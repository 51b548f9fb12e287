"""Past and running runs from the runs directory, newest first; Enter opens one (re-attaching to a
run that is still going)."""

from __future__ import annotations

import time
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import DataTable, Footer, Header, Static

from ddptui.messages import RunsListed
from ddptui.screens.base import PollingScreen
from ddptui.screens.run import STATUS_STYLES
from ddptui.watch import RunLister, RunListing
from ddptui.widgets.fitted_table import FittedTable
from engine.core.common import formatting
from engine.core.runs.rundir import RunDir


class RunsTable(FittedTable):
    """The runs, one a row; Enter opens the highlighted one (and the footer says so)."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("enter", "select_cursor", "Open")]


class RunsScreen(PollingScreen):
    PROBLEM_AT = "#runs-head"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("f5", "refresh", "Refresh", show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.runs: list[RunListing] = []
        self._lister: RunLister | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("", id="runs-head")
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

    def on_runs_listed(self, message: RunsListed) -> None:
        app = self.ddptui
        open_ids = {name.removeprefix("run:") for name in app.run_screen_names}
        going = sum(1 for r in message.runs if r.status.active)
        self.query_one("#runs-head", Static).update(
            Text.assemble(
                (f"{len(message.runs)} runs in {app.runs_dir}", "bold"),
                f" · {going} going · Enter opens (re-attaches to a running one)",
            )
        )
        if message.runs == self.runs:
            return
        self.runs = message.runs
        table = self.query_one(DataTable)
        keep = None
        if table.row_count:
            keep = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        table.clear()
        now = app.clock()
        for run in message.runs:
            marker = "▸ " if run.run_id in open_ids else "  "
            started = (
                time.strftime("%m-%d %H:%M", time.localtime(run.created)) if run.created else "-"
            )
            elapsed = formatting.format_duration(run.elapsed) if run.elapsed is not None else "-"
            if run.status.active and run.elapsed is None:
                elapsed = formatting.format_duration(now - run.created)
            said = f"{run.status} ({run.waiting_for})" if run.waiting_for else str(run.status)
            status = Text(said, style=STATUS_STYLES.get(run.status, ""))
            devices = run.devices or "-"
            if run.job_id:  # a run on Slurm: where it runs is its job
                devices += f" · job {run.job_id}"
            table.add_row(
                marker + run.run_id,
                status,
                devices,
                started,
                elapsed,
                f"{run.accuracy:.1%}" if run.accuracy is not None else "-",
                key=run.run_id,
            )
        if keep is not None and keep in table.rows:
            table.move_cursor(row=table.get_row_index(keep))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if event.row_key.value is not None:
            self._open(event.row_key.value)

    def action_open(self) -> None:
        table = self.query_one(DataTable)
        if not table.row_count:
            return
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        if key is not None:
            self._open(key)

    def _open(self, run_id: str) -> None:
        run = next((r for r in self.runs if r.run_id == run_id), None)
        if run is not None:
            self.ddptui.open_run(RunDir(run.path))

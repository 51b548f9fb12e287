"""Processes: the ``ddptui ps`` view, live. Every distributed-training job on this machine (ours and
foreign) with its processes; orphaned jobs are highlighted, and ``x`` cleans them (this user's
only) after a confirmation."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Footer, Header, Static

from ddptui.actions import KILL_GRACE_SECONDS
from ddptui.messages import CleanFinished, ProcessesListed, WorkerProblem
from ddptui.widgets import figures
from ddptui.widgets.confirm import ConfirmDialog
from engine.core.statuses import JobState

if TYPE_CHECKING:
    from ddptui.app import DdptuiApp

JOB_STYLES = {
    JobState.RUNNING: "green",
    JobState.ORPHANED: "bold red",
    JobState.STALLED: "bold yellow",
    JobState.STOPPED: "bold magenta",
    JobState.ZOMBIE: "red",
}


def jobs_renderable(jobs: list[Any], width: int) -> Group:
    """Each job as a header line (orphaned ones in red, with the reason) over a table of its
    processes: pid, role, state, CPU, memory, GPU memory, age and command."""
    if not jobs:
        return Group(Text("No distributed-training process is running on this machine.", "dim"))
    parts: list[Any] = []
    for job in jobs:
        style = JOB_STYLES.get(job.state, "")
        head = Text(no_wrap=True, overflow="ellipsis")
        head.append("● ", style=style)
        head.append(job.label, style="bold")
        head.append(f"  {job.state}", style=style)
        if job.state != JobState.RUNNING and job.reason:
            head.append(f": {job.reason}", style=style)
        if job.state == JobState.ORPHANED:
            head.stylize("on #3b0000")
        parts.append(head)
        table = Table(box=None, padding=(0, 1), pad_edge=False, expand=True, header_style="dim")
        for name, justify in (
            ("pid", "right"),
            ("role", "left"),
            ("state", "left"),
            ("cpu", "right"),
            ("rss", "right"),
            ("gpu", "right"),
            ("age", "right"),
        ):
            table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
        table.add_column("command", no_wrap=True, overflow="ellipsis", ratio=1)
        for p in job.processes:
            role = p.role + (f" {p.rank}" if p.rank is not None else "")
            table.add_row(
                str(p.pid),
                role,
                Text(str(p.state), style=JOB_STYLES.get(p.state, "")),
                f"{p.cpu_percent:.0f}%" if p.cpu_percent is not None else "-",
                figures.mib(p.rss_bytes),
                figures.mib(p.gpu_bytes) if p.gpu else "-",
                figures.duration(p.age_seconds),
                Text(p.command, style="dim"),
            )
        parts.append(table)
        parts.append(Text(""))
    return Group(*parts)


class ProcessesScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("x", "clean", "Clean orphans"),
        Binding("f5", "refresh", "Refresh", show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.jobs: list[Any] = []
        self.notes: tuple[str, ...] = ()
        self.report = ""
        self.cleaning = False
        self._timer: Timer | None = None

    @property
    def ddptui(self) -> DdptuiApp:
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("scanning processes…", id="ps-head")
        with VerticalScroll(id="ps-body", can_focus=True):
            yield Static("", id="ps-table")
        yield Static("", id="ps-foot")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = "Processes"
        self._timer = self.set_interval(self.ddptui.list_poll_seconds, self.scan, pause=True)

    def on_screen_resume(self) -> None:
        self.scan()
        if self._timer is not None:
            self._timer.resume()
        self.query_one("#ps-body").focus()

    def on_screen_suspend(self) -> None:
        if self._timer is not None:
            self._timer.pause()

    def action_refresh(self) -> None:
        self.scan()

    @work(thread=True, exclusive=True, exit_on_error=False, group="scan")
    def scan(self) -> None:
        try:
            table = self.ddptui.actions.scan_processes()
        except Exception as err:
            self.post_message(WorkerProblem("process scan", f"{type(err).__name__}: {err}"))
            return
        self.post_message(
            ProcessesListed(list(table.jobs), tuple(table.notes), table.gpu_error or "")
        )

    def on_worker_problem(self, message: WorkerProblem) -> None:
        self.query_one("#ps-head", Static).update(
            Text(f"{message.source}: {message.error}", style="bold red")
        )

    def on_processes_listed(self, message: ProcessesListed) -> None:
        jobs = message.jobs
        self.jobs = jobs
        self.notes = message.notes
        orphaned = [j for j in jobs if j.state == JobState.ORPHANED]
        head = Text(f"{len(jobs)} training job{'s' if len(jobs) != 1 else ''}", style="bold")
        if orphaned:
            head.append(f" · {len(orphaned)} orphaned (x cleans them)", style="bold red")
        else:
            head.append(" · none orphaned", style="green")
        if message.gpu_error:
            head.append(f" · GPU memory not available: {message.gpu_error}", style="dim")
        self.query_one("#ps-head", Static).update(head)
        self._show_foot()
        self.query_one("#ps-table", Static).update(jobs_renderable(jobs, self.size.width or 80))

    def _show_foot(self) -> None:
        foot = Text()
        if self.report:
            foot.append(self.report, style="bold")
        elif self.notes:
            foot.append(self.notes[0], style="dim")
        self.query_one("#ps-foot", Static).update(foot)

    # -- cleaning -------------------------------------------------------------------------------

    def action_clean(self) -> None:
        if self.cleaning:
            return
        orphaned = [j for j in self.jobs if j.state == JobState.ORPHANED]
        if not orphaned:
            self.notify("No orphaned job to clean.")
            return
        listing = "\n".join(f"• {j.label}: {len(j.live_processes)} processes" for j in orphaned[:6])
        dialog = ConfirmDialog(
            f"Clean {len(orphaned)} orphaned job{'s' if len(orphaned) > 1 else ''}?",
            f"{listing}\n\nEach process gets SIGTERM, then SIGKILL after {KILL_GRACE_SECONDS:.0f} s. "
            "Only your own processes are touched.",
            [("y", "Clean", "clean")],
        )

        def chosen(answer: str | None) -> None:
            if answer == "clean":
                self.cleaning = True
                self.report = "cleaning…"
                self._show_foot()
                self.clean()

        self.app.push_screen(dialog, chosen)

    @work(thread=True, exclusive=True, exit_on_error=False, group="clean")
    def clean(self) -> None:
        try:
            outcome = self.ddptui.actions.clean(KILL_GRACE_SECONDS)
        except Exception as err:
            self.post_message(CleanFinished(False, f"clean failed: {err}"))
            return
        self.post_message(CleanFinished(outcome.ok, outcome.report))

    def on_clean_finished(self, message: CleanFinished) -> None:
        self.cleaning = False
        self.report = message.report
        self.notify(message.report, severity="information" if message.ok else "error")
        self._show_foot()
        self.scan()

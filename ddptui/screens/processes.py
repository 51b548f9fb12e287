"""Processes: the ``ddptui ps`` view, live. Every distributed-training job on this machine (ours and
foreign) with its processes and their users, then the processes that hold a GPU device open that
NVML does not list; orphaned jobs are highlighted, and ``x`` cleans them after a confirmation:
this user's only, unless root turns on all users (``a``, confirmed too)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.widgets import Footer, Header, Static

from ddptui import text_figures
from ddptui.actions import STOP_GRACE_SECONDS
from ddptui.messages import CleanFinished, ProcessesListed
from ddptui.screens.base import PollingScreen
from ddptui.widgets.confirm import AllUsersToggle, ConfirmDialog
from engine.core.common import formatting
from engine.core.common.statuses import JobState

if TYPE_CHECKING:
    from engine.core.jobs.process_table import ProcessTable

JOB_STYLES = {
    JobState.RUNNING: "green",
    JobState.ORPHANED: "bold red",
    JobState.STALLED: "bold yellow",
    JobState.STOPPED: "bold magenta",
    JobState.ZOMBIE: "red",
}


def _gpu_cell(p: Any) -> str:
    if not p.gpu:
        return "-"
    listed = [g for g in p.gpu if g.listed]
    if not listed:
        return "unlisted"
    return formatting.mib(p.gpu_bytes)


def jobs_renderable(jobs: list[Any], width: int, hidden: tuple[Any, ...] = ()) -> Group:
    """Each job as a header line (orphaned ones in red, with the reason) over a table of its
    processes: pid, user, role, state, CPU, memory, GPU memory, age and command (its script name
    kept, the middle elided); then the processes holding a GPU device NVML does not list."""
    parts: list[Any] = []
    if not jobs:
        parts.append(Text("No distributed-training process is running on this machine.", "dim"))
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
        rows = [
            (
                str(p.pid),
                p.user,
                p.role + (f" {p.rank}" if p.rank is not None else ""),
                str(p.state),
                f"{p.cpu_percent:.0f}%" if p.cpu_percent is not None else "-",
                formatting.mib(p.rss_bytes),
                _gpu_cell(p),
                formatting.format_duration(p.age_seconds),
            )
            for p in job.processes
        ]
        headers = ("pid", "user", "role", "state", "cpu", "rss", "gpu", "age")
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
        room = max(12, width - sum(widths) - 2 * len(widths))  # two spaces between columns
        table = Table(box=None, padding=(0, 1), pad_edge=False, expand=True, header_style="dim")
        for name, w in zip(headers, widths, strict=True):
            justify = "left" if name in ("user", "role", "state") else "right"
            table.add_column(name, justify=justify, no_wrap=True, width=w)  # type: ignore[arg-type]
        table.add_column("command", no_wrap=True, overflow="crop", ratio=1)
        for p, cells in zip(job.processes, rows, strict=True):
            table.add_row(
                cells[0],
                Text(cells[1], style="" if p.own else "yellow"),
                cells[2],
                Text(cells[3], style=JOB_STYLES.get(p.state, "")),
                *cells[4:],
                Text(text_figures.short_command(p.command, room), style="dim"),
            )
        parts.append(table)
        parts.append(Text(""))
    if hidden:
        parts.append(Text("GPU devices held open that NVML does not list", style="bold yellow"))
        for h in hidden:
            line = Text(no_wrap=True, overflow="ellipsis")
            cards = ",".join(str(m) for m in h.minors)
            line.append(f"{h.pid:>7} {h.user:<8} GPU {cards:<4}", style="")
            line.append(" a zombie whose threads hold it" if h.zombie else "", style="red")
            line.append(f" {h.name}", style="dim")
            parts.append(line)
    return Group(*parts)


class ProcessesScreen(AllUsersToggle, PollingScreen):
    ALL_USERS_QUESTION = (
        "Clean other users' orphaned jobs too?",
        "As root, x will also stop orphaned jobs that belong to other users.",
    )
    PROBLEM_AT = "#ps-head"

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("x", "clean", "Clean orphans"),
        Binding("a", "all_users", "All"),
        Binding("f5", "refresh", "Refresh", show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.jobs: list[Any] = []
        self.gpu_error = ""
        self.notes: tuple[str, ...] = ()
        self.report = ""
        self.cleaning = False
        self.hidden: tuple[Any, ...] = ()

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("scanning processes…", id="ps-head")
        with VerticalScroll(id="ps-body", can_focus=True):
            yield Static("", id="ps-table")
        yield Static("", id="ps-foot")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = "Processes"

    def on_screen_resume(self) -> None:
        self.query_one("#ps-body").focus()

    def read(self) -> None:
        def listed(table: ProcessTable) -> ProcessesListed:
            jobs, notes = list(table.jobs), tuple(table.notes)
            return ProcessesListed(jobs, notes, table.gpu_error or "", table.hidden_holders)

        self.post_read("process scan", self.ddptui.actions.scan_processes, listed)

    def on_processes_listed(self, message: ProcessesListed) -> None:
        self.jobs = message.jobs
        self.notes = message.notes
        self.gpu_error = message.gpu_error
        self.hidden = message.hidden
        self._show_head()
        self._show_foot()
        self.query_one("#ps-table", Static).update(
            jobs_renderable(self.jobs, (self.size.width or 80) - 2, self.hidden)
        )

    def _show_head(self) -> None:
        jobs = self.jobs
        orphaned = [j for j in jobs if j.state == JobState.ORPHANED]
        head = Text(f"{len(jobs)} training job{'s' if len(jobs) != 1 else ''}", style="bold")
        if orphaned:
            head.append(f" · {len(orphaned)} orphaned (x cleans them)", style="bold red")
        else:
            head.append(" · none orphaned", style="green")
        if self.hidden:
            n = len(self.hidden)
            head.append(f" · {n} GPU holder{'s' if n != 1 else ''} NVML does not list", "yellow")
        if self.root():
            head.append(
                " · cleans: ALL USERS" if self.all_users else " · cleans: yours (a: all)",
                style="bold red" if self.all_users else "dim",
            )
        if self.gpu_error:
            head.append(f" · GPU memory not available: {self.gpu_error}", style="dim")
        self.query_one("#ps-head", Static).update(head)

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
        chosen_jobs = [j for j in orphaned if j.own or self.all_users]
        others = [j for j in orphaned if j not in chosen_jobs]
        if not chosen_jobs:
            self.notify(
                f"The orphaned job{'s belong' if len(others) > 1 else ' belongs'} to "
                f"{', '.join(sorted({u for j in others for u in j.users}))}; ddptui cleans only "
                "your own" + (" (a: allow all users)" if self.root() else ""),
                severity="warning",
            )
            return
        listing = "\n".join(
            f"• {j.label} ({', '.join(j.users)}): {len(j.live_processes)} processes"
            for j in chosen_jobs[:6]
        )
        if others:
            listing += (
                f"\n\nLeft alone: {len(others)} job{'s' if len(others) > 1 else ''} of "
                f"{', '.join(sorted({u for j in others for u in j.users}))}"
                + (" (a: allow all users)" if self.root() else "")
            )
        whose = (
            "Processes of every user are touched."
            if self.all_users
            else ("Only your own processes are touched.")
        )
        dialog = ConfirmDialog(
            f"Clean {len(chosen_jobs)} orphaned job{'s' if len(chosen_jobs) > 1 else ''}?",
            f"{listing}\n\nEach process gets SIGTERM, then SIGKILL after {STOP_GRACE_SECONDS:.0f} s. "
            + whose,
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
            outcome = self.ddptui.actions.clean(STOP_GRACE_SECONDS, self.all_users)
        except Exception as err:
            self.post_message(CleanFinished(False, f"clean failed: {err}"))
            return
        self.post_message(CleanFinished(outcome.ok, outcome.report))

    def on_clean_finished(self, message: CleanFinished) -> None:
        self.cleaning = False
        self.report = message.report
        self.notify(message.report, severity="information" if message.ok else "error")
        self._show_foot()
        self.poll()

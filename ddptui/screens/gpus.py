"""GPUs: every GPU of the machine (utilisation and memory bars with their history, temperature,
power) over every process on them, named for what it is: a ddptui run's rank, a foreign job's
rank, an orphaned job's process, a DataLoader worker, or unknown, including processes NVML does
not list that hold a GPU device open, under a line of the host's CPU, memory and swap. ``f``
filters the list (pid, user, kind, job, command). Select one and stop it (``t``) or its whole
job (``T``) after a confirmation that picks the signal (SIGTERM then SIGKILL, SIGINT, or SIGKILL
now); this user's processes only, unless root turns on all users (``a``, confirmed).

Without NVML the first line says why and the ranks of ddptui runs on the CPU are listed.
The NVML sample comes from the app (every ``gpu_poll_seconds``); the process scan is a thread
worker every ``list_poll_seconds`` that posts ``GpusScanned``.
"""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING, ClassVar

from rich.console import Group
from rich.text import Text
from textual import events, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widget import Widget
from textual.widgets import Footer, Header, Input, Static

from ddptui import text_figures
from ddptui.actions import STOP_GRACE_SECONDS
from ddptui.messages import GpusScanned, StopFinished
from ddptui.screens.base import PollingScreen
from ddptui.widgets.confirm import AllUsersToggle, ConfirmDialog
from ddptui.widgets.gpu_panel import gpu_bar_line
from ddptui.widgets.gpu_process_list import GpuProcessList
from engine.core.host.gpus import GpuInventory
from engine.core.jobs.gpu_view import GpuProcessRow, GpuView
from engine.core.procs.process_identity import ProcessRef

if TYPE_CHECKING:
    from ddptui.gpu_history import GpuHistory

HINT = "↑↓ select · t stop process · T stop its job · f filter · , . sort · / reverse"
# The signals a stop may send, each a key of the stop dialog: (key, label, answer).
SIGNAL_CHOICES = [("y", "Stop", "stop"), ("i", "SIGINT", "SIGINT"), ("k", "SIGKILL", "SIGKILL")]


class GpuBars(Widget):
    """One line per GPU (``gpu_bar_line``); its height follows the GPU count."""

    DEFAULT_CSS = "GpuBars { height: 1; }"

    def __init__(self, history: GpuHistory, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.history = history
        self.inventory: GpuInventory | None = None
        self.held: dict[int, int] = {}

    def show(self, inventory: GpuInventory | None, held: dict[int, int]) -> None:
        self.inventory, self.held = inventory, held
        count = len(self._lines(self.size.width or 80))
        if self.styles.height is None or self.styles.height.value != count:
            self.styles.height = count
        self.refresh()

    def on_resize(self) -> None:  # a wrapped sentence takes more lines on a narrower terminal
        self.show(self.inventory, self.held)

    def _lines(self, width: int) -> list[Text]:
        inventory = self.inventory
        if inventory is None:
            return [Text("GPUs: sampling NVML…", style="dim")]
        if inventory.error is not None:  # a sentence: wrapped at words, never cut
            sentence = (
                f"GPUs not available: {inventory.error}. Showing the ranks of ddptui runs on the "
                "CPU."
            )
            return [
                Text(line, style="yellow")
                for line in textwrap.wrap(sentence, max(20, width), break_on_hyphens=False)
            ]
        if not inventory.gpus:
            return [Text("GPUs: NVML lists none on this machine.", style="yellow")]
        history = self.history
        return [
            gpu_bar_line(gpu, history, width, self.held.get(gpu.index, 0)) for gpu in inventory.gpus
        ]

    def render(self) -> Group:
        return Group(*self._lines(self.size.width or 80))


class GpusScreen(AllUsersToggle, PollingScreen):
    ALL_USERS_QUESTION = (
        "Stop other users' processes too?",
        "As root, t and T will also stop processes that belong to other users (their training "
        "is lost).",
    )
    PROBLEM_AT = "#gpus-head"

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("t", "stop(False)", "Stop"),
        Binding("T", "stop(True)", "Job"),
        Binding("f", "filter", "Filter"),
        Binding("a", "all_users", "All"),
        Binding("comma", "sort(-1)", "Sort", show=False),
        Binding("full_stop", "sort(1)", "Sort", show=False),
        Binding("slash", "reverse", "Reverse", show=False),
        Binding("f5", "refresh", "Refresh", show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.view: GpuView | None = None
        self.stopping = False
        self.report = ""

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("", id="gpus-head")
        yield GpuBars(self.ddptui.gpu_history, id="gpu-bars")
        yield Static("", id="gpus-host", markup=False)
        yield Static(HINT, id="gpus-hint")
        yield Input(
            placeholder="filter: pid, user, kind, job or command (esc clears)",
            id="gpus-filter",
            compact=True,
        )
        yield GpuProcessList(id="gpu-procs")
        yield Static("", id="gpus-detail")
        yield Footer()  # fmt: skip

    def on_mount(self) -> None:
        self.sub_title = "GPUs"
        self.query_one("#gpus-host").display = False
        self.query_one("#gpus-filter").display = False
        self.watch(self.ddptui, "gpu_inventory", self._gpus_changed)

    def on_screen_resume(self) -> None:
        self.query_one(GpuProcessList).focus()

    # -- reading -------------------------------------------------------------------------------

    def _gpus_changed(self, inventory: GpuInventory | None) -> None:
        if self.is_current:
            self._show_bars()
            if self.view is None or self.view.error != (inventory.error if inventory else None):
                self.poll()

    def _show_bars(self) -> None:
        held: dict[int, int] = {}
        for row in self.view.rows if self.view else ():
            if row.gpu_index is not None:
                held[row.gpu_index] = held.get(row.gpu_index, 0) + 1
        self.query_one(GpuBars).show(self.ddptui.gpu_inventory, held)

    def read(self) -> None:
        inventory = self.ddptui.gpu_inventory
        if inventory is None:
            return  # the app's first NVML sample triggers a scan when it lands
        scan = self.ddptui.actions.scan_gpus
        self.post_read("GPU process scan", lambda: scan(inventory), GpusScanned)

    def on_gpus_scanned(self, message: GpusScanned) -> None:
        self.view = message.view
        self._show_head()
        self._show_bars()
        self._show_host()
        self.query_one(GpuProcessList).rows = message.view.rows

    def _show_host(self) -> None:
        host = self.view.host if self.view is not None else None
        line = self.query_one("#gpus-host", Static)
        line.display = host is not None
        if host is not None:
            text = Text(text_figures.host_line(host, self.size.width or 80), style="dim")
            text.no_wrap, text.overflow = True, "ellipsis"
            line.styles.height = 1
            line.update(text)

    def _show_head(self) -> None:
        view = self.view
        parts: list[tuple[str, str]] = []
        if view is not None and view.error is None:
            parts.append((f"{len(view.gpus)} GPUs", "bold"))
            if view.driver_version and self.size.width >= 100:
                parts.append((f"driver {view.driver_version}", ""))
        if view is not None:
            hidden = sum(1 for r in view.rows if not r.listed and r.gpu_index is not None)
            parts.append((f"{len(view.rows)} processes", ""))
            if hidden:
                parts.append((f"{hidden} unlisted by NVML", "yellow"))
        shown = self.query_one(GpuProcessList).filter_text
        if shown:
            parts.append((f"filter {shown!r} (f: change)", "yellow"))
        if self.root():
            parts.append(
                ("stops: ALL USERS", "bold red")
                if self.all_users
                else ("stops: yours (a: all)", "dim")
            )
        head = Text(no_wrap=True, overflow="ellipsis")
        for i, (text, style) in enumerate(parts):
            head.append(" · " if i else "")
            head.append(text, style=style)
        self.query_one("#gpus-head", Static).update(head)

    def on_gpu_process_list_highlighted(self, message: GpuProcessList.Highlighted) -> None:
        self._show_detail(message.row)

    def _show_detail(self, row: GpuProcessRow | None) -> None:
        lines: list[Text] = []
        if self.report:
            lines.append(Text(self.report, style="bold"))
        if row is not None:
            what = Text(f"pid {row.pid} ", style="bold")
            what.append(f"{row.user} · ", style="")
            what.append(row.what, style="")
            if row.note:
                what.append(f" ({row.note})", style="dim")
            lines.append(what)
            if self.size.height >= 30 and row.command:  # room for the whole command line
                lines.append(Text(row.command, style="dim"))
        elif self.view is not None and self.view.notes:
            lines.append(Text(self.view.notes[0], style="dim"))
        for line in lines:
            line.no_wrap, line.overflow = True, "ellipsis"
        detail = self.query_one("#gpus-detail", Static)
        detail.styles.height = max(1, len(lines))
        detail.update(Group(*lines))

    # -- filtering -------------------------------------------------------------------------------

    def action_filter(self) -> None:
        """Show the filter field (as nvitop filters its list); typing narrows the list at once,
        Enter goes back to the list keeping it, Escape clears it."""
        field = self.query_one("#gpus-filter", Input)
        field.display = True
        field.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "gpus-filter":
            self.query_one(GpuProcessList).filter_text = event.value.strip()
            self._show_head()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "gpus-filter":
            event.input.display = bool(event.value.strip())
            self.query_one(GpuProcessList).focus()

    def on_key(self, event: events.Key) -> None:
        field = self.query_one("#gpus-filter", Input)
        if event.key == "escape" and field.has_focus:
            event.stop()
            field.value = ""
            field.display = False
            self.query_one(GpuProcessList).focus()

    # -- sorting ---------------------------------------------------------------------------------

    def action_sort(self, step: int) -> None:
        self.query_one(GpuProcessList).cycle_sort(step)

    def action_reverse(self) -> None:
        procs = self.query_one(GpuProcessList)
        procs.reverse = not procs.reverse

    # -- stopping ------------------------------------------------------------------------------

    def action_stop(self, whole_job: bool) -> None:
        row = self.query_one(GpuProcessList).selected
        if self.stopping:
            self.notify("Stopping is already in progress.")
            return
        if row is None or self.view is None:
            self.notify("No process selected.")
            return
        if row.ref is None:
            self.notify(
                f"pid {row.pid} is not visible here (another PID namespace): it cannot be "
                "stopped from this machine's view.",
                severity="warning",
            )
            return
        refs: tuple[ProcessRef, ...] = (row.ref,)
        title = f"Stop pid {row.pid}?"
        what = f"pid {row.pid} ({row.user}): {row.what}"
        if whole_job and row.job_key is not None:
            refs = self.view.job_refs(row.job_key) or refs
            title = f"Stop {row.job_label or 'its job'}?"
            what = (
                f"{len(refs)} processes of {row.job_label}: pids "
                + ", ".join(str(r.pid) for r in refs[:12])
                + ("…" if len(refs) > 12 else "")
            )
        others = self._other_users(refs)
        if others and not self.all_users:
            self.notify(
                f"{what.split(':')[0]} belongs to {', '.join(sorted(others))}; ddptui stops only "
                "your own processes" + (" (a: allow all users)" if self.root() else ""),
                severity="warning",
            )
            return
        body = (
            f"{what}\n\nStop: SIGTERM, then SIGKILL after {STOP_GRACE_SECONDS:.0f} s, child "
            "processes too. Or one signal: SIGINT (as Ctrl-C), or SIGKILL now."
        )
        if others:
            body += f"\nThis includes processes of {', '.join(sorted(others))}."

        def chosen(answer: str | None) -> None:
            if answer is None:
                return
            self.stopping = True
            self.report = "stopping…" if answer == "stop" else f"sending {answer}…"
            self._show_detail(self.query_one(GpuProcessList).selected)
            self.stop(refs, bool(others), answer)

        self.app.push_screen(ConfirmDialog(title, body, SIGNAL_CHOICES), chosen)

    def _other_users(self, refs: tuple[ProcessRef, ...]) -> set[str]:
        pids = {r.pid for r in refs}
        users = set()
        for row in self.view.rows if self.view else ():
            if row.pid in pids and not row.own:
                users.add(row.user)
        if self.view is not None and self.view.table is not None:
            for job in self.view.table.jobs:
                users.update(p.user for p in job.processes if p.pid in pids and not p.own)
        return users

    @work(thread=True, exclusive=True, exit_on_error=False, group="stop")
    def stop(self, refs: tuple[ProcessRef, ...], all_users: bool, how: str = "stop") -> None:
        """``how``: "stop" (SIGTERM, SIGKILL after the grace), or one signal's name to send."""
        actions = self.ddptui.actions
        try:
            if how == "stop":
                outcome = actions.stop_processes(refs, STOP_GRACE_SECONDS, all_users)
            else:
                outcome = actions.signal_processes(refs, how, all_users)
        except Exception as err:
            self.post_message(StopFinished(False, f"stop failed: {err}"))
            return
        self.post_message(StopFinished(outcome.ok, outcome.report))

    def on_stop_finished(self, message: StopFinished) -> None:
        self.stopping = False
        self.report = message.report
        self.notify(message.report, severity="information" if message.ok else "error")
        self._show_detail(self.query_one(GpuProcessList).selected)
        self.poll()

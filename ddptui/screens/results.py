"""Results: the speedup table (``engine.core.speedup_table``) of the runs launched since the app opened,
or of a stored bench; the baseline row is choosable, and the table exports to Markdown or CSV.

The screen renders the table module's own cells and notes: it never computes a figure itself.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import DataTable, Footer, Header, OptionList, Static
from textual.widgets.option_list import Option

from ddptui.messages import ResultsBuilt

if TYPE_CHECKING:
    from ddptui.app import DdptuiApp

SESSION = "session"
WIDE = 120
NARROW_HIDDEN = ("strategy", "precision", "data wait")


class ChoiceDialog(ModalScreen[str | None]):
    """Pick one of ``choices`` (id, label); Escape cancels."""

    DEFAULT_CSS = """
    ChoiceDialog { align: center middle; }
    ChoiceDialog > Vertical {
        width: 72; max-width: 95%; height: auto; max-height: 80%;
        border: thick $accent; background: $surface; padding: 0 1;
    }
    ChoiceDialog OptionList { height: auto; max-height: 16; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, title: str, choices: list[tuple[str, str]], current: str | None) -> None:
        super().__init__()
        self.title_text = title
        self.choices = choices
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.title_text, markup=False)
            yield OptionList(*[Option(label, id=key) for key, label in self.choices])

    def on_mount(self) -> None:
        options = self.query_one(OptionList)
        keys = [k for k, _ in self.choices]
        if self.current in keys:
            options.highlighted = keys.index(self.current)
        options.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)


class ResultsScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("o", "choose_source", "Source"),
        Binding("b", "choose_baseline", "Baseline"),
        Binding("m", "export('markdown')", "→.md"),
        Binding("v", "export('csv')", "→.csv"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.source = SESSION  # "session" or a bench id
        self.baseline: str | None = None
        self.table: Any = None
        self.export_dir: Path = Path.cwd()

    @property
    def ddptui(self) -> DdptuiApp:
        return self.app  # type: ignore[return-value]

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("", id="results-head")
        yield DataTable(id="results-table", cursor_type="row")
        yield Static("", id="results-notes")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = "Results"

    def on_screen_resume(self) -> None:
        self.build()
        self.query_one(DataTable).focus()

    @work(thread=True, exclusive=True, exit_on_error=False, group="results")
    def build(self) -> None:
        app = self.ddptui
        source, baseline = self.source, self.baseline
        try:
            if source == SESSION:
                if not app.session_runs:
                    self.post_message(ResultsBuilt(source, None))
                    return
                table = app.actions.session_table(list(app.session_runs), baseline, app.probe)
            else:
                table = app.actions.bench_table(int(source), baseline)
        except Exception as err:  # shown in place of the table
            self.post_message(ResultsBuilt(source, None, f"{type(err).__name__}: {err}"))
            return
        self.post_message(ResultsBuilt(source, table))

    def on_results_built(self, message: ResultsBuilt) -> None:
        head = self.query_one("#results-head", Static)
        notes = self.query_one("#results-notes", Static)
        data = self.query_one(DataTable)
        self.table = message.table
        data.clear(columns=True)
        if message.error:
            head.update(Text(f"The table could not be built: {message.error}", style="bold red"))
            notes.update("")
            return
        table = message.table
        if table is None:
            head.update(
                Text.assemble(
                    ("No run launched from this app yet.", "bold"),
                    " Launch one (l), or pick a stored bench (o).",
                )
            )
            notes.update("")
            return
        title = Text(table.title or "Speedup table", style="bold")
        title.append(f" · baseline: {table.baseline or 'none'} (b changes it)", style="")
        head.update(title)
        # Narrow terminals drop the columns the row label and the export already tell.
        shown = [
            i
            for i, header in enumerate(table.columns)
            if self.size.width >= WIDE or header not in NARROW_HIDDEN
        ]
        data.add_columns(*[table.columns[i] for i in shown])
        for cells, row in zip(table.display_rows(), table.rows, strict=True):
            style = "" if row.ok else "red"
            if row.baseline:
                style = "bold"
            data.add_row(*[Text(cells[i], style=style) for i in shown], key=row.label)
        notes.update(Text("\n".join(table.notes), style="dim"))

    # -- choices --------------------------------------------------------------------------------

    def action_choose_source(self) -> None:
        self.list_benches()

    @work(thread=True, exclusive=True, exit_on_error=False, group="benches")
    def list_benches(self) -> None:
        try:
            benches = self.ddptui.actions.list_benches()
            error = ""
        except Exception as err:
            benches, error = [], f"{type(err).__name__}: {err}"
        self.app.call_from_thread(self._pick_source, benches, error)

    def _pick_source(self, benches: list[Any], error: str) -> None:
        if error:
            self.notify(f"Stored benches cannot be read: {error}", severity="error")
        choices = [(SESSION, f"Runs launched in this session ({len(self.ddptui.session_runs)})")]
        for b in benches:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(b.created))
            choices.append(
                (
                    str(b.id),
                    f"#{b.id} {when} {b.title} · {b.completed_rows}/{b.rows} rows · {b.gpus}",
                )
            )

        def chosen(key: str | None) -> None:
            if key is not None and key != self.source:
                self.source, self.baseline = key, None
                self.build()

        self.app.push_screen(ChoiceDialog("Show the table of", choices, self.source), chosen)

    def action_choose_baseline(self) -> None:
        table = self.table
        if table is None or not table.rows:
            self.notify("No table to re-baseline yet.")
            return
        choices = [
            (row.label, f"{row.label} · {row.devices} · {row.status}")
            for row in table.rows
            if row.ok
        ]
        if not choices:
            self.notify("No row completed, so none can be the baseline.", severity="warning")
            return

        def chosen(label: str | None) -> None:
            if label is not None:
                self.baseline = label
                self.build()

        self.app.push_screen(ChoiceDialog("Baseline row", choices, table.baseline), chosen)

    def action_export(self, fmt: str) -> None:
        table = self.table
        if table is None:
            self.notify("No table to export yet.", severity="warning")
            return
        suffix = {"markdown": "md", "csv": "csv"}[fmt]
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(self.ddptui.clock()))
        path = self.export_dir / f"ddptui-results-{stamp}.{suffix}"
        try:
            path.write_text(table.render(fmt), encoding="utf-8")
        except OSError as err:
            self.notify(f"Cannot write {path}: {err.strerror}", severity="error")
            return
        self.notify(f"Wrote {path}", title=f"Exported {fmt}")

"""Results: the speedup table (``engine.core.bench.speedup_table``) of the runs launched since the app opened,
or of a stored bench; the baseline row is choosable, and the table exports to Markdown or CSV.
``space`` marks a row (A, then B) and ``d`` compares the runs of two rows as ``ddptui diff`` does.

The essential columns come first (row, devices, precision, images/s, speedup, efficiency, accuracy,
note), so they fit 80 columns; the rest follow, and a line says the table scrolls when it does.
Under it, speedup against devices as bars, one group per precision.

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
from textual.widgets import DataTable, Footer, Header, OptionList, Static
from textual.widgets.option_list import Option

from ddptui import text_figures
from ddptui.messages import ResultsBuilt, RunsCompared
from ddptui.screens.base import DdptuiScreen
from ddptui.widgets.dialog import Dialog
from ddptui.widgets.fitted_table import FittedTable
from ddptui.widgets.run_diff_dialog import read_diff, show_comparison

if TYPE_CHECKING:
    from engine.core.runs.rundir import RunDir

SESSION = "session"
# The columns that fit 80 columns first; every other column of the table follows.
ESSENTIAL = ("row", "devices", "precision", "images/s", "speedup", "efficiency", "test acc", "flag")
FLAG = "flag"  # the note in a word or two (SpeedupRow.flag); the note column has it in full
# Shorter headers for the screen, so the essential columns fit 80 (the exports keep the long ones)
SHORT_HEADERS = {"precision": "prec", "images/s": "img/s", "efficiency": "eff", "test acc": "acc"}
CHART_BAR = 24


def column_order(columns: tuple[str, ...]) -> list[int]:
    """Indices of ``columns``: the essential ones first, in ESSENTIAL's order, then the rest."""
    first = [columns.index(name) for name in ESSENTIAL if name in columns]
    return first + [i for i in range(len(columns)) if i not in first]


def screen_columns(table: Any) -> tuple[list[str], list[list[str]]]:
    """The table's headers and cells with the flag column added, essential columns first."""
    from engine.core.bench.table_render import DISPLAY_HEADERS, display_rows

    headers = (*DISPLAY_HEADERS, FLAG)
    rows = [(*cells, row.flag) for cells, row in zip(display_rows(table), table.rows, strict=True)]
    order = column_order(headers)
    shown = [SHORT_HEADERS.get(headers[i], headers[i]) for i in order]
    return shown, [[cells[i] for i in order] for cells in rows]


def speedup_bars(table: Any, width: int) -> Text:
    """Speedup against devices, a bar a row, grouped by precision (the rows that completed)."""
    rows = [r for r in table.rows if r.ok and r.speedup is not None]
    text = Text()
    if not rows:
        return text
    top = max(r.speedup for r in rows) or 1.0
    label_width = min(24, max(len(r.devices or "-") for r in rows) + 2)
    names = max(len(r.label) for r in rows)
    bar_width = max(6, min(CHART_BAR * 2, width - label_width - names - 14))
    text.append("speedup against devices", style="bold")
    for precision in dict.fromkeys(r.precision for r in rows):
        group = sorted((r for r in rows if r.precision == precision), key=lambda r: r.device_count)
        text.append(f"\n{precision}", style="bold cyan")
        for r in group:
            text.append(f"\n  {(r.devices or '-'):<{label_width}}")
            text.append(
                text_figures.bar(int(r.speedup * 1000), int(top * 1000), bar_width), "green"
            )
            text.append(f" {r.speedup:.2f}x", style="bold" if r.baseline else "")
            text.append(f"  {r.label}", style="dim")
    return text


class ChoiceDialog(Dialog[str | None]):
    """Pick one of ``choices`` (id, label); Escape cancels."""

    DEFAULT_CSS = """
    ChoiceDialog > Vertical { max-height: 80%; }
    ChoiceDialog OptionList { height: auto; max-height: 16; }
    """

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


class ResultsScreen(DdptuiScreen):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("o", "choose_source", "Source"),
        Binding("b", "choose_baseline", "Baseline"),
        Binding("m", "export('markdown')", "→.md"),
        Binding("v", "export('csv')", "→.csv"),
        Binding("space", "mark", "Mark", show=False),
        Binding("d", "compare", "Compare"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.source = SESSION  # "session" or a bench id
        self.baseline: str | None = None
        self.table: Any = None
        self.export_dir: Path = Path.cwd()
        self.marked: list[str] = []  # the rows marked for comparing, A first (at most 2)

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("", id="results-head")
        yield FittedTable(id="results-table", cursor_type="row")
        yield Static("", id="results-scroll")
        yield Static("", id="results-chart")
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
        scroll = self.query_one("#results-scroll", Static)
        chart = self.query_one("#results-chart", Static)
        scroll.update("")
        chart.update("")
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
        self.marked = [label for label in self.marked if any(r.label == label for r in table.rows)]
        self._draw_head()
        headers, rows = screen_columns(table)
        data.add_columns(*headers)
        for cells, row in zip(rows, table.rows, strict=True):
            style = "" if row.ok else "red"
            if row.baseline:
                style = "bold"
            data.add_row(*[Text(cell, style=style) for cell in cells], key=row.label)
        # Each column is as wide as its widest cell plus one space either side.
        widths = [2 + max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
        width = self.size.width or 80
        fit = 0
        while fit < len(widths) and sum(widths[: fit + 1]) <= width:
            fit += 1
        if fit < len(headers):
            hint = Text(no_wrap=True, overflow="ellipsis", style="yellow")
            hint.append(f"→ scrolls right for {', '.join(headers[fit:])}")
            scroll.update(hint)
        chart.update(speedup_bars(table, width))
        notes.update(Text("\n".join(table.notes), style="dim"))

    def _draw_head(self) -> None:
        table = self.table
        title = Text(table.title or "Speedup table", style="bold")
        title.append(f" · baseline: {table.baseline or 'none'} (b changes it)", style="")
        if self.marked:
            marks = ", ".join(f"{'AB'[i]} {label}" for i, label in enumerate(self.marked))
            title.append(f" · marked {marks} (d compares)", style="cyan")
        self.query_one("#results-head", Static).update(title)

    # -- comparing two rows' runs ---------------------------------------------------------------

    def _highlighted_label(self) -> str | None:
        data = self.query_one(DataTable)
        if self.table is None or not data.row_count:
            return None
        value = data.coordinate_to_cell_key(data.cursor_coordinate).row_key.value
        return str(value) if value is not None else None

    def action_mark(self) -> None:
        """Mark the highlighted row for comparing (again: unmark it); a third replaces A."""
        label = self._highlighted_label()
        if label is None:
            return
        if label in self.marked:
            self.marked.remove(label)
        else:
            self.marked = [*self.marked[-1:], label]
        self._draw_head()

    def _run_of(self, label: str) -> RunDir | None:
        """The run a row stands for (its last repeat's), in this session or the runs directory."""
        from engine.core.runs.rundir import RunDir

        row = next((r for r in self.table.rows if r.label == label), None) if self.table else None
        if row is None or not row.run_ids:
            return None
        run_id = row.run_ids[-1]
        here = next((r for r in self.ddptui.session_runs if r.run_id == run_id), None)
        return here if here is not None else RunDir(self.ddptui.runs_dir / run_id)

    def action_compare(self) -> None:
        labels = list(self.marked)
        highlighted = self._highlighted_label()
        if len(labels) < 2 and highlighted is not None and highlighted not in labels:
            labels.append(highlighted)
        if len(labels) < 2:
            self.notify("Mark a row (space), then press d on another to compare their runs.")
            return
        a, b = self._run_of(labels[0]), self._run_of(labels[1])
        if a is None or b is None:
            missing = labels[0] if a is None else labels[1]
            self.notify(f"Row {missing} has no run to compare.", severity="warning")
            return
        self.compare_runs(a, b)

    @work(thread=True, exclusive=True, exit_on_error=False, group="compare")
    def compare_runs(self, a: RunDir, b: RunDir) -> None:
        self.post_message(read_diff(a, b))

    def on_runs_compared(self, message: RunsCompared) -> None:
        show_comparison(self, message)

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
        from engine.core.bench.table_render import render_table

        try:
            path.write_text(render_table(table, fmt), encoding="utf-8")
        except OSError as err:
            self.notify(f"Cannot write {path}: {err.strerror}", severity="error")
            return
        self.notify(f"Wrote {path}", title=f"Exported {fmt}")

"""The speedup table: what a bench prints, the history stores and the UI's results screen shows.

Plain Python (no torch). The table is built once, from each row's run summaries (or the reason a
row never ran or failed), and every view of it (markdown, CSV, JSON, the cells of a Textual
DataTable) is rendered from the same computed rows, so the views cannot disagree.

What a caller may rely on:

- Speed figures come from the *last* epoch of each run: steady-state seconds and images/s (the
  warm-up steps at the start of the epoch left out), data loading included, and the share of the
  epoch spent waiting for data reported separately.
- ``speedup`` is the row's images/s over the baseline row's. It equals baseline epoch seconds over
  row epoch seconds whenever both epochs hold the same images (a full epoch, as the tutorial ran),
  and stays right when they do not (``max_steps`` caps steps per rank, so a 2-rank epoch then holds
  twice the images).
- ``efficiency`` is speedup divided by the ratio of devices (row devices / baseline devices).
- With repeats, each figure is the median over the repeats, with the min and max kept as the spread.
- A row whose global batch differs from the baseline's is flagged (``batch_differs``), and a row
  slower than another row of the same precision with fewer devices names it (``slower_than``).
- Figures that cannot be trusted are flagged, each with a footnote: efficiency above 100 % beyond
  the spread of the repeats (``superlinear``), fewer than ``MIN_STEADY_STEPS`` steady steps
  (``few_steps``), and other processes keeping more than ``OUTSIDE_LOAD_CORES`` cores busy while
  the row ran (``outside_load``, measured by the bench: ``engine.core.host.outside_load``).
"""

from __future__ import annotations

import csv
import io
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from engine.core.common import strict_json
from engine.core.common.statuses import RowStatus, RunStatus
from engine.core.runs.summary import RunSummary

TABLE_SCHEMA_VERSION = 1

FORMATS = ("markdown", "csv", "json")

WARN_MARK = "⚠"
BATCH_MARK = "†"
SUPERLINEAR_MARK = "‡"
FEW_STEPS_MARK = "§"
LOAD_MARK = "◊"
NONE_CELL = "—"

# Fewer steady (post-warm-up) steps than this in a row's last epoch: its rate is mostly noise.
MIN_STEADY_STEPS = 20
# Other processes keeping this many cores busy on average while a row ran: it had company.
OUTSIDE_LOAD_CORES = 0.25


class TableError(ValueError):
    """A table that cannot be built or read back; the message is one sentence."""


@dataclass(frozen=True)
class RowResult:
    """One row as it was run: its planned shape, plus the summaries of its repeats or why none ran.

    ``strategy`` … ``global_batch`` are what the plan said before anything started (a skipped row
    has nothing else); a completed run's summary takes precedence where it says otherwise.
    ``global_batch`` and ``device_count`` are 0 when the row could not even be planned.
    """

    label: str
    preset: str
    strategy: str
    devices: str
    device_count: int
    precision: str
    global_batch: int
    summaries: tuple[RunSummary, ...] = ()
    skipped: str = ""  # why the row never ran; empty when it ran


@dataclass(frozen=True)
class SpeedupRow:
    """One computed row. Figures are None where the row did not complete."""

    label: str
    preset: str
    status: RowStatus
    reason: str
    strategy: str
    devices: str
    device_count: int
    precision: str
    global_batch: int
    repeats: int = 0  # completed runs behind the figures
    epoch_seconds: float | None = None
    epoch_seconds_min: float | None = None
    epoch_seconds_max: float | None = None
    data_wait_share: float | None = None
    images_per_s: float | None = None
    images_per_s_min: float | None = None
    images_per_s_max: float | None = None
    epoch_images: int | None = None
    warmup_steps: int | None = None
    test_accuracy: float | None = None  # fraction of the test set, 0..1
    speedup: float | None = None
    efficiency: float | None = None
    baseline: bool = False
    batch_differs: bool = False
    # label of a faster row of the same precision with fewer devices (the fewest such)
    slower_than: str | None = None
    run_ids: tuple[str, ...] = ()
    steady_steps: int | None = None  # the fewest steps after the warm-up in a repeat's last epoch
    outside_load: float | None = None  # the most cores other processes kept busy in a repeat
    superlinear: bool = False  # efficiency above 100 % beyond the spread of the repeats

    @property
    def few_steps(self) -> bool:
        return self.steady_steps is not None and self.steady_steps < MIN_STEADY_STEPS

    @property
    def loaded(self) -> bool:
        return self.outside_load is not None and self.outside_load > OUTSIDE_LOAD_CORES

    @property
    def ok(self) -> bool:
        return self.status == RowStatus.OK

    @property
    def flag(self) -> str:
        """The row's note in a word or two (the note column says it in full)."""
        if self.status != RowStatus.OK:
            return str(self.status)
        marks = []
        if self.baseline:
            marks.append("baseline")
        if self.slower_than:
            marks.append(f"{WARN_MARK} slower")
        if self.batch_differs:
            marks.append(f"{BATCH_MARK} batch")
        return " ".join(marks)

    def cells(self) -> tuple[str, ...]:
        """The row as display strings, in the order of ``DISPLAY_COLUMNS``."""
        batch = _int_cell(self.global_batch) + (f" {BATCH_MARK}" if self.batch_differs else "")
        speedup = _speedup_cell(self.speedup) + (f" {WARN_MARK}" if self.slower_than else "")
        if self.status == RowStatus.OK:
            note = "baseline" if self.baseline else ""
        else:
            note = f"{self.status}: {self.reason}" if self.reason else self.status
        seconds = _seconds_cell(self.epoch_seconds, self.epoch_seconds_min, self.epoch_seconds_max)
        rate = _rate_cell(self.images_per_s, self.images_per_s_min, self.images_per_s_max)
        efficiency = _percent_cell(self.efficiency, digits=0)
        return (
            self.label,
            self.strategy,
            self.devices if self.devices else NONE_CELL,
            self.precision,
            batch,
            seconds + (f" {LOAD_MARK}" if self.loaded else ""),
            _percent_cell(self.data_wait_share, digits=0),
            rate + (f" {FEW_STEPS_MARK}" if self.few_steps else ""),
            speedup,
            efficiency + (f" {SUPERLINEAR_MARK}" if self.superlinear else ""),
            _percent_cell(self.test_accuracy, digits=1),
            note,
        )


# (key, header) of the displayed columns, in order; keys name SpeedupRow fields where they can.
DISPLAY_COLUMNS: tuple[tuple[str, str], ...] = (
    ("label", "row"),
    ("strategy", "strategy"),
    ("devices", "devices"),
    ("precision", "precision"),
    ("global_batch", "global batch"),
    ("epoch_seconds", "epoch s"),
    ("data_wait_share", "data wait"),
    ("images_per_s", "images/s"),
    ("speedup", "speedup"),
    ("efficiency", "efficiency"),
    ("test_accuracy", "test acc"),
    ("note", "note"),
)

# CSV columns: every SpeedupRow field, raw numbers.
CSV_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(SpeedupRow))


@dataclass(frozen=True)
class SpeedupTable:
    title: str
    rows: tuple[SpeedupRow, ...]
    baseline: str | None  # label of the baseline row, None when no row can be one
    notes: tuple[str, ...] = field(default=())  # footer sentences, in order
    # Lines shown under the title: the machine, the command that reproduces the table.
    header_lines: tuple[str, ...] = field(default=())

    @property
    def columns(self) -> tuple[str, ...]:
        """Headers of the displayed columns (for a Textual DataTable's ``add_columns``)."""
        return tuple(header for _, header in DISPLAY_COLUMNS)

    def display_rows(self) -> list[tuple[str, ...]]:
        """Each row's display strings, matching ``columns`` (for ``DataTable.add_row``)."""
        return [row.cells() for row in self.rows]

    def row(self, label: str) -> SpeedupRow:
        for row in self.rows:
            if row.label == label:
                return row
        raise KeyError(label)

    # ---- views -------------------------------------------------------------------------------

    def render(self, fmt: str) -> str:
        if fmt == "markdown":
            return self.to_markdown()
        if fmt == "csv":
            return self.to_csv()
        if fmt == "json":
            return strict_json.dumps(self.to_json(), indent=2) + "\n"
        raise TableError(f"format {fmt!r} is not one of {', '.join(FORMATS)}")

    def to_markdown(self) -> str:
        lines = [f"## {self.title}", ""] if self.title else []
        if self.header_lines:
            lines.extend([*self.header_lines, ""])
        lines.extend(markdown_table(self.columns, self.display_rows()))
        if self.notes:
            lines.append("")
            lines.extend(f"- {note}" for note in self.notes)
        return "\n".join(lines) + "\n"

    def to_csv(self) -> str:
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(CSV_COLUMNS)
        for row in self.rows:
            values = asdict(row)
            writer.writerow([_csv_value(values[name]) for name in CSV_COLUMNS])
        return out.getvalue()

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": TABLE_SCHEMA_VERSION,
            "title": self.title,
            "baseline": self.baseline,
            "notes": list(self.notes),
            "header_lines": list(self.header_lines),
            "rows": [{**asdict(row), "run_ids": list(row.run_ids)} for row in self.rows],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SpeedupTable:
        """Read back ``to_json``; a table from a newer ddptui is refused with the reason."""
        version = data.get("schema")
        if not isinstance(version, int):
            raise TableError("the stored table has no schema version; it is corrupt")
        if version > TABLE_SCHEMA_VERSION:
            raise TableError(
                f"the stored table was written by a newer ddptui (table schema {version}, this one "
                f"reads {TABLE_SCHEMA_VERSION}); upgrade ddptui to read it"
            )
        known = {f.name for f in fields(SpeedupRow)}
        try:
            rows = tuple(
                SpeedupRow(
                    **{
                        **{k: v for k, v in raw.items() if k in known},
                        "status": RowStatus(raw.get("status")),
                        "run_ids": tuple(raw.get("run_ids", ())),
                    }
                )
                for raw in data.get("rows", [])
            )
        except (TypeError, ValueError) as err:
            raise TableError(f"the stored table is corrupt ({err})") from None
        return cls(
            title=str(data.get("title", "")),
            rows=rows,
            baseline=data.get("baseline"),
            notes=tuple(str(n) for n in data.get("notes", [])),
            header_lines=tuple(str(n) for n in data.get("header_lines", [])),
        )


# ---- building -----------------------------------------------------------------------------------


def build_speedup_table(
    results: Sequence[RowResult],
    *,
    title: str = "",
    baseline: str | None = None,
    header_lines: Sequence[str] = (),
) -> SpeedupTable:
    """Compute the table from the rows as they ran.

    ``baseline`` names a row label (a suite's baseline). When it is given and that row did not
    complete, no row gets a speedup and a note says why; it is never silently replaced. When it is
    not given, the first row that completed is the baseline, and a note says so.
    """
    labels = [r.label for r in results]
    if len(set(labels)) != len(labels):
        duplicate = next(label for label in labels if labels.count(label) > 1)
        raise TableError(f"two rows are labelled {duplicate!r}; row labels must be unique")
    if baseline is not None and baseline not in labels:
        raise TableError(f"baseline {baseline!r} is not one of the rows ({', '.join(labels)})")

    measured = [_measure(r) for r in results]
    notes: list[str] = []
    base: SpeedupRow | None
    # Global batches compare with the baseline's even when it did not run: its plan says it.
    batch_reference = 0
    if baseline is not None:
        base = next(m for m in measured if m.label == baseline)
        batch_reference = base.global_batch
        if not base.ok:
            notes.append(
                f"The baseline row {baseline!r} {_did_not_complete(base)}, so no row has a speedup."
            )
            base = None
    else:
        base = next((m for m in measured if m.ok), None)
        if base is None and measured:
            notes.append("No row completed, so there is no baseline and no speedup.")
        batch_reference = base.global_batch if base else 0
    rows = [_relate(m, base, batch_reference) for m in measured]
    rows = _flag_slower_with_more_devices(rows)
    notes = _explain(rows, base, batch_reference, explicit_baseline=baseline is not None) + notes
    return SpeedupTable(
        title=title,
        rows=tuple(rows),
        baseline=base.label if base else None,
        notes=tuple(notes),
        header_lines=tuple(header_lines),
    )


def _did_not_complete(row: SpeedupRow) -> str:
    if row.status == RowStatus.SKIPPED:
        return f"was skipped ({row.reason})"
    return f"failed ({row.reason})" if row.reason else "failed"


def _median(values: Iterable[float]) -> float:
    return float(statistics.median(values))


def _measure(result: RowResult) -> SpeedupRow:
    """A row's own figures: medians over its completed repeats. Relative figures come later."""
    shape: dict[str, Any] = {
        "label": result.label,
        "preset": result.preset,
        "strategy": result.strategy,
        "devices": result.devices,
        "device_count": result.device_count,
        "precision": result.precision,
        "global_batch": result.global_batch,
        "run_ids": tuple(s.run_id for s in result.summaries),
    }
    if result.skipped:
        return SpeedupRow(**shape, status=RowStatus.SKIPPED, reason=result.skipped)
    if not result.summaries:
        return SpeedupRow(**shape, status=RowStatus.FAILED, reason="no run finished")
    first = result.summaries[0]
    # What the run actually was beats what the plan said.
    shape.update(
        strategy=first.strategy,
        devices=first.devices,
        device_count=first.device_count,
        precision=first.precision,
        global_batch=first.global_batch,
    )
    total = len(result.summaries)
    for index, summary in enumerate(result.summaries, start=1):
        problem = ""
        if summary.status != RunStatus.COMPLETED:
            problem = failure_reason(summary)
        elif summary.last_epoch is None:
            problem = "it completed without finishing an epoch"
        if problem:
            which = f"run {index} of {total}: " if total > 1 else ""
            return SpeedupRow(**shape, status=RowStatus.FAILED, reason=which + problem)
    last = [s.last_epoch for s in result.summaries if s.last_epoch is not None]
    seconds = [e.steady_epoch_seconds for e in last]
    rates = [e.steady_images_per_s for e in last]
    waits = [e.data_wait_seconds / e.seconds if e.seconds > 0 else 0.0 for e in last]
    accuracies = [e.test_accuracy for e in last if e.test_accuracy is not None]
    loads = [s.outside_load_cores for s in result.summaries if s.outside_load_cores is not None]
    return SpeedupRow(
        **shape,
        status=RowStatus.OK,
        reason="",
        repeats=len(last),
        epoch_seconds=_median(seconds),
        epoch_seconds_min=min(seconds),
        epoch_seconds_max=max(seconds),
        data_wait_share=_median(waits),
        images_per_s=_median(rates),
        images_per_s_min=min(rates),
        images_per_s_max=max(rates),
        epoch_images=int(_median(e.images for e in last)),
        warmup_steps=last[0].warmup_steps,
        test_accuracy=_median(accuracies) if accuracies else None,
        steady_steps=min(e.steps - e.warmup_steps for e in last),
        outside_load=max(loads) if loads else None,
    )


def failure_reason(summary: RunSummary) -> str:
    """One line: the root cause (the first rank to fail) when known, else the launcher's reason."""
    status = summary.status
    failure = summary.failure
    if failure is not None:
        where = f"rank {failure.rank}" if failure.rank is not None else "a process"
        if failure.error:
            return f"{where}: {failure.error}"
        if failure.signal:
            return f"{where} ended by {failure.signal}"
        if failure.exitcode is not None:
            return f"{where} exited with code {failure.exitcode}"
    if summary.reason:
        return f"{status}: {summary.reason}" if status != RunStatus.FAILED else summary.reason
    return f"the run ended {status}"


def _relate(row: SpeedupRow, base: SpeedupRow | None, batch_reference: int) -> SpeedupRow:
    differs = batch_reference > 0 and row.global_batch > 0 and row.global_batch != batch_reference
    if base is None:
        return _replace(row, batch_differs=differs)
    is_base = row.label == base.label
    if not row.ok or row.images_per_s is None or not base.images_per_s:
        return _replace(row, baseline=is_base, batch_differs=differs)
    speedup = row.images_per_s / base.images_per_s
    device_ratio = row.device_count / base.device_count if base.device_count > 0 else 0.0
    efficiency = speedup / device_ratio if device_ratio > 0 else None
    # Beyond the spread: even the row's slowest repeat over the baseline's fastest is above 100 %.
    low = row.images_per_s_min or row.images_per_s
    high = base.images_per_s_max or base.images_per_s
    superlinear = not is_base and device_ratio > 0 and low / high / device_ratio > 1.0
    return _replace(
        row,
        speedup=speedup,
        efficiency=efficiency,
        baseline=is_base,
        batch_differs=differs,
        superlinear=superlinear,
    )


def _flag_slower_with_more_devices(rows: list[SpeedupRow]) -> list[SpeedupRow]:
    done = [r for r in rows if r.ok and r.images_per_s is not None]
    flagged = []
    for row in rows:
        faster_with_fewer = [
            other
            for other in done
            if row.ok
            and other.precision == row.precision  # precision is another axis, not scaling
            and other.device_count < row.device_count
            and _clearly_faster(other, row)
        ]
        if faster_with_fewer:
            # The fewest devices that still beat it is the plainest statement of the problem.
            fewest = min(faster_with_fewer, key=lambda r: (r.device_count, -(r.images_per_s or 0)))
            row = _replace(row, slower_than=fewest.label)
        flagged.append(row)
    return flagged


def _clearly_faster(a: SpeedupRow, b: SpeedupRow) -> bool:
    """``a`` beats ``b`` on images/s. With repeats on both, one median must also lie outside the
    other's range (min to max), so noise between two equal rows is not reported as a scaling
    problem, while one noisy repeat cannot hide a real gap either."""
    if a.images_per_s is None or b.images_per_s is None or a.images_per_s <= b.images_per_s:
        return False
    if a.repeats > 1 and b.repeats > 1:
        below = a.images_per_s_min is not None and b.images_per_s < a.images_per_s_min
        above = b.images_per_s_max is not None and a.images_per_s > b.images_per_s_max
        return below or above
    return True


def _replace(row: SpeedupRow, **changes: Any) -> SpeedupRow:
    return SpeedupRow(**{**asdict(row), "run_ids": row.run_ids, **changes})


def _explain(
    rows: list[SpeedupRow],
    base: SpeedupRow | None,
    batch_reference: int,
    *,
    explicit_baseline: bool,
) -> list[str]:
    """The footer: what the figures mean and where rows are not comparable."""
    done = [r for r in rows if r.ok]
    notes: list[str] = []
    if done:
        warmups = sorted({r.warmup_steps for r in done if r.warmup_steps is not None})
        warmup = " or ".join(str(w) for w in warmups) if warmups else "the configured"
        notes.append(
            "Figures are from each run's last epoch: epoch seconds and images/s are steady state "
            f"(the first {warmup} steps of the epoch, the warm-up, are left out), device-synchronised "
            "and with data loading included; data wait is the share of the epoch spent waiting "
            "for the next batch."
        )
    if base is not None:
        chosen = "" if explicit_baseline else " (the first row that completed)"
        notes.append(
            f"Speedup is a row's images/s over the baseline's, {base.label!r}{chosen}; efficiency "
            "is speedup divided by the row's devices over the baseline's "
            f"({base.device_count} device{'s' if base.device_count != 1 else ''})."
        )
    differing = [r.label for r in rows if r.batch_differs]
    if differing:
        notes.append(
            f"{BATCH_MARK} Global batch differs from the baseline's ({batch_reference}) in "
            f"{_names(differing)}: an epoch takes fewer or more optimiser steps, so their test "
            "accuracy is not directly comparable with the baseline's unless the learning rate "
            "was scaled to match."
        )
    slow = [r for r in rows if r.slower_than]
    if slow:
        pairs = "; ".join(
            f"{r.label!r} ({r.device_count} devices) is slower than {r.slower_than!r}" for r in slow
        )
        beyond = " (beyond the spread of the repeats)" if any(r.repeats > 1 for r in slow) else ""
        notes.append(
            f"{WARN_MARK} More devices, yet slower than a row with fewer in the same precision"
            f"{beyond}: {pairs}."
        )
    superlinear = [r.label for r in rows if r.superlinear]
    if superlinear:
        notes.append(
            f"{SUPERLINEAR_MARK} Efficiency above 100 % beyond the spread of the repeats in "
            f"{_names(superlinear)}: more than linear scaling usually means the baseline was "
            "slowed (outside load, a cold start, a throttled device), not that the row scales "
            "better than perfectly; rerun with --repeat 3 on a quiet machine."
        )
    few = [r for r in rows if r.few_steps]
    if few:
        counts = ", ".join(f"{r.label!r} {r.steady_steps}" for r in few)
        notes.append(
            f"{FEW_STEPS_MARK} Too few steady steps to trust (after the warm-up; at least "
            f"{MIN_STEADY_STEPS} are needed): {counts}; raise training.max_steps or the data set."
        )
    loaded = [r for r in rows if r.loaded]
    if loaded:
        loads = ", ".join(f"{r.label!r} {r.outside_load:.2f}" for r in loaded)
        notes.append(
            f"{LOAD_MARK} Outside load while the row ran: other processes kept this many cores "
            f"busy on average (their CPU time, from psutil; flagged above {OUTSIDE_LOAD_CORES:g}): "
            f"{loads}; its figures are likely low, and a speedup over it likely high."
        )
    repeats = sorted({r.repeats for r in done})
    if repeats and repeats != [1]:
        notes.append(
            f"Each figure is the median of {' or '.join(map(str, repeats))} runs; "
            "(min–max) is the spread of epoch seconds and images/s."
        )
    images = {r.epoch_images for r in done}
    if len(images) > 1:
        notes.append(
            "Rows processed different numbers of images per epoch (a step cap per rank, or a "
            "sampler that pads), so compare them by images/s and speedup, not by epoch seconds."
        )
    if any(r.test_accuracy is not None for r in done):
        notes.append("Test accuracy is on the test set after the last epoch.")
    return notes


def _names(labels: list[str]) -> str:
    return ", ".join(repr(label) for label in labels)


# ---- cells --------------------------------------------------------------------------------------


def _int_cell(value: int) -> str:
    return str(value) if value > 0 else NONE_CELL


def _seconds_cell(value: float | None, low: float | None, high: float | None) -> str:
    if value is None:
        return NONE_CELL
    text = f"{value:.2f}"
    if low is not None and high is not None and high > low:
        text += f" ({low:.2f}–{high:.2f})"
    return text


def _rate_cell(value: float | None, low: float | None, high: float | None) -> str:
    if value is None:
        return NONE_CELL
    text = f"{value:.0f}"
    if low is not None and high is not None and high > low:
        text += f" ({low:.0f}–{high:.0f})"
    return text


def _speedup_cell(value: float | None) -> str:
    return f"{value:.2f}x" if value is not None else NONE_CELL


def _percent_cell(value: float | None, *, digits: int) -> str:
    return f"{value * 100:.{digits}f}%" if value is not None else NONE_CELL


def _csv_value(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return " ".join(str(v) for v in value)
    return value


def _escape_markdown(cell: str) -> str:
    return cell.replace("|", "\\|").replace("\n", " ")


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """A GitHub-flavoured markdown table, columns padded so it also reads as plain text."""
    body = [[_escape_markdown(c) for c in row] for row in rows]
    head = [_escape_markdown(h) for h in headers]
    widths = [max([len(h), *(len(r[i]) for r in body)]) for i, h in enumerate(head)]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    return [line(head), "| " + " | ".join("-" * w for w in widths) + " |", *map(line, body)]


# ---- two tables side by side ---------------------------------------------------------------------

COMPARE_COLUMNS: tuple[str, ...] = (
    "row",
    "A epoch s",
    "B epoch s",
    "A images/s",
    "B images/s",
    "B vs A",
    "A speedup",
    "B speedup",
    "A test acc",
    "B test acc",
)


@dataclass(frozen=True)
class RowComparison:
    label: str
    a: SpeedupRow | None  # None: the row is only in B
    b: SpeedupRow | None

    @property
    def throughput_change(self) -> float | None:
        """B's images/s over A's, minus 1 (+0.10: B is 10 % faster)."""
        if self.a is None or self.b is None or not self.a.images_per_s or not self.b.images_per_s:
            return None
        return self.b.images_per_s / self.a.images_per_s - 1.0

    def cells(self) -> tuple[str, ...]:
        def pick(row: SpeedupRow | None, name: str) -> Any:
            return getattr(row, name) if row is not None and row.ok else None

        def missing(row: SpeedupRow | None) -> str:
            return "absent" if row is None else row.status

        change = self.throughput_change
        return (
            self.label,
            _seconds_cell(pick(self.a, "epoch_seconds"), None, None)
            if self.a is not None and self.a.ok
            else missing(self.a),
            _seconds_cell(pick(self.b, "epoch_seconds"), None, None)
            if self.b is not None and self.b.ok
            else missing(self.b),
            _rate_cell(pick(self.a, "images_per_s"), None, None),
            _rate_cell(pick(self.b, "images_per_s"), None, None),
            f"{change * 100:+.1f}%" if change is not None else NONE_CELL,
            _speedup_cell(pick(self.a, "speedup")),
            _speedup_cell(pick(self.b, "speedup")),
            _percent_cell(pick(self.a, "test_accuracy"), digits=1),
            _percent_cell(pick(self.b, "test_accuracy"), digits=1),
        )


def compare_tables(a: SpeedupTable, b: SpeedupTable) -> list[RowComparison]:
    """Rows matched by label: A's rows in A's order, then rows only B has."""
    b_rows = {r.label: r for r in b.rows}
    a_labels = {r.label for r in a.rows}
    matched = [RowComparison(r.label, r, b_rows.get(r.label)) for r in a.rows]
    matched.extend(RowComparison(r.label, None, r) for r in b.rows if r.label not in a_labels)
    return matched


def comparison_markdown(a: SpeedupTable, b: SpeedupTable) -> list[str]:
    return markdown_table(COMPARE_COLUMNS, [c.cells() for c in compare_tables(a, b)])

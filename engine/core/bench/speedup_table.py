"""The speedup table: what a bench prints, the history stores and the UI's results screen shows.

Plain Python (no torch). This module holds the table's types and its stored form (``to_json`` /
``from_json``, what the result history keeps); the table is computed once by
``engine.core.bench.table_compute.build_speedup_table`` from each row's run summaries (or the
reason a row never ran or failed), its footer sentences come from ``table_notes``, and every view
of it (markdown, CSV, JSON, the cells of a Textual DataTable: ``table_render``; two tables side
by side: ``table_compare``) is rendered from the same computed rows, so the views cannot disagree.

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
- Each row says where its steps go (``step_*``: seconds per step of data wait, forward, backward,
  gradient sync where timed apart, optimizer and other, the ranks' mean, median over the repeats)
  and names its bottleneck in one sentence (``engine.core.runs.step_breakdown``'s rule), so the
  table says why a row scales badly beside its efficiency.
- Figures that cannot be trusted are flagged, each with a footnote: efficiency above 100 % beyond
  the spread of the repeats (``superlinear``), fewer than ``MIN_STEADY_STEPS`` steady steps
  (``few_steps``), and other processes keeping more than ``OUTSIDE_LOAD_CORES`` cores busy while
  the row ran (``outside_load``, measured by the bench: ``engine.core.host.outside_load``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from engine.core.common.statuses import RowStatus
from engine.core.common.step_split import StepPart
from engine.core.runs.summary import RunSummary

TABLE_SCHEMA_VERSION = 1

WARN_MARK = "⚠"
BATCH_MARK = "†"
SUPERLINEAR_MARK = "‡"
FEW_STEPS_MARK = "§"
LOAD_MARK = "◊"

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
    # Where a step goes: seconds per step of each part, the mean of the ranks (the median of
    # the repeats); None where not timed (sync: where not timed apart from backward).
    step_data: float | None = None
    step_forward: float | None = None
    step_backward: float | None = None
    step_sync: float | None = None
    step_optimizer: float | None = None
    step_other: float | None = None
    bottleneck: str = ""  # the first repeat's, in one sentence

    def step_split(self) -> dict[StepPart, float]:
        """Seconds per step of each timed part, in step order (empty where none was timed)."""
        parts = {part: getattr(self, f"step_{part.value}") for part in StepPart}
        return {part: seconds for part, seconds in parts.items() if seconds is not None}

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


@dataclass(frozen=True)
class SpeedupTable:
    title: str
    rows: tuple[SpeedupRow, ...]
    baseline: str | None  # label of the baseline row, None when no row can be one
    notes: tuple[str, ...] = field(default=())  # footer sentences, in order
    # Lines shown under the title: the machine, the command that reproduces the table.
    header_lines: tuple[str, ...] = field(default=())

    def row(self, label: str) -> SpeedupRow:
        for row in self.rows:
            if row.label == label:
                return row
        raise KeyError(label)

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

"""Two runs' comparison as text lines fitted to a width: what ``ddptui diff`` prints and the Runs
and Results screens show. The sentence first, then what differs in the config and in the
environment, the figures as ratios and the step split part by part per rank. Plain text (no
textual), from ``engine.core.runs.compare``'s ``RunDiff``."""

from __future__ import annotations

from collections.abc import Sequence

from ddptui.cli_table import Column, cut_middle, render_table, wrap_line
from engine.core.runs.compare.diff_cause import Change, PartChange
from engine.core.runs.compare.run_diff import FigureChange, RunDiff
from engine.core.runs.step_breakdown import StepPart

# More ranks than this: the split shows, per part, the mean over the ranks and the rank whose
# part moved most (--json has every rank).
RANKS_SHOWN = 4
CHANGES_SHOWN = 12

_CHANGE_COLUMNS = (
    Column("KEY", shrink=2, min_width=12),
    Column("A", shrink=1, min_width=8),
    Column("B", shrink=1, min_width=8),
)
_FIGURE_COLUMNS = (
    Column("FIGURE"),
    Column("A", right=True),
    Column("B", right=True),
    Column("B/A", right=True),
)


def _figure(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "img/s":
        return f"{value:,.0f}"
    if unit == "%":
        return f"{value:.1f} %"
    if unit == "cores":
        return f"{value:.2f}"
    return f"{value:.2f} s"


def _ratio(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def _changes_lines(title: str, changes: Sequence[Change], width: int | None) -> list[str]:
    shown = changes[:CHANGES_SHOWN]
    if not shown:
        return [f"{title}: the same"]
    more = len(changes) - len(shown)
    lines = [f"{title}: {len(changes)} difference{'s' if len(changes) != 1 else ''}"]
    lines += render_table(_CHANGE_COLUMNS, [(c.key, c.a, c.b) for c in shown], width, indent=2)
    if more:
        lines.append(f"  and {more} more (--json lists them all)")
    return lines


def _figure_rows(figures: Sequence[FigureChange]) -> list[tuple[str, str, str, str]]:
    return [
        (f.name, _figure(f.a, f.unit), _figure(f.b, f.unit), _ratio(f.ratio))
        for f in figures
        if f.a is not None or f.b is not None
    ]


def _ms(a: float | None, b: float | None) -> str:
    def one(seconds: float | None) -> str:
        return "-" if seconds is None else f"{1000 * seconds:.1f}"

    return f"{one(a)}→{one(b)}"


def _shares(changes: Sequence[PartChange]) -> str:
    def mean(shares: list[float | None]) -> str:
        known = [s for s in shares if s is not None]
        return "-" if not known else str(round(100 * sum(known) / len(known)))

    return f"{mean([p.a_share for p in changes])}→{mean([p.b_share for p in changes])} %"


def _split_table(split: Sequence[PartChange], width: int | None) -> list[str]:
    """One row per part: its share of the step in A and B (the ranks' mean), then each rank's
    ms per step in A and B; past ``RANKS_SHOWN`` ranks, the ranks' mean and the rank whose part
    moved most."""
    ranks = sorted({p.rank for p in split})
    few = len(ranks) <= RANKS_SHOWN
    columns = [Column("PART"), Column("SHARE", right=True)]
    if few:
        columns += [Column(f"RANK {r} MS", right=True) for r in ranks]
    else:
        columns += [Column("MEAN MS", right=True), Column("MOVED MOST", right=True)]
    rows = []
    for part in StepPart:
        changes = [p for p in split if p.part == part]
        if not changes:
            continue
        row = [str(part), _shares(changes)]
        if few:
            by_rank = {p.rank: p for p in changes}
            row += [
                _ms(by_rank[r].a_seconds, by_rank[r].b_seconds) if r in by_rank else "-"
                for r in ranks
            ]
        else:
            a = sum(p.a_seconds or 0.0 for p in changes) / len(changes)
            b = sum(p.b_seconds or 0.0 for p in changes) / len(changes)
            moved = max(changes, key=lambda p: abs((p.b_seconds or 0.0) - (p.a_seconds or 0.0)))
            row += [_ms(a, b), f"rank {moved.rank} {_ms(moved.a_seconds, moved.b_seconds)}"]
        rows.append(row)
    return render_table(columns, rows, width, indent=2)


def diff_lines(diff: RunDiff, width: int | None) -> list[str]:
    """The whole report, each line at most ``width`` columns (None: no limit)."""
    id_width = None if width is None else max(12, width - 4)
    lines = [
        f"A  {diff.a if id_width is None else cut_middle(diff.a, id_width)}",
        f"B  {diff.b if id_width is None else cut_middle(diff.b, id_width)}",
        "",
        *wrap_line(diff.sentence, width),
        "",
        *_changes_lines("config", diff.config, width),
    ]
    if diff.environment_note:
        lines += wrap_line(diff.environment_note, width, hang="  ")
    else:
        lines += _changes_lines("environment", diff.environment, width)
    figures = _figure_rows(diff.figures)
    if figures:
        lines += ["", "figures (the last epoch; B/A: B's over A's)"]
        lines += render_table(_FIGURE_COLUMNS, figures, width, indent=2)
    if diff.split:
        lines += ["", "step split (share of the step, ms per step; A→B)"]
        lines += _split_table(diff.split, width)
    noise = f"noise: step times of these runs vary {round(100 * diff.noise)} % on their own"
    lines += ["", *wrap_line(noise, width)]
    lines += [line for note in diff.notes for line in wrap_line(f"note: {note}", width, hang="  ")]
    return lines

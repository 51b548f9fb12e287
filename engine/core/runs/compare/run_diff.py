"""What differs between two runs, A and B: their resolved configs key by key, the environment
their ranks ran with, their figures as ratios, their step split part by part on each rank, and
one sentence naming the biggest cause (``engine.core.runs.compare.diff_cause``).

Pure: ``diff_runs`` compares two ``ComparedRun`` values (``compared_run.read_compared_run``
reads them); ``RunDiff.to_json`` is the form ``ddptui diff --json`` prints.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.core.runs.compare.compared_run import ComparedRun
from engine.core.runs.compare.diff_cause import NOISE_FLOOR, Change, PartChange, cause_sentence
from engine.core.runs.step_breakdown import StepBreakdown, StepPart
from engine.core.runs.summary import RunSummary

UNSET = "unset"
NOT_RECORDED = "not recorded (a run from before ddptui recorded its environment)"


@dataclass(frozen=True)
class FigureChange:
    """One figure of both runs; ``ratio`` is B's over A's."""

    name: str
    a: float | None
    b: float | None
    unit: str = ""  # "img/s", "s", "%", "cores"

    @property
    def ratio(self) -> float | None:
        if self.a is None or self.b is None or self.a == 0:
            return None
        return self.b / self.a

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "a": self.a, "b": self.b, "unit": self.unit, "ratio": self.ratio}


@dataclass(frozen=True)
class RunDiff:
    a: str  # run ids
    b: str
    config: tuple[Change, ...]
    environment: tuple[Change, ...]
    environment_note: str  # why the environments were not compared, else ""
    figures: tuple[FigureChange, ...]
    split: tuple[PartChange, ...]
    slower: float | None  # how many times slower B is than A (below 1: faster)
    noise: float  # the runs' own step-time spread (at least NOISE_FLOOR)
    sentence: str
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "a": self.a,
            "b": self.b,
            "sentence": self.sentence,
            "slower": self.slower,
            "noise": self.noise,
            "config": [c.to_json() for c in self.config],
            "environment": [c.to_json() for c in self.environment],
            "environment_note": self.environment_note,
            "figures": [f.to_json() for f in self.figures],
            "split": [p.to_json() for p in self.split],
            "notes": list(self.notes),
        }


def changed(a: Mapping[str, str], b: Mapping[str, str]) -> tuple[Change, ...]:
    """Every key whose value differs, in A's order then B's new keys; a missing one is unset."""
    keys = [*a, *(k for k in b if k not in a)]
    return tuple(Change(k, a.get(k, UNSET), b.get(k, UNSET)) for k in keys if a.get(k) != b.get(k))


def _environment(a: ComparedRun, b: ComparedRun) -> tuple[tuple[Change, ...], str]:
    missing = [name for name, run in (("A", a), ("B", b)) if run.environment is None]
    if missing:
        return (), f"environment of {' and '.join(missing)}: {NOT_RECORDED}"
    assert a.environment is not None and b.environment is not None
    return changed(a.environment.facts(), b.environment.facts()), ""


def _figures(a: RunSummary | None, b: RunSummary | None) -> tuple[FigureChange, ...]:
    def last(s: RunSummary | None, what: str) -> float | None:
        epoch = s.last_epoch if s else None
        if epoch is None:
            return None
        if what == "images":
            return epoch.steady_images_per_s or None
        if what == "epoch":
            return epoch.steady_epoch_seconds
        if what == "wait":
            return 100 * epoch.data_wait_seconds / epoch.seconds if epoch.seconds > 0 else None
        accuracy = epoch.test_accuracy
        return None if accuracy is None else 100 * accuracy

    return (
        FigureChange("images/s", last(a, "images"), last(b, "images"), "img/s"),
        FigureChange("epoch time", last(a, "epoch"), last(b, "epoch"), "s"),
        FigureChange("data wait", last(a, "wait"), last(b, "wait"), "%"),
        FigureChange("test accuracy", last(a, "accuracy"), last(b, "accuracy"), "%"),
        FigureChange(
            "elapsed", a.elapsed_seconds if a else None, b.elapsed_seconds if b else None, "s"
        ),
    )


def outside_load(run: ComparedRun) -> float | None:
    """Cores other processes kept busy while the run went on: as its launcher measured it
    (environment.json), else as a bench did (its summary)."""
    if run.environment is not None and run.environment.outside_load_cores is not None:
        return run.environment.outside_load_cores
    return run.summary.outside_load_cores if run.summary else None


def split_of(run: ComparedRun) -> tuple[StepBreakdown, ...]:
    """The split a comparison goes by: the steady one (without each rank's first report), else
    the summary's (the whole run)."""
    if run.steady_split:
        return run.steady_split
    return run.summary.step_breakdown if run.summary else ()


def _split(a: ComparedRun, b: ComparedRun) -> tuple[PartChange, ...]:
    ranks_a: dict[int, StepBreakdown] = {s.rank: s for s in split_of(a)}
    ranks_b: dict[int, StepBreakdown] = {s.rank: s for s in split_of(b)}
    out = []
    for rank in sorted(set(ranks_a) & set(ranks_b)):
        sa, sb = ranks_a[rank], ranks_b[rank]
        pa, pb = sa.parts(), sb.parts()
        for part in StepPart:
            if part not in pa and part not in pb:
                continue
            out.append(
                PartChange(
                    rank=rank,
                    part=part,
                    a_seconds=pa.get(part),
                    b_seconds=pb.get(part),
                    a_share=sa.share(part) if part in pa else None,
                    b_share=sb.share(part) if part in pb else None,
                )
            )
    return tuple(out)


def _slower(figures: tuple[FigureChange, ...], split: tuple[PartChange, ...]) -> float | None:
    """How many times slower B is: A's images/s over B's; a script's (no images/s) by its mean
    step time, the ranks' parts added up."""
    images = figures[0].ratio
    if images is not None and images > 0:
        return 1 / images
    step_a = sum(p.a_seconds or 0.0 for p in split)
    step_b = sum(p.b_seconds or 0.0 for p in split)
    return step_b / step_a if step_a > 0 and step_b > 0 else None


def diff_runs(a: ComparedRun, b: ComparedRun) -> RunDiff:
    """Everything that differs between A and B, and the sentence that says why B is slower or
    faster (or within noise)."""
    config = changed(a.config, b.config)
    environment, environment_note = _environment(a, b)
    figures = (
        *_figures(a.summary, b.summary),
        FigureChange("outside load", outside_load(a), outside_load(b), "cores"),
    )
    split = _split(a, b)
    slower = _slower(figures, split)
    spreads = [s for s in (a.step_spread, b.step_spread) if s is not None]
    noise = max([NOISE_FLOOR, *spreads])
    unfinished = [name for name, run in (("A", a), ("B", b)) if run.summary is None]
    sentence = cause_sentence(
        slower=slower,
        noise=noise,
        config=config,
        environment=environment,
        environment_recorded=not environment_note,
        split=split,
        outside_load=(figures[-1].a, figures[-1].b),
        unfinished=unfinished,
    )
    return RunDiff(
        a=a.run_id,
        b=b.run_id,
        config=config,
        environment=environment,
        environment_note=environment_note,
        figures=figures,
        split=split,
        slower=slower,
        noise=noise,
        sentence=sentence,
        notes=(*a.notes, *b.notes),
    )

"""What ``ddptui diff`` costs on long runs: reading two runs of 100k events each and comparing them.

    python bench/run_diff.py                 # 100,000 events a run, 5 timed comparisons
    python bench/run_diff.py --events 400000 --repeat 3 --json

Two ended runs are made in a temporary directory (tests/fixtures/diff_runs.py: config, run.json,
summary.json, environment.json), each with ``--events`` events over two ranks, half step reports
and half step-split reports, as the engine writes them. Timed, in this process, the median of
``--repeat``: reading both runs for a comparison (``read_compared_run``: config, summary,
environment, the spread of the step reports) and comparing them (``diff_runs``); goal < 1 s. The
baseline, measured in the same run over the same files, is the floor of reading every line:
``json.loads`` of each line of every event file of both runs. The comparison parses an even
sample of the step reports only (``engine.core.runs.compare.step_spread``), so it stays well
under the baseline however long the runs are.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from engine.core.runs.compare.compared_run import read_compared_run  # noqa: E402
from engine.core.runs.compare.run_diff import diff_runs  # noqa: E402
from engine.core.runs.events import EventWriter, StepBreakdownReported  # noqa: E402
from tests.fixtures.diff_runs import WORLD, make_ended_run  # noqa: E402

GOAL_SECONDS = 1.0


def make_runs(where: Path, events: int) -> list[Path]:
    """Two runs of ``events`` events each: step reports (the fixture's) and as many step-split
    reports, appended to each rank's file."""
    per_rank = events // (2 * WORLD)
    made = []
    for run_id, step in (
        ("20261206-100000-cpu-demo-aaaa", 0.05),
        ("20261206-110000-cpu-demo-bbbb", 0.09),
    ):
        run = make_ended_run(where, run_id, step_seconds=step, reports=per_rank, spread=0.05)
        for rank in range(WORLD):
            with EventWriter(run.rank_events_path(rank)) as writer:
                for _ in range(per_rank):
                    writer.write(
                        StepBreakdownReported(
                            rank=rank, steps=4, timed=1, data=0.002, forward=0.02,
                            backward=0.02, sync=0.002, optimizer=0.004, other=0.002,
                        )
                    )  # fmt: skip
        made.append(run.path)
    return made


def time_compare(runs: list[Path]) -> float:
    from engine.core.runs.rundir import RunDir

    started = time.perf_counter()
    diff_runs(read_compared_run(RunDir(runs[0])), read_compared_run(RunDir(runs[1])))
    return time.perf_counter() - started


def time_baseline(runs: list[Path]) -> float:
    started = time.perf_counter()
    for run in runs:
        for path in sorted((run / "events").glob("rank-*.jsonl")):
            with open(path, "rb") as f:
                for line in f:
                    json.loads(line)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000, help="events in each run")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ddptui-bench-diff-") as tmp:
        runs = make_runs(Path(tmp), args.events)
        lines = sum(
            p.read_bytes().count(b"\n") for r in runs for p in (r / "events").glob("*.jsonl")
        )
        compare = statistics.median(time_compare(runs) for _ in range(args.repeat))
        baseline = statistics.median(time_baseline(runs) for _ in range(args.repeat))
    figures = {
        "events_per_run": lines // 2,
        "compare_seconds": round(compare, 4),
        "baseline_json_loads_seconds": round(baseline, 4),
        "ratio_to_baseline": round(compare / baseline, 3) if baseline else None,
        "goal_seconds": GOAL_SECONDS,
        "within_goal": compare < GOAL_SECONDS,
    }
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print(f"two runs of {lines // 2:,} events each")
        print(
            f"  read both and compare (ddptui diff's work): {compare:.3f} s (goal < {GOAL_SECONDS} s)"
        )
        print(f"  baseline, json.loads of every line:         {baseline:.3f} s")
        print(f"  ratio to the baseline:                      {compare / baseline:.3f}")
    return 0 if compare < GOAL_SECONDS else 1


if __name__ == "__main__":
    sys.exit(main())

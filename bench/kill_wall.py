"""What ``ddptui kill`` of a local run costs, from the command line.

    python bench/kill_wall.py                # 5 runs killed, the median wall time
    python bench/kill_wall.py --repeat 9 --json
    python bench/kill_wall.py --against ../other-checkout --repeat 10

Each round starts a two-rank script run (a sleep loop, ``ddptui run … --detach``) in a temporary
runs directory, waits until both ranks are recorded in run.json, then times ``ddptui kill RUN
--yes`` (a fresh interpreter, output to a pipe) to its return: the proof of the run's processes,
SIGTERM, the launcher's stop and the summary. The ranks exit on SIGTERM at once, so the figure is
ddptui's own cost, not the grace. Only the CLI is used, so the same script measures any checkout
(``PYTHONPATH=that/checkout``). ``--against CHECKOUT`` is the baseline measured in the same run:
its rounds alternate with this checkout's (each round a run started and killed by that
checkout's code), so both see the same load; the CPU time of the kill (its process and its
children: user + system) is given beside the wall time, being less at the mercy of a busy
machine. Both checkouts are byte-compiled first (``compiled_checkout``), as an installed ddptui
is.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from compiled_checkout import compile_checkout

REPO = Path(__file__).resolve().parent.parent

SLEEPER = "import time\nwhile True:\n    time.sleep(0.5)\n"
RANKS = 2
START_TIMEOUT_SECONDS = 60.0


def ddptui(*args: str) -> subprocess.CompletedProcess[str]:
    command = [str(Path(sys.executable).parent / "ddptui"), *args]
    return subprocess.run(command, check=True, capture_output=True, text=True, timeout=120)


def start_sleeper(home: Path, runs_dir: Path) -> str:
    """A detached two-rank run whose ranks are all recorded; its id."""
    script = home / "sleeper.py"
    script.write_text(SLEEPER, encoding="utf-8")
    out = ddptui(
        "run", str(script), "--devices", f"cpu:{RANKS}", "--detach", "--runs-dir", str(runs_dir)
    )
    run_id = out.stdout.split()[-1]
    run_json = runs_dir / run_id / "run.json"
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        try:
            ranks = json.loads(run_json.read_text(encoding="utf-8")).get("ranks") or []
        except (OSError, ValueError):
            ranks = []
        if len([r for r in ranks if r]) >= RANKS:
            return run_id
        time.sleep(0.1)
    raise SystemExit(f"{run_id}: its ranks were not recorded in {START_TIMEOUT_SECONDS:g} s")


def timed_kill(runs_dir: Path, run_id: str) -> float:
    start = time.perf_counter()
    ddptui("kill", run_id, "--yes", "--runs-dir", str(runs_dir))
    return time.perf_counter() - start


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def round_of(home: Path, runs_dir: Path) -> tuple[float, float]:
    """One run started and killed: (wall seconds, CPU seconds) of the kill."""
    run_id = start_sleeper(home, runs_dir)
    cpu = children_cpu()
    wall = timed_kill(runs_dir, run_id)
    return wall, children_cpu() - cpu


def figures_of(rounds: list[tuple[float, float]]) -> dict[str, float]:
    walls = [wall for wall, _ in rounds]
    return {
        "kill_median_seconds": round(statistics.median(walls), 3),
        "kill_min_seconds": round(min(walls), 3),
        "kill_max_seconds": round(max(walls), 3),
        "kill_cpu_median_seconds": round(statistics.median(cpu for _, cpu in rounds), 3),
    }


def said(figures: dict[str, float]) -> str:
    return (
        f"median {figures['kill_median_seconds']:.3f} s (min {figures['kill_min_seconds']:.3f}, "
        f"max {figures['kill_max_seconds']:.3f}; CPU {figures['kill_cpu_median_seconds']:.3f} s)"
    )


def leave_nothing_running(runs_dir: Path) -> None:
    """Kill every run of the bench that may still be going (a round that failed half-way)."""
    for run in runs_dir.glob("*/run.json"):
        command = [str(Path(sys.executable).parent / "ddptui"), "kill", run.parent.name, "--yes"]
        subprocess.run(
            [*command, "--runs-dir", str(runs_dir)], capture_output=True, timeout=120, check=False
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs killed (the median)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--against", type=Path, help="another checkout, whose rounds alternate with this one's"
    )
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="ddptui-kill-bench-"))
    # this checkout: as the interpreter finds it; the other one goes first on the path
    checkouts = {"this": os.environ.get("PYTHONPATH", "")}
    if args.against:
        checkouts["against"] = str(args.against.resolve())
    rounds: dict[str, list[tuple[float, float]]] = {name: [] for name in checkouts}
    for checkout in (REPO, *([args.against] if args.against else [])):
        compile_checkout(checkout)  # as installed: bytecode, not source compiled by each command
    try:
        for i in range(args.repeat):
            order = list(checkouts.items())  # each goes first every other round
            for name, path in order if i % 2 == 0 else reversed(order):
                os.environ["PYTHONPATH"] = path
                rounds[name].append(round_of(home, home / name / "runs"))
    finally:
        for name, path in checkouts.items():
            os.environ["PYTHONPATH"] = path
            leave_nothing_running(home / name / "runs")
        shutil.rmtree(home, ignore_errors=True)
    figures: dict[str, object] = {**figures_of(rounds["this"]), "repeat": args.repeat}
    if args.against:
        figures["against"] = {"checkout": str(args.against), **figures_of(rounds["against"])}
    if args.json:
        print(json.dumps(figures))
        return
    print(
        f"ddptui kill of a local {RANKS}-rank run, {args.repeat} runs: {said(figures_of(rounds['this']))}"
    )
    if args.against:
        print(
            f"the same, {args.against}'s code, alternating: {said(figures_of(rounds['against']))}"
        )


if __name__ == "__main__":
    main()

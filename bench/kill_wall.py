"""What ``ddptui kill`` of a local run costs, from the command line.

    python bench/kill_wall.py                # 5 runs killed, the median wall time
    python bench/kill_wall.py --repeat 9 --json

Each round starts a two-rank script run (a sleep loop, ``ddptui run … --detach``) in a temporary
runs directory, waits until both ranks are recorded in run.json, then times ``ddptui kill RUN
--yes`` (a fresh interpreter, output to a pipe) to its return: the proof of the run's processes,
SIGTERM, the launcher's stop and the summary. The ranks exit on SIGTERM at once, so the figure is
ddptui's own cost, not the grace. Only the CLI is used, so the same script measures any checkout
(``PYTHONPATH=that/checkout``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="ddptui-kill-bench-"))
    runs_dir = home / "runs"
    times: list[float] = []
    try:
        for _ in range(args.repeat):
            times.append(timed_kill(runs_dir, start_sleeper(home, runs_dir)))
    finally:
        leave_nothing_running(runs_dir)
        shutil.rmtree(home, ignore_errors=True)
    figures = {
        "kill_median_seconds": round(statistics.median(times), 3),
        "kill_min_seconds": round(min(times), 3),
        "kill_max_seconds": round(max(times), 3),
        "repeat": args.repeat,
    }
    if args.json:
        print(json.dumps(figures))
    else:
        print(
            f"ddptui kill of a local {RANKS}-rank run: median {figures['kill_median_seconds']:.3f} s"
            f" (min {figures['kill_min_seconds']:.3f}, max {figures['kill_max_seconds']:.3f},"
            f" {args.repeat} runs)"
        )


if __name__ == "__main__":
    main()

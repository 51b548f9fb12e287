"""What 1,000 run directories cost: ``ddptui runs`` and an idle Runs screen.

    python bench/runs_listing.py                 # 1,000 runs, 5 timed listings, 20 s of the screen
    python bench/runs_listing.py --runs 465 --seconds 30
    python bench/runs_listing.py --json
    python bench/runs_listing.py --against ../other-checkout --repeat 15

The runs are copies of the recorded runs the UI tests use (tests/fixtures/recorded-run: a
completed GPU run and a failed and a lost CPU run, each with its events, logs and summary), under
new ids, in a temporary directory; the lost one gets its summary written by the first listing, as
on any machine. Nothing of them is going, so an ended run never changes.

- ``ddptui runs``: the wall time of the command (a fresh interpreter each time, output to a pipe),
  the median of ``--repeat`` runs; goal < 0.5 s for 1,000 runs. Its first listing reads every
  ended run once (summary.json and run.json) and keeps what it read in its cache
  (``$DDPTUI_CACHE_DIR``, here a temporary one); that one is timed apart. The baseline, measured the same
  way in the same run, is the floor of any listing in Python: an interpreter that lists the
  directory and parses every summary.json with the standard library. Also shown: what observing
  every run in full costs in this process (config, events, summary: how ``ddptui runs`` listed
  them before ended runs were read from their summary alone).
- The Runs screen: the app headless at 80x24 on the Runs screen, polling at its real interval
  (2 s), for ``--seconds`` after a warm-up; this process's CPU time over the wall time is the
  figure, goal < 2 % of one core. The baseline is a bare Textual app (a header and a footer)
  idling as long.
- ``--against CHECKOUT``: ``ddptui runs`` only, this checkout's against another's measured in the
  same run, their listings alternating (each first every other round) so both see the same
  load: each lists copies of its own recorded runs (made by its own ``make_runs``), warm (from
  its cache) and cold (its cache removed first), wall and CPU time (user + system) of each.
  Both checkouts are byte-compiled first (``compiled_checkout``), as an installed ddptui is.
"""

from __future__ import annotations

import argparse
import asyncio
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

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "bench")]  # also when loaded by path (MAKE_RUNS)

from compiled_checkout import compile_checkout  # noqa: E402

from engine.core.runs.observer import observe_run  # noqa: E402
from engine.core.runs.rundir import list_runs  # noqa: E402

RECORDED = REPO / "tests" / "fixtures" / "recorded-run"
LISTING_GOAL_SECONDS = 0.5
SCREEN_GOAL_PERCENT = 2.0

FLOOR = """
import json, os, sys
runs = sys.argv[1]
for name in sorted(os.listdir(runs)):
    with open(os.path.join(runs, name, "summary.json"), encoding="utf-8") as f:
        summary = json.load(f)
    print(name, summary["status"])
"""


def make_runs(runs_dir: Path, count: int) -> None:
    """``count`` copies of the recorded runs, under ids that sort in the order they were made."""
    sources = sorted(p for p in RECORDED.iterdir() if (p / "config.toml").exists())
    for i in range(count):
        source = sources[i % len(sources)]
        preset = source.name.split("-", 2)[2][:-5]
        run_id = f"20261202-{i // 3600:02d}{i // 60 % 60:02d}{i % 60:02d}-{preset}-{i:04x}"
        target = runs_dir / run_id
        shutil.copytree(source, target)
        for name in ("run.json", "summary.json"):
            path = target / name
            if path.exists():
                data = json.loads(path.read_text(encoding="utf-8"))
                data["run_id"] = run_id
                path.write_text(json.dumps(data), encoding="utf-8")


def timed(command: list[str], repeat: int) -> float:
    """The median wall seconds of ``command``, its output to a pipe."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def listing_cost(command: list[str], env: dict[str, str], cold: bool) -> tuple[float, float]:
    """(wall, CPU) seconds of one listing; ``cold``: its cache removed first."""
    if cold:
        shutil.rmtree(env["DDPTUI_CACHE_DIR"], ignore_errors=True)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = usage.ru_utime + usage.ru_stime
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, env=env)
    wall = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, usage.ru_utime + usage.ru_stime - cpu


MAKE_RUNS = """
import importlib.util, sys
from pathlib import Path
spec = importlib.util.spec_from_file_location("runs_listing", sys.argv[1])
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
bench.make_runs(Path(sys.argv[2]), int(sys.argv[3]))
"""


def against(other: Path, runs: int, repeat: int) -> dict[str, dict[str, float]]:
    """Median wall and CPU seconds of ``ddptui runs``, warm and cold, for this checkout and
    ``other``, their listings alternating."""
    ddptui = str(Path(sys.executable).parent / "ddptui")
    checkouts = {"this": REPO, "against": other.resolve()}
    for checkout in checkouts.values():
        compile_checkout(checkout)  # as installed: bytecode, not source compiled by each command
    with tempfile.TemporaryDirectory(prefix="ddptui-runs-ab-") as tmp:
        envs, commands = {}, {}
        for name, checkout in checkouts.items():
            runs_dir = Path(tmp) / name / "runs"
            runs_dir.mkdir(parents=True)
            envs[name] = {
                **os.environ,
                "PYTHONPATH": str(checkout),
                "DDPTUI_CACHE_DIR": str(Path(tmp) / name / "cache"),
            }
            bench = str(checkout / "bench" / "runs_listing.py")
            made = [sys.executable, "-c", MAKE_RUNS, bench, str(runs_dir), str(runs)]
            subprocess.run(made, check=True, env=envs[name])
            commands[name] = [ddptui, "runs", "--runs-dir", str(runs_dir)]
            subprocess.run(commands[name], check=True, capture_output=True, env=envs[name])
        costs: dict[str, list[tuple[float, float]]] = {
            f"{name}_{kind}": [] for name in checkouts for kind in ("warm", "cold")
        }
        for i in range(repeat):
            # each goes first every other round: what one listing leaves (a cache written, the
            # page cache) falls on both alike
            order = list(checkouts) if i % 2 == 0 else list(reversed(checkouts))
            for kind in ("warm", "cold"):
                for name in order:
                    cost = listing_cost(commands[name], envs[name], cold=kind == "cold")
                    costs[f"{name}_{kind}"].append(cost)
    return {
        key: {
            "wall_seconds": round(statistics.median(w for w, _ in found), 3),
            "cpu_seconds": round(statistics.median(c for _, c in found), 3),
        }
        for key, found in costs.items()
    }


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def screen_cpu(runs_dir: Path, warmup: float, seconds: float) -> tuple[float, int]:
    """(% of one core, runs shown) of the app idling on the Runs screen."""
    from ddptui.app import DdptuiApp
    from ddptui.screens.runs import RunsScreen

    app = DdptuiApp(runs_dir, screen="runs")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(warmup)
        cpu0, wall0 = cpu_seconds(), time.monotonic()
        await asyncio.sleep(seconds)
        cpu, wall = cpu_seconds() - cpu0, time.monotonic() - wall0
        screen = app.screen
        shown = len(screen.runs) if isinstance(screen, RunsScreen) else 0
    return 100.0 * cpu / wall, shown


async def bare_cpu(seconds: float) -> float:
    from textual.app import App, ComposeResult
    from textual.widgets import Footer, Header

    class Bare(App[None]):
        def compose(self) -> ComposeResult:
            yield Header()
            yield Footer()

    async with Bare().run_test(size=(80, 24)) as pilot:
        await pilot.pause(1.0)
        cpu0, wall0 = cpu_seconds(), time.monotonic()
        await asyncio.sleep(seconds)
        return 100.0 * (cpu_seconds() - cpu0) / (time.monotonic() - wall0)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5, help="timed listings (the median)")
    parser.add_argument(
        "--seconds", type=float, default=20.0, help="measured seconds of the screen"
    )
    parser.add_argument("--warmup", type=float, default=6.0)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--check", action="store_true", help="exit 1 when a goal is missed")
    parser.add_argument(
        "--against", type=Path, help="only ddptui runs, against another checkout's, alternating"
    )
    args = parser.parse_args()
    if args.against:
        compared = against(args.against, args.runs, args.repeat)
        if args.json:
            print(json.dumps(compared, indent=2))
        else:
            for key, cost in compared.items():
                print(f"{key}: {cost['wall_seconds']:.3f} s, CPU {cost['cpu_seconds']:.3f} s")
        return 0
    ddptui = str(Path(sys.executable).parent / "ddptui")
    figures: dict[str, float] = {"runs": float(args.runs)}
    with tempfile.TemporaryDirectory(prefix="ddptui-runs-bench-") as tmp:
        runs_dir = Path(tmp) / "runs"
        runs_dir.mkdir()
        make_runs(runs_dir, args.runs)
        os.environ["DDPTUI_CACHE_DIR"] = str(Path(tmp) / "cache")  # not the user's own
        listing = [ddptui, "runs", "--runs-dir", str(runs_dir)]
        subprocess.run(listing, check=True, stdout=subprocess.PIPE)  # settles the lost copies
        cold = []
        for _ in range(args.repeat):  # every ended run read from its files
            shutil.rmtree(Path(tmp) / "cache", ignore_errors=True)
            cold.append(timed(listing, 1))
        figures["ddptui_runs_first_seconds"] = statistics.median(cold)
        figures["ddptui_runs_seconds"] = timed(listing, args.repeat)
        figures["floor_seconds"] = timed([sys.executable, "-c", FLOOR, str(runs_dir)], args.repeat)
        figures["ratio_to_floor"] = figures["ddptui_runs_seconds"] / figures["floor_seconds"]
        start = time.perf_counter()
        for run_dir in list_runs(runs_dir):
            observe_run(run_dir)
        figures["observe_every_run_seconds"] = time.perf_counter() - start
        percent, shown = asyncio.run(screen_cpu(runs_dir, args.warmup, args.seconds))
        figures["runs_screen_cpu_percent"] = percent
        figures["runs_screen_rows"] = float(shown)
    figures["bare_textual_cpu_percent"] = asyncio.run(bare_cpu(args.seconds))
    figures["load_average"] = os.getloadavg()[0]
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print(
            f"ddptui runs with {args.runs} ended runs: {figures['ddptui_runs_seconds']:.3f} s "
            f"(goal < {LISTING_GOAL_SECONDS:g} s; the first listing, which reads every run "
            f"once: {figures['ddptui_runs_first_seconds']:.3f} s); the floor (Python lists the "
            f"directory and parses every summary.json): {figures['floor_seconds']:.3f} s, ratio "
            f"{figures['ratio_to_floor']:.1f}; observing every run in full, in-process (how they "
            f"were listed before): {figures['observe_every_run_seconds']:.2f} s"
        )
        print(
            f"idle Runs screen, {shown} runs, over {args.seconds:g} s: "
            f"{percent:.2f} % of one core (goal < {SCREEN_GOAL_PERCENT:g} %); a bare Textual "
            f"app idles at {figures['bare_textual_cpu_percent']:.2f} %; load average "
            f"{figures['load_average']:.2f}"
        )
    missed = (
        figures["ddptui_runs_seconds"] >= LISTING_GOAL_SECONDS
        or figures["runs_screen_cpu_percent"] >= SCREEN_GOAL_PERCENT
    )
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    raise SystemExit(main())

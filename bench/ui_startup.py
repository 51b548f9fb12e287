"""How long the UI takes to show its first screen, against a bare Textual app measured in the same run.

    python bench/ui_startup.py              # 8 tries each, alternating, best and median
    python bench/ui_startup.py --tries 12 --screen gpus --json

Each try is a fresh interpreter (warm file cache): the CPU time it has used (user + system) when
the first screen is composed and drawn, so a loaded machine stretches wall time but not this
figure. The baseline is a Textual app with a header and a footer only, which is the floor any
Textual UI pays; the ratio says what ddptui adds. The target is under 1 s for ddptui.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET_SECONDS = 1.0

DDPTUI = """
import resource, sys
from ddptui.app import DdptuiApp
from engine.core.host.gpus import GpuInventory

class Timed(DdptuiApp):
    def on_ready(self):
        self.set_timer(0.01, self.exit)

Timed(sys.argv[1], screen=sys.argv[2], gpu_sampler=lambda: GpuInventory(error="off")).run(
    headless=True
)
usage = resource.getrusage(resource.RUSAGE_SELF)
print(usage.ru_utime + usage.ru_stime)
"""

BARE = """
import resource
from textual.app import App
from textual.widgets import Footer, Header

class Bare(App):
    def compose(self):
        yield Header()
        yield Footer()

    def on_ready(self):
        self.set_timer(0.01, self.exit)

Bare().run(headless=True)
usage = resource.getrusage(resource.RUSAGE_SELF)
print(usage.ru_utime + usage.ru_stime)
"""


def one(code: str, *args: str) -> float:
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    return float(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tries", type=int, default=8)
    parser.add_argument(
        "--screen", default="launch", help="the screen the app opens on (launch, gpus, ...)"
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--check", action="store_true", help="exit 1 when the best is >= 1 s")
    args = parser.parse_args()
    ours: list[float] = []
    bare: list[float] = []
    with tempfile.TemporaryDirectory() as runs:
        for _ in range(args.tries):  # alternating, so both see the same load
            ours.append(one(DDPTUI, runs, args.screen))
            bare.append(one(BARE))
    figures = {
        "screen": args.screen,
        "tries": args.tries,
        "ddptui_best_s": min(ours),
        "ddptui_median_s": statistics.median(ours),
        "bare_textual_best_s": min(bare),
        "bare_textual_median_s": statistics.median(bare),
        "ratio_best": min(ours) / min(bare),
        "ratio_median": statistics.median(ours) / statistics.median(bare),
        "load_average": os.getloadavg()[0],
    }
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print(
            f"first frame of the {args.screen} screen, CPU seconds over {args.tries} tries: "
            f"ddptui best {figures['ddptui_best_s']:.2f} (median {figures['ddptui_median_s']:.2f}), "
            f"bare Textual best {figures['bare_textual_best_s']:.2f} "
            f"(median {figures['bare_textual_median_s']:.2f}); "
            f"ratio {figures['ratio_best']:.2f} best, {figures['ratio_median']:.2f} median "
            f"(target: ddptui under {TARGET_SECONDS:g} s; load average {figures['load_average']:.2f})"
        )
    return 1 if args.check and figures["ddptui_best_s"] >= TARGET_SECONDS else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What ddptui costs a user's own script: the same plain DDP script (the tutorial's loop, no ddptui
in it: ``tests/fixtures/tutorial_ddp.py``) under ``torchrun --standalone`` and under ``ddptui run
script.py`` (one rank process per device, the optimizer step hook, the progress-bar reader, stall
supervision), alternating, swapped order every other round, on 2 CPU ranks (gloo). Both print the
script's own steady optimizer steps a second (epochs after the first); the figure is the ratio of
the medians. Target (issue 14): at most 1 % fewer steps/s under ddptui (ratio >= 0.99).

    .venv/bin/python bench/script_overhead.py                # about 6 minutes on 2 cores
    .venv/bin/python bench/script_overhead.py --rounds 3 --epochs 4 --steps 40

Run on demand; never as a timed test. Look at the load average it prints first.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tests" / "fixtures" / "tutorial_ddp.py"
STEADY = re.compile(r"steady steps/s ([0-9.]+)")
TORCHRUN = Path(sys.executable).parent / "torchrun"


def script_args(args: argparse.Namespace) -> list[str]:
    return ["--epochs", str(args.epochs), "--steps", str(args.steps)]


def under_torchrun(args: argparse.Namespace) -> float:
    done = subprocess.run(
        [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", str(SCRIPT), *script_args(args)],
        capture_output=True, text=True, timeout=900, check=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    return float(STEADY.findall(done.stdout)[-1])


def under_ddptui(args: argparse.Namespace, runs: Path) -> float:
    subprocess.run(
        [sys.executable, "-m", "ddptui", "run", str(SCRIPT), "--devices", "cpu:2",
         "--runs-dir", str(runs), "--", *script_args(args)],
        capture_output=True, text=True, timeout=900, check=True, cwd=REPO,
    )  # fmt: skip
    newest = sorted(runs.iterdir())[-1]
    return float(STEADY.findall((newest / "logs" / "rank-0.log").read_text())[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60, help="steps per epoch")
    args = parser.parse_args()
    print(f"load average at the start: {os.getloadavg()[0]:.2f}", flush=True)
    figures: dict[str, list[float]] = {"torchrun": [], "ddptui": []}
    with tempfile.TemporaryDirectory(prefix="ddptui-bench-") as tmp:
        for round_ in range(args.rounds):
            order = ("torchrun", "ddptui") if round_ % 2 == 0 else ("ddptui", "torchrun")
            for side in order:
                value = (
                    under_torchrun(args) if side == "torchrun" else under_ddptui(args, Path(tmp))
                )
                figures[side].append(value)
            print(
                f"  round {round_ + 1}: torchrun {figures['torchrun'][-1]:.2f} steps/s, "
                f"ddptui {figures['ddptui'][-1]:.2f} steps/s, "
                f"ratio {figures['ddptui'][-1] / figures['torchrun'][-1]:.3f}",
                flush=True,
            )
    ratio = statistics.median(figures["ddptui"]) / statistics.median(figures["torchrun"])
    ratios = [d / t for d, t in zip(figures["ddptui"], figures["torchrun"], strict=True)]
    print(
        f"ddptui / torchrun steps/s: {ratio:.3f} (ratio of medians; rounds "
        f"{min(ratios):.3f}-{max(ratios):.3f}); target >= 0.99"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

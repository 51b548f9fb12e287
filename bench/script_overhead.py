"""What ddptui costs a user's own script: the same plain DDP script (the tutorial's loop, no ddptui
in it: ``tests/fixtures/tutorial_ddp.py``) under ``torchrun --standalone`` and under ``ddptui run
script.py`` (one rank process per device, the optimizer step hook, the progress-bar reader, stall
supervision), on 2 CPU ranks (gloo).

Target (issue 14): at most 1 % fewer steps/s under ddptui (ratio >= 0.99). On a shared 2-core
machine the steps/s of one run swing by tens of percent from one run to the next, far more than
1 %, so two of the figures held against the target are made to cancel the neighbours out:

- **the parts, estimated**: in the ranks, what the step hook and the bar reader cost per optimizer
  step, timed in this process (best of 5, a real event file, the default report interval), as a
  share of torchrun's median step; beside the ranks, the CPU of the processes that are not ranks
  (torchrun's agent; ddptui's launcher and its ``ddptui run`` follower), sampled once a second
  while the ranks train, as a share of the ranks' own CPU. Ratio = (1 - the hooks' share) x (1 -
  the extra supervision share).
- **end to end, at the same moment**: pairs of runs started together, torchrun's and ddptui's,
  four ranks sharing the cores, so that whatever else the machine does hits both alike; each
  side's steps/s over the window where both are in their steady epochs (the script prints the
  time every 10 steps), ddptui's over torchrun's, the median of the pairs. Which side starts
  first alternates.
- **end to end, one after the other**, for a quiet machine: alternating rounds, swapped order
  every other round; the wall-clock ratio of the medians of steady steps/s and the median of the
  rounds' ratios of rank 0's CPU seconds per step (the script prints them).

    .venv/bin/python bench/script_overhead.py                # about 9 minutes on 2 cores
    .venv/bin/python bench/script_overhead.py --rounds 1 --pairs 8   # the pairs, mostly

Run on demand; never as a timed test. Look at the load average it prints first.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from engine.core.runs.events import EventWriter
from engine.core.runs.script_reporting import BarReader, ScriptReporter

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tests" / "fixtures" / "tutorial_ddp.py"
STEADY = re.compile(r"steady steps/s ([0-9.]+)")
STEADY_CPU = re.compile(r"steady cpu ms/step ([0-9.]+)")
TICK = re.compile(r"tick ([0-9.]+) ([0-9]+)$", re.MULTILINE)
TICK_STEPS = 10
TORCHRUN = Path(sys.executable).parent / "torchrun"
SAMPLE_SECONDS = 1.0
BAR_LINE = "\r 45%|#########           | 90/200 [00:00<00:01, 170.00it/s]"


@dataclass
class Side:
    steps_per_s: list[float] = field(default_factory=list)
    rank_cpu_ms_per_step: list[float] = field(default_factory=list)
    supervision_share: list[float] = field(default_factory=list)  # of the ranks' CPU


class TreeSampler:
    """CPU seconds of a process tree, split into ranks (processes without children) and the rest,
    sampled every second while the ranks run; ``share`` is the rest's CPU over the ranks'."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.samples: list[tuple[float, float]] = []  # (rest, ranks) CPU seconds
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _cpu(self) -> tuple[float, float, int]:
        try:
            top = psutil.Process(self.root)
            procs = [top, *top.children(recursive=True)]
        except psutil.Error:
            return 0.0, 0.0, 0
        rest = ranks = 0.0
        n_ranks = 0
        for p in procs:
            try:
                t = p.cpu_times()
                used = t.user + t.system
                if p.children():
                    rest += used
                else:
                    ranks += used
                    n_ranks += 1
            except psutil.Error:
                continue
        return rest, ranks, n_ranks

    def _run(self) -> None:
        while not self.stop.wait(SAMPLE_SECONDS):
            rest, ranks, n_ranks = self._cpu()
            if n_ranks == 2:  # both ranks up, none gone
                self.samples.append((rest, ranks))

    def __enter__(self) -> TreeSampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()

    def share(self) -> float:
        """The rest's CPU over the ranks', between the second sample and the last but one (the
        ranks' start-up and shut-down left out)."""
        window = self.samples[1:-1]
        if len(window) < 2:
            return float("nan")
        rest = window[-1][0] - window[0][0]
        ranks = window[-1][1] - window[0][1]
        return rest / ranks if ranks > 0 else float("nan")


def hook_seconds_per_step(steps: int = 20_000) -> float:
    """What one optimizer step costs a ddptui script rank in its own code: the step hook's
    ``on_step`` and one progress bar passing through the bar reader (best of 5)."""
    best = float("inf")
    with tempfile.TemporaryDirectory() as tmp, open(os.devnull, "w") as sink:
        events = EventWriter(Path(tmp) / "rank-0.jsonl")
        reporter = ScriptReporter(events, 0, report_interval=0.25)
        bars = BarReader(sink, reporter)
        for _ in range(5):
            started = time.perf_counter()
            for _ in range(steps):
                reporter.on_step(0.1)
                bars.write(BAR_LINE)
                bars.flush()
            best = min(best, (time.perf_counter() - started) / steps)
        events.close()
    return best


def script_args(args: argparse.Namespace) -> list[str]:
    return ["--epochs", str(args.epochs), "--steps", str(args.steps)]


def run_tree(command: list[str], env: dict[str, str] | None = None) -> tuple[str, float]:
    """Run a command to its end, sampling its process tree; (its stdout, supervision share)."""
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO, env=env
    ) as proc:
        with TreeSampler(proc.pid) as sampler:
            out, _ = proc.communicate(timeout=900)
        if proc.returncode != 0:
            raise SystemExit(f"{command[0]} ... exited with {proc.returncode}")
    return out, sampler.share()


def under_torchrun(args: argparse.Namespace, tmp: Path, side: Side) -> None:
    out, share = run_tree(
        [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", str(SCRIPT), *script_args(args)],
        env={**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp)},  # its torchelastic_* dir
    )
    record(side, out, share)


def under_ddptui(args: argparse.Namespace, runs: Path, side: Side) -> None:
    _, share = run_tree(
        [sys.executable, "-m", "ddptui", "run", str(SCRIPT), "--devices", "cpu:2",
         "--runs-dir", str(runs), "--", *script_args(args)],
    )  # fmt: skip
    newest = sorted(runs.iterdir())[-1]
    record(side, (newest / "logs" / "rank-0.log").read_text(), share)


def ticks_of(text: str) -> list[tuple[float, int]]:
    return [(float(t), int(n)) for t, n in TICK.findall(text)]


def step_at(ticks: list[tuple[float, int]], when: float) -> float:
    """The step count at wall-clock time ``when``, between the two ticks around it."""
    for (t0, n0), (t1, n1) in itertools.pairwise(ticks):
        if t0 <= when <= t1:
            return n0 + (n1 - n0) * (when - t0) / (t1 - t0) if t1 > t0 else float(n0)
    raise ValueError(f"no ticks around {when}")


def concurrent_pair(args: argparse.Namespace, tmp: Path, ddptui_first: bool) -> tuple[float, float]:
    """torchrun and ddptui started together; each side's steps/s over their common steady
    window, (torchrun, ddptui)."""
    runs = tmp / f"pair-runs-{time.monotonic_ns()}"
    pair_args = ["--epochs", str(args.pair_epochs), "--steps", str(args.steps)]
    pair_args += ["--ticks", str(TICK_STEPS)]
    torchrun = [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", str(SCRIPT), *pair_args]
    ddptui = [sys.executable, "-m", "ddptui", "run", str(SCRIPT), "--devices", "cpu:2",
              "--runs-dir", str(runs), "--", *pair_args]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp)}
    procs: dict[str, subprocess.Popen[str]] = {}
    for name in ("ddptui", "torchrun") if ddptui_first else ("torchrun", "ddptui"):
        procs[name] = subprocess.Popen(
            torchrun if name == "torchrun" else ddptui, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True, cwd=REPO, env=env if name == "torchrun" else None,
        )  # fmt: skip
    outs = {name: proc.communicate(timeout=900)[0] for name, proc in procs.items()}
    for name, proc in procs.items():
        if proc.returncode != 0:
            raise SystemExit(f"the {name} side of a pair exited with {proc.returncode}")
    newest = sorted(runs.iterdir())[-1]
    sides = {
        "torchrun": ticks_of(outs["torchrun"]),
        "ddptui": ticks_of((newest / "logs" / "rank-0.log").read_text()),
    }
    start = max(t[0][0] for t in sides.values())
    end = min(t[-1][0] for t in sides.values())
    if end - start < 3.0:
        raise SystemExit(f"the pair's steady epochs overlapped {end - start:.1f} s: use more")
    rate = {k: (step_at(t, end) - step_at(t, start)) / (end - start) for k, t in sides.items()}
    return rate["torchrun"], rate["ddptui"]


def record(side: Side, out: str, share: float) -> None:
    side.steps_per_s.append(float(STEADY.findall(out)[-1]))
    side.rank_cpu_ms_per_step.append(float(STEADY_CPU.findall(out)[-1]))
    side.supervision_share.append(share)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=150, help="steps per epoch")
    parser.add_argument("--pairs", type=int, default=6, help="pairs started together")
    parser.add_argument("--pair-epochs", type=int, default=8)
    args = parser.parse_args()
    print(f"load average at the start: {os.getloadavg()[0]:.2f}", flush=True)
    sides = {"torchrun": Side(), "ddptui": Side()}
    with tempfile.TemporaryDirectory(prefix="ddptui-bench-") as tmp:
        for round_ in range(args.rounds):
            order = ("torchrun", "ddptui") if round_ % 2 == 0 else ("ddptui", "torchrun")
            for name in order:
                if name == "torchrun":
                    under_torchrun(args, Path(tmp), sides[name])
                else:
                    under_ddptui(args, Path(tmp) / "runs", sides[name])
            t, d = sides["torchrun"], sides["ddptui"]
            print(
                f"  round {round_ + 1}: steps/s torchrun {t.steps_per_s[-1]:.1f}, ddptui "
                f"{d.steps_per_s[-1]:.1f}; rank CPU ms/step {t.rank_cpu_ms_per_step[-1]:.3f}, "
                f"{d.rank_cpu_ms_per_step[-1]:.3f}; supervision {100 * t.supervision_share[-1]:.2f}"
                f" %, {100 * d.supervision_share[-1]:.2f} % of the ranks' CPU",
                flush=True,
            )
        pairs: list[float] = []
        for pair in range(args.pairs):
            torchrun_rate, ddptui_rate = concurrent_pair(
                args, Path(tmp), ddptui_first=pair % 2 == 1
            )
            pairs.append(ddptui_rate / torchrun_rate)
            print(
                f"  pair {pair + 1} (started together): steps/s torchrun {torchrun_rate:.1f}, "
                f"ddptui {ddptui_rate:.1f}, ratio {pairs[-1]:.3f}",
                flush=True,
            )
    t, d = sides["torchrun"], sides["ddptui"]

    def med(values: list[float]) -> float:  # nan when the runs were too short to sample
        return statistics.median(values) if values else float("nan")

    hook = hook_seconds_per_step()
    step = 1 / med(t.steps_per_s)
    cpu = [a / b for a, b in zip(d.rank_cpu_ms_per_step, t.rank_cpu_ms_per_step, strict=True)]
    shares = [s for s in d.supervision_share if s == s], [s for s in t.supervision_share if s == s]
    extra = med(shares[0]) - med(shares[1])
    estimate = (1 - hook / step) * (1 - extra)
    wall = med(d.steps_per_s) / med(t.steps_per_s)
    walls = [a / b for a, b in zip(d.steps_per_s, t.steps_per_s, strict=True)]
    print(
        f"in the ranks: the step hook and the bar reader take {1e6 * hook:.1f} us a step, "
        f"{100 * hook / step:.3f} % of torchrun's median step ({1e3 * step:.2f} ms)\n"
        f"beside the ranks: supervision CPU as a share of the ranks' CPU: ddptui "
        f"{100 * med(shares[0]):.2f} %, torchrun {100 * med(shares[1]):.2f} %; extra "
        f"{100 * extra:.2f} %\n"
        f"estimated ddptui / torchrun steps/s: {estimate:.4f}; target >= 0.99\n"
        f"end to end, at the same moment, steps/s ddptui / torchrun: {med(pairs):.3f} (median of "
        f"{len(pairs)} pairs; {min(pairs, default=float('nan')):.3f}-"
        f"{max(pairs, default=float('nan')):.3f}); target >= 0.99\n"
        f"end to end, rank CPU per step ddptui / torchrun: {med(cpu):.3f} (median of the rounds' "
        f"ratios; rounds {min(cpu):.3f}-{max(cpu):.3f})\n"
        f"end to end, wall-clock steps/s ddptui / torchrun: {wall:.3f} (ratio of medians; rounds "
        f"{min(walls):.3f}-{max(walls):.3f}; load average now {os.getloadavg()[0]:.2f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

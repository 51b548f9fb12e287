"""What the step split costs a run: the same run with the step timer's global hooks
(``training.step_timing = true``, the default) against the same run without them (``false``), for
a user's plain DDP script (``tests/fixtures/tutorial_ddp.py``, no ddptui in it) and for the
engine's own loop (``cpu-demo``: the hooks plus the timed all-reduce as DDP's communication hook),
on 2 CPU ranks (gloo).

Target (issue 23): at most 1 % fewer steps/s with the hooks (ratio >= 0.99). Two measures:

- **the parts, in this process** (best of 7, interleaved, one thread; a whole step is too noisy
  on a shared machine to show a fraction of a percent): what the module hooks add to one module
  call while a step is timed, what the optimizer hooks add to a step that is not timed, what a
  timed step's own marks, split and report add (with its module hooks put in and taken out), and
  what the engine's timed all-reduce adds to a gradient bucket against DDP's own. A timed step of
  a real loop costs more than those parts add up to, so it is measured too (below). With it, the module calls a step of the tutorial's model (and the engine's small
  CNN) makes, its step time and the one-in-N the sampler picks for it: the hooks' share of its
  steps.
- **a timed step of a real loop**: the tutorial's loop (one gloo rank's DDP) with every fifth
  step timed, each step's time taken: the median timed step less the median untimed one, from
  the same run.
- **in one process, interleaved**: the same loop in 40 pairs of blocks of 100 steps, with the
  timer (sampling as it does) and without, alternating which comes first; the median of the
  pairs' ratios, wall and CPU time a step.
- **end to end, at the same moment**: pairs of ``ddptui run``, one with the hooks and one
  without, started together, so whatever else the machine does hits both alike (as
  ``bench/script_overhead.py`` does); one rank each by default (``--ranks``), each run pinned to
  a core of its own (which run gets which core alternates), so its rank trains with one thread
  (with two ranks or two threads each, four threads take turns on two cores, and one run of a
  pair outpaces the other by up to 2x either way, whatever the hooks do); each side's steps/s
  over the window where both are in the middle of their training, from rank 0's step events;
  hooks over no hooks, the median of the pairs. Which side starts first alternates.

    .venv/bin/python bench/step_timing_overhead.py                 # about 10 minutes on 2 cores
    .venv/bin/python bench/step_timing_overhead.py --pairs 0       # the parts only, seconds

Run on demand; never as a timed test. Look at the load average it prints first.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import torch
import torch.distributed as dist
import torch.nn.modules.module as module_hooks
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from engine.core.runs.events import EventWriter, StepProgress, read_events
from engine.core.runs.rundir import list_runs
from engine.train import step_timing
from engine.train.models import SmallCNN
from engine.train.step_timing import (
    ALL_TIMED_FIRST,
    HOOKED_CALL_SECONDS,
    TIMED_STEP_SECONDS,
    next_gap,
    start_step_timing,
    step_timer_for_rank,
)

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tests" / "fixtures" / "tutorial_ddp.py"
STEADY_CPU = re.compile(r"steady cpu ms/step ([0-9.]+)")


# ---- the parts ---------------------------------------------------------------------------------


def tutorial_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 2),
    )


def best_of(runs: int, measures: dict[str, Callable[[], float]]) -> dict[str, float]:
    """The least seconds of each measure over ``runs`` rounds, the measures interleaved."""
    best = dict.fromkeys(measures, float("inf"))
    for _ in range(runs):
        for name, measure in measures.items():
            best[name] = min(best[name], measure())
    return best


def per_call_seconds(events: EventWriter, calls: int = 20_000) -> float:
    """What the module hooks add to one module call while a step is timed."""
    module, x = nn.ReLU(), torch.zeros(1)

    def run(timed: bool) -> float:
        timer = start_step_timing(events, 0, 3600.0) if timed else None
        if timer is not None:
            timer.restart()  # a timed step from here: the module hooks are in place
        started = time.perf_counter()
        for _ in range(calls):
            module(x)
        seconds = (time.perf_counter() - started) / calls
        if timer is not None:
            timer.close()
        return seconds

    best = best_of(7, {"plain": lambda: run(False), "hooked": lambda: run(True)})
    return best["hooked"] - best["plain"]


def per_step_seconds(events: EventWriter, steps: int = 5_000) -> tuple[float, float]:
    """What the optimizer hooks add to a step that is not timed, and what a timed step's own
    marks, split and report add with its module hooks put in and taken out (a step of one
    parameter: nothing else to time)."""
    weight = nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([weight], lr=0.0)

    def run(how: str) -> float:
        timer = start_step_timing(events, 0, 3600.0) if how != "plain" else None
        if timer is not None and how == "untimed":
            timer.timed = 10**9  # past the first steps: the gap decides, and it never comes
            timer._gap = 10**9
        if timer is not None and how == "timed":
            timer.timed = -(10**9)  # never past the first steps, which are all timed
        started = time.perf_counter()
        for _ in range(steps):
            optimizer.step()
        seconds = (time.perf_counter() - started) / steps
        if timer is not None:
            timer.close()
        return seconds

    def churn() -> float:  # the module hooks in and out, as around each sampled step
        timer = start_step_timing(events, 0, 3600.0)
        started = time.perf_counter()
        for _ in range(steps):
            timer._hook_modules()
            timer._unhook_modules()
        seconds = (time.perf_counter() - started) / steps
        timer.close()
        return seconds

    best = best_of(
        7,
        {
            "plain": lambda: run("plain"),
            "untimed": lambda: run("untimed"),
            "timed": lambda: run("timed"),
            "churn": churn,
        },
    )
    return best["untimed"] - best["plain"], best["timed"] - best["plain"] + best["churn"]


def per_bucket_seconds(events: EventWriter, tmp: Path, steps: int = 2_000) -> float:
    """What the timed all-reduce adds to one gradient bucket of a step that is not timed, against
    DDP's own all-reduce: one gloo rank, a one-weight model (one bucket, little else)."""
    dist.init_process_group(
        "gloo", store=dist.FileStore(str(tmp / "store"), 1), rank=0, world_size=1
    )
    try:

        def run(hooked: bool) -> float:
            model = DistributedDataParallel(nn.Linear(1, 1))
            timer = step_timer_for_rank(hooked, events, 0, 3600.0, model)
            timer.timed, timer._gap = 10**9, 10**9  # past the first steps, none timed after
            optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
            x = torch.ones(1, 1)
            for _ in range(20):
                model(x).sum().backward()
            started = time.perf_counter()
            for _ in range(steps):
                model(x).sum().backward()
                optimizer.step()
            seconds = (time.perf_counter() - started) / steps
            timer.close()
            return seconds

        best = best_of(7, {"ddp": lambda: run(False), "timed": lambda: run(True)})
        return best["timed"] - best["ddp"]
    finally:
        dist.destroy_process_group()


def interleaved_blocks(blocks: int = 40, steps: int = 100) -> tuple[list[float], list[float]]:
    """The tutorial's loop on one gloo rank's DDP, in pairs of blocks of ``steps`` steps, one with
    the step timer in place and one without (which comes first alternates): (wall, CPU) ratios of
    each pair, the block without the hooks over the block with them (per step: below 1, the
    hooks cost)."""
    return _interleaved(blocks, steps)


def timed_step_seconds(steps: int = 1500, every: int = 5) -> tuple[float, float]:
    """(the median untimed step, what a timed step takes more) of the tutorial's loop on one
    gloo rank's DDP, every ``every``-th step timed: both from the same run, step by step."""
    sampler = step_timing.next_gap
    step_timing.next_gap = lambda *_args: every
    try:
        with tempfile.TemporaryDirectory(prefix="ddptui-bench-") as tmp:
            dist.init_process_group(
                "gloo", store=dist.FileStore(str(Path(tmp) / "store"), 1), rank=0, world_size=1
            )
            try:
                model = DistributedDataParallel(tutorial_model())
                optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
                criterion = nn.CrossEntropyLoss()
                x, y = torch.randn(32, 3, 32, 32), torch.randint(0, 2, (32,))
                events = EventWriter(Path(tmp) / "rank-0.jsonl")
                timer = start_step_timing(events, 0, 0.25)
                timer.timed = ALL_TIMED_FIRST
                seconds: dict[bool, list[float]] = {True: [], False: []}
                for n in range(steps):
                    timed = timer._step is not None
                    started = time.perf_counter()
                    optimizer.zero_grad()
                    criterion(model(x), y).backward()
                    optimizer.step()
                    if n >= 50:
                        seconds[timed].append(time.perf_counter() - started)
                timer.close()
                events.close()
            finally:
                dist.destroy_process_group()
    finally:
        step_timing.next_gap = sampler
    untimed = statistics.median(seconds[False])
    return untimed, statistics.median(seconds[True]) - untimed


def _interleaved(blocks: int, steps: int) -> tuple[list[float], list[float]]:
    with tempfile.TemporaryDirectory(prefix="ddptui-bench-") as tmp:
        store = dist.FileStore(str(Path(tmp) / "store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        try:
            model = DistributedDataParallel(tutorial_model())
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            criterion = nn.CrossEntropyLoss()
            x, y = torch.randn(32, 3, 32, 32), torch.randint(0, 2, (32,))

            def block() -> tuple[float, float]:
                wall, cpu = time.perf_counter(), time.process_time()
                for _ in range(steps):
                    optimizer.zero_grad()
                    criterion(model(x), y).backward()
                    optimizer.step()
                return (time.perf_counter() - wall) / steps, (time.process_time() - cpu) / steps

            events = EventWriter(Path(tmp) / "rank-0.jsonl")
            block()  # warm up
            walls, cpus = [], []
            for n in range(blocks):
                if n % 2:  # which block of a pair comes first alternates
                    without = block()
                timer = start_step_timing(events, 0, 0.25)
                timer.timed = ALL_TIMED_FIRST  # a run's steady state: one step in N timed
                with_hooks = block()
                timer.close()
                if not n % 2:
                    without = block()
                walls.append(without[0] / with_hooks[0])
                cpus.append(without[1] / with_hooks[1])
            events.close()
            return walls, cpus
        finally:
            dist.destroy_process_group()


def step_profile(
    make_model: Callable[[], nn.Module], batch: int, classes: int
) -> tuple[float, int]:
    """(the median seconds of a training step of the model, its module calls a step)."""
    torch.manual_seed(0)
    model = make_model()
    x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, classes, (batch,))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    calls = [0]

    def count(_module: nn.Module, _args: object) -> None:
        calls[0] += 1

    seconds = []
    for i in range(60):
        handle = module_hooks.register_module_forward_pre_hook(count) if i == 0 else None
        started = time.perf_counter()
        optimizer.zero_grad()
        criterion(model(x), y).backward()
        optimizer.step()
        seconds.append(time.perf_counter() - started)
        if handle is not None:
            handle.remove()
    return statistics.median(seconds[10:]), calls[0]


def quartiles(values: list[float]) -> str:
    low, _, high = statistics.quantiles(values, n=4)
    return f"{low:.3f}-{high:.3f}"


def mean_gap(calls: int, step: float) -> float:
    rng = random.Random(0)
    return statistics.mean(next_gap(calls, step, ALL_TIMED_FIRST, rng) for _ in range(20_000))


def report_parts() -> None:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="ddptui-bench-") as tmp:
        events = EventWriter(Path(tmp) / "rank-0.jsonl")
        call = per_call_seconds(events)
        untimed, timed = per_step_seconds(events)
        print(
            f"the parts: a module call while a step is timed {1e6 * call:+.2f} us; a step not "
            f"timed {1e6 * untimed:+.2f} us (the optimizer hooks); a timed step's own marks, "
            f"split, report and module hooks in and out {1e6 * timed:+.2f} us",
            flush=True,
        )
        walls, cpus = interleaved_blocks()
        print(
            "the tutorial's loop in one process (one gloo rank), 40 blocks of 100 steps with the "
            "hooks and 40 without, alternating; without over with, per step: wall median "
            f"{statistics.median(walls):.4f} (quartiles {quartiles(walls)}), CPU median "
            f"{statistics.median(cpus):.4f} (quartiles {quartiles(cpus)})",
            flush=True,
        )
        step, per_timed = timed_step_seconds()
        print(
            f"the tutorial's loop with every fifth step timed: an untimed step "
            f"{1e3 * step:.2f} ms (median), a timed one {1e6 * per_timed:+.0f} us (the sampler "
            f"reckons {1e6 * (7 * HOOKED_CALL_SECONDS + TIMED_STEP_SECONDS):.0f} us for its 7 "
            "module calls)",
            flush=True,
        )
        bucket = per_bucket_seconds(events, Path(tmp))
        print(
            f"the engine's DDP: the timed all-reduce adds {1e6 * bucket:+.2f} us to a gradient "
            "bucket of a step not timed, against DDP's own (small models have one bucket; "
            "ResNet-50 about four)",
            flush=True,
        )
        for name, make, batch, classes, buckets in (
            ("a script (the tutorial's model, batch 32)", tutorial_model, 32, 2, 0),
            ("the engine (its small CNN, batch 32, one bucket)", SmallCNN, 32, 10, 1),
        ):
            step, calls = step_profile(make, batch, classes)
            gap = mean_gap(calls, step)
            # a timed step as the real loop measured it, its module calls' share scaled
            timed_step = max(per_timed, timed) * calls / 7
            cost = timed_step / gap + untimed * (gap - 1) / gap + buckets * bucket
            print(
                f"{name}: {1e3 * step:.2f} ms a step, {calls} module calls; one step in "
                f"{gap:.1f} timed after the first {ALL_TIMED_FIRST}, each ~{1e6 * timed_step:.0f}"
                f" us: {1e6 * cost:.1f} us a step, {100 * cost / step:.3f} % of it; estimated "
                f"steps/s ratio {1 - cost / step:.4f}",
                flush=True,
            )
        events.close()


# ---- end to end, at the same moment ----------------------------------------------------------


def command(workload: str, runs: Path, timing: bool, args: argparse.Namespace) -> list[str]:
    on = f"training.step_timing={'true' if timing else 'false'}"
    if workload == "script":
        return [sys.executable, "-m", "ddptui", "run", str(SCRIPT), "--devices", f"cpu:{args.ranks}",
                "--runs-dir", str(runs), "--set", on, "--",
                "--epochs", str(args.script_epochs), "--steps", str(args.script_steps)]  # fmt: skip
    return [sys.executable, "-m", "ddptui", "run", "cpu-demo", "--devices", f"cpu:{args.ranks}",
            "--runs-dir", str(runs), "--set", on, "--batch-size", "32", "--epochs", "1",
            "--set", f"training.max_steps={args.engine_steps}",
            "--set", "training.evaluate=false", "--set", "training.checkpoint=false"]  # fmt: skip


def ticks(runs: Path) -> list[tuple[float, int]]:
    """(time, global step) of rank 0's step events in the one run under ``runs``."""
    (run,) = list_runs(runs)
    found = [
        (e.time, e.global_step)
        for e in read_events(run.rank_events_path(0))
        if isinstance(e, StepProgress)
    ]
    return sorted(found)


def step_at(points: list[tuple[float, int]], when: float) -> float:
    for (t0, n0), (t1, n1) in itertools.pairwise(points):
        if t0 <= when <= t1:
            return n0 + (n1 - n0) * (when - t0) / (t1 - t0) if t1 > t0 else float(n0)
    raise ValueError(f"no step events around {when}")


def steady_cpu(runs: Path) -> float | None:
    """Rank 0's CPU milliseconds a step from its second epoch on, as the script prints it."""
    (run,) = list_runs(runs)
    found = STEADY_CPU.findall(run.rank_log_path(0).read_text(errors="replace"))
    return float(found[-1]) if found else None


def pair(
    workload: str, tmp: Path, args: argparse.Namespace, timed_first: bool
) -> tuple[float, float | None]:
    """Hooks over no hooks: (steps/s over the window where both runs are in the middle of their
    training (past its first fifth, before its last tenth); for the script, its rank 0's CPU a
    step, no hooks over hooks)."""
    dirs = {timing: tmp / f"{workload}-{timing}-{time.monotonic_ns()}" for timing in (True, False)}
    procs: dict[bool, subprocess.Popen[bytes]] = {}
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    pin = args.ranks == 1 and len(cores) >= 2  # each run on a core of its own, alternating
    try:
        for timing in (True, False) if timed_first else (False, True):
            dirs[timing].mkdir()
            core = cores[(timing + timed_first) % 2] if pin else None
            procs[timing] = subprocess.Popen(
                command(workload, dirs[timing], timing, args), cwd=REPO,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                preexec_fn=(lambda core=core: os.sched_setaffinity(0, {core})) if pin else None,
            )  # fmt: skip
        for timing, proc in procs.items():
            if proc.wait(timeout=900) != 0:
                raise SystemExit(f"the {workload} run with step_timing={timing} failed")
    finally:  # interrupted: each `ddptui run` stops its run as on Ctrl-C, and is waited for
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc in procs.values():
            proc.wait(timeout=120)
    points = {timing: ticks(path) for timing, path in dirs.items()}
    spans = [(p[0][0], p[-1][0]) for p in points.values()]
    start = max(a + 0.2 * (b - a) for a, b in spans)
    end = min(b - 0.1 * (b - a) for a, b in spans)
    if end - start < 0.4 * min(b - a for a, b in spans):
        raise SystemExit(
            f"the pair's runs trained together {end - start:.1f} s only: use more steps"
        )
    rate = {k: (step_at(p, end) - step_at(p, start)) / (end - start) for k, p in points.items()}
    cpu = {timing: steady_cpu(path) for timing, path in dirs.items()}
    on, off = cpu[True], cpu[False]
    return rate[True] / rate[False], (off / on if on and off else None)


def report_pairs(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="ddptui-bench-") as tmp:
        for workload in args.workloads:
            ratios, cpus = [], []
            for n in range(args.pairs):
                ratio, cpu = pair(workload, Path(tmp), args, timed_first=n % 2 == 0)
                ratios.append(ratio)
                cpus += [cpu] if cpu is not None else []
                said = f", rank 0's CPU a step without / with {cpu:.3f}" if cpu else ""
                print(
                    f"  {workload} pair {n + 1}: steps/s with / without {ratio:.3f}{said}",
                    flush=True,
                )
            print(
                f"{workload}: steps/s with the hooks over without, median of {len(ratios)} pairs "
                f"started together: {statistics.median(ratios):.3f} ({min(ratios):.3f}-"
                f"{max(ratios):.3f}); target >= 0.99",
                flush=True,
            )
            if cpus:
                print(
                    f"{workload}: rank 0's CPU a step without the hooks over with, median: "
                    f"{statistics.median(cpus):.3f} ({min(cpus):.3f}-{max(cpus):.3f})",
                    flush=True,
                )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=6, help="pairs of runs per workload")
    parser.add_argument(
        "--ranks",
        type=int,
        default=1,
        help="ranks per run (1: on 2 cores each run of a pair has a core of its own)",
    )
    parser.add_argument(
        "--workloads", nargs="+", default=["script", "engine"], choices=["script", "engine"]
    )
    parser.add_argument("--script-epochs", type=int, default=10)
    parser.add_argument("--script-steps", type=int, default=150, help="script steps per epoch")
    parser.add_argument("--engine-steps", type=int, default=400, help="cpu-demo steps")
    args = parser.parse_args()
    print(f"load average at the start: {os.getloadavg()[0]:.2f}", flush=True)
    report_parts()
    if args.pairs > 0:
        report_pairs(args)
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How much host memory a rank really holds, against what ``engine.core.plan.memory_estimate`` says.

Each case is a real run, started exactly as ``ddptui run`` starts it (``engine.core.backends.local.start``: the
launcher, spawned ranks, DataLoader workers where the pipeline uses them), on the CPU with a few
steps per epoch and the evaluation and checkpoint left on. While it runs, every process of the run
is sampled every 20 ms for its peak resident set (``VmHWM`` in ``/proc/<pid>/status``, which the
kernel keeps, so a peak between two samples is not missed) and, for DataLoader workers, the peak of
their unique set (USS: the pages no other process shares; the torch libraries a worker maps are
already counted in its rank's RSS). The figures printed are the largest rank's peak, the
launcher's, the largest worker's and the sum over one rank's workers, each next to the estimate
and the ratio estimate / measured, which must stay >= 1.

    .venv/bin/python bench/rank_memory.py                         # every model, batch 32 and 128
    .venv/bin/python bench/rank_memory.py --models small_cnn --train-sizes 2000,50000
    .venv/bin/python bench/rank_memory.py --models resnet18 --pipeline torchvision --num-workers 2

Run on demand (a few minutes on 2 cores), never as a test; ``tests/test_resource_guard.py`` keeps
one slow check of the same kind. Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from engine.core.backends.local.start import start_run  # noqa: E402
from engine.core.config.presets import load_preset  # noqa: E402
from engine.core.config.schema import MODELS, RunConfig  # noqa: E402
from engine.core.config.toml_io import apply_overrides  # noqa: E402
from engine.core.plan.memory_estimate import MemoryEstimate, estimate_memory  # noqa: E402
from engine.core.plan.run_plan import plan_run  # noqa: E402

MIB = 2**20
SAMPLE_SECONDS = 0.02
_HWM = re.compile(rb"VmHWM:\s+(\d+) kB")


def peak_rss_bytes(pid: int) -> int | None:
    """The kernel's high-water mark of the resident set of ``pid``, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            found = _HWM.search(status.read())
    except OSError:
        return None
    return int(found[1]) * 1024 if found else None


@dataclass
class RunPeaks:
    """Peak figures of one run's processes, by role."""

    launcher: int = 0
    ranks: dict[int, int] = field(default_factory=dict)  # pid -> peak RSS
    workers: dict[int, int] = field(default_factory=dict)  # pid -> peak RSS
    worker_uss: dict[int, int] = field(default_factory=dict)  # pid -> peak USS
    worker_rank: dict[int, int] = field(default_factory=dict)  # worker pid -> its rank's pid

    @property
    def rank_peak(self) -> int:
        return max(self.ranks.values(), default=0)

    @property
    def workers_uss_per_rank(self) -> int:
        """The largest sum of one rank's workers' peak USS (a sum of peaks: an upper bound)."""
        sums: dict[int, int] = {}
        for pid, uss in self.worker_uss.items():
            rank = self.worker_rank[pid]
            sums[rank] = sums.get(rank, 0) + uss
        return max(sums.values(), default=0)


def is_rank(proc: psutil.Process) -> bool:
    """A rank is a spawned interpreter (``multiprocessing.spawn``), not the resource tracker."""
    try:
        cmdline = " ".join(proc.cmdline())
    except psutil.Error:
        return False
    return "spawn_main" in cmdline


def sample(launcher: psutil.Process, peaks: RunPeaks) -> None:
    """One look at the run's process tree: launcher -> ranks -> DataLoader workers."""
    value = peak_rss_bytes(launcher.pid)
    if value is not None:
        peaks.launcher = max(peaks.launcher, value)
    try:
        children = launcher.children()
    except psutil.Error:
        return
    for child in children:
        if not is_rank(child):
            continue
        value = peak_rss_bytes(child.pid)
        if value is not None:
            peaks.ranks[child.pid] = max(peaks.ranks.get(child.pid, 0), value)
        try:
            workers = child.children(recursive=True)
        except psutil.Error:
            continue
        for worker in workers:
            peaks.worker_rank[worker.pid] = child.pid
            value = peak_rss_bytes(worker.pid)
            if value is not None:
                peaks.workers[worker.pid] = max(peaks.workers.get(worker.pid, 0), value)
            try:
                uss = worker.memory_full_info().uss
            except psutil.Error:
                continue
            peaks.worker_uss[worker.pid] = max(peaks.worker_uss.get(worker.pid, 0), uss)


def measure(config: RunConfig, timeout: float) -> RunPeaks:
    """Run ``config`` to its end, sampling; raises SystemExit if it does not complete."""
    peaks = RunPeaks()
    with tempfile.TemporaryDirectory(prefix="ddptui-rank-memory-") as tmp:
        started = start_run(config, Path(tmp), gpu_count=0)
        launcher = psutil.Process(started.process.pid)
        deadline = time.monotonic() + timeout
        while started.poll() is None:
            if time.monotonic() > deadline:
                started.process.terminate()
                started.wait(timeout=30)
                raise SystemExit(f"{config.model.name}: the run took over {timeout} s")
            sample(launcher, peaks)
            time.sleep(SAMPLE_SECONDS)
        summary = started.run_dir.read_summary()
        if summary is None:
            raise SystemExit(f"{config.model.name}: the run left no summary.json")
        if summary.status != "completed":
            raise SystemExit(
                f"{config.model.name}: the run ended {summary.status}: {summary.reason}"
            )
    return peaks


def case_config(args: argparse.Namespace, model: str, batch: int, train_size: int) -> RunConfig:
    overrides: dict[str, Any] = {
        "strategy.name": "ddp" if args.ranks > 1 else "single",
        "devices.spec": f"cpu:{args.ranks}",
        "model.name": model,
        "data.dataset": "synthetic",
        "data.pipeline": args.pipeline,
        "data.num_workers": args.num_workers,
        "data.train_size": train_size,
        "data.test_size": args.test_size,
        "training.epochs": 1,
        "training.batch_size": batch,
        "training.max_steps": args.max_steps,
        "training.warmup_steps": 0,
    }
    return apply_overrides(load_preset("cpu-demo"), overrides)


def ratio(estimate: int, measured: int) -> str:
    return f"{estimate / measured:5.2f}" if measured else "   - "


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--batch-sizes", default="32,128")
    parser.add_argument("--train-sizes", default="12000")
    parser.add_argument("--test-size", type=int, default=2000)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=3)
    parser.add_argument("--pipeline", choices=["tensor", "torchvision"], default="tensor")
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args(argv)

    print(
        f"cpu:{args.ranks} ddp, synthetic, {args.pipeline} pipeline, {args.num_workers} workers, "
        f"test_size {args.test_size}, {args.max_steps} steps; MiB, ratio = estimate / measured"
    )
    print(
        f"{'model':<10} {'batch':>5} {'train':>6} | {'rank':>6} {'est':>6} {'ratio':>5} | "
        f"{'launch':>6} {'est':>6} {'ratio':>5} | {'1 wkr':>6} {'wkrs':>6} {'est':>6} {'ratio':>5}"
    )
    worst = float("inf")
    for model in args.models.split(","):
        for batch in (int(b) for b in args.batch_sizes.split(",")):
            for train_size in (int(t) for t in args.train_sizes.split(",")):
                config = case_config(args, model, batch, train_size)
                estimate: MemoryEstimate = estimate_memory(plan_run(config, 0))
                peaks = measure(config, args.timeout)
                worker_uss = max(peaks.worker_uss.values(), default=0)
                workers = peaks.workers_uss_per_rank
                worker_est = estimate.workers_host_bytes
                line = (
                    f"{model:<10} {batch:>5} {train_size:>6} | {peaks.rank_peak / MIB:6.0f} "
                    f"{estimate.rank_host_bytes / MIB:6.0f} "
                    f"{ratio(estimate.rank_host_bytes, peaks.rank_peak)} | "
                    f"{peaks.launcher / MIB:6.0f} {estimate.launcher_host_bytes / MIB:6.0f} "
                    f"{ratio(estimate.launcher_host_bytes, peaks.launcher)} | "
                    f"{worker_uss / MIB:6.0f} {workers / MIB:6.0f} {worker_est / MIB:6.0f} "
                    f"{ratio(worker_est, workers)}"
                )
                print(line + f"  ({len(peaks.workers)} workers seen)", flush=True)
                worst = min(worst, estimate.rank_host_bytes / max(peaks.rank_peak, 1))
    print(f"smallest rank ratio: {worst:.2f} (must be >= 1)")
    return 0 if worst >= 1 else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""Images/s of the ``tensor`` input pipeline against the ``torchvision`` one (PIL + workers).

Both pipelines come from ``engine.train.data.make_train_batches``, on the same synthetic CIFAR-shaped
images, batch and augmentation (random crop with 4-pixel padding + horizontal flip, normalise), on
the CPU. Only the input pipeline runs: no model. The two are measured alternately, ``--rounds``
times each, and compared by

- wall images/s, and
- images per CPU-second: images / (CPU seconds of this process and its DataLoader workers), which
  is "per CPU core": a pipeline that is fast only because it keeps more cores busy does not win.

Target (issue 4): the tensor pipeline at least 10x faster per CPU core.

    .venv/bin/python bench/data_pipeline.py                 # about 45 s on 2 cores
    .venv/bin/python bench/data_pipeline.py --workers 4 --batch-size 512 --seconds 8
    .venv/bin/python bench/data_pipeline.py --device cuda   # on a GPU machine

Run on demand; never as a timed test.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

from engine.core.host.capacity import usable_cores

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def cpu_seconds(proc: psutil.Process) -> float:
    """CPU seconds of this process and of its live children (DataLoader workers)."""
    total = sum(proc.cpu_times()[:2])
    for child in proc.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            total += sum(child.cpu_times()[:2])
    return total


def endless(batches: Any) -> Iterator[Any]:
    """Batches across epoch boundaries, for as long as the measurement wants."""
    epoch = 0
    while True:
        yield from batches.epoch(epoch)
        epoch += 1


def measure(pipeline: str, args: argparse.Namespace) -> dict[str, float]:
    import torch

    from engine.core.config.schema import RunConfig
    from engine.core.config.toml_io import apply_overrides
    from engine.train.data import make_train_batches

    config = apply_overrides(
        RunConfig(),
        {
            "data.dataset": "synthetic",
            "data.pipeline": pipeline,
            "data.train_size": args.train_size,
            "data.num_workers": args.workers,
            "data.pin_memory": args.device == "cuda",
            "training.batch_size": args.batch_size,
        },
    )
    device = torch.device(args.device)
    batches = make_train_batches(
        config,
        batch_size=args.batch_size,
        rank=0,
        world_size=1,
        device=device,
        distributed=False,
    )
    proc = psutil.Process()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    it = endless(batches)
    for _ in range(args.warmup):  # starts the workers, fills their prefetch queues
        next(it)
    sync()
    start_wall, start_cpu = time.perf_counter(), cpu_seconds(proc)
    count = 0
    while time.perf_counter() - start_wall < args.seconds:
        images, _labels = next(it)
        count += images.shape[0]
    sync()
    wall, cpu = time.perf_counter() - start_wall, cpu_seconds(proc) - start_cpu
    it.close()
    del it, batches  # ends the persistent workers before the next measurement
    return {
        "images_per_s": count / wall,
        "images_per_cpu_s": count / cpu if cpu > 0 else float("nan"),
        "cpu_cores_busy": cpu / wall,
        "images": count,
    }


def compare(args: argparse.Namespace, threads: int, workers: int) -> dict[str, Any]:
    """Alternate the two pipelines ``args.rounds`` times; medians and ratios."""
    import torch

    torch.set_num_threads(threads)
    args.workers = workers
    results: dict[str, list[dict[str, float]]] = {"tensor": [], "torchvision": []}
    for round_ in range(args.rounds):
        for pipeline in ("tensor", "torchvision"):
            figures = measure(pipeline, args)
            results[pipeline].append(figures)
            if not args.json:
                print(
                    f"  round {round_ + 1} {pipeline:<11}: {figures['images_per_s']:>9,.0f} img/s, "
                    f"{figures['images_per_cpu_s']:>9,.0f} img per CPU-s, "
                    f"{figures['cpu_cores_busy']:.2f} cores busy",
                    flush=True,
                )

    def median(pipeline: str, key: str) -> float:
        return statistics.median(r[key] for r in results[pipeline])

    summary: dict[str, Any] = {
        "tensor_threads": threads,
        "torchvision_workers": workers,
        "tensor_images_per_s": median("tensor", "images_per_s"),
        "torchvision_images_per_s": median("torchvision", "images_per_s"),
        "tensor_images_per_cpu_s": median("tensor", "images_per_cpu_s"),
        "torchvision_images_per_cpu_s": median("torchvision", "images_per_cpu_s"),
    }
    summary["wall_ratio"] = summary["tensor_images_per_s"] / summary["torchvision_images_per_s"]
    summary["per_core_ratio"] = (
        summary["tensor_images_per_cpu_s"] / summary["torchvision_images_per_cpu_s"]
    )
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument(
        "--workers",
        type=int,
        default=0,
        help="torchvision DataLoader workers (default: measure 1, then one per core)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads for the tensor pipeline (default: measure 1, then one per core)",
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="timed seconds per measurement")
    parser.add_argument("--warmup", type=int, default=3, help="untimed batches first")
    parser.add_argument("--rounds", type=int, default=3, help="alternating measurements of each")
    parser.add_argument("--train-size", type=int, default=50_000, help="images, like CIFAR-10")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()

    n = usable_cores()
    if args.threads or args.workers:
        setups = [("as asked", args.threads or n, args.workers or n)]
    else:
        # One core each is the per-core comparison; the whole machine is what a run would see.
        setups = [("one core each", 1, 1), (f"all {n} cores", n, n)]
    report: dict[str, Any] = {"device": args.device, "batch_size": args.batch_size, "cores": n}
    for name, threads, workers in setups:
        if not args.json:
            print(
                f"{name}: tensor pipeline with {threads} torch thread(s), torchvision with "
                f"{workers} worker(s)",
                flush=True,
            )
        report[name] = figures = compare(args, threads, workers)
        if not args.json:
            verdict = "meets" if figures["per_core_ratio"] >= 10 else "MISSES"
            print(
                f"  median of {args.rounds}: tensor {figures['tensor_images_per_s']:,.0f} img/s "
                f"({figures['tensor_images_per_cpu_s']:,.0f} per CPU-s), torchvision "
                f"{figures['torchvision_images_per_s']:,.0f} img/s "
                f"({figures['torchvision_images_per_cpu_s']:,.0f} per CPU-s)\n"
                f"  tensor / torchvision: {figures['wall_ratio']:.1f}x wall, "
                f"{figures['per_core_ratio']:.1f}x per CPU core ({verdict} the 10x target)",
                flush=True,
            )
    if args.json:
        print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

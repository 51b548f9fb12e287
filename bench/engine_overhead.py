"""What the engine costs: its training throughput against a bare hand-written PyTorch loop.

Three comparisons, each on the same model, batch, images, augmentation and thread count:

- loop: the engine's training loop (``engine.train.training.train_rank``, writing its events to a
  temporary run directory) against the tutorial's loop (``plain_ddp.plain_training``), in this one
  process, one epoch each, alternating. Both see the same load at the same moment, so this is the
  figure a busy machine cannot blur; it leaves out what the launcher costs;
- single process: the engine (``ddptui``'s launcher, strategy ``single`` on ``cpu:1``) against the
  tutorial's plain loop (``bench/plain_ddp.py`` started plainly);
- 2-rank CPU DDP on gloo: the engine (``ddp`` on ``cpu:2``) against the tutorial's bare DDP script
  started by ``torchrun --standalone --nproc_per_node 2``.

The engine runs exactly as ``ddptui run`` runs it (launcher, spawned ranks, events, supervision).
Both sides report steady-state images/s of their last epoch, warm-up steps left out, and both get
cores / ranks threads per process (the launcher's split). Engine and plain runs alternate within
each round, in swapped order every other round, so drift in the machine's load hits both; the
figure is the ratio of the medians. Target (issue 4): engine / plain >= 0.97 for both.

    .venv/bin/python bench/engine_overhead.py                # about 5 minutes on 2 cores
    .venv/bin/python bench/engine_overhead.py --rounds 5 --only ddp
    .venv/bin/python bench/engine_overhead.py --only loop --rounds 5   # 15 in-process rounds
    .venv/bin/python bench/engine_overhead.py --model resnet18 --train-size 2048 --batch-size 32

Run on demand; never as a timed test. A busy machine makes every figure noisy: look at the load
average it prints first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from engine.core.backends.local.start import start_run  # noqa: E402
from engine.core.config.presets import load_preset  # noqa: E402
from engine.core.config.schema import RunConfig  # noqa: E402
from engine.core.config.toml_io import apply_overrides, to_toml  # noqa: E402
from engine.core.host.capacity import usable_cores  # noqa: E402

PLAIN_SCRIPT = REPO / "bench" / "plain_ddp.py"
sys.path.insert(0, str(PLAIN_SCRIPT.parent))
LR = 0.05


def threads_for(ranks: int) -> int:
    """The launcher's split: cores / ranks, at least one."""
    return max(1, usable_cores() // ranks)


def engine_config(args: argparse.Namespace, ranks: int) -> RunConfig:
    overrides: dict[str, Any] = {
        "strategy.name": "single" if ranks == 1 else "ddp",
        "devices.spec": f"cpu:{ranks}",
        "precision.mode": "fp32",
        "model.name": args.model,
        "data.dataset": "synthetic",
        "data.pipeline": "tensor",
        "data.train_size": args.train_size,
        "optimizer.lr": LR,
        "optimizer.momentum": 0.9,
        "optimizer.lr_scaling": "none",
        "training.epochs": args.epochs,
        "training.batch_size": args.batch_size,
        "training.warmup_steps": args.warmup_steps,
        "training.max_steps": 0,
        "training.seed": 0,
        "training.evaluate": False,
        "training.checkpoint": False,
    }
    return apply_overrides(load_preset("cpu-demo"), overrides)


def engine_images_per_s(args: argparse.Namespace, ranks: int) -> float:
    """One run through the engine, exactly as ``ddptui run`` starts it."""
    config = engine_config(args, ranks)
    with tempfile.TemporaryDirectory(prefix="ddptui-bench-") as tmp:
        started = start_run(config, Path(tmp))
        try:
            started.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            started.process.terminate()
            started.wait(timeout=30)
            raise SystemExit(f"the engine run took over {args.timeout} s; see --timeout") from None
        summary = started.run_dir.read_summary()
        if summary is None:
            log = started.run_dir.launcher_log_path.read_text(errors="replace")[-2000:]
            raise SystemExit(f"the engine run left no summary.json; launcher log:\n{log}")
        last = summary.last_epoch
        if summary.status != "completed" or last is None:
            raise SystemExit(f"the engine run ended {summary.status}: {summary.reason}")
        return last.steady_images_per_s


def plain_images_per_s(args: argparse.Namespace, ranks: int) -> float:
    """One run of the bare script: plainly for one process, under torchrun for several."""
    threads = threads_for(ranks)
    script_args = [
        str(PLAIN_SCRIPT),
        "--model",
        args.model,
        "--batch-size",
        str(args.batch_size),
        "--train-size",
        str(args.train_size),
        "--epochs",
        str(args.epochs),
        "--warmup-steps",
        str(args.warmup_steps),
        "--lr",
        str(LR),
        "--threads",
        str(threads),
    ]
    if ranks == 1:
        command = [sys.executable, *script_args]
    else:
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            str(ranks),
            *script_args,
        ]
    with tempfile.TemporaryDirectory(prefix="ddptui-bench-") as tmp:  # torchrun's torchelastic_*
        env = {
            **os.environ,
            "OMP_NUM_THREADS": str(threads),
            "CUDA_VISIBLE_DEVICES": "",
            "TMPDIR": tmp,
        }
        done = subprocess.run(
            command, capture_output=True, text=True, env=env, timeout=args.timeout, check=False
        )
    if done.returncode != 0:
        raise SystemExit(f"the plain run failed ({done.returncode}):\n{done.stderr[-2000:]}")
    line = [ln for ln in done.stdout.splitlines() if ln.startswith("{")][-1]
    return float(json.loads(line)["steady_images_per_s"])


def loop_epoch_images_per_s(args: argparse.Namespace, side: str) -> float:
    """One epoch of one side's loop in this process: steady images/s after the warm-up steps."""
    import contextlib
    import io

    import torch

    torch.set_num_threads(threads_for(1))
    if side == "plain":
        from plain_ddp import plain_training

        images, seconds, _ = plain_training(
            model_name=args.model,
            batch_size=args.batch_size,
            train_size=args.train_size,
            epochs=1,
            warmup_steps=args.warmup_steps,
            lr=LR,
            seed=0,
        )
        return images / seconds
    from engine.core.plan.run_plan import plan_run
    from engine.core.runs.events import EpochEnded, EventWriter, read_events
    from engine.core.runs.rundir import RunDir
    from engine.train.training import train_rank

    config = apply_overrides(engine_config(args, 1), {"training.epochs": 1})
    with tempfile.TemporaryDirectory(prefix="ddptui-bench-") as tmp:
        run_dir = RunDir(Path(tmp) / "loop")
        run_dir.create()
        run_dir.config_path.write_text(to_toml(config), encoding="utf-8")
        with (
            EventWriter(run_dir.rank_events_path(0)) as events,
            contextlib.redirect_stdout(io.StringIO()),
        ):
            train_rank(
                run_dir, plan_run(config, 0), rank=0, local_rank=0, world_size=1, events=events
            )
        ended = [e for e in read_events(run_dir.rank_events_path(0)) if isinstance(e, EpochEnded)]
        return ended[-1].global_steady_images_per_s


def compare(args: argparse.Namespace, ranks: int) -> dict[str, Any]:
    if ranks == 0:
        name = "loop (in-process)"
        shape = f"one epoch of {args.train_size} images per measurement"
    else:
        name = "single process" if ranks == 1 else f"{ranks}-rank DDP (gloo)"
        shape = f"{args.train_size} images, last of {args.epochs} epochs"
    if not args.json:
        print(
            f"{name}: {args.model}, batch {args.batch_size} per process, "
            f"{threads_for(max(ranks, 1))} thread(s) per process, {shape}",
            flush=True,
        )
    engine: list[float] = []
    plain: list[float] = []
    if ranks == 0:
        # One untimed epoch of each first: the first use of a model in a process is slow.
        loop_epoch_images_per_s(args, "engine")
        loop_epoch_images_per_s(args, "plain")
    rounds = args.rounds * 3 if ranks == 0 else args.rounds  # the loop case is cheap: more rounds
    for round_ in range(rounds):
        order = ("engine", "plain") if round_ % 2 == 0 else ("plain", "engine")
        figures = {}
        for side in order:
            if ranks == 0:
                figures[side] = loop_epoch_images_per_s(args, side)
            elif side == "engine":
                figures[side] = engine_images_per_s(args, ranks)
            else:
                figures[side] = plain_images_per_s(args, ranks)
        engine.append(figures["engine"])
        plain.append(figures["plain"])
        if not args.json:
            print(
                f"  round {round_ + 1}: engine {figures['engine']:,.0f} img/s, plain "
                f"{figures['plain']:,.0f} img/s, ratio {figures['engine'] / figures['plain']:.3f}",
                flush=True,
            )
    ratio = statistics.median(engine) / statistics.median(plain)
    result = {
        "case": name,
        "ranks": ranks,
        "threads_per_process": threads_for(max(ranks, 1)),
        "engine_images_per_s": engine,
        "plain_images_per_s": plain,
        "engine_median": statistics.median(engine),
        "plain_median": statistics.median(plain),
        "ratio_of_medians": ratio,
        "median_of_round_ratios": statistics.median(
            e / p for e, p in zip(engine, plain, strict=True)
        ),
    }
    if not args.json:
        verdict = "meets" if ratio >= 0.97 else "MISSES"
        print(
            f"  median of {rounds}: engine {result['engine_median']:,.0f} img/s, plain "
            f"{result['plain_median']:,.0f} img/s: engine / plain = {ratio:.3f} "
            f"({verdict} the 0.97 target); median of the rounds' ratios "
            f"{result['median_of_round_ratios']:.3f}\n",
            flush=True,
        )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="small_cnn")
    parser.add_argument("--batch-size", type=int, default=64, help="per process")
    parser.add_argument("--train-size", type=int, default=8192)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--warmup-steps", type=int, default=5)
    parser.add_argument(
        "--rounds", type=int, default=3, help="end-to-end rounds; the loop case runs 3x as many"
    )
    parser.add_argument(
        "--only", choices=("loop", "single", "ddp"), help="run one comparison, not all three"
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    parser.add_argument(
        "--cores",
        type=int,
        default=0,
        help="pin this script, and so both sides, to the first N cores (0: all it may use)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.cores > 0 and hasattr(os, "sched_setaffinity"):
        allowed = sorted(os.sched_getaffinity(0))[: args.cores]
        os.sched_setaffinity(0, allowed)  # inherited by the launcher, its ranks and torchrun

    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    if not args.json:
        print(f"{usable_cores()} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}\n")
    started = time.monotonic()
    results = []
    if args.only in (None, "loop"):
        results.append(compare(args, 0))
    if args.only in (None, "single"):
        results.append(compare(args, 1))
    if args.only in (None, "ddp"):
        results.append(compare(args, 2))
    if args.json:
        print(
            json.dumps(
                {"cores": usable_cores(), "load_average": load, "results": results}, indent=2
            )
        )
    else:
        print(f"took {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()

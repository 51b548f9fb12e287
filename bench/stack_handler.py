"""What the rank bootstrap's stack-dump handler costs a training loop: the tutorial's plain loop
(``bench/plain_ddp.py``) with faulthandler registered on ``STACK_DUMP_SIGNAL`` and ptrace allowed
(``engine.train.rank_bootstrap.prepare_stack_dumps``, as every rank does) against the same loop
without, in this one process, alternating, swapped order every other round. Both see the same load
at the same moment; the figure is the ratio of the medians of steady images/s (warm-up left out).
Target (issue 13): nothing measurable, 1.00 within the rounds' spread.

    .venv/bin/python bench/stack_handler.py                 # about 3 minutes on 2 cores
    .venv/bin/python bench/stack_handler.py --rounds 9 --train-size 4096

Run on demand; never as a timed test.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from engine.core.common.run_environment import STACK_DUMP_SIGNAL  # noqa: E402
from engine.core.host.capacity import usable_cores  # noqa: E402
from engine.train import rank_bootstrap  # noqa: E402


def images_per_s(args: argparse.Namespace) -> float:
    from plain_ddp import plain_training

    images, seconds, _ = plain_training(
        model_name=args.model,
        batch_size=args.batch_size,
        train_size=args.train_size,
        epochs=1,
        warmup_steps=5,
        lr=0.05,
        seed=0,
    )
    return images / seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--model", default="small_cnn")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--train-size", type=int, default=4096)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(usable_cores())
    print(f"load average at the start: {os.getloadavg()[0]:.2f}", flush=True)
    images_per_s(args)  # the first use of a model in a process is slow: untimed
    with tempfile.TemporaryDirectory(prefix="ddptui-bench-") as run_dir:
        figures: dict[str, list[float]] = {"with": [], "without": []}
        for round_ in range(args.rounds):
            order = ("with", "without") if round_ % 2 == 0 else ("without", "with")
            for side in order:
                if side == "with":
                    rank_bootstrap.prepare_stack_dumps(run_dir)
                figures[side].append(images_per_s(args))
                if side == "with":
                    faulthandler.unregister(STACK_DUMP_SIGNAL)
                    rank_bootstrap._stack_file.pop(os.getpid()).close()
            ratio = figures["with"][-1] / figures["without"][-1]
            print(
                f"  round {round_ + 1}: with the handler {figures['with'][-1]:,.0f} img/s, "
                f"without {figures['without'][-1]:,.0f} img/s, ratio {ratio:.3f}",
                flush=True,
            )
    ratios = [w / o for w, o in zip(figures["with"], figures["without"], strict=True)]
    median_ratio = statistics.median(figures["with"]) / statistics.median(figures["without"])
    print(
        f"with / without the stack-dump handler: {median_ratio:.3f} (ratio of medians; "
        f"rounds {min(ratios):.3f}-{max(ratios):.3f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The batch job's own steps around its node launchers, in the batch script
``engine.core.backends.slurm.submit`` writes::

    python -m engine.core.backends.slurm.job_steps begin RUN_DIR
    while :; do
        srun ... python -m engine.train.node_launch RUN_DIR
        python -m engine.core.backends.slurm.job_steps finish RUN_DIR || break
    done

- ``begin``, first: a job Slurm requeued after a node failure goes on as the run's next attempt,
  or ends the run (``engine.core.backends.slurm.restarts.begin_after_requeue``). Exit 0: start
  the node launchers; ``OVER`` (1): the run is over, the script ends.
- ``finish``, after each step: the run's end once every node said how its share ended, or its
  next attempt in this allocation (``finish_attempt``). Exit 0: the next attempt begins here,
  start the node launchers again; ``OVER``: the script ends.

What each decided is printed to the job's output (``slurm/job.out``). Plain Python, no torch: a
step takes a fraction of a second.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from engine.core.backends.slurm.restarts import (
    REQUEUE_COUNT_ENV,
    begin_after_requeue,
    finish_attempt,
)
from engine.core.common.config_error import ConfigError
from engine.core.runs.restart_policy import RestartDecision
from engine.core.runs.rundir import RunDir, RunDirError

GO = 0  # start the node launchers (again)
OVER = 1  # the run is over: the batch script ends


def _said(decision: RestartDecision | None, step: str) -> int:
    if decision is None:
        return GO if step == "begin" else OVER
    if decision.why:
        print(f"ddptui: {decision.why}", flush=True)
    return GO if decision.restart else OVER


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m engine.core.backends.slurm.job_steps",
        description="A step of a ddptui run's Slurm batch job (its batch script runs them).",
    )
    parser.add_argument("step", choices=("begin", "finish"))
    parser.add_argument("run_dir", type=Path)
    args = parser.parse_args(argv)
    run_dir = RunDir(args.run_dir)
    try:
        if args.step == "begin":
            count = os.environ.get(REQUEUE_COUNT_ENV, "0").strip()
            decision = begin_after_requeue(run_dir, int(count) if count.isdigit() else 0)
        else:
            decision = finish_attempt(run_dir)
    except (ConfigError, RunDirError, OSError) as err:
        print(f"ddptui: {args.step}: {err}", file=sys.stderr, flush=True)
        return OVER
    return _said(decision, args.step)


if __name__ == "__main__":
    sys.exit(main())

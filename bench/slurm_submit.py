"""Submit to first step on Slurm: ``ddptui run SCRIPT --slurm`` against a plain ``sbatch`` of the
same script under ``srun torchrun``, on the same two-node cluster, started here as the tests start
it (``tests/slurm/cluster.py``: Debian's Slurm, two slurmd on this machine; root, and apt-get
where Slurm is not installed).

The script is the tutorial's plain DDP loop (``tests/fixtures/tutorial_ddp.py``, no ddptui in it),
one CPU rank on each of the two nodes. A third side, the leanest plain step (``srun`` starting
the script itself, RANK and the rest from Slurm's own variables, no torchrun agent), shows what
torchrun's agent costs. Each side's time is from the moment its command is typed
(``ddptui run`` itself included: its checks of the cluster, the run directory, the batch script)
to the first progress bar of step 1 that any rank prints (the job's output for sbatch, the
ranks' logs for ddptui). The rounds alternate which side goes first.

Target (issue 22): ddptui's median at most 2 s more than the plain sbatch's.

    sudo .venv/bin/python bench/slurm_submit.py              # 5 rounds, about 4 minutes
    sudo .venv/bin/python bench/slurm_submit.py --rounds 9

Run on demand; never as a timed test.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from tests.slurm.cluster import ClusterUnavailable, SlurmTestCluster, free_port  # noqa: E402

SCRIPT = REPO / "tests" / "fixtures" / "tutorial_ddp.py"
SCRIPT_ARGS = ["--epochs", "1", "--steps", "10"]
FIRST_STEP = re.compile(rb"\b1/10 \[")
TORCHRUN = Path(sys.executable).parent / "torchrun"
WAIT_SECONDS = 180.0


def first_step(paths: list[Path], started: float) -> float:
    """Seconds from ``started`` until one of ``paths`` shows step 1's progress bar."""
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        for path in paths:
            try:
                said = path.read_bytes()
            except OSError:
                continue
            if FIRST_STEP.search(said):
                return time.monotonic() - started
            if b"srun: error" in said or b"Traceback" in said:
                raise RuntimeError(f"the job failed before its first step; see {path}")
        time.sleep(0.02)
    raise TimeoutError(f"no first step within {WAIT_SECONDS:g} s in {paths}")


def torchrun_step() -> str:
    """The step the issue names as the baseline: ``srun torchrun`` with c10d rendezvous."""
    return (
        f"srun {TORCHRUN} --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d "
        f'--rdzv-endpoint "$head:{free_port()}" --rdzv-id "$SLURM_JOB_ID" '
        f"{SCRIPT} {' '.join(SCRIPT_ARGS)}"
    )


def python_step() -> str:
    """The leanest plain step: srun starts the script itself, the torchrun contract from
    Slurm's own variables (no agent process)."""
    contract = (
        f"RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=$SLURM_LOCALID "
        f'MASTER_ADDR="$head" MASTER_PORT={free_port()}'
    )
    return f"srun bash -c '{contract} exec {sys.executable} {SCRIPT} {' '.join(SCRIPT_ARGS)}'"


def plain_sbatch(cluster: SlurmTestCluster, work: Path, env: dict[str, str], step: str) -> float:
    out = work / f"plain-{time.monotonic_ns()}.out"
    script = work / "plain.sbatch"
    script.write_text(
        "\n".join(
            [
                "#!/bin/bash",
                "#SBATCH --nodes=2",
                "#SBATCH --ntasks-per-node=1",
                "#SBATCH --cpus-per-task=1",
                f"#SBATCH --output={out}",
                'export head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -1)',
                step,
                "",
            ]
        )
    )
    started = time.monotonic()
    subprocess.run(["sbatch", "--parsable", str(script)], env=env, check=True, capture_output=True)
    took = first_step([out], started)
    cluster.cancel_all()
    return took


def ddptui_slurm(cluster: SlurmTestCluster, work: Path, env: dict[str, str], _step: str) -> float:
    runs = work / f"runs-{time.monotonic_ns()}"
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "ddptui", "run", str(SCRIPT), "--slurm", "--nodes", "2",
         "--devices", "cpu:1", "--runs-dir", str(runs), "--detach", "--", *SCRIPT_ARGS],
        env=env, check=True, capture_output=True, text=True, cwd=REPO,
    )  # fmt: skip
    logs = runs / done.stdout.strip() / "logs"
    took = first_step([logs / "rank-0.log", logs / "rank-1.log"], started)
    cluster.cancel_all()
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    cluster = SlurmTestCluster()
    try:
        cluster.start()
    except ClusterUnavailable as err:
        print(f"no test Slurm cluster here: {err}", file=sys.stderr)
        return 2
    env = {**os.environ, **cluster.env(), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    plain: list[float] = []
    lean: list[float] = []
    ours: list[float] = []
    sides = [
        ("sbatch + srun torchrun", plain_sbatch, torchrun_step, plain),
        ("sbatch + srun python", plain_sbatch, python_step, lean),
        ("ddptui run --slurm", ddptui_slurm, str, ours),
    ]
    try:
        with tempfile.TemporaryDirectory(prefix="ddptui-bench-slurm-") as tmp:
            work = Path(tmp)
            for round_ in range(args.rounds):
                for name, measure, step, into in sides if round_ % 2 == 0 else sides[::-1]:
                    into.append(measure(cluster, work, env, step()))
                    print(f"round {round_ + 1}: {name:<22} {into[-1]:5.2f} s to the first step")
    finally:
        cluster.stop()
    base, mine = statistics.median(plain), statistics.median(ours)
    print()
    print("| submit to first step (median) | seconds |")
    print("| --- | --- |")
    for name, _, _, into in sides:
        print(f"| {name} | {statistics.median(into):.2f} |")
    print(f"| ddptui's extra over sbatch + srun torchrun | {mine - base:+.2f} |")
    print(f"| ddptui's extra over sbatch + srun python | {mine - statistics.median(lean):+.2f} |")
    ok = mine - base <= 2.0
    print(f"target: at most 2 s more: {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

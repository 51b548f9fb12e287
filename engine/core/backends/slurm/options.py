"""What the Slurm backend adds to ``ddptui run`` (``engine.core.backends.interface.RunOptions``):
``--slurm``, the keys of a preset's ``[slurm]`` section as options (``--nodes``, ``--partition``,
``--time``, ``--account``, ``--qos``, ``--sbatch KEY=VALUE``), and the help lines that teach them.
Plain data, which the run command turns into its options. Plain Python.
"""

from __future__ import annotations

from engine.core.backends.interface import RunOption, RunOptions
from engine.core.backends.slurm.config import SECTION, parse_sbatch_option

RUN_OPTIONS = RunOptions(
    flag="--slurm",
    help="Run on the Slurm cluster (sbatch; inside an allocation, srun): one node launcher per "
    "node, --devices each node's devices.",
    options=(
        RunOption("--nodes", f"{SECTION}.nodes", "Slurm nodes.", kind="count"),
        RunOption("--partition", f"{SECTION}.partition", "Slurm partition (default: its own)."),
        RunOption(
            "--time", f"{SECTION}.time", "Slurm time limit: minutes (30), 1:00:00, 2-00:00:00."
        ),
        RunOption("--account", f"{SECTION}.account", "Slurm account to charge."),
        RunOption("--qos", f"{SECTION}.qos", "Slurm quality of service."),
        RunOption(
            "--sbatch",
            f"{SECTION}.sbatch",
            "Another sbatch option, e.g. --sbatch constraint=a100 (repeatable).",
            kind="items",
            metavar="KEY=VALUE",
            parse_item=parse_sbatch_option,
        ),
    ),
    teaching=(
        "On a Slurm cluster, one node launcher per node (--devices: each node's devices):",
        "  ddptui run cpu-demo --slurm --nodes 2 --devices cpu:1",
        "  ddptui run train.py --slurm --nodes 4 --devices 8 --partition gpu --time 2:00:00 \\",
        "      --sbatch constraint=a100 -- --epochs 10",
        "The run directory must be on storage every node sees. Inside an allocation (salloc) the",
        "run is a step of it. Its state shows pending with Slurm's reason until the job starts.",
        "With --max-restarts a lost node restarts it too: Slurm requeues its job (--requeue).",
    ),
)

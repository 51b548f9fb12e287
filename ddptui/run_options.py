"""The override options shared by ``ddptui run`` and ``ddptui bench``: ``--set section.key=value``
plus shortcuts, turned into one overrides mapping for ``engine.core.config.schema.apply_overrides``."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click

from ddptui.cli_common import runs_dir_option
from engine.core.backends.slurm.config import parse_sbatch_option
from engine.core.config.schema import ConfigError
from engine.core.config.toml_io import parse_setting

F = TypeVar("F", bound=Callable[..., Any])

# option name -> config key
SHORTCUTS = {
    "devices": "devices.spec",
    "oversubscribe": "devices.oversubscribe",
    "epochs": "training.epochs",
    "max_steps": "training.max_steps",
    "batch_size": "training.batch_size",
    "precision": "precision.mode",
    "data": "data.dataset",
    "model": "model.name",
    "seed": "training.seed",
    "max_restarts": "supervision.max_restarts",  # ddptui run's own option
}


def override_options(func: F) -> F:
    """Add --set, the shortcuts and --runs-dir to a command."""
    options = [
        click.option(
            "--set",
            "set_values",
            multiple=True,
            metavar="SECTION.KEY=VALUE",
            help="Override any preset key, e.g. --set optimizer.lr=0.1 (repeatable).",
        ),
        click.option(
            "--devices",
            help="auto, all, a GPU count (2), GPU indices in NVML/PCI order (0,2), cpu or cpu:N.",
        ),
        click.option(
            "--oversubscribe",
            is_flag=True,
            default=None,
            help="Allow more than 4 CPU ranks per core (devices.oversubscribe = true).",
        ),
        click.option("--epochs", type=int, help="Epochs to train."),
        click.option("--max-steps", type=int, help="Steps per epoch, for quick runs (0 = all)."),
        click.option("--batch-size", type=int, help="Batch per process."),
        click.option(
            "--precision", type=click.Choice(["fp32", "fp16", "bf16"]), help="Numeric precision."
        ),
        click.option("--data", type=click.Choice(["synthetic", "cifar10"]), help="Data set."),
        click.option(
            "--model",
            type=click.Choice(["small_cnn", "resnet18", "resnet34", "resnet50"]),
            help="Model.",
        ),
        click.option("--seed", type=int, help="Training seed."),
        runs_dir_option(write=True, description="Where run directories are made."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def collect_overrides(set_values: tuple[str, ...], **shortcuts: Any) -> dict[str, Any]:
    """Overrides in command-line order: --set first, then the shortcuts (which win)."""
    overrides: dict[str, Any] = {}
    for item in set_values:
        try:
            key, value = parse_setting(item)
        except ConfigError as err:
            raise click.UsageError(f"--set {err}") from None
        overrides[key] = value
    for name, key in SHORTCUTS.items():
        shortcut = shortcuts.get(name)
        if shortcut is not None:
            overrides[key] = shortcut
    return overrides


# --option name -> the [slurm] key it sets
SLURM_SHORTCUTS = {
    "nodes": "slurm.nodes",
    "partition": "slurm.partition",
    "time": "slurm.time",
    "account": "slurm.account",
    "qos": "slurm.qos",
}


def slurm_options(func: F) -> F:
    """``--slurm`` and the keys of a preset's [slurm] section as options; the command gets
    ``slurm`` (run on Slurm) and ``slurm_values`` (the overrides they make, in ``slurm.KEY``
    form; --sbatch KEY=VALUE adds to slurm.sbatch)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        values: dict[str, Any] = {}
        for name, key in SLURM_SHORTCUTS.items():
            given = kwargs.pop(f"slurm_{name}")
            if given is not None:
                values[key] = given
        sbatch = kwargs.pop("sbatch_options")
        if sbatch:
            values["slurm.sbatch"] = tuple(sbatch)  # checked by slurm_overrides
        return func(*args, slurm_values=values, **kwargs)

    options = [
        click.option(
            "--slurm",
            is_flag=True,
            help="Run on the Slurm cluster (sbatch; inside an allocation, srun): one node "
            "launcher per node, --devices each node's devices.",
        ),
        click.option("--nodes", "slurm_nodes", type=click.IntRange(min=1), help="Slurm nodes."),
        click.option("--partition", "slurm_partition", help="Slurm partition (default: its own)."),
        click.option(
            "--time", "slurm_time", help="Slurm time limit: minutes (30), 1:00:00, 2-00:00:00."
        ),
        click.option("--account", "slurm_account", help="Slurm account to charge."),
        click.option("--qos", "slurm_qos", help="Slurm quality of service."),
        click.option(
            "--sbatch",
            "sbatch_options",
            multiple=True,
            metavar="KEY=VALUE",
            help="Another sbatch option, e.g. --sbatch constraint=a100 (repeatable).",
        ),
    ]
    decorated: Any = wrapper
    for option in reversed(options):
        decorated = option(decorated)
    return decorated


def slurm_option_names(values: dict[str, Any]) -> str:
    """The options that made ``values``, as the user typed them."""
    names = [f"--{k.removeprefix('slurm.')}" for k in values if k != "slurm.sbatch"]
    if "slurm.sbatch" in values:
        names.append("--sbatch")
    return ", ".join(names)


def slurm_overrides(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` as ``apply_overrides`` takes them: --sbatch KEY=VALUE items as one table;
    ConfigError (one sentence) for an item that is no sbatch option."""
    items = values.get("slurm.sbatch")
    if not items:
        return values
    return {**values, "slurm.sbatch": dict(parse_sbatch_option(i) for i in items)}

"""The override options shared by ``ddptui run`` and ``ddptui bench``: ``--set section.key=value``
plus shortcuts, turned into one overrides mapping for ``engine.core.config.schema.apply_overrides``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from ddptui.cli_common import runs_dir_option
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

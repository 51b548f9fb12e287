"""A preset's ``[slurm]`` section: how a run asks Slurm for its nodes when it runs there
(``ddptui run --slurm`` or the launch screen's "where to run"). The same keys as the command line:
``--nodes``, ``--partition``, ``--time``, ``--account``, ``--qos`` and ``--sbatch KEY=VALUE``.

Plain Python. Values are checked where they are made, as every section's are; whether the cluster
has that partition, or that many nodes, is asked of Slurm when the run is submitted
(``engine.core.backends.slurm.submit``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.core.common.config_error import ConfigError

if TYPE_CHECKING:  # this module is registered as engine.core starts: it stays light
    from engine.core.config.schema import RunConfig

SECTION = "slurm"  # its section of a run config, registered by this package

# Slurm's time formats: minutes, minutes:seconds, hours:minutes:seconds, days-hours,
# days-hours:minutes, days-hours:minutes:seconds; or UNLIMITED / INFINITE.
_TIME = re.compile(r"^(\d+-\d+(:\d+(:\d+)?)?|\d+(:\d+(:\d+)?)?|unlimited|infinite)$", re.I)
_NAME = re.compile(r"^[A-Za-z0-9_.+-]+$")
_OPTION = re.compile(r"^[a-z][a-z0-9-]*$")
# Options ddptui sets itself in the batch script: one node launcher per node, its output file,
# and the keys of this section, which have their own names.
RESERVED_OPTIONS = frozenset(
    {
        "nodes", "N", "ntasks", "n", "ntasks-per-node", "output", "o", "error", "e",
        "partition", "p", "time", "t", "account", "A", "qos", "q", "parsable", "wrap",
        "job-name", "J", "chdir", "D", "export",
    }
)  # fmt: skip


def _refuse(key: str, message: str, reason: str) -> ConfigError:
    return ConfigError(message, key=f"slurm.{key}", reason=reason)


@dataclass(frozen=True)
class SlurmConfig:
    """What the run asks of Slurm. ``devices.spec`` is then the devices of each node."""

    nodes: int = 1
    partition: str = ""  # "" is the cluster's default partition
    time: str = ""  # Slurm's time limit format (30, 1:00:00, 2-00:00:00); "" the partition's
    account: str = ""
    qos: str = ""
    # Further sbatch options, written as ``#SBATCH --KEY=VALUE`` (e.g. constraint = "a100").
    sbatch: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, config: RunConfig) -> SlurmConfig:
        """The ``[slurm]`` section of ``config`` (its defaults when the preset has none)."""
        return config.backend_section(SECTION, cls)

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise _refuse("nodes", f"slurm.nodes is {self.nodes}; it must be 1 or more", "< 1")
        if self.time and not _TIME.match(self.time):
            raise _refuse(
                "time",
                f"slurm.time is {self.time!r}; expected Slurm's time format: minutes (30), "
                "hours:minutes:seconds (1:30:00) or days-hours:minutes (2-12:00)",
                "not a Slurm time limit",
            )
        for key in ("partition", "account", "qos"):
            value = getattr(self, key)
            if value and not _NAME.match(value):
                raise _refuse(
                    key, f"slurm.{key} is {value!r}; expected a plain name", "not a plain name"
                )
        for option, value in self.sbatch.items():
            self._check_option(option, value)

    @staticmethod
    def _check_option(option: str, value: object) -> None:
        where = f"sbatch.{option}"
        if not _OPTION.match(option):
            raise _refuse(
                where,
                f"--sbatch {option}: expected an sbatch option name such as constraint or "
                "gres (without its dashes)",
                "not an sbatch option name",
            )
        if option in RESERVED_OPTIONS:
            raise _refuse(
                where,
                f"--sbatch {option} is set by ddptui itself; use --nodes, --partition, --time, "
                "--account or --qos for those",
                "set by ddptui",
            )
        if not isinstance(value, str) or "\n" in value or "\r" in value or "\0" in value:
            raise _refuse(
                where,
                f"--sbatch {option}={value!r}: the value must be one line of text",
                "not one line of text",
            )


def parse_sbatch_option(item: str) -> tuple[str, str]:
    """``KEY=VALUE`` (or a bare ``KEY``, a flag) as ``--sbatch`` takes it; the key without
    leading dashes."""
    key, sep, value = item.partition("=")
    key = key.strip().lstrip("-")
    if not key:
        raise ConfigError(
            f"--sbatch {item!r} is not KEY=VALUE", key="slurm.sbatch", reason="not KEY=VALUE"
        )
    SlurmConfig._check_option(key, value.strip() if sep else "")
    return key, value.strip() if sep else ""

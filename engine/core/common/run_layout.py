"""Every path of a run directory, in one place, and the one rule for what a run directory is.

Layout (docs/architecture.md)::

    runs/<run-id>/config.toml                 resolved preset        (launcher, first)
                  run.json                    ids, pids, state       (launcher)
                  environment.json            what the ranks ran with (launcher)
                  events/rank-<r>.jsonl       rank events            (rank r)
                  events/launcher.jsonl       launcher events        (launcher)
                  events/launcher-<n>.jsonl   a node launcher's      (node n, across nodes)
                  logs/rank-<r>.log           stdout + stderr        (rank r)
                  logs/launcher.log           launcher output        (launcher)
                  logs/launcher-<n>.log       a node launcher's      (node n)
                  stacks/                     stack dumps, snapshots (ranks, launcher, kill)
                  flight-recorder/            collective traces      (ranks, torch)
                  summary.json                final status, figures  (launcher, always)
                  checkpoint.pt               resumable checkpoint   (rank 0)
                  checkpoint.json             what the checkpoint holds (rank 0)
                  stop-request                who asked it to stop   (kill, Ctrl-C, the UI)
                  checkpoints/                a script's own checkpoints ($DDPTUI_CHECKPOINT_DIR)
                  attempts/<n>/               attempt n's run.json, summary.json, events/, stacks/,
                                              flight-recorder/, environment.json, stop-request,
                                              moved there as attempt n+1 starts (its launcher)
                  .rendezvous                 the ranks' file store  (single node, while it runs)
                  .space-reserve              space given back for the summary (run start)
                  nodes/<n>.json              a node launcher's record (across nodes)
                  gpus/<n>.json               a node's GPUs, sampled (across nodes)
                  <placement>/                a placement backend's own records (its own)

Paths only: nothing here reads or writes (``engine.core.common.run_files`` does, safely). Below
every other part of ``engine.core``, so the stacks, the runs and the placements name a run's
files from one list. Node names are checked by whoever takes them from the outside
(``engine.core.runs.placement``).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from engine.core.common.run_environment import STACKS_DIR, faulthandler_file_name

CONFIG_NAME = "config.toml"  # written first, by every launcher: what makes a directory a run's
RUN_JSON_NAME = "run.json"
SUMMARY_NAME = "summary.json"
ENVIRONMENT_NAME = "environment.json"
CHECKPOINT_NAME = "checkpoint.pt"
CHECKPOINT_RECORD_NAME = "checkpoint.json"  # what the checkpoint holds, for readers without torch
STOP_REQUEST_NAME = "stop-request"
RENDEZVOUS_NAME = ".rendezvous"
RESERVE_NAME = ".space-reserve"  # given back for the last writes (engine.core.common.disk_space)
EVENTS_DIR = "events"
LOGS_DIR = "logs"
FLIGHT_RECORDER_DIR = "flight-recorder"
# The files of each rank and each node launcher, as a directory listing finds them.
RANK_EVENTS_PATTERN = "rank-*.jsonl"
NODE_EVENTS_PATTERN = "launcher-*.jsonl"
NODES_DIR = "nodes"
GPUS_DIR = "gpus"
ATTEMPTS_DIR = "attempts"
SCRIPT_CHECKPOINTS_DIR = "checkpoints"


def holds_run(path: str | os.PathLike[str]) -> bool:
    """Whether the directory ``path`` (known to be no symbolic link) holds a run: its config.toml,
    the file every launcher writes first. One call: a listing asks it of every run there is."""
    return os.path.exists(os.path.join(path, CONFIG_NAME))


def is_run_dir(path: str | os.PathLike[str]) -> bool:
    """The one rule for a run directory: not a symbolic link (it could point at any directory
    of the machine, /root included), holding a run (``holds_run``)."""
    try:
        if stat.S_ISLNK(os.lstat(path).st_mode):
            return False
    except OSError:
        return False
    return holds_run(path)


@dataclass(frozen=True)
class RunLayout:
    """The paths of the run directory ``path``."""

    path: Path

    @property
    def config(self) -> Path:
        return self.path / CONFIG_NAME

    @property
    def run_json(self) -> Path:
        return self.path / RUN_JSON_NAME

    @property
    def summary(self) -> Path:
        return self.path / SUMMARY_NAME

    @property
    def environment(self) -> Path:
        return self.path / ENVIRONMENT_NAME

    @property
    def checkpoint(self) -> Path:
        return self.path / CHECKPOINT_NAME

    @property
    def checkpoint_record(self) -> Path:
        return self.path / CHECKPOINT_RECORD_NAME

    @property
    def stop_request(self) -> Path:
        return self.path / STOP_REQUEST_NAME

    @property
    def rendezvous(self) -> Path:
        """The file store where the ranks of a single-node run meet (exists while it runs)."""
        return self.path / RENDEZVOUS_NAME

    @property
    def space_reserve(self) -> Path:
        return self.path / RESERVE_NAME

    @property
    def events_dir(self) -> Path:
        return self.path / EVENTS_DIR

    @property
    def logs_dir(self) -> Path:
        return self.path / LOGS_DIR

    @property
    def stacks_dir(self) -> Path:
        """Stack dumps of the ranks (faulthandler) and the snapshots taken of them."""
        return self.path / STACKS_DIR

    @property
    def flight_recorder_dir(self) -> Path:
        """torch's flight-recorder dumps, ``rank_<r>`` each."""
        return self.path / FLIGHT_RECORDER_DIR

    def stack_dump(self, pid: int, node: str = "") -> Path:
        """The file a rank's faulthandler appends its stacks to (``faulthandler_file_name``)."""
        return self.stacks_dir / faulthandler_file_name(pid, node)

    def rank_events(self, rank: int) -> Path:
        return self.events_dir / f"rank-{rank}.jsonl"

    @property
    def launcher_events(self) -> Path:
        return self.events_dir / "launcher.jsonl"

    def node_events(self, node: str) -> Path:
        """A node launcher's own events, beside the ranks' (a run across nodes)."""
        return self.events_dir / f"launcher-{node}.jsonl"

    def rank_log(self, rank: int) -> Path:
        return self.logs_dir / f"rank-{rank}.log"

    @property
    def launcher_log(self) -> Path:
        return self.logs_dir / "launcher.log"

    def node_log(self, node: str) -> Path:
        return self.logs_dir / f"launcher-{node}.log"

    @property
    def nodes_dir(self) -> Path:
        return self.path / NODES_DIR

    def node_record(self, node: str) -> Path:
        return self.nodes_dir / f"{node}.json"

    @property
    def gpus_dir(self) -> Path:
        return self.path / GPUS_DIR

    def node_gpus(self, node: str) -> Path:
        """The node's GPUs as its launcher last sampled them (NVML)."""
        return self.gpus_dir / f"{node}.json"

    @property
    def script_checkpoints(self) -> Path:
        """Where a user's script writes its checkpoints (``$DDPTUI_CHECKPOINT_DIR``)."""
        return self.path / SCRIPT_CHECKPOINTS_DIR

    @property
    def attempts_dir(self) -> Path:
        return self.path / ATTEMPTS_DIR

    def attempt(self, number: int) -> RunLayout:
        """An earlier attempt's files, as they were when the next attempt started: the same
        names, below ``attempts/<number>/``."""
        return RunLayout(self.attempts_dir / str(number))

    def placement_dir(self, placement: str) -> Path:
        """A placement backend's own folder: what is in it is that backend's business."""
        return self.path / placement
